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

// Rows of `size` <= WIDTH * PER_LANE contiguous elements. Lane l of a group holds
// elements l, l + WIDTH, ... of its row (coalesced loads). The loop bound is the
// same for the whole warp, so every lane reaches every shuffle.
template <typename T, int WIDTH, int PER_LANE>
__global__ void softmax_forward_rows(const T* __restrict__ input, T* __restrict__ output,
                                     long long rows, int size) {
    const int lane = threadIdx.x % WIDTH;
    const long long groups_per_block = blockDim.x / WIDTH;
    const long long first = (long long)blockIdx.x * groups_per_block;
    const long long step = (long long)gridDim.x * groups_per_block;
    const long long warp_first = first + (threadIdx.x / 32) * (32 / WIDTH);
    for (long long base = warp_first; base < rows; base += step) {
        const long long row = base + (threadIdx.x % 32) / WIDTH;
        const bool valid = row < rows;
        const T* in = input + row * size;
        T v[PER_LANE];
        T row_max = lowest<T>();
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int index = lane + j * WIDTH;
            v[j] = (valid && index < size) ? in[index] : lowest<T>();
            row_max = larger(row_max, v[j]);
        }
        row_max = group_max<T, WIDTH>(row_max);
        T sum = T(0);
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int index = lane + j * WIDTH;
            v[j] = index < size ? exp_of(v[j] - row_max) : T(0);
            sum += v[j];
        }
        sum = group_sum<T, WIDTH>(sum);
        if (valid) {
            T* out = output + row * size;
#pragma unroll
            for (int j = 0; j < PER_LANE; ++j) {
                const int index = lane + j * WIDTH;
                if (index < size) out[index] = v[j] / sum;
            }
        }
    }
}

