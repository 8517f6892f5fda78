// conv_2d's own kernels: the bias gradient; im2col and the col2im gather around
// cuBLAS GEMMs for groups == 1; both gradients of depthwise convolutions. The
// rest runs in cuDNN (kernels/runtime/cudnn.py) and cuBLAS; the fused activation in activation.cu, or, for a
// state without backward (no pre-activation kept), in the depthwise forward and in
// conv_bias_activation, with activation.cuh's same device functions.
//
// The bias gradient, the depthwise kernels and conv_bias_activation also take the half storage
// types (half.cuh, included by activation.cuh: half_t, bfloat16_t): each value widened when read,
// products and sums in compute_t (float) or double as for float, each result rounded when written
// (narrow). For float and double, widen and narrow are the identity: the same code as before.
#include "activation.cuh"

// Constants shared with kernels/conv_2d/gpu.py, defined there once and passed as -D options
// (CudaModule's defines): the launch block sizes of the two shared-memory reductions (powers of
// two; each block's shared array has one double per thread), and the fields of struct ConvGeometry.
#ifndef CONV_BIAS_GRAD_BLOCK
#error "CONV_BIAS_GRAD_BLOCK is defined by kernels/conv_2d/gpu.py (CudaModule's -D options)"
#endif
#ifndef CONV_DEPTHWISE_FILTER_BLOCK
#error "CONV_DEPTHWISE_FILTER_BLOCK is defined by kernels/conv_2d/gpu.py (CudaModule's -D options)"
#endif
#ifndef CONV_GEOMETRY_FIELDS
#error "CONV_GEOMETRY_FIELDS is defined by kernels/conv_2d/gpu.py (CudaModule's -D options)"
#endif

// The block's values summed by a fixed tree in shared memory (`partial`: a double a thread, blockDim.x a
// power of two), the same additions in the same order every run; thread 0 hands the sum to `write`. Every
// thread of the block calls it; `partial` may be written again when it returns.
template <class Write>
__device__ __forceinline__ void block_tree_sum(double* partial, double value, Write write) {
    partial[threadIdx.x] = value;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) write(partial[0]);
    __syncthreads();  // partial is reused by the block's next sum
}

// bias_grad[c] = sum over n, and the spatial positions of output_grad (N, C, spatial).
// One block per channel (grid-stride over channels): each thread sums a fixed
// strided subset in double, then a fixed tree in shared memory adds the
// threads' sums. No atomics: the same bits on every run. Double accumulation
// for float too, so the result is the float64 sum rounded once (for the half types
// rounded to float, then to T: as the CPU reference does).
template <typename T>
__global__ void conv_bias_grad(const T* __restrict__ output_grad, T* __restrict__ bias_grad,
                               long long batch, long long channels, long long spatial) {
    __shared__ double partial[CONV_BIAS_GRAD_BLOCK];
    for (long long channel = blockIdx.x; channel < channels; channel += gridDim.x) {
        double sum = 0.0;
        for (long long n = 0; n < batch; ++n) {
            const T* plane = output_grad + (n * channels + channel) * spatial;
            for (long long i = threadIdx.x; i < spatial; i += blockDim.x) sum += (double)widen(plane[i]);
        }
        block_tree_sum(partial, sum, [&](double total) { bias_grad[channel] = narrow<T>((compute_t<T>)total); });
    }
}

// im2col for groups == 1: the column matrix of `images` consecutive images,
// columns[n] (C * kh * kw rows, Ho * Wo columns), row (c * kh + i) * kw + j,
// column oh * Wo + ow, holding input[n, c, oh * sh - ph + i * dh, ow * sw - pw + j * dw]
// or 0 where that falls in the padding. One thread per column entry, grid-stride;
// consecutive threads write consecutive columns (coalesced). geometry:
// {C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw}.
struct ConvGeometry {
    long long v[CONV_GEOMETRY_FIELDS];
};
static_assert(CONV_GEOMETRY_FIELDS == 13, "CONV_GEOMETRY_LOCALS reads 13 fields: C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw");

