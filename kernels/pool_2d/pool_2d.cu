// pool_2d: MAX and AVG pooling of NCHW planes, forward and backward.
//
// Forward: one thread per output element, reading its window in row-major order.
// Backward is a gather, never a scatter: one thread per input element loops over
// the output windows that cover it, in row-major output order, and sums their
// gradients. Each input gradient is written once by one thread, so there are no
// atomics and the bits are the same on every run.
//
// MAX follows PyTorch exactly: the window's maximum is its first occurrence in
// row-major order; a NaN always wins, so the last NaN of a window is its argmax
// and the output is NaN; padding never wins (it is not read at all); a window
// whose elements are all -inf has its first element as argmax. The forward saves
// each window's argmax as a tap index (row * kernel_w + column within the window)
// in `taps`, like cuDNN's reserve space, and the backward reads it back.
//
// Every window holds at least one input element: padding is at most half the
// kernel and the output size is floor((H + 2p - k) / s) + 1 (checked on the host).
//
// Half precision (half_t, bfloat16_t): values are widened to compute_t<T> (float)
// when read and rounded once when written. MAX compares the widened values (exact:
// its output is one of its inputs); the AVG window sums, the gathered gradient sums
// and the divisions are in float, as the CPU path's float32.
#include "common.cuh"

template <typename T> __device__ __forceinline__ T negative_infinity();
template <> __device__ __forceinline__ float negative_infinity<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double negative_infinity<double>() {
    return __longlong_as_double(0xfff0000000000000ULL);
}

// Output rows (or columns) whose windows cover input row (or column) `position`: [*start, *end).
__device__ __forceinline__ void covering_outputs(int position, int padding, int kernel, int stride, int out_size,
                                                 int* start, int* end) {
    const int padded = position + padding;
    *start = padded < kernel ? 0 : (padded - kernel) / stride + 1;
    *end = min(padded / stride + 1, out_size);
}

// count = N * C * out_h * out_w; taps gets each window's argmax as a tap index.
template <typename T, typename Tap, typename I>
__global__ void max_pool_forward(const T* __restrict__ input, T* __restrict__ output, Tap* __restrict__ taps,
                                 I count, int height, int width, int out_h, int out_w, int kernel_h, int kernel_w,
                                 int stride_h, int stride_w, int padding_h, int padding_w) {
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count; index += (I)gridDim.x * blockDim.x) {
        const int ow = (int)(index % out_w);
        const I rest = index / out_w;
        const int oh = (int)(rest % out_h);
        const I plane = rest / out_h;
        const int h0 = oh * stride_h - padding_h, w0 = ow * stride_w - padding_w;
        const int h_start = max(h0, 0), h_end = min(h0 + kernel_h, height);
        const int w_start = max(w0, 0), w_end = min(w0 + kernel_w, width);
        const T* __restrict__ base = input + plane * (I)height * width;
        using C = compute_t<T>;
        C best = negative_infinity<C>();
        int best_tap = (h_start - h0) * kernel_w + (w_start - w0);
        for (int h = h_start; h < h_end; ++h) {
            const T* __restrict__ row = base + (I)h * width;
            for (int w = w_start; w < w_end; ++w) {
                const C value = widen(row[w]);
                if (value > best || value != value) {  // a NaN always wins: the last NaN stays
                    best = value;
                    best_tap = (h - h0) * kernel_w + (w - w0);
                }
            }
        }
        output[index] = narrow<T>(best);
        taps[index] = (Tap)best_tap;
    }
}

