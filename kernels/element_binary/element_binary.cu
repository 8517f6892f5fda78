// element_binary: output = lhs (op) rhs with broadcasting, and its gradients.
// The host collapses dims first (collapse, in plan.py); an index space is given
// as rank, sizes (innermost first), 32-bit division constants, and the output, lhs
// and rhs strides of each dim (0 where that side is broadcast).
//
// Gradients are reduced over broadcast dims without atomics: every sum is taken by
// one thread or one warp in a fixed order, and a split reduction writes partial sums
// that a second kernel adds in chunk order. The same shapes give the same bits.
//
// T is the storage type; values are computed and summed in C = compute_t<T> (float for
// half_t and bfloat16_t: widened as read, rounded once as written; the partial sums of
// a split reduction stay in C, so a half gradient is rounded once, after the last add).
#include "common.cuh"

// The op codes OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN are BinaryOpType's values and
// EB_VECTOR_BYTES the width of a vector load, all defined once in Python (gpu.py) and passed
// by CudaModule as -D options.
#if !defined(OP_ADD) || !defined(OP_SUB) || !defined(OP_MUL) || !defined(OP_DIV) || !defined(OP_MAX) || !defined(OP_MIN)
#error "OP_ADD ... OP_MIN are defined by kernels/element_binary/gpu.py (CudaModule's -D options)"
#endif
#ifndef EB_VECTOR_BYTES
#error "EB_VECTOR_BYTES is defined by kernels/element_binary/gpu.py (CudaModule's -D options)"
#endif

// Correctly rounded arithmetic that the compiler may not contract into an FMA, so an
// elementwise gradient has the bits NumPy gives it.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }

template <int OP, typename T>
__device__ __forceinline__ T apply(T l, T r) {
    if (OP == OP_ADD) return l + r;
    if (OP == OP_SUB) return l - r;
    if (OP == OP_MUL) return mul_rn(l, r);
    if (OP == OP_DIV) return div_rn(l, r);
    // torch.maximum/minimum: NaN propagates from either side; a tie (+0 and -0) gives lhs.
    if (OP == OP_MAX) return (l < r || r != r) ? r : l;
    return (l > r || r != r) ? r : l;
}

// The gradient one output element sends to side 0 (lhs) or 1 (rhs): torch's formulas,
// in torch's order of operations.
template <int OP, typename T>
__device__ __forceinline__ T grad_of(int side, T l, T r, T g) {
    if (OP == OP_ADD) return g;
    if (OP == OP_SUB) return side ? -g : g;
    if (OP == OP_MUL) return mul_rn(g, side ? l : r);
    if (OP == OP_DIV) return side ? mul_rn(-g, div_rn(div_rn(l, r), r)) : div_rn(g, r);
    // where(l == r, g / 2, g).masked_fill_(this side loses, 0); NaN on either side gives g.
    const bool loses = (OP == OP_MAX) == (side == 0) ? (l < r) : (l > r);
    return l == r ? mul_rn(g, (T)0.5) : (loses ? (T)0 : g);
}

// Instantiate the body (the variadic arguments) with the op as a compile-time constant.
#define DISPATCH_OP(op, ...)                                   \
    switch (op) {                                              \
        case OP_ADD: { constexpr int OPC = OP_ADD; __VA_ARGS__; } break; \
        case OP_SUB: { constexpr int OPC = OP_SUB; __VA_ARGS__; } break; \
        case OP_MUL: { constexpr int OPC = OP_MUL; __VA_ARGS__; } break; \
        case OP_DIV: { constexpr int OPC = OP_DIV; __VA_ARGS__; } break; \
        case OP_MAX: { constexpr int OPC = OP_MAX; __VA_ARGS__; } break; \
        default:     { constexpr int OPC = OP_MIN; __VA_ARGS__; } break; \
    }

// n / size. For 32-bit indices by the host's constants (PyTorch's IntDivider:
// packed = magic | shift << 32, exact for n < 2^31, size < 2^31).
template <typename I>
__device__ __forceinline__ I divide(I n, long long size, long long packed);

template <>
__device__ __forceinline__ int divide<int>(int n, long long size, long long packed) {
    const unsigned magic = (unsigned)(packed & 0xffffffffLL);
    const unsigned shift = (unsigned)(packed >> 32);
    return (int)((__umulhi((unsigned)n, magic) + (unsigned)n) >> shift);
}