// The geometry's fields as named locals of index type I, in conv_2d/gpu.py's _make_geometry order.
// CONV_GEOMETRY_LOCALS_AS puts a prefix on the kernel, stride and dilation fields' names, for a kernel
// that may fix them at compile time; CONV_GEOMETRY_LOCALS names them plainly.
#define CONV_GEOMETRY_LOCALS_AS(g, prefix)                                                                     \
    const I channels = (I)(g).v[0], height = (I)(g).v[1], width = (I)(g).v[2], out_h = (I)(g).v[3];           \
    const I out_w = (I)(g).v[4], prefix##kernel_h = (I)(g).v[5], prefix##kernel_w = (I)(g).v[6];               \
    const I prefix##stride_h = (I)(g).v[7], prefix##stride_w = (I)(g).v[8], pad_h = (I)(g).v[9];             \
    const I pad_w = (I)(g).v[10], prefix##dilation_h = (I)(g).v[11], prefix##dilation_w = (I)(g).v[12]
#define CONV_GEOMETRY_LOCALS(g) CONV_GEOMETRY_LOCALS_AS(g, )

template <typename T, typename I>
__global__ void conv_im2col(const T* __restrict__ input, T* __restrict__ columns, I images, ConvGeometry g) {
    CONV_GEOMETRY_LOCALS(g);
    const I positions = out_h * out_w;
    const I rows = channels * kernel_h * kernel_w;
    const I total = images * rows * positions;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < total; index += (I)gridDim.x * blockDim.x) {
        const I ow = index % out_w;
        I rest = index / out_w;
        const I oh = rest % out_h;
        rest /= out_h;
        const I j = rest % kernel_w;
        rest /= kernel_w;
        const I i = rest % kernel_h;
        rest /= kernel_h;
        const I c = rest % channels;
        const I n = rest / channels;
        const I h = oh * stride_h - pad_h + i * dilation_h;
        const I w = ow * stride_w - pad_w + j * dilation_w;
        T value = (T)0;
        if (h >= 0 && h < height && w >= 0 && w < width) value = input[((n * channels + c) * height + h) * width + w];
        columns[index] = value;
    }
}

// col2im for groups == 1 as a gather (no atomics): input_grad[n, c, h, w] is the sum,
// taps (i, j) in row-major order, of columns[n][(c * kh + i) * kw + j][oh * Wo + ow]
// over the output positions whose window tap (i, j) reads (h, w): oh = (h + ph - i * dh) / sh
// where that is a whole number in [0, Ho), likewise ow. Same geometry as conv_im2col;
// one thread per input_grad element, summing in T in a fixed order: the same bits every run.
template <typename T, typename I>
__global__ void conv_col2im(const T* __restrict__ columns, T* __restrict__ input_grad, I images, ConvGeometry g) {
    CONV_GEOMETRY_LOCALS(g);
    const I positions = out_h * out_w;
    const I total = images * channels * height * width;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < total; index += (I)gridDim.x * blockDim.x) {
        const I w = index % width;
        I rest = index / width;
        const I h = rest % height;
        rest /= height;
        const I c = rest % channels;
        const I n = rest / channels;
        const T* plane = columns + (n * channels + c) * kernel_h * kernel_w * positions;
        T sum = (T)0;
        for (I i = 0; i < kernel_h; ++i) {
            const I y = h + pad_h - i * dilation_h;
            if (y < 0 || y % stride_h) continue;
            const I oh = y / stride_h;
            if (oh >= out_h) continue;
            for (I j = 0; j < kernel_w; ++j) {
                const I x = w + pad_w - j * dilation_w;
                if (x < 0 || x % stride_w) continue;
                const I ow = x / stride_w;
                if (ow >= out_w) continue;
                sum += plane[(i * kernel_w + j) * positions + oh * out_w + ow];
            }
        }
        input_grad[index] = sum;
    }
}

// Depthwise convolutions (groups == C, O = C * multiplier, filter (O, 1, kh, kw)): both
// gradients without GEMMs or cuDNN. Same geometry as conv_im2col; grad is (N, O, Ho, Wo).