// The same result as max_pool_forward, separably, for a tile of tile_h x tile_w
// outputs of one plane a block: the block loads the tile's input rectangle into
// shared memory (-inf outside the input), takes each input row's maximum over
// the window columns of every output column, then each output's maximum over
// its window rows. The scan rule (greater, or NaN) in row order then column order
// picks the same argmax as the row-major scan: the first maximum, or the last NaN.
// Shared memory: in_h x in_w values, then in_h x tile_w row maxima and their columns.
template <typename T, typename Tap, typename I>
__global__ void max_pool_forward_tiled(const T* __restrict__ input, T* __restrict__ output, Tap* __restrict__ taps,
                                       I planes, int height, int width, int out_h, int out_w, int kernel_h,
                                       int kernel_w, int stride_h, int stride_w, int padding_h, int padding_w,
                                       int tile_h, int tile_w, int tiles_w) {
    using C = compute_t<T>;
    extern __shared__ __align__(16) unsigned char shared[];
    const int in_h = (tile_h - 1) * stride_h + kernel_h, in_w = (tile_w - 1) * stride_w + kernel_w;
    T* tile = reinterpret_cast<T*>(shared);
    T* row_best = tile + in_h * in_w;
    // The columns start at the next multiple of sizeof(Tap): 2-byte values may leave an odd offset
    // for int taps (the host's shared size counts the same padding, pool_2d.max_forward_tile).
    const size_t column_offset = ((size_t)(in_h * in_w + in_h * tile_w) * sizeof(T) + sizeof(Tap) - 1)
                                 / sizeof(Tap) * sizeof(Tap);
    Tap* row_column = reinterpret_cast<Tap*>(shared + column_offset);
    const int oh0 = (int)(blockIdx.x / tiles_w) * tile_h, ow0 = (int)(blockIdx.x % tiles_w) * tile_w;
    const int h0 = oh0 * stride_h - padding_h, w0 = ow0 * stride_w - padding_w;
    for (I plane = blockIdx.y; plane < planes; plane += gridDim.y) {
        const T* __restrict__ base = input + plane * (I)height * width;
        for (int i = threadIdx.x; i < in_h * in_w; i += blockDim.x) {
            const int h = h0 + i / in_w, w = w0 + i % in_w;
            tile[i] = (h >= 0 && h < height && w >= 0 && w < width) ? base[(I)h * width + w]
                                                                    : narrow<T>(negative_infinity<C>());
        }
        __syncthreads();
        for (int i = threadIdx.x; i < in_h * tile_w; i += blockDim.x) {
            const T* row = tile + (i / tile_w) * in_w + (i % tile_w) * stride_w;
            C best = negative_infinity<C>();
            int column = 0;  // a row left at -inf is never taken below, whatever its column
            for (int j = 0; j < kernel_w; ++j) {
                const C value = widen(row[j]);
                if (value > best || value != value) {
                    best = value;
                    column = j;
                }
            }
            row_best[i] = narrow<T>(best);  // exact: one of the row's values
            row_column[i] = (Tap)column;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < tile_h * tile_w; i += blockDim.x) {
            const int y = i / tile_w, x = i % tile_w;
            const int oh = oh0 + y, ow = ow0 + x;
            if (oh >= out_h || ow >= out_w) continue;
            C best = negative_infinity<C>();
            int best_tap = -1;
            for (int r = 0; r < kernel_h; ++r) {
                const int k = (y * stride_h + r) * tile_w + x;
                const C value = widen(row_best[k]);
                if (value > best || value != value) {
                    best = value;
                    best_tap = r * kernel_w + (int)row_column[k];
                }
            }
            if (best_tap < 0) {  // every element is -inf: the first one inside the input, as PyTorch
                const int wh = oh * stride_h - padding_h, ww = ow * stride_w - padding_w;
                best_tap = (max(wh, 0) - wh) * kernel_w + (max(ww, 0) - ww);
            }
            const I o = (plane * out_h + oh) * (I)out_w + ow;
            output[o] = narrow<T>(best);
            taps[o] = (Tap)best_tap;
        }
        __syncthreads();  // the next plane overwrites the tile
    }
}

// count = N * C * height * width; each thread writes one input gradient: the sum,
// in row-major output order, of the gradients of the windows whose argmax it is.
template <typename T, typename Tap, typename I>
__global__ void max_pool_backward(const T* __restrict__ output_grad, const Tap* __restrict__ taps,
                                  T* __restrict__ input_grad, I count, int height, int width, int out_h, int out_w,
                                  int kernel_h, int kernel_w, int stride_h, int stride_w, int padding_h, int padding_w) {
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count; index += (I)gridDim.x * blockDim.x) {
        const int w = (int)(index % width);
        const I rest = index / width;
        const int h = (int)(rest % height);
        const I plane = rest / height;
        int oh_start, oh_end, ow_start, ow_end;
        covering_outputs(h, padding_h, kernel_h, stride_h, out_h, &oh_start, &oh_end);
        covering_outputs(w, padding_w, kernel_w, stride_w, out_w, &ow_start, &ow_end);
        const I offset = plane * (I)out_h * out_w;
        compute_t<T> sum = 0;  // half: summed in float, rounded once (exact where one gradient lands)
        for (int oh = oh_start; oh < oh_end; ++oh) {
            const int tap_row = (h - (oh * stride_h - padding_h)) * kernel_w;
            for (int ow = ow_start; ow < ow_end; ++ow) {
                const I o = offset + (I)oh * out_w + ow;
                if ((int)taps[o] == tap_row + (w - (ow * stride_w - padding_w))) sum += widen(output_grad[o]);
            }
        }
        input_grad[index] = narrow<T>(sum);
    }
}