template <>
__device__ __forceinline__ long long divide<long long>(long long n, long long size, long long) {
    return n / size;
}

// The output, lhs and rhs offsets of element `index` of an index space whose dims come
// innermost first. The loop is unrolled with an exit at the rank, so every dim's
// constants are read straight from the kernel parameters (a runtime index would copy
// them to local memory) and a space of rank r costs r divisions and one failed test.
template <typename I>
__device__ __forceinline__ void offsets(I index, int rank, const Ints& sizes, const Ints& divs,
                                        const Ints& out_strides, const Ints& lhs_strides,
                                        const Ints& rhs_strides, I& out, I& lhs, I& rhs) {
    out = 0;
    lhs = 0;
    rhs = 0;
    I rest = index;
#pragma unroll
    for (int d = 0; d < KERNELS_MAX_RANK; ++d) {
        if (d >= rank) break;
        const I quotient = divide<I>(rest, sizes.v[d], divs.v[d]);
        const I coordinate = rest - quotient * (I)sizes.v[d];
        rest = quotient;
        out += coordinate * (I)out_strides.v[d];
        lhs += coordinate * (I)lhs_strides.v[d];
        rhs += coordinate * (I)rhs_strides.v[d];
    }
}

// EB_VECTOR_BYTES (16) bytes of T, for vector loads and stores where the host found every pointer aligned.
template <typename T>
using Vec = Pack<T, EB_VECTOR_BYTES / sizeof(T)>;  // common.cuh's Pack

// --------------------------------------------------------------------------- forward

// lhs, rhs and output have the same dims.
template <typename T, typename I>
__global__ void binary_same(const T* __restrict__ lhs, const T* __restrict__ rhs, T* __restrict__ output,
                            I count, int op, int vectorized) {
    constexpr int N = EB_VECTOR_BYTES / sizeof(T);
    const I start = (I)blockIdx.x * blockDim.x + threadIdx.x;
    const I step = (I)gridDim.x * blockDim.x;
    DISPATCH_OP(op, {
        I done = 0;
        if (vectorized) {
            const I groups = count / N;
            for (I i = start; i < groups; i += step) {
                const Vec<T> a = reinterpret_cast<const Vec<T>*>(lhs)[i];
                const Vec<T> b = reinterpret_cast<const Vec<T>*>(rhs)[i];
                Vec<T> c;
#pragma unroll
                for (int k = 0; k < N; ++k) c.v[k] = narrow<T>(apply<OPC>(widen(a.v[k]), widen(b.v[k])));
                reinterpret_cast<Vec<T>*>(output)[i] = c;
            }
            done = groups * N;
        }
        for (I i = done + start; i < count; i += step) output[i] = narrow<T>(apply<OPC>(widen(lhs[i]), widen(rhs[i])));
    })
}

// Broadcasting: each thread gathers its lhs and rhs elements through the strides.
template <typename T, typename I>
__global__ void binary_broadcast(const T* __restrict__ lhs, const T* __restrict__ rhs, T* __restrict__ output,
                                 I count, int op, int rank, Ints sizes, Ints divs, Ints out_strides,
                                 Ints lhs_strides, Ints rhs_strides) {
    const I step = (I)gridDim.x * blockDim.x;
    DISPATCH_OP(op, {
        for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count; index += step) {
            I out, l, r;
            offsets<I>(index, rank, sizes, divs, out_strides, lhs_strides, rhs_strides, out, l, r);
            output[index] = narrow<T>(apply<OPC>(widen(lhs[l]), widen(rhs[r])));
        }
    })
}

