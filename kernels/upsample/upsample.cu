// upsample of NCHW by an integer scale s: NEAREST (any dtype) and BILINEAR
// (align_corners=False; float, double, half_t, bfloat16_t), forward and backward.
//
// Tensors are seen as planes (N*C of them) of rows: input row r = n*C*H + h,
// output rows r*s .. r*s + s-1, each of width W*s. Backward is a gather: each
// thread owns one input_grad element and sums its sources in a fixed order, so
// there are no atomics and the result is the same on every run.
//
// Compiled with --fmad=false: the bilinear arithmetic then rounds exactly as the
// NumPy (CPU) twin does, so both devices give the same bits.
//
// Half precision (half_t, bfloat16_t): NEAREST forward moves bits (the BITS types);
// the sums of the backwards and the bilinear arithmetic are in compute_t<T> (float),
// each value widened when read, each result rounded once when written.
#include "common.cuh"

// A value as its compute type (half: widened; integers and floats as they are), and back.
template <typename T> __device__ __forceinline__ compute_t<T> load(T x) { return x; }
__device__ __forceinline__ float load(half_t x) { return widen(x); }
__device__ __forceinline__ float load(bfloat16_t x) { return widen(x); }
template <typename T> __device__ __forceinline__ T store(compute_t<T> x) { return x; }
template <> __device__ __forceinline__ half_t store<half_t>(float x) { return narrow<half_t>(x); }
template <> __device__ __forceinline__ bfloat16_t store<bfloat16_t>(float x) { return narrow<bfloat16_t>(x); }

struct __align__(4) half_pair { half_t x, y; };
struct __align__(4) bfloat16_pair { bfloat16_t x, y; };

// Two elements of T in one aligned access (8 to 16 bytes): the s = 2 fast paths.
template <typename T> struct Vec2;
#define KERNELS_VEC2(T, V) template <> struct Vec2<T> { typedef V type; };
KERNELS_VEC2(float, float2)
KERNELS_VEC2(double, double2)
KERNELS_VEC2(signed char, char2)
KERNELS_VEC2(unsigned char, uchar2)
KERNELS_VEC2(short, short2)
KERNELS_VEC2(unsigned short, ushort2)
KERNELS_VEC2(int, int2)
KERNELS_VEC2(unsigned int, uint2)
KERNELS_VEC2(long long, longlong2)
KERNELS_VEC2(unsigned long long, ulonglong2)
KERNELS_VEC2(half_t, half_pair)
KERNELS_VEC2(bfloat16_t, bfloat16_pair)
#undef KERNELS_VEC2

// ------------------------------------------------------------------ NEAREST

// Each thread reads one input element and writes its s x s block: s consecutive
// outputs in each of s output rows. count = N*C*H*W.
template <typename T, typename I>
__global__ void upsample_nearest_forward(const T* __restrict__ input, T* __restrict__ output,
                                         I count, I width, int scale) {
    const I out_width = width * scale;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count;
         index += (I)gridDim.x * blockDim.x) {
        const T value = input[index];
        const I row = index / width;
        const I column = index - row * width;
        T* target = output + row * scale * out_width + column * scale;
        for (int i = 0; i < scale; ++i, target += out_width) {
            for (int k = 0; k < scale; ++k) target[k] = value;
        }
    }
}

// s = 2: the two outputs of a row as one aligned vector store (the host checks
// that output is aligned to 2 * sizeof(T); out_width is even).
template <typename T, typename I>
__global__ void upsample_nearest_forward_x2(const T* __restrict__ input, T* __restrict__ output,
                                            I count, I width) {
    typedef typename Vec2<T>::type V;
    const I out_width = width * 2;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count;
         index += (I)gridDim.x * blockDim.x) {
        V pair;
        pair.x = input[index];
        pair.y = pair.x;
        const I row = index / width;
        const I column = index - row * width;
        T* target = output + row * 2 * out_width + column * 2;
        *reinterpret_cast<V*>(target) = pair;
        *reinterpret_cast<V*>(target + out_width) = pair;
    }
}

// input_grad[r, w] = sum over i of (sum over k of output_grad[r*s + i, w*s + k]):
// each row of the block summed left to right, then the row sums top to bottom
// (the CPU twin's order), in compute_t<T> (integers wrap as they do in T; half sums in float).
template <typename T, typename I>
__global__ void upsample_nearest_backward(const T* __restrict__ output_grad, T* __restrict__ input_grad,
                                          I count, I width, int scale) {
    using C = compute_t<T>;
    const I out_width = width * scale;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count;
         index += (I)gridDim.x * blockDim.x) {
        const I row = index / width;
        const I column = index - row * width;
        const T* source = output_grad + row * scale * out_width + column * scale;
        C sum = load(source[0]);
        for (int k = 1; k < scale; ++k) sum += load(source[k]);
        for (int i = 1; i < scale; ++i) {
            source += out_width;
            C row_sum = load(source[0]);
            for (int k = 1; k < scale; ++k) row_sum += load(source[k]);
            sum += row_sum;
        }
        input_grad[index] = store<T>(sum);
    }
}