// input_grad[n, c, h, w] = sum over q < multiplier, then taps (i, j) in row-major order, of
// grad[n, c * multiplier + q, oh, ow] * filter[c * multiplier + q, 0, i, j] over the output
// positions whose window tap (i, j) reads (h, w) (the gather of conv_col2im). One thread per
// input_grad element, a fixed order: the same bits every run. KH, KW and S zero: the geometry's
// kernel, stride, dilation and multiplier; else (conv_2d/plan.py's DEPTHWISE_ROWS_SHAPES) a KH x KW
// kernel, stride S both ways, dilation 1 and one filter a channel, known at compile time: the same
// operations, with the tap loops unrolled and no division by a run-time stride.
template <typename T, typename I, int KH, int KW, int S>
__global__ void conv_depthwise_input_grad(const T* __restrict__ grad, const T* __restrict__ filter,
                                          T* __restrict__ input_grad, I images, I multiplier_, ConvGeometry g) {
    constexpr bool fixed = KH > 0;
    CONV_GEOMETRY_LOCALS_AS(g, geometry_);
    const I kernel_h = fixed ? (I)KH : geometry_kernel_h, kernel_w = fixed ? (I)KW : geometry_kernel_w;
    const I stride_h = fixed ? (I)S : geometry_stride_h, stride_w = fixed ? (I)S : geometry_stride_w;
    const I dilation_h = fixed ? (I)1 : geometry_dilation_h, dilation_w = fixed ? (I)1 : geometry_dilation_w;
    const I multiplier = fixed ? (I)1 : multiplier_;
    const I positions = out_h * out_w;
    const I out_channels = channels * multiplier;
    const I total = images * channels * height * width;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < total; index += (I)gridDim.x * blockDim.x) {
        const I w = index % width;
        I rest = index / width;
        const I h = rest % height;
        rest /= height;
        const I c = rest % channels;
        const I n = rest / channels;
        compute_t<T> sum = 0;
        for (I q = 0; q < multiplier; ++q) {
            const I o = c * multiplier + q;
            const T* plane = grad + (n * out_channels + o) * positions;
            const T* taps = filter + o * kernel_h * kernel_w;
            for (I i = 0; i < kernel_h; ++i) {
                const I y = h + pad_h - i * dilation_h;
                if (y < 0 || y % stride_h) continue;
                const I oh = y / stride_h;
                if (oh >= out_h) continue;
                for (I j = 0; j < kernel_w; ++j) {
                    const I x = w + pad_w - j * dilation_w;
                    if (x < 0 || x % stride_w) continue;
                    const I ow = x / stride_w;
                    if (ow >= out_w) continue;
                    sum += widen(plane[oh * out_w + ow]) * widen(taps[i * kernel_w + j]);
                }
            }
        }
        input_grad[index] = narrow<T>(sum);
    }
}

// filter_grad[o, 0, i, j] = sum over n, oh, ow of grad[n, o, oh, ow] * input[n, o / multiplier,
// oh * sh - ph + i * dh, ow * sw - pw + j * dw] (0 in the padding, multiplied all the same). One block per filter element
// (grid-stride over them): each thread sums a fixed strided subset of the output positions in
// double (a float product is exact in double), then a fixed shared-memory tree adds the threads'
// sums, rounded once to T. No atomics: the same bits every run.
template <typename T, typename I>
__global__ void conv_depthwise_filter_grad(const T* __restrict__ grad, const T* __restrict__ input,
                                           T* __restrict__ filter_grad, I images, I multiplier, ConvGeometry g) {
    __shared__ double partial[CONV_DEPTHWISE_FILTER_BLOCK];
    CONV_GEOMETRY_LOCALS(g);
    const I positions = out_h * out_w;
    const I out_channels = channels * multiplier;
    const I taps = kernel_h * kernel_w;
    for (I item = blockIdx.x; item < out_channels * taps; item += gridDim.x) {
        const I o = item / taps;
        const I tap = item % taps;
        const I i = tap / kernel_w;
        const I j = tap % kernel_w;
        const I c = o / multiplier;
        double sum = 0.0;
        for (I n = 0; n < images; ++n) {
            const T* plane = grad + (n * out_channels + o) * positions;
            const T* image = input + (n * channels + c) * height * width;
            for (I p = threadIdx.x; p < positions; p += blockDim.x) {
                const I h = (p / out_w) * stride_h - pad_h + i * dilation_h;
                const I w = (p % out_w) * stride_w - pad_w + j * dilation_w;
                // A padding tap reads 0, and adds 0 * grad as PyTorch does: an infinite or NaN
                // output gradient makes the filter gradient NaN, as it does there.
                const double value = (h >= 0 && h < height && w >= 0 && w < width) ? (double)widen(image[h * width + w]) : 0.0;
                sum += (double)widen(plane[p]) * value;
            }
        }
        block_tree_sum(partial, sum, [&](double total) { filter_grad[item] = narrow<T>((compute_t<T>)total); });
    }
}

