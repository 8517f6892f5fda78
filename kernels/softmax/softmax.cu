// softmax along one dim. The tensor is viewed as (outer, size, inner) with the
// softmax dim in the middle. Three kernel families, chosen on the host:
//   *_rows<T, WIDTH, PER_LANE>  inner == 1, size <= 1024: a group of WIDTH lanes
//                               (a whole warp or a part of one) owns a row and keeps
//                               it in registers; warp-shuffle reductions.
//   *_block<T>                  one block per (outer, inner) column: long rows, or
//                               few columns with a long softmax dim.
//   *_columns<T>                inner > 1: one thread per (outer, inner) column,
//                               looping over the softmax dim; neighbouring threads
//                               read neighbouring addresses (coalesced along inner).
//   *_columns_cached<T, MAX>    the same for a softmax dim <= MAX (32): the column
//                               lives in registers, all its loads in flight at once
//                               (the DFL decode's 16 bins).
// Every reduction has a fixed order (per-lane sequential, then a fixed butterfly
// or tree), so the same input gives the same bits on every run. No atomics.
//
// Forward:  y = exp(x - max) / sum(exp(x - max))        (stable: the max is subtracted)
// Backward: input_grad = y * (g - sum(g * y))           (from the output y alone)
//
// T is the storage type; values are held and reduced in C = compute_t<T> (float for
// half_t and bfloat16_t: widened as loaded, rounded once as stored).
#include "common.cuh"

#define FULL_MASK 0xffffffffu

template <typename T> __device__ __forceinline__ T exp_of(T x);
template <> __device__ __forceinline__ float exp_of<float>(float x) { return expf(x); }
template <> __device__ __forceinline__ double exp_of<double>(double x) { return exp(x); }

// -infinity: the identity of max (NVRTC has no <cmath> INFINITY).
template <typename T> __device__ __forceinline__ T lowest();
template <> __device__ __forceinline__ float lowest<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double lowest<double>() { return -__longlong_as_double(0x7ff0000000000000LL); }

template <typename T> __device__ __forceinline__ T larger(T a, T b) { return b > a ? b : a; }

// Butterfly reductions within aligned groups of WIDTH lanes (a power of two <= 32).
// Every lane of the warp must take part; each lane ends with the same bits because
// each step adds the same two values (addition is commutative).
template <typename T, int WIDTH>
__device__ __forceinline__ T group_max(T value) {
#pragma unroll
    for (int offset = WIDTH / 2; offset > 0; offset /= 2)
        value = larger(value, __shfl_xor_sync(FULL_MASK, value, offset, WIDTH));
    return value;
}

template <typename T, int WIDTH>
__device__ __forceinline__ T group_sum(T value) {
#pragma unroll
    for (int offset = WIDTH / 2; offset > 0; offset /= 2)
        value += __shfl_xor_sync(FULL_MASK, value, offset, WIDTH);
    return value;
}

// ---------------------------------------------------------------------------- rows in registers

// a / b rounded to nearest, from r = the rounded reciprocal of b (made once per row):
// q = a * r is within about an ulp, the residual a - q * b comes exactly from an fma,
// and one correction q + residual * r rounds to a / b (Markstein's theorem) while the
// quotient is a normal number. Here b is a row sum in [1, size], a in [0, 1]; only a
// subnormal quotient (a < 2^-126 * b) may differ, by at most its last bit. Three
// instructions instead of the IEEE division's sequence (with its slow-path branch).
template <typename T> __device__ __forceinline__ T reciprocal(T b);
template <> __device__ __forceinline__ float reciprocal<float>(float b) { return __frcp_rn(b); }
template <> __device__ __forceinline__ double reciprocal<double>(double b) { return __drcp_rn(b); }
template <typename T> __device__ __forceinline__ T fused(T a, T b, T c);
template <> __device__ __forceinline__ float fused<float>(float a, float b, float c) { return __fmaf_rn(a, b, c); }
template <> __device__ __forceinline__ double fused<double>(double a, double b, double c) { return __fma_rn(a, b, c); }