// The divisor of one window: the whole kernel, or only its elements inside the input.
__device__ __forceinline__ int average_divisor(int oh, int ow, int height, int width, int kernel_h, int kernel_w,
                                               int stride_h, int stride_w, int padding_h, int padding_w,
                                               int count_include_pad) {
    if (count_include_pad) return kernel_h * kernel_w;
    const int h0 = oh * stride_h - padding_h, w0 = ow * stride_w - padding_w;
    return (min(h0 + kernel_h, height) - max(h0, 0)) * (min(w0 + kernel_w, width) - max(w0, 0));
}

// count = N * C * out_h * out_w: the sum of the window in row-major order, divided once.
template <typename T, typename I>
__global__ void avg_pool_forward(const T* __restrict__ input, T* __restrict__ output, I count, int height, int width,
                                 int out_h, int out_w, int kernel_h, int kernel_w, int stride_h, int stride_w,
                                 int padding_h, int padding_w, int count_include_pad) {
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count; index += (I)gridDim.x * blockDim.x) {
        const int ow = (int)(index % out_w);
        const I rest = index / out_w;
        const int oh = (int)(rest % out_h);
        const I plane = rest / out_h;
        const int h0 = oh * stride_h - padding_h, w0 = ow * stride_w - padding_w;
        const int h_start = max(h0, 0), h_end = min(h0 + kernel_h, height);
        const int w_start = max(w0, 0), w_end = min(w0 + kernel_w, width);
        const T* __restrict__ base = input + plane * (I)height * width;
        using C = compute_t<T>;
        C sum = 0;
        for (int h = h_start; h < h_end; ++h) {
            const T* __restrict__ row = base + (I)h * width;
            for (int w = w_start; w < w_end; ++w) sum += widen(row[w]);
        }
        const int divisor = average_divisor(oh, ow, height, width, kernel_h, kernel_w, stride_h, stride_w,
                                            padding_h, padding_w, count_include_pad);
        output[index] = narrow<T>(sum / (C)divisor);
    }
}

// count = N * C * height * width: the sum, in row-major output order, of
// output_grad / divisor over the windows that cover the element (as PyTorch).
template <typename T, typename I>
__global__ void avg_pool_backward(const T* __restrict__ output_grad, T* __restrict__ input_grad, I count, int height,
                                  int width, int out_h, int out_w, int kernel_h, int kernel_w, int stride_h,
                                  int stride_w, int padding_h, int padding_w, int count_include_pad) {
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count; index += (I)gridDim.x * blockDim.x) {
        const int w = (int)(index % width);
        const I rest = index / width;
        const int h = (int)(rest % height);
        const I plane = rest / height;
        int oh_start, oh_end, ow_start, ow_end;
        covering_outputs(h, padding_h, kernel_h, stride_h, out_h, &oh_start, &oh_end);
        covering_outputs(w, padding_w, kernel_w, stride_w, out_w, &ow_start, &ow_end);
        const I offset = plane * (I)out_h * out_w;
        using C = compute_t<T>;
        C sum = 0;
        for (int oh = oh_start; oh < oh_end; ++oh) {
            for (int ow = ow_start; ow < ow_end; ++ow) {
                const int divisor = average_divisor(oh, ow, height, width, kernel_h, kernel_w, stride_h, stride_w,
                                                    padding_h, padding_w, count_include_pad);
                sum += widen(output_grad[offset + (I)oh * out_w + ow]) / (C)divisor;
            }
        }
        input_grad[index] = narrow<T>(sum);
    }
}