// The same filter gradient for conv_2d/plan.py's DEPTHWISE_ROWS_SHAPES (a KH x KW kernel, stride S
// both ways, dilation 1, one filter a channel; compile-time), a block per channel for all its taps:
// each thread sums, for every tap, the same strided subset of the output positions as
// conv_depthwise_filter_grad's thread of that index, in the same order (images, then positions), in
// double, reading each output gradient once for all the taps; then the same shared-memory tree for
// each tap in turn. The same bits as conv_depthwise_filter_grad.
// The kernel is bound by its instructions, the integer ones most (ncu: the ALU the busiest pipe, the
// conversions to double next), so a thread's output row and column are not divided out of each position:
// they start from its index and step by the block's width in rows and columns, carried over the row's end;
// and a row's taps are read at fixed offsets from its first. B: the blocks an SM must hold at once, which
// caps the registers (plan.depthwise_filter_taps_blocks); 1: only the block's size.
template <typename T, typename I, int KH, int KW, int S, int B>
__global__ void __launch_bounds__(CONV_DEPTHWISE_FILTER_BLOCK, B)
    conv_depthwise_filter_grad_taps(const T* __restrict__ grad, const T* __restrict__ input, T* __restrict__ filter_grad,
                                    I images, I /* multiplier: 1 */, ConvGeometry g) {
    __shared__ double partial[CONV_DEPTHWISE_FILTER_BLOCK];
    CONV_GEOMETRY_LOCALS_AS(g, geometry_);
    const I positions = out_h * out_w;
    const I first_h = threadIdx.x / out_w, first_w = threadIdx.x % out_w;  // position threadIdx.x
    const I step_h = blockDim.x / out_w, step_w = blockDim.x % out_w;      // blockDim.x positions on
    for (I c = blockIdx.x; c < channels; c += gridDim.x) {
        double sum[KH * KW];
#pragma unroll
        for (int t = 0; t < KH * KW; ++t) sum[t] = 0.0;
        for (I n = 0; n < images; ++n) {
            const T* plane = grad + (n * channels + c) * positions;
            const T* image = input + (n * channels + c) * height * width;
            I oh = first_h, ow = first_w;
            for (I p = threadIdx.x; p < positions; p += blockDim.x) {
                const I h0 = oh * S - pad_h, w0 = ow * S - pad_w;
                oh += step_h;
                ow += step_w;
                if (ow >= out_w) ow -= out_w, ++oh;
                const double gradient = (double)widen(plane[p]);
#pragma unroll
                for (int i = 0; i < KH; ++i) {
                    const I h = h0 + i;
                    const bool row = h >= 0 && h < height;
                    const T* line = image + (h * width + w0);  // the row's first tap, read only inside the image
#pragma unroll
                    for (int j = 0; j < KW; ++j) {
                        const I w = w0 + j;
                        // A padding tap reads 0, and adds 0 * grad, as conv_depthwise_filter_grad does.
                        const double value = (row && w >= 0 && w < width) ? (double)widen(line[j]) : 0.0;
                        sum[i * KW + j] += gradient * value;
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < KH * KW; ++t)  // unrolled: sum stays in registers
            block_tree_sum(partial, sum[t], [&](double total) { filter_grad[c * (KH * KW) + t] = narrow<T>((compute_t<T>)total); });
    }
}

// The filter gradient of a chunk of images from their per-image gradients (cuBLAS's batched
// GEMM output, `size` elements each, one after another): out[i] = (accumulate ? out[i] : 0)
// + partials[0][i] + partials[1][i] + ..., added in image order in double and rounded once.
// One thread per element, grid-stride: a fixed order, the same bits every run.
template <typename T>
__global__ void conv_sum_images(const T* __restrict__ partials, T* __restrict__ out, long long images,
                                long long size, int accumulate) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < size;
         i += (long long)gridDim.x * blockDim.x) {
        double sum = accumulate ? (double)out[i] : 0.0;
        for (long long n = 0; n < images; ++n) sum += (double)partials[n * size + i];
        out[i] = (T)sum;
    }
}

// Depthwise forward: output[n, o, oh, ow] = sum over taps (i, j) in row-major order of
// input[n, o / multiplier, oh * sh - ph + i * dh, ow * sw - pw + j * dw] * filter[o, 0, i, j]
// (taps in the padding skipped), then + bias[o] where has_bias (rounded after the sum, as a
// separate bias add would: for the half types the sum is rounded to T, widened, the bias added
// in float and rounded again, as cuDNN's convolution and conv_bias_activation do on the other
// paths), then f of that where activation is not KERNELS_ACTIVATION_NONE (the value activation.cu's
// pass would write from it: f in float of the rounded value, rounded). One thread per output
// element, a fixed order.
template <typename T, typename I>
__global__ void conv_depthwise_forward(const T* __restrict__ input, const T* __restrict__ filter,
                                       const T* __restrict__ bias, T* __restrict__ output, int has_bias,
                                       int activation, I images, I multiplier, ConvGeometry g) {
    CONV_GEOMETRY_LOCALS(g);
    const I out_channels = channels * multiplier;
    const I total = images * out_channels * out_h * out_w;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < total; index += (I)gridDim.x * blockDim.x) {
        const I ow = index % out_w;
        I rest = index / out_w;
        const I oh = rest % out_h;
        rest /= out_h;
        const I o = rest % out_channels;
        const I n = rest / out_channels;
        const T* image = input + (n * channels + o / multiplier) * height * width;
        const T* taps = filter + o * kernel_h * kernel_w;
        compute_t<T> sum = 0;
        for (I i = 0; i < kernel_h; ++i) {
            const I h = oh * stride_h - pad_h + i * dilation_h;
            if (h < 0 || h >= height) continue;
            for (I j = 0; j < kernel_w; ++j) {
                const I w = ow * stride_w - pad_w + j * dilation_w;
                if (w < 0 || w >= width) continue;
                sum += widen(image[h * width + w]) * widen(taps[i * kernel_w + j]);
            }
        }
        if (has_bias) sum = widen(narrow<T>(sum)) + widen(bias[o]);
        const compute_t<T> pre = widen(narrow<T>(sum));  // the pre-activation as stored (for float: sum)
        output[index] = narrow<T>(kernels_activation::activation_forward<compute_t<T>>(activation, pre));
    }
}