template <typename T>
__device__ __forceinline__ T divide(T a, T b, T r) {
    const T q = a * r;
    return fused(fused(-q, b, a), r, q);
}

// VEC consecutive elements are moved by one 16-byte (or 8-byte) load or store: common.cuh's Pack.

// Elements a lane moves per vector access in the *_rows kernels: 16 bytes' worth
// when whole warps own rows and a lane holds at least that many, else 1 (scalar).
template <typename T, int WIDTH, int PER_LANE>
__host__ __device__ constexpr int rows_vec() {
    return WIDTH == 32 && PER_LANE >= int(16 / sizeof(T)) ? int(16 / sizeof(T)) : 1;
}

// Blocks of 128 threads the forward kernel is compiled to fit per SM: with at most 32
// floats (128 bytes) of a row per lane, 8 blocks (64 registers a thread, no spills
// at compute_90), so twice the rows of the unconstrained 80-register build are in
// flight; larger rows per lane keep the compiler's choice.
template <typename T, int PER_LANE>
__host__ __device__ constexpr int rows_min_blocks() {
    return sizeof(T) * PER_LANE <= 128 ? 8 : 1;
}

// Rows of `size` <= WIDTH * PER_LANE contiguous elements. Slot j of lane l holds
// element (j / VEC) * WIDTH * VEC + l * VEC + j % VEC of its row: with VEC > 1 a lane
// holds VEC neighbours per chunk and a warp's access covers WIDTH * VEC contiguous
// elements (coalesced either way; VEC == 1 is the plain lane + j * WIDTH). When the
// size is a multiple of VEC and every array starts on a VEC * sizeof(T) boundary (so
// every row does), a chunk is one vector access; otherwise (odd sizes, offset views)
// the same slots are filled by scalar accesses. Both paths sum the slots in the same
// order (j = 0, 1, ..., then the butterfly), so they give the same bits. The loop
// bound is the same for the whole warp, so every lane reaches every shuffle.
template <typename T, int WIDTH, int PER_LANE>
__global__ void __launch_bounds__(128, rows_min_blocks<compute_t<T>, PER_LANE>()) softmax_forward_rows(const T* __restrict__ input, T* __restrict__ output,
                                                            long long rows, int size) {
    using C = compute_t<T>;
    constexpr int VEC = rows_vec<T, WIDTH, PER_LANE>();
    constexpr int CHUNKS = PER_LANE / VEC;
    constexpr int STRIDE = WIDTH * VEC;  // elements between a lane's chunks
    const bool packed = VEC > 1 && size % VEC == 0 &&
        ((reinterpret_cast<unsigned long long>(input) | reinterpret_cast<unsigned long long>(output)) %
         (VEC * sizeof(T))) == 0;
    const int lane = threadIdx.x % WIDTH;
    const int first_in_lane = lane * VEC;
    const long long groups_per_block = blockDim.x / WIDTH;
    const long long first = (long long)blockIdx.x * groups_per_block;
    const long long step = (long long)gridDim.x * groups_per_block;
    const long long warp_first = first + (threadIdx.x / 32) * (32 / WIDTH);
    for (long long base = warp_first; base < rows; base += step) {
        const long long row = base + (threadIdx.x % 32) / WIDTH;
        const bool valid = row < rows;
        const T* in = input + (valid ? row : 0) * size + first_in_lane;
        C v[PER_LANE];
        if (packed) {
#pragma unroll
            for (int c = 0; c < CHUNKS; ++c) {
                if (valid && first_in_lane + c * STRIDE < size) {
                    const Pack<T, VEC> p = *reinterpret_cast<const Pack<T, VEC>*>(in + c * STRIDE);
#pragma unroll
                    for (int i = 0; i < VEC; ++i) v[c * VEC + i] = widen(p.v[i]);
                } else {
#pragma unroll
                    for (int i = 0; i < VEC; ++i) v[c * VEC + i] = lowest<C>();
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < PER_LANE; ++j) {
                const int at = (j / VEC) * STRIDE + j % VEC;
                v[j] = (valid && first_in_lane + at < size) ? widen(in[at]) : lowest<C>();
            }
        }
        C row_max = lowest<C>();
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) row_max = larger(row_max, v[j]);
        row_max = group_max<C, WIDTH>(row_max);
        C sum = C(0);
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int at = (j / VEC) * STRIDE + j % VEC;
            v[j] = first_in_lane + at < size ? exp_of(v[j] - row_max) : C(0);
            sum += v[j];
        }
        sum = group_sum<C, WIDTH>(sum);
        const C inverse = reciprocal(sum);
        if (valid) {
            T* out = output + row * size + first_in_lane;
            if (packed) {
#pragma unroll
                for (int c = 0; c < CHUNKS; ++c) {
                    if (first_in_lane + c * STRIDE < size) {
                        Pack<T, VEC> p;
#pragma unroll
                        for (int i = 0; i < VEC; ++i) p.v[i] = narrow<T>(divide(v[c * VEC + i], sum, inverse));
                        *reinterpret_cast<Pack<T, VEC>*>(out + c * STRIDE) = p;
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < PER_LANE; ++j) {
                    const int at = (j / VEC) * STRIDE + j % VEC;
                    if (first_in_lane + at < size) out[at] = narrow<T>(divide(v[j], sum, inverse));
                }
            }
        }
    }
}