// Broadcasting along rows: the innermost collapsed dim (`inner` elements, contiguous in the output) is
// read with stride 1 by a side that has it (lhs_inner, rhs_inner) and stride 0 by a side broadcast along
// it; a row's offsets (the outer dims, through their strides) are found once per row, not per element.
// blockIdx.y strides over the rows and the x blocks over a row's elements, in 16-byte vectors where
// `vectorized` (the host found `inner` a multiple of the vector and every pointer aligned to it, so every
// row of a side that has the inner dim starts aligned). The same arithmetic as binary_broadcast, so the
// same bits.
template <typename T, typename I>
__global__ void binary_rows(const T* __restrict__ lhs, const T* __restrict__ rhs, T* __restrict__ output,
                            I rows, I inner, int op, int lhs_inner, int rhs_inner, int rank, Ints sizes, Ints divs,
                            Ints out_strides, Ints lhs_strides, Ints rhs_strides, int vectorized) {
    using C = compute_t<T>;
    constexpr int N = EB_VECTOR_BYTES / sizeof(T);
    const I start = (I)blockIdx.x * blockDim.x + threadIdx.x;
    const I step = (I)gridDim.x * blockDim.x;
    DISPATCH_OP(op, {
        for (I row = blockIdx.y; row < rows; row += gridDim.y) {
            I out0, lhs0, rhs0;
            offsets<I>(row, rank, sizes, divs, out_strides, lhs_strides, rhs_strides, out0, lhs0, rhs0);
            const T* l = lhs + lhs0;
            const T* r = rhs + rhs0;
            T* o = output + out0;
            const C lone = lhs_inner ? C(0) : widen(l[0]);  // the value of a side broadcast along the row
            const C rone = rhs_inner ? C(0) : widen(r[0]);
            I done = 0;
            if (vectorized) {
                const I groups = inner / N;
                for (I i = start; i < groups; i += step) {
                    Vec<T> a = {}, b = {}, c;
                    if (lhs_inner) a = reinterpret_cast<const Vec<T>*>(l)[i];
                    if (rhs_inner) b = reinterpret_cast<const Vec<T>*>(r)[i];
#pragma unroll
                    for (int k = 0; k < N; ++k)
                        c.v[k] = narrow<T>(apply<OPC>(lhs_inner ? widen(a.v[k]) : lone, rhs_inner ? widen(b.v[k]) : rone));
                    reinterpret_cast<Vec<T>*>(o)[i] = c;
                }
                done = groups * N;
            }
            for (I i = done + start; i < inner; i += step)
                o[i] = narrow<T>(apply<OPC>(lhs_inner ? widen(l[i]) : lone, rhs_inner ? widen(r[i]) : rone));
        }
    })
}

// --------------------------------------------------------------------------- backward

// No broadcasting: both gradients in one pass over output_grad. Pointers of gradients
// not wanted, or of values not needed, are never dereferenced.
template <typename T, typename I>
__global__ void binary_backward_same(const T* __restrict__ lhs, const T* __restrict__ rhs,
                                     const T* __restrict__ output_grad, T* __restrict__ lhs_grad,
                                     T* __restrict__ rhs_grad, I count, int op, int want_lhs, int want_rhs,
                                     int need_lhs, int need_rhs, int vectorized) {
    using C = compute_t<T>;
    constexpr int N = EB_VECTOR_BYTES / sizeof(T);
    const I start = (I)blockIdx.x * blockDim.x + threadIdx.x;
    const I step = (I)gridDim.x * blockDim.x;
    DISPATCH_OP(op, {
        I done = 0;
        if (vectorized) {
            const I groups = count / N;
            for (I i = start; i < groups; i += step) {
                const Vec<T> g = reinterpret_cast<const Vec<T>*>(output_grad)[i];
                Vec<T> l = {}, r = {};
                if (need_lhs) l = reinterpret_cast<const Vec<T>*>(lhs)[i];
                if (need_rhs) r = reinterpret_cast<const Vec<T>*>(rhs)[i];
                if (want_lhs) {
                    Vec<T> out;
#pragma unroll
                    for (int k = 0; k < N; ++k)
                        out.v[k] = narrow<T>(grad_of<OPC>(0, widen(l.v[k]), widen(r.v[k]), widen(g.v[k])));
                    reinterpret_cast<Vec<T>*>(lhs_grad)[i] = out;
                }
                if (want_rhs) {
                    Vec<T> out;
#pragma unroll
                    for (int k = 0; k < N; ++k)
                        out.v[k] = narrow<T>(grad_of<OPC>(1, widen(l.v[k]), widen(r.v[k]), widen(g.v[k])));
                    reinterpret_cast<Vec<T>*>(rhs_grad)[i] = out;
                }
            }
            done = groups * N;
        }
        for (I i = done + start; i < count; i += step) {
            const C g = widen(output_grad[i]);
            const C l = need_lhs ? widen(lhs[i]) : C(0);
            const C r = need_rhs ? widen(rhs[i]) : C(0);
            if (want_lhs) lhs_grad[i] = narrow<T>(grad_of<OPC>(0, l, r, g));
            if (want_rhs) rhs_grad[i] = narrow<T>(grad_of<OPC>(1, l, r, g));
        }
    })
}