// The same forward, a tile of one output plane per block (blockIdx.x the plane n * O + o, blockIdx.y
// and blockIdx.z the tile's row and column; tile_h x tile_w outputs, threads striding over them):
// the input rows and columns the tile's taps reach and the plane's filter taps are first staged in
// shared memory (widened), so each input value is read from global memory about once per block
// instead of once per tap, and no thread divides its index three times. A tile is up to 2048
// outputs (8 a thread), so that each block has many loads in flight. Each output's sum has
// conv_depthwise_forward's operations in its order (taps outside the input skipped, not added as
// zeros), then the same bias and activation: the same bits. conv_2d/plan.py's depthwise_tile picks
// the tile so that the shared memory fits; where none fits, conv_depthwise_forward runs.
template <typename T, typename I>
__global__ void conv_depthwise_forward_tiled(const T* __restrict__ input, const T* __restrict__ filter,
                                             const T* __restrict__ bias, T* __restrict__ output, int has_bias,
                                             int activation, I images, I multiplier, ConvGeometry g, int tile_h,
                                             int tile_w) {
    CONV_GEOMETRY_LOCALS(g);
    using C = compute_t<T>;
    extern __shared__ __align__(16) unsigned char conv_tile_shared[];
    C* taps = reinterpret_cast<C*>(conv_tile_shared);
    const I taps_count = kernel_h * kernel_w;
    C* region = taps + taps_count;
    const I out_channels = channels * multiplier;
    const I plane = (I)blockIdx.x;
    const I o = plane % out_channels;
    const I n = plane / out_channels;
    const I oh0 = (I)blockIdx.y * tile_h, ow0 = (I)blockIdx.z * tile_w;
    const I h0 = oh0 * stride_h - pad_h, w0 = ow0 * stride_w - pad_w;  // the region's first input row, column
    const I region_h = (tile_h - 1) * stride_h + (kernel_h - 1) * dilation_h + 1;
    const I region_w = (tile_w - 1) * stride_w + (kernel_w - 1) * dilation_w + 1;
    const T* image = input + (n * channels + o / multiplier) * height * width;
    for (I k = threadIdx.x; k < taps_count; k += blockDim.x) taps[k] = widen(filter[o * taps_count + k]);
#pragma unroll 4
    for (I k = threadIdx.x; k < region_h * region_w; k += blockDim.x) {  // unrolled: several loads in flight
        const I h = h0 + k / region_w, w = w0 + k % region_w;
        region[k] = (h >= 0 && h < height && w >= 0 && w < width) ? widen(image[h * width + w]) : (C)0;
    }
    __syncthreads();
    T* plane_out = output + plane * out_h * out_w;
    for (I k = threadIdx.x; k < (I)tile_h * tile_w; k += blockDim.x) {
        const I oh = oh0 + k / tile_w, ow = ow0 + k % tile_w;
        if (oh >= out_h || ow >= out_w) continue;
        C sum = 0;
        for (I i = 0; i < kernel_h; ++i) {
            const I h = oh * stride_h - pad_h + i * dilation_h;
            if (h < 0 || h >= height) continue;
            const C* row = region + (h - h0) * region_w;
            for (I j = 0; j < kernel_w; ++j) {
                const I w = ow * stride_w - pad_w + j * dilation_w;
                if (w < 0 || w >= width) continue;
                sum += row[w - w0] * taps[i * kernel_w + j];
            }
        }
        if (has_bias) sum = widen(narrow<T>(sum)) + widen(bias[o]);
        const C pre = widen(narrow<T>(sum));
        plane_out[oh * out_w + ow] = narrow<T>(kernels_activation::activation_forward<C>(activation, pre));
    }
}