// s = 2 with aligned vector loads (the host checks output_grad's alignment).
template <typename T, typename I>
__global__ void upsample_nearest_backward_x2(const T* __restrict__ output_grad, T* __restrict__ input_grad,
                                             I count, I width) {
    typedef typename Vec2<T>::type V;
    const I out_width = width * 2;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count;
         index += (I)gridDim.x * blockDim.x) {
        const I row = index / width;
        const I column = index - row * width;
        const T* source = output_grad + row * 2 * out_width + column * 2;
        const V top = *reinterpret_cast<const V*>(source);
        const V bottom = *reinterpret_cast<const V*>(source + out_width);
        compute_t<T> top_sum = load(top.x);
        top_sum += load(top.y);
        compute_t<T> bottom_sum = load(bottom.x);
        bottom_sum += load(bottom.y);
        top_sum += bottom_sum;
        input_grad[index] = store<T>(top_sum);
    }
}

// ------------------------------------------------------------------ BILINEAR

// Where output coordinate o reads from along one axis of `size` input pixels:
// source = (o + 0.5) / s - 0.5, clamped at 0 (align_corners=False), written with
// integers as (2o + 1 - s) / (2s). i0 = floor, i1 = the next pixel (clamped at the
// end), weights l0 = (2s - r) / 2s on i0 and l1 = r / 2s on i1, each rounded once.
template <typename T, typename I>
__device__ __forceinline__ void bilinear_source(I o, int scale, I size, I& i0, I& i1, T& l0, T& l1) {
    const I numerator = 2 * o + 1 - scale;
    const I twice = 2 * (I)scale;
    I remainder = 0;
    i0 = 0;
    if (numerator > 0) {
        i0 = numerator / twice;
        remainder = numerator - i0 * twice;
    }
    i1 = i0 + (i0 < size - 1 ? 1 : 0);
    l1 = (T)remainder / (T)twice;
    l0 = (T)(twice - remainder) / (T)twice;
}

// The weight that output coordinate o gives input pixel p along one axis. zero_term: both of o's
// taps are p and the second weighs 0; PyTorch's backward adds that term apart (0 * g, NaN where g is
// not finite), so the caller adds it too (kernels/upsample/: bilinear_zero_taps).
template <typename T, typename I>
__device__ __forceinline__ T bilinear_weight(I o, I p, int scale, I size, bool& zero_term) {
    I i0, i1;
    T l0, l1;
    bilinear_source<T, I>(o, scale, size, i0, i1, l0, l1);
    zero_term = i0 == p && i1 == p && l1 == (T)0;
    return (i0 == p ? l0 : (T)0) + (i1 == p ? l1 : (T)0);
}

// One thread per output element: l_y0 * (l_x0 * x00 + l_x1 * x01) + l_y1 * (l_x0 * x10 + l_x1 * x11).
template <typename T, typename I>
__global__ void upsample_bilinear_forward(const T* __restrict__ input, T* __restrict__ output,
                                          I count, I height, I width, int scale) {
    const I out_height = height * scale, out_width = width * scale;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count;
         index += (I)gridDim.x * blockDim.x) {
        const I ox = index % out_width;
        const I rest = index / out_width;
        const I oy = rest % out_height;
        const I plane = rest / out_height;
        using C = compute_t<T>;
        I y0, y1, x0, x1;
        C ly0, ly1, lx0, lx1;
        bilinear_source<C, I>(oy, scale, height, y0, y1, ly0, ly1);
        bilinear_source<C, I>(ox, scale, width, x0, x1, lx0, lx1);
        const T* base = input + plane * height * width;
        const C top = lx0 * load(base[y0 * width + x0]) + lx1 * load(base[y0 * width + x1]);
        const C bottom = lx0 * load(base[y1 * width + x0]) + lx1 * load(base[y1 * width + x1]);
        output[index] = store<T>(ly0 * top + ly1 * bottom);
    }
}

// One thread per input_grad element (y, x): the output pixels that read it have
// coordinates y*s + ty and x*s + tx with ty, tx in [tap_low, tap_high] (2s taps per
// axis). Summed separably, rows inside: sum over ty of w_y * (sum over tx of w_x * g),
// both in ascending order, out-of-range taps skipped: the CPU twin's exact order. Pixel 1 starts at
// tap -s: the coordinates clamped to pixel 0 (before its centre) give it weight 0, a term PyTorch's
// backward adds (0 * inf is NaN); bilinear_weight's zero_term adds the other such term.
template <typename T, typename I>
__global__ void upsample_bilinear_backward(const T* __restrict__ output_grad, T* __restrict__ input_grad,
                                           I count, I height, I width, int scale) {
    const I out_height = height * scale, out_width = width * scale;
    const int tap_low = -((scale + 1) / 2), tap_high = scale - 1 + scale / 2;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count;
         index += (I)gridDim.x * blockDim.x) {
        const I x = index % width;
        const I rest = index / width;
        const I y = rest % height;
        const I plane = rest / height;
        using C = compute_t<T>;
        const T* base = output_grad + plane * out_height * out_width;
        C sum = (C)0;
        const int y_low = y == 1 ? -scale : tap_low, x_low = x == 1 ? -scale : tap_low;
        for (int ty = y_low; ty <= tap_high; ++ty) {
            const I oy = y * scale + ty;
            if (oy < 0 || oy >= out_height) continue;
            C row = (C)0;
            for (int tx = x_low; tx <= tap_high; ++tx) {
                const I ox = x * scale + tx;
                if (ox < 0 || ox >= out_width) continue;
                bool zero_x;
                const C g = load(base[oy * out_width + ox]);
                row += bilinear_weight<C, I>(ox, x, scale, width, zero_x) * g;
                if (zero_x) row += (C)0 * g;
            }
            bool zero_y;
            sum += bilinear_weight<C, I>(oy, y, scale, height, zero_y) * row;
            if (zero_y) sum += (C)0 * row;
        }
        input_grad[index] = store<T>(sum);
    }
}