// The gradient of a side that was broadcast along nothing (it has every output dim), along rows as
// binary_rows: gradient[i] = grad_of(side) at output element i, whose output_grad and gradient offsets
// are i itself; lhs and rhs are read with their row offsets and stride 1 or 0 along the row. Values not
// needed (need_lhs, need_rhs) are never read. The same arithmetic as binary_grad_rows, so the same bits.
template <typename T, typename I>
__global__ void binary_grad_along_rows(const T* __restrict__ lhs, const T* __restrict__ rhs,
                                       const T* __restrict__ output_grad, T* __restrict__ gradient, I rows, I inner,
                                       int op, int side, int need_lhs, int need_rhs, int lhs_inner, int rhs_inner,
                                       int rank, Ints sizes, Ints divs, Ints out_strides, Ints lhs_strides,
                                       Ints rhs_strides, int vectorized) {
    using C = compute_t<T>;
    constexpr int N = EB_VECTOR_BYTES / sizeof(T);
    const I start = (I)blockIdx.x * blockDim.x + threadIdx.x;
    const I step = (I)gridDim.x * blockDim.x;
    DISPATCH_OP(op, {
        for (I row = blockIdx.y; row < rows; row += gridDim.y) {
            I out0, lhs0, rhs0;
            offsets<I>(row, rank, sizes, divs, out_strides, lhs_strides, rhs_strides, out0, lhs0, rhs0);
            const T* l = lhs + lhs0;
            const T* r = rhs + rhs0;
            const T* g = output_grad + out0;
            T* d = gradient + out0;
            const bool l_row = need_lhs && lhs_inner, r_row = need_rhs && rhs_inner;  // read along the row
            const C lone = need_lhs && !lhs_inner ? widen(l[0]) : C(0);
            const C rone = need_rhs && !rhs_inner ? widen(r[0]) : C(0);
            I done = 0;
            if (vectorized) {
                const I groups = inner / N;
                for (I i = start; i < groups; i += step) {
                    const Vec<T> gv = reinterpret_cast<const Vec<T>*>(g)[i];
                    Vec<T> a = {}, b = {}, out;
                    if (l_row) a = reinterpret_cast<const Vec<T>*>(l)[i];
                    if (r_row) b = reinterpret_cast<const Vec<T>*>(r)[i];
#pragma unroll
                    for (int k = 0; k < N; ++k)
                        out.v[k] = narrow<T>(grad_of<OPC>(side, l_row ? widen(a.v[k]) : lone,
                                                          r_row ? widen(b.v[k]) : rone, widen(gv.v[k])));
                    reinterpret_cast<Vec<T>*>(d)[i] = out;
                }
                done = groups * N;
            }
            for (I i = done + start; i < inner; i += step)
                d[i] = narrow<T>(grad_of<OPC>(side, l_row ? widen(l[i]) : lone, r_row ? widen(r[i]) : rone,
                                              widen(g[i])));
        }
    })
}

// The arguments of the gradient kernels of one side: the kept space (the dims that side
// has; its element j is gradient element j) and the reduced space (the dims it was
// broadcast along), each as rank, sizes, division constants and out/lhs/rhs strides.
#define GRAD_PARAMS                                                                              \
    const T *__restrict__ lhs, const T *__restrict__ rhs, const T *__restrict__ output_grad,     \
        D *__restrict__ destination, int op, int side, int need_lhs, int need_rhs, I kept_count, \
        I reduced_count, I chunks, I chunk, int kept_rank, Ints kept_sizes, Ints kept_divs,      \
        Ints kept_out, Ints kept_lhs, Ints kept_rhs, int reduced_rank, Ints reduced_sizes,       \
        Ints reduced_divs, Ints reduced_out, Ints reduced_lhs, Ints reduced_rhs