// The same forward for the kernels YOLOv10 has (conv_2d/plan.py's DEPTHWISE_ROWS_SHAPES: one filter a
// channel, dilation 1, a KH x KW kernel, stride S both ways; KH, KW and S compile-time): a thread computes
// R rows of Q consecutive outputs (conv_2d/plan.py's DEPTHWISE_SHARES by element and kernel size), with
// the plane's taps in registers. It reads the input rows those outputs reach once each, top to bottom, the values of the
// row they reach into registers, and adds each value to every output whose taps cover it: an output's taps arrive in its
// row-major order, so each sum has conv_depthwise_forward's operations in its order (taps outside
// the input skipped, not added as zeros), then the same bias and activation: the same bits. Threads
// run over (plane, group of rows, column), the column fastest, so a warp reads consecutive columns;
// the rows a group shares with the next come from the cache. No index divided per output or tap.
//
// FLIP (stride 1 only): the input gradient of a stride-1 depthwise convolution, which is this forward
// of the output gradient with the filter turned by 180 degrees and padding K - 1 - p (the geometry
// describes that forward: the gradient's planes in, the input's planes out). The taps are read turned,
// and the rows bottom to top and each row's values right to left, so that each sum takes its taps in
// the original filter's row-major order, as conv_depthwise_input_grad does: the same operations in the
// same order (grad times tap, taps outside the gradient skipped), the same bits. No bias, no activation.
template <typename T, typename I, int KH, int KW, int S, bool FLIP, int R, int Q>
__global__ void conv_depthwise_forward_rows(const T* __restrict__ input, const T* __restrict__ filter,
                                            const T* __restrict__ bias, T* __restrict__ output, int has_bias,
                                            int activation, I images, I /* multiplier: 1 */, ConvGeometry g) {
    static_assert(!FLIP || S == 1, "the turned filter is the input gradient of a stride-1 convolution only");
    CONV_GEOMETRY_LOCALS(g);
    using C = compute_t<T>;
    constexpr int ROWS_READ = (R - 1) * S + KH;  // the input rows a thread's R x Q outputs reach
    constexpr int READ = (Q - 1) * S + KW;       // and the values of each such row
    const I groups = (out_h + R - 1) / R, column_groups = (out_w + Q - 1) / Q;
    const I total = images * channels * groups * column_groups;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < total; index += (I)gridDim.x * blockDim.x) {
        const I ow0 = (index % column_groups) * Q;
        I rest = index / column_groups;
        const I oh0 = (rest % groups) * R;
        const I plane = rest / groups;  // n * channels + c
        const I c = plane % channels;
        const T* image = input + plane * height * width;
        C taps[KH * KW];
#pragma unroll
        for (int k = 0; k < KH * KW; ++k) taps[k] = widen(filter[c * (KH * KW) + (FLIP ? KH * KW - 1 - k : k)]);
        const I h0 = oh0 * S - pad_h, w0 = ow0 * S - pad_w;
        bool inside[READ];
#pragma unroll
        for (int t = 0; t < READ; ++t) inside[t] = w0 + t >= 0 && w0 + t < width;
        C sum[R][Q];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int q = 0; q < Q; ++q) sum[r][q] = 0;