// Same slots, same two paths, same summation order as softmax_forward_rows.
template <typename T, int WIDTH, int PER_LANE>
__global__ void __launch_bounds__(128) softmax_backward_rows(const T* __restrict__ output,
                                                             const T* __restrict__ output_grad,
                                                             T* __restrict__ input_grad, long long rows, int size) {
    using C = compute_t<T>;
    constexpr int VEC = rows_vec<T, WIDTH, PER_LANE>();
    constexpr int CHUNKS = PER_LANE / VEC;
    constexpr int STRIDE = WIDTH * VEC;
    const bool packed = VEC > 1 && size % VEC == 0 &&
        ((reinterpret_cast<unsigned long long>(output) | reinterpret_cast<unsigned long long>(output_grad) |
          reinterpret_cast<unsigned long long>(input_grad)) % (VEC * sizeof(T))) == 0;
    const int lane = threadIdx.x % WIDTH;
    const int first_in_lane = lane * VEC;
    const long long groups_per_block = blockDim.x / WIDTH;
    const long long first = (long long)blockIdx.x * groups_per_block;
    const long long step = (long long)gridDim.x * groups_per_block;
    const long long warp_first = first + (threadIdx.x / 32) * (32 / WIDTH);
    for (long long base = warp_first; base < rows; base += step) {
        const long long row = base + (threadIdx.x % 32) / WIDTH;
        const bool valid = row < rows;
        const long long offset = (valid ? row : 0) * size + first_in_lane;
        const T* y_row = output + offset;
        const T* g_row = output_grad + offset;
        C y[PER_LANE], g[PER_LANE];
        if (packed) {
#pragma unroll
            for (int c = 0; c < CHUNKS; ++c) {
                if (valid && first_in_lane + c * STRIDE < size) {
                    const Pack<T, VEC> py = *reinterpret_cast<const Pack<T, VEC>*>(y_row + c * STRIDE);
                    const Pack<T, VEC> pg = *reinterpret_cast<const Pack<T, VEC>*>(g_row + c * STRIDE);
#pragma unroll
                    for (int i = 0; i < VEC; ++i) {
                        y[c * VEC + i] = widen(py.v[i]);
                        g[c * VEC + i] = widen(pg.v[i]);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < VEC; ++i) y[c * VEC + i] = g[c * VEC + i] = C(0);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < PER_LANE; ++j) {
                const int at = (j / VEC) * STRIDE + j % VEC;
                const bool inside = valid && first_in_lane + at < size;
                y[j] = inside ? widen(y_row[at]) : C(0);
                g[j] = inside ? widen(g_row[at]) : C(0);
            }
        }
        C dot = C(0);
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) dot += g[j] * y[j];
        dot = group_sum<C, WIDTH>(dot);
        if (valid) {
            T* dx_row = input_grad + offset;
            if (packed) {
#pragma unroll
                for (int c = 0; c < CHUNKS; ++c) {
                    if (first_in_lane + c * STRIDE < size) {
                        Pack<T, VEC> p;
#pragma unroll
                        for (int i = 0; i < VEC; ++i) p.v[i] = narrow<T>(y[c * VEC + i] * (g[c * VEC + i] - dot));
                        *reinterpret_cast<Pack<T, VEC>*>(dx_row + c * STRIDE) = p;
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < PER_LANE; ++j) {
                    const int at = (j / VEC) * STRIDE + j % VEC;
                    if (first_in_lane + at < size) dx_row[at] = narrow<T>(y[j] * (g[j] - dot));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------- one block per column

// Block-wide reductions in a fixed order: each warp's butterfly, then warp 0 over
// the per-warp results. `scratch` holds 32 values; the result is returned to all.
template <typename T>
__device__ __forceinline__ T block_max(T value, T* scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
    value = group_max<T, 32>(value);
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    if (warp == 0) {
        value = lane < warps ? scratch[lane] : lowest<T>();
        value = group_max<T, 32>(value);
        if (lane == 0) scratch[32] = value;
    }
    __syncthreads();
    value = scratch[32];
    __syncthreads();
    return value;
}

template <typename T>
__device__ __forceinline__ T block_sum(T value, T* scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
    value = group_sum<T, 32>(value);
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    if (warp == 0) {
        value = lane < warps ? scratch[lane] : T(0);
        value = group_sum<T, 32>(value);
        if (lane == 0) scratch[32] = value;
    }
    __syncthreads();
    value = scratch[32];
    __syncthreads();
    return value;
}

// Column c is (c / inner, c % inner); its elements are `inner` apart. blockDim.x is
// a multiple of 32. Three passes (max, sum, write) re-read the column from cache.
template <typename T>
__global__ void softmax_forward_block(const T* __restrict__ input, T* __restrict__ output,
                                      long long columns, long long size, long long inner) {
    using C = compute_t<T>;
    __shared__ C scratch[33];
    for (long long column = blockIdx.x; column < columns; column += gridDim.x) {
        const long long base = (column / inner) * size * inner + column % inner;
        C row_max = lowest<C>();
        for (long long d = threadIdx.x; d < size; d += blockDim.x) row_max = larger(row_max, widen(input[base + d * inner]));
        row_max = block_max(row_max, scratch);
        C sum = C(0);
        for (long long d = threadIdx.x; d < size; d += blockDim.x) sum += exp_of(widen(input[base + d * inner]) - row_max);
        sum = block_sum(sum, scratch);
        for (long long d = threadIdx.x; d < size; d += blockDim.x)
            output[base + d * inner] = narrow<T>(exp_of(widen(input[base + d * inner]) - row_max) / sum);
    }
}

template <typename T>
__global__ void softmax_backward_block(const T* __restrict__ output, const T* __restrict__ output_grad,
                                       T* __restrict__ input_grad, long long columns, long long size, long long inner) {
    using C = compute_t<T>;
    __shared__ C scratch[33];
    for (long long column = blockIdx.x; column < columns; column += gridDim.x) {
        const long long base = (column / inner) * size * inner + column % inner;
        C dot = C(0);
        for (long long d = threadIdx.x; d < size; d += blockDim.x) {
            const long long at = base + d * inner;
            dot += widen(output_grad[at]) * widen(output[at]);
        }
        dot = block_sum(dot, scratch);
        for (long long d = threadIdx.x; d < size; d += blockDim.x) {
            const long long at = base + d * inner;
            input_grad[at] = narrow<T>(widen(output[at]) * (widen(output_grad[at]) - dot));
        }
    }
}

// ---------------------------------------------------------------------------- one thread per column

template <typename T>
__global__ void softmax_forward_columns(const T* __restrict__ input, T* __restrict__ output,
                                        long long columns, long long size, long long inner) {
    for (long long column = (long long)blockIdx.x * blockDim.x + threadIdx.x; column < columns;
         column += (long long)gridDim.x * blockDim.x) {
        using C = compute_t<T>;
        const long long base = (column / inner) * size * inner + column % inner;
        C row_max = lowest<C>();
        for (long long d = 0; d < size; ++d) row_max = larger(row_max, widen(input[base + d * inner]));
        C sum = C(0);
        for (long long d = 0; d < size; ++d) sum += exp_of(widen(input[base + d * inner]) - row_max);
        for (long long d = 0; d < size; ++d)
            output[base + d * inner] = narrow<T>(exp_of(widen(input[base + d * inner]) - row_max) / sum);
    }
}

template <typename T>
__global__ void softmax_backward_columns(const T* __restrict__ output, const T* __restrict__ output_grad,
                                         T* __restrict__ input_grad, long long columns, long long size, long long inner) {
    for (long long column = (long long)blockIdx.x * blockDim.x + threadIdx.x; column < columns;
         column += (long long)gridDim.x * blockDim.x) {
        using C = compute_t<T>;
        const long long base = (column / inner) * size * inner + column % inner;
        C dot = C(0);
        for (long long d = 0; d < size; ++d) dot += widen(output_grad[base + d * inner]) * widen(output[base + d * inner]);
        for (long long d = 0; d < size; ++d) {
            const long long at = base + d * inner;
            input_grad[at] = narrow<T>(widen(output[at]) * (widen(output_grad[at]) - dot));
        }
    }
}

// A softmax dim of at most MAX_SIZE: the column is loaded once into registers (the
// loads of a thread are independent, so they are all in flight together). Same
// summation order as *_columns: sequential along the dim.
template <typename T, int MAX_SIZE>
__global__ void softmax_forward_columns_cached(const T* __restrict__ input, T* __restrict__ output,
                                               long long columns, int size, long long inner) {
    for (long long column = (long long)blockIdx.x * blockDim.x + threadIdx.x; column < columns;
         column += (long long)gridDim.x * blockDim.x) {
        using C = compute_t<T>;
        const long long base = (column / inner) * size * inner + column % inner;
        C v[MAX_SIZE];
        C row_max = lowest<C>();
#pragma unroll
        for (int d = 0; d < MAX_SIZE; ++d) {
            if (d < size) {
                v[d] = widen(input[base + d * inner]);
                row_max = larger(row_max, v[d]);
            }
        }
        C sum = C(0);
#pragma unroll
        for (int d = 0; d < MAX_SIZE; ++d) {
            if (d < size) {
                v[d] = exp_of(v[d] - row_max);
                sum += v[d];
            }
        }
#pragma unroll
        for (int d = 0; d < MAX_SIZE; ++d)
            if (d < size) output[base + d * inner] = narrow<T>(v[d] / sum);
    }
}

template <typename T, int MAX_SIZE>
__global__ void softmax_backward_columns_cached(const T* __restrict__ output, const T* __restrict__ output_grad,
                                                T* __restrict__ input_grad, long long columns, int size, long long inner) {
    for (long long column = (long long)blockIdx.x * blockDim.x + threadIdx.x; column < columns;
         column += (long long)gridDim.x * blockDim.x) {
        using C = compute_t<T>;
        const long long base = (column / inner) * size * inner + column % inner;
        C y[MAX_SIZE], g[MAX_SIZE];
        C dot = C(0);
#pragma unroll
        for (int d = 0; d < MAX_SIZE; ++d) {
            if (d < size) {
                y[d] = widen(output[base + d * inner]);
                g[d] = widen(output_grad[base + d * inner]);
                dot += g[d] * y[d];
            }
        }
#pragma unroll
        for (int d = 0; d < MAX_SIZE; ++d)
            if (d < size) input_grad[base + d * inner] = narrow<T>(y[d] * (g[d] - dot));
    }
}