// 'rows': one thread per gradient element j and chunk s (blockIdx.y) of its reduced
// positions, summed in order. Used when the innermost dim is kept, so neighbouring
// threads read neighbouring elements; with no reduced dims it is an elementwise gather.
// destination[s * kept_count + j] is the gradient itself (D = T) when chunks == 1, else
// the partial sums (D = C).
template <typename T, typename D, typename I>
__global__ void binary_grad_rows(GRAD_PARAMS) {
    using C = compute_t<T>;
    const I step = (I)gridDim.x * blockDim.x;
    DISPATCH_OP(op, {
        for (I s = blockIdx.y; s < chunks; s += gridDim.y) {
            const I first = s * chunk;
            const I last = min(first + chunk, reduced_count);
            for (I j = (I)blockIdx.x * blockDim.x + threadIdx.x; j < kept_count; j += step) {
                I out0, lhs0, rhs0;
                offsets<I>(j, kept_rank, kept_sizes, kept_divs, kept_out, kept_lhs, kept_rhs, out0, lhs0, rhs0);
                C sum = 0;
                for (I k = first; k < last; ++k) {
                    I out, l, r;
                    offsets<I>(k, reduced_rank, reduced_sizes, reduced_divs, reduced_out, reduced_lhs,
                               reduced_rhs, out, l, r);
                    const C lv = need_lhs ? widen(lhs[lhs0 + l]) : C(0);
                    const C rv = need_rhs ? widen(rhs[rhs0 + r]) : C(0);
                    sum += grad_of<OPC>(side, lv, rv, widen(output_grad[out0 + out]));
                }
                destination[s * kept_count + j] = narrow<D>(sum);
            }
        }
    })
}

// 'warps': one warp per (gradient element j, chunk s); the lanes stride over the
// chunk (the innermost dim is reduced, so a warp reads consecutive elements) and the
// lane sums are added by a fixed shuffle tree.
template <typename T, typename D, typename I>
__global__ void binary_grad_warps(GRAD_PARAMS) {
    using C = compute_t<T>;
    const int lane = threadIdx.x & 31;
    const I warp = ((I)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const I warps = ((I)gridDim.x * blockDim.x) >> 5;
    const I items = kept_count * chunks;
    DISPATCH_OP(op, {
        for (I item = warp; item < items; item += warps) {
            const I j = item / chunks;  // neighbouring warps take neighbouring chunks of one j
            const I s = item - j * chunks;
            I out0, lhs0, rhs0;
            offsets<I>(j, kept_rank, kept_sizes, kept_divs, kept_out, kept_lhs, kept_rhs, out0, lhs0, rhs0);
            const I first = s * chunk;
            const I last = min(first + chunk, reduced_count);
            C sum = 0;
            for (I k = first + lane; k < last; k += 32) {
                I out, l, r;
                offsets<I>(k, reduced_rank, reduced_sizes, reduced_divs, reduced_out, reduced_lhs, reduced_rhs,
                           out, l, r);
                const C lv = need_lhs ? widen(lhs[lhs0 + l]) : C(0);
                const C rv = need_rhs ? widen(rhs[rhs0 + r]) : C(0);
                sum += grad_of<OPC>(side, lv, rv, widen(output_grad[out0 + out]));
            }
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
            if (lane == 0) destination[s * kept_count + j] = narrow<D>(sum);
        }
    })
}

// The second pass of a split reduction, for few chunks: a thread per gradient element
// adds the partial sums of chunks 0, 1, ... in order.
template <typename T, typename I>
__global__ void binary_sum_partials(const compute_t<T>* __restrict__ partials, T* __restrict__ gradient, I count,
                                    I chunks) {
    for (I j = (I)blockIdx.x * blockDim.x + threadIdx.x; j < count; j += (I)gridDim.x * blockDim.x) {
        compute_t<T> sum = partials[j];
        for (I s = 1; s < chunks; ++s) sum += partials[s * count + j];
        gradient[j] = narrow<T>(sum);
    }
}

// The second pass for many chunks: a warp per gradient element, lane i adding chunks
// i, i + 32, ... in order, then the fixed shuffle tree.
template <typename T, typename I>
__global__ void binary_sum_partials_warps(const compute_t<T>* __restrict__ partials, T* __restrict__ gradient,
                                          I count, I chunks) {
    const int lane = threadIdx.x & 31;
    const I warps = ((I)gridDim.x * blockDim.x) >> 5;
    for (I j = ((I)blockIdx.x * blockDim.x + threadIdx.x) >> 5; j < count; j += warps) {
        compute_t<T> sum = 0;
        for (I s = lane; s < chunks; s += 32) sum += partials[s * count + j];
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
        if (lane == 0) gradient[j] = narrow<T>(sum);
    }
}