#pragma unroll
        for (int step = 0; step < ROWS_READ; ++step) {
            const int row = FLIP ? ROWS_READ - 1 - step : step;
            const I h = h0 + row;
            if (h < 0 || h >= height) continue;
            C x[READ];
#pragma unroll
            for (int t = 0; t < READ; ++t) x[t] = inside[t] ? widen(image[h * width + w0 + t]) : (C)0;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int i = row - r * S;  // this row's tap row in output row oh0 + r: known at compile time
                if (i < 0 || i >= KH) continue;
#pragma unroll
                for (int q = 0; q < Q; ++q)
#pragma unroll
                    for (int column = 0; column < KW; ++column) {
                        const int j = FLIP ? KW - 1 - column : column, t = q * S + j;
                        if (inside[t]) sum[r][q] += x[t] * taps[i * KW + j];
                    }
            }
        }
        T* out = output + (plane * out_h + oh0) * out_w + ow0;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (oh0 + r >= out_h) break;
#pragma unroll
            for (int q = 0; q < Q; ++q) {
                if (ow0 + q >= out_w) break;
                C value = sum[r][q];
                if (FLIP) {
                    out[r * out_w + q] = narrow<T>(value);
                    continue;
                }
                if (has_bias) value = widen(narrow<T>(value)) + widen(bias[c]);
                const C pre = widen(narrow<T>(value));
                out[r * out_w + q] = narrow<T>(kernels_activation::activation_forward<C>(activation, pre));
            }
        }
    }
}

// The epilogue of a forward whose state keeps no pre-activation, in place over the (N, C, plane)
// output: data = f(data + bias[c]) (bias where has_bias; f the identity for KERNELS_ACTIVATION_NONE).
// The sum and f are the operations of a separate bias add and activation.cu's pass: the same bits.
// For the half types: the sum in float, rounded (the pre-activation), then f in float of that,
// rounded; with KERNELS_ACTIVATION_NONE it is the half types' bias add on every path but depthwise.
template <typename T, typename I>
__global__ void conv_bias_activation(T* __restrict__ data, const T* __restrict__ bias, int has_bias, int activation,
                                     I total, I plane, I channels) {
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < total; index += (I)gridDim.x * blockDim.x) {
        compute_t<T> value = widen(data[index]);
        if (has_bias) value = widen(narrow<T>(value + widen(bias[(index / plane) % channels])));
        data[index] = narrow<T>(kernels_activation::activation_forward<compute_t<T>>(activation, value));
    }
}