template <typename T, int WIDTH, int PER_LANE>
__global__ void softmax_backward_rows(const T* __restrict__ output, const T* __restrict__ output_grad,
                                      T* __restrict__ input_grad, long long rows, int size) {
    const int lane = threadIdx.x % WIDTH;
    const long long groups_per_block = blockDim.x / WIDTH;
    const long long first = (long long)blockIdx.x * groups_per_block;
    const long long step = (long long)gridDim.x * groups_per_block;
    const long long warp_first = first + (threadIdx.x / 32) * (32 / WIDTH);
    for (long long base = warp_first; base < rows; base += step) {
        const long long row = base + (threadIdx.x % 32) / WIDTH;
        const bool valid = row < rows;
        T y[PER_LANE], g[PER_LANE];
        T dot = T(0);
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int index = lane + j * WIDTH;
            const bool inside = valid && index < size;
            y[j] = inside ? output[row * size + index] : T(0);
            g[j] = inside ? output_grad[row * size + index] : T(0);
            dot += g[j] * y[j];
        }
        dot = group_sum<T, WIDTH>(dot);
        if (valid) {
#pragma unroll
            for (int j = 0; j < PER_LANE; ++j) {
                const int index = lane + j * WIDTH;
                if (index < size) input_grad[row * size + index] = y[j] * (g[j] - dot);
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
    __shared__ T scratch[33];
    for (long long column = blockIdx.x; column < columns; column += gridDim.x) {
        const long long base = (column / inner) * size * inner + column % inner;
        T row_max = lowest<T>();
        for (long long d = threadIdx.x; d < size; d += blockDim.x) row_max = larger(row_max, input[base + d * inner]);
        row_max = block_max(row_max, scratch);
        T sum = T(0);
        for (long long d = threadIdx.x; d < size; d += blockDim.x) sum += exp_of(input[base + d * inner] - row_max);
        sum = block_sum(sum, scratch);
        for (long long d = threadIdx.x; d < size; d += blockDim.x)
            output[base + d * inner] = exp_of(input[base + d * inner] - row_max) / sum;
    }
}

template <typename T>
__global__ void softmax_backward_block(const T* __restrict__ output, const T* __restrict__ output_grad,
                                       T* __restrict__ input_grad, long long columns, long long size, long long inner) {
    __shared__ T scratch[33];
    for (long long column = blockIdx.x; column < columns; column += gridDim.x) {
        const long long base = (column / inner) * size * inner + column % inner;
        T dot = T(0);
        for (long long d = threadIdx.x; d < size; d += blockDim.x) {
            const long long at = base + d * inner;
            dot += output_grad[at] * output[at];
        }
        dot = block_sum(dot, scratch);
        for (long long d = threadIdx.x; d < size; d += blockDim.x) {
            const long long at = base + d * inner;
            input_grad[at] = output[at] * (output_grad[at] - dot);
        }
    }
}

// ---------------------------------------------------------------------------- one thread per column

template <typename T>
__global__ void softmax_forward_columns(const T* __restrict__ input, T* __restrict__ output,
                                        long long columns, long long size, long long inner) {
    for (long long column = (long long)blockIdx.x * blockDim.x + threadIdx.x; column < columns;
         column += (long long)gridDim.x * blockDim.x) {
        const long long base = (column / inner) * size * inner + column % inner;
        T row_max = lowest<T>();
        for (long long d = 0; d < size; ++d) row_max = larger(row_max, input[base + d * inner]);
        T sum = T(0);
        for (long long d = 0; d < size; ++d) sum += exp_of(input[base + d * inner] - row_max);
        for (long long d = 0; d < size; ++d) output[base + d * inner] = exp_of(input[base + d * inner] - row_max) / sum;
    }
}

template <typename T>
__global__ void softmax_backward_columns(const T* __restrict__ output, const T* __restrict__ output_grad,
                                         T* __restrict__ input_grad, long long columns, long long size, long long inner) {
    for (long long column = (long long)blockIdx.x * blockDim.x + threadIdx.x; column < columns;
         column += (long long)gridDim.x * blockDim.x) {
        const long long base = (column / inner) * size * inner + column % inner;
        T dot = T(0);
        for (long long d = 0; d < size; ++d) dot += output_grad[base + d * inner] * output[base + d * inner];
        for (long long d = 0; d < size; ++d) {
            const long long at = base + d * inner;
            input_grad[at] = output[at] * (output_grad[at] - dot);
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
        const long long base = (column / inner) * size * inner + column % inner;
        T v[MAX_SIZE];
        T row_max = lowest<T>();
#pragma unroll
        for (int d = 0; d < MAX_SIZE; ++d) {
            if (d < size) {
                v[d] = input[base + d * inner];
                row_max = larger(row_max, v[d]);
            }
        }
        T sum = T(0);
#pragma unroll
        for (int d = 0; d < MAX_SIZE; ++d) {
            if (d < size) {
                v[d] = exp_of(v[d] - row_max);
                sum += v[d];
            }
        }
#pragma unroll
        for (int d = 0; d < MAX_SIZE; ++d)
            if (d < size) output[base + d * inner] = v[d] / sum;
    }
}

template <typename T, int MAX_SIZE>
__global__ void softmax_backward_columns_cached(const T* __restrict__ output, const T* __restrict__ output_grad,
                                                T* __restrict__ input_grad, long long columns, int size, long long inner) {
    for (long long column = (long long)blockIdx.x * blockDim.x + threadIdx.x; column < columns;
         column += (long long)gridDim.x * blockDim.x) {
        const long long base = (column / inner) * size * inner + column % inner;
        T y[MAX_SIZE], g[MAX_SIZE];
        T dot = T(0);
#pragma unroll
        for (int d = 0; d < MAX_SIZE; ++d) {
            if (d < size) {
                y[d] = output[base + d * inner];
                g[d] = output_grad[base + d * inner];
                dot += g[d] * y[d];
            }
        }
#pragma unroll
        for (int d = 0; d < MAX_SIZE; ++d)
            if (d < size) input_grad[base + d * inner] = y[d] * (g[d] - dot);
    }
}
