// batch_norm: statistics and gradients reduced in double, in a fixed order with no
// atomics, so that every run gives the same bits. Every arithmetic step uses
// the explicitly rounded intrinsics (__dadd_rn, __dmul_rn, ...) so that no
// multiply-add is contracted into an FMA: the GPU does the same operations as
// the NumPy code of batch_norm/cpu.py, in the same order.
//
// Layout: the input is (outer, stats, inner). SPATIAL: (N, C, H*W), one
// statistic per channel, reduced by (part, channel) blocks over
// rows of `inner` contiguous elements. PER_ACTIVATION (or no spatial dims):
// (N, F, 1), one thread per statistic reducing over N.
//
// A fused activation (activation.cuh; code KERNELS_ACTIVATION_NONE for none) is
// applied by the forward apply, which keeps the pre-activation (rounded to T)
// for backward and evaluates f on it in double, rounding once; backward kernels
// take g = f'(pre) * output_grad in double wherever they read the gradient. In
// double, CUDA's exp/erf/tanh are within an ulp or two, so float32 results do
// not depend on which device's math library evaluated them.
//
// Half precision (T = half_t or bfloat16_t): the data (input, output, pre, the
// gradients of input and output) is stored in T; gamma, beta, the running
// statistics and gamma_grad / beta_grad are P = compute_t<T> (float), as in
// PyTorch's mixed precision. Every value is widened to double (exactly) when read,
// the statistics and the normalization are the same double operations as for
// float, and each result is rounded once, straight from double to T (PTX cvt.rn,
// as NumPy and ml_dtypes round float64 on the CPU). A fused activation is
// evaluated in float at the pre-activation rounded to T (widen, float, narrow).
#include "common.cuh"
#include "activation.cuh"

// A stored value as double (exact), and a double rounded once to the storage type.
__device__ __forceinline__ double to_double(float x) { return (double)x; }
__device__ __forceinline__ double to_double(double x) { return x; }
__device__ __forceinline__ double to_double(half_t x) { return (double)widen(x); }
__device__ __forceinline__ double to_double(bfloat16_t x) { return (double)widen(x); }
template <typename T> __device__ __forceinline__ T from_double(double x);
template <> __device__ __forceinline__ float from_double<float>(double x) { return __double2float_rn(x); }
template <> __device__ __forceinline__ double from_double<double>(double x) { return x; }
template <> __device__ __forceinline__ half_t from_double<half_t>(double x) {
    half_t h;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.bits) : "d"(x));
    return h;
}
template <> __device__ __forceinline__ bfloat16_t from_double<bfloat16_t>(double x) {
    bfloat16_t b;
    asm("cvt.rn.bf16.f64 %0, %1;" : "=h"(b.bits) : "d"(x));
    return b;
}

// The type a fused activation is evaluated in: double for float and double data,
// float for the half types; and its result rounded to T.
template <typename T> struct BnActivation { using type = double; };
template <> struct BnActivation<half_t> { using type = float; };
template <> struct BnActivation<bfloat16_t> { using type = float; };
template <typename T> using bn_act_t = typename BnActivation<T>::type;
template <typename T> __device__ __forceinline__ T from_activation(double x) { return from_double<T>(x); }
template <typename T> __device__ __forceinline__ T from_activation(float x) { return narrow<T>(x); }

// Every constant this source shares with Python is defined once there (plan.py, gpu.py) and
// passed by CudaModule as a -D option: BN_BLOCK (threads of every block), BN_APPLY_UNROLL, and
// the codes BN_PARTIALS_*, BN_STATS_* and BN_COEF_* below.
#if !defined(BN_BLOCK) || !defined(BN_APPLY_UNROLL)
#error "BN_BLOCK and BN_APPLY_UNROLL are defined by kernels/batch_norm/plan.py (CudaModule's -D options)"
#endif

// Sum of one value per thread, a fixed-order tree over the block (blockDim.x == BN_BLOCK).
__device__ __forceinline__ double block_sum(double value, double* shared) {
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int stride = BN_BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) shared[threadIdx.x] = __dadd_rn(shared[threadIdx.x], shared[threadIdx.x + stride]);
        __syncthreads();
    }
    double total = shared[0];
    __syncthreads();
    return total;
}

// The sum of a channel's partials, in order: the mean it gives is the same wherever it is computed.
__device__ __forceinline__ double sum_in_order(const double* values, long long count) {
    double total = 0.0;
    for (long long i = 0; i < count; ++i) total = __dadd_rn(total, values[i]);
    return total;
}

// torch's running update: momentum * value + (1 - momentum) * running.
template <typename P>
__device__ __forceinline__ P running_update(double momentum, double value, P running) {
    return from_double<P>(__dadd_rn(__dmul_rn(momentum, value), __dmul_rn(__dsub_rn(1.0, momentum), (double)running)));
}

__device__ __forceinline__ double inverse_std(double var, double eps) {
    return __ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(var, eps)));
}

// ----------------------------------------------------------------------------- SPATIAL statistics

// What a bn_spatial_partials launch writes:
//   BN_PARTIALS_SUMS     sums of x
//   BN_PARTIALS_SQUARES  sums of (x - mean)^2, the mean from the sums of a launch before
#if !defined(BN_PARTIALS_SUMS) || !defined(BN_PARTIALS_SQUARES)
#error "BN_PARTIALS_* are defined by kernels/batch_norm/gpu.py (CudaModule's -D options)"
#endif

// The value a partial sum adds: x, or (x - mean)^2.
template <typename T>
__device__ __forceinline__ double part_term(T x, bool squares, double mean) {
    double value = to_double(x);
    if (squares) {
        value = __dsub_rn(value, mean);
        value = __dmul_rn(value, value);
    }
    return value;
}

// The sum of x (squares false) or of (x - mean)^2 over one block's part, reduced over the block.
// A thread adds its elements s = begin + threadIdx.x, + BN_BLOCK, ... in that order, loading
// four at a time.
template <typename T, typename I>
__device__ __forceinline__ double part_sum(const T* row, I begin, I end, bool squares, double mean, double* shared) {
    double sum = 0.0;
    I s = begin + threadIdx.x;
    for (; end - s > 3 * BN_BLOCK; s += 4 * BN_BLOCK) {
        const T x0 = row[s], x1 = row[s + BN_BLOCK], x2 = row[s + 2 * BN_BLOCK], x3 = row[s + 3 * BN_BLOCK];
        sum = __dadd_rn(sum, part_term(x0, squares, mean));
        sum = __dadd_rn(sum, part_term(x1, squares, mean));
        sum = __dadd_rn(sum, part_term(x2, squares, mean));
        sum = __dadd_rn(sum, part_term(x3, squares, mean));
    }
    for (; s < end; s += BN_BLOCK) sum = __dadd_rn(sum, part_term(row[s], squares, mean));
    return block_sum(sum, shared);
}

// The sums of a channel's `parts` partials (values[0, parts) and values[offset, offset + parts)),
// each in order (as sum_in_order), for every thread of the block: the block loads them into shared
// memory together, thread 0 adds up the first and thread 32 (another warp) the second.
// Every thread of the block must call it; shared holds 2 * BN_BLOCK doubles.
__device__ __forceinline__ void block_sums_in_order(const double* values, long long offset, long long parts,
                                                    double* shared, double& first, double& second) {
    double total = 0.0;  // thread 0's first, thread 32's second
    for (long long base = 0; base < parts; base += BN_BLOCK) {
        const long long i = base + threadIdx.x;
        if (i < parts) {
            shared[threadIdx.x] = values[i];
            shared[BN_BLOCK + threadIdx.x] = values[offset + i];
        }
        __syncthreads();
        if (threadIdx.x == 0 || threadIdx.x == 32) {
            const double* tile = shared + (threadIdx.x == 0 ? 0 : BN_BLOCK);
            const long long n = parts - base < BN_BLOCK ? parts - base : BN_BLOCK;
            for (long long k = 0; k < n; ++k) total = __dadd_rn(total, tile[k]);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) shared[0] = total;
    if (threadIdx.x == 32) shared[1] = total;
    __syncthreads();
    first = shared[0];
    second = shared[1];
    __syncthreads();
}

// Block (p, c): part p of channel c is row n = p / parts_per_row of the channel
// (input[n, c, :]), elements [piece * chunk, piece * chunk + chunk). Writes the
// part's sum of x to sums[c * parts + p] or its sum of (x - mean)^2 to
// squares[c * parts + p] (see BN_PARTIALS_*). The mean is the channel's sum
// of sums, in order, divided by count: the same wherever it is computed.
template <typename T, typename I>
__global__ void bn_spatial_partials(const T* __restrict__ input, double* __restrict__ sums,
                                    double* __restrict__ squares, int what, I channels, I inner, I chunk,
                                    I parts_per_row, I parts, double count) {
    __shared__ double shared[2 * BN_BLOCK];
    for (I c = blockIdx.y; c < channels; c += gridDim.y) {
        double mean = 0.0;
        if (what == BN_PARTIALS_SQUARES) {
            double sum, unused;
            block_sums_in_order(sums + c * parts, 0, parts, shared, sum, unused);
            mean = __ddiv_rn(sum, count);
        }
        for (I p = blockIdx.x; p < parts; p += gridDim.x) {
            const I n = p / parts_per_row;
            const I begin = (p - n * parts_per_row) * chunk;
            const I end = begin + chunk < inner ? begin + chunk : inner;
            const T* row = input + (n * channels + c) * inner;
            if (what == BN_PARTIALS_SQUARES) {
                const double sum = part_sum(row, begin, end, true, mean, shared);
                if (threadIdx.x == 0) squares[c * parts + p] = sum;
                continue;
            }
            const double sum = part_sum(row, begin, end, false, 0.0, shared);
            if (threadIdx.x == 0) sums[c * parts + p] = sum;
        }
    }
}

// One thread per channel: mean and invstd (saved for backward), and the running
// statistics (their variance unbiased: the sum divided by count - 1).
template <typename P>
__device__ __forceinline__ void spatial_finalize_one(long long c, double sum, double var_sum, double count,
                                                     double eps, double momentum, P* running_mean, P* running_var,
                                                     double* saved_mean, double* saved_invstd) {
    const double mean = __ddiv_rn(sum, count);
    saved_mean[c] = mean;
    saved_invstd[c] = inverse_std(__ddiv_rn(var_sum, count), eps);
    running_mean[c] = running_update(momentum, mean, running_mean[c]);
    running_var[c] = running_update(momentum, __ddiv_rn(var_sum, __dsub_rn(count, 1.0)), running_var[c]);
}

// ----------------------------------------------------------------------------- PER_ACTIVATION statistics

// One thread per statistic f: two passes over the rows input[n, f].
template <typename T, typename I>
__global__ void bn_feature_stats(const T* __restrict__ input, I rows, I features, double eps, double momentum,
                                 compute_t<T>* __restrict__ running_mean, compute_t<T>* __restrict__ running_var,
                                 double* __restrict__ saved_mean, double* __restrict__ saved_invstd) {
    const double count = (double)rows;
    for (I f = (I)blockIdx.x * blockDim.x + threadIdx.x; f < features; f += (I)gridDim.x * blockDim.x) {
        double sum = 0.0;
        for (I n = 0; n < rows; ++n) sum = __dadd_rn(sum, to_double(input[n * features + f]));
        const double mean = __ddiv_rn(sum, count);
        double var_sum = 0.0;
        for (I n = 0; n < rows; ++n) {
            const double centered = __dsub_rn(to_double(input[n * features + f]), mean);
            var_sum = __dadd_rn(var_sum, __dmul_rn(centered, centered));
        }
        saved_mean[f] = mean;
        saved_invstd[f] = inverse_std(__ddiv_rn(var_sum, count), eps);
        running_mean[f] = running_update(momentum, mean, running_mean[f]);
        running_var[f] = running_update(momentum, __ddiv_rn(var_sum, __dsub_rn(count, 1.0)), running_var[f]);
    }
}

// ----------------------------------------------------------------------------- forward apply

// Where bn_forward_apply takes the statistics from:
//   BN_STATS_SAVED     saved_mean / saved_invstd, written by a launch before (by feature, training)
//   BN_STATS_RUNNING   the running statistics (inference); written to saved_* for backward
//   BN_STATS_PARTIALS  the channel sums of bn_spatial_partials (SPATIAL training): saved_* and
//                      the running statistics are written, once a channel, by block x 0
#if !defined(BN_STATS_SAVED) || !defined(BN_STATS_RUNNING) || !defined(BN_STATS_PARTIALS)
#error "BN_STATS_* are defined by kernels/batch_norm/gpu.py (CudaModule's -D options)"
#endif

// One element of the forward: f((x - mean) * invstd * g + b) (g, b: the statistic's gamma and beta,
// where affine), rounded to T; the pre-activation (rounded to T) in pre_value.
template <typename T>
__device__ __forceinline__ T forward_value(T x, double mean, double invstd, bool affine, double g, double b,
                                           int activation, T& pre_value) {
    double value = __dmul_rn(__dsub_rn(to_double(x), mean), invstd);
    if (affine) value = __dadd_rn(__dmul_rn(value, g), b);
    pre_value = from_double<T>(value);
    if (activation == KERNELS_ACTIVATION_NONE) return pre_value;
    using A = bn_act_t<T>;
    return from_activation<T>(kernels_activation::activation_forward<A>(activation, (A)to_double(pre_value)));
}

// One element of the forward written: output[index], and pre[index] when there is an activation and pre
// is not null (a state made with attrs.backward False passes null: it keeps nothing for a backward).
template <typename T, typename I>
__device__ __forceinline__ void forward_one(T x, double mean, double invstd, const compute_t<T>* gamma,
                                            const compute_t<T>* beta, I s, T* pre, T* output, I index,
                                            int activation) {
    T pre_value;
    output[index] = forward_value(x, mean, invstd, gamma != nullptr, gamma ? (double)gamma[s] : 0.0,
                                  gamma ? (double)beta[s] : 0.0, activation, pre_value);
    if (pre && activation != KERNELS_ACTIVATION_NONE) pre[index] = pre_value;
}

// output[row, col] = (x - mean) * invstd * gamma + beta for a (rows, cols) view of
// the input; the statistic is row % stats (SPATIAL: rows N*C, cols H*W) or col
// (by feature: rows N, cols F; not with BN_STATS_PARTIALS). gamma and beta are
// null when not affine. The mean and invstd are the same float64 operations
// wherever they are computed (sum_in_order of the partials; the finalize of
// bn_feature_stats), so every block and the saved copy agree to the bit.
// A block covers BN_APPLY_UNROLL * BN_BLOCK columns of a row per step (the host picks
// 64-bit I where base + step could pass 2^31).
template <typename T, typename I>
__global__ void bn_forward_apply(const T* __restrict__ input, int stats_from, const double* __restrict__ partials,
                                 I parts, double count, double eps, double momentum,
                                 compute_t<T>* __restrict__ running_mean, compute_t<T>* __restrict__ running_var,
                                 double* __restrict__ saved_mean, double* __restrict__ saved_invstd,
                                 const compute_t<T>* __restrict__ gamma, const compute_t<T>* __restrict__ beta,
                                 T* __restrict__ pre, T* __restrict__ output, I rows,
                                 I cols, I stats, int stat_by_row, int activation) {
    __shared__ double shared[2 * BN_BLOCK];
    for (I row = blockIdx.y; row < rows; row += gridDim.y) {
        // The row's statistic (stat_by_row): the same for the whole block.
        const I row_stat = stat_by_row ? row % stats : 0;
        double row_mean = 0.0, row_invstd = 0.0;
        if (stat_by_row && stats_from == BN_STATS_PARTIALS) {
            double sum, var_sum;
            block_sums_in_order(partials + row_stat * parts, stats * parts, parts, shared, sum, var_sum);
            row_mean = __ddiv_rn(sum, count);
            row_invstd = inverse_std(__ddiv_rn(var_sum, count), eps);
            if (blockIdx.x == 0 && threadIdx.x == 0 && row < stats) {
                spatial_finalize_one((long long)row, sum, var_sum, count, eps, momentum, running_mean, running_var,
                                     saved_mean, saved_invstd);
            }
        } else if (stat_by_row && stats_from == BN_STATS_RUNNING) {
            row_mean = (double)running_mean[row_stat];
            row_invstd = inverse_std((double)running_var[row_stat], eps);
            if (blockIdx.x == 0 && threadIdx.x == 0 && row < stats) {
                saved_mean[row] = row_mean;
                saved_invstd[row] = row_invstd;
            }
        } else if (stat_by_row) {
            row_mean = saved_mean[row_stat];
            row_invstd = saved_invstd[row_stat];
        }
        const I offset = row * cols;
        const I step = (I)gridDim.x * (BN_APPLY_UNROLL * BN_BLOCK);
        for (I base = (I)blockIdx.x * (BN_APPLY_UNROLL * BN_BLOCK) + threadIdx.x; base < cols; base += step) {
            T x[BN_APPLY_UNROLL];
#pragma unroll
            for (int k = 0; k < BN_APPLY_UNROLL; ++k) {
                if (cols - base > k * BN_BLOCK) x[k] = input[offset + base + k * BN_BLOCK];
            }
#pragma unroll
            for (int k = 0; k < BN_APPLY_UNROLL; ++k) {
                if (cols - base <= k * BN_BLOCK) break;
                const I col = base + k * BN_BLOCK;
                double mean = row_mean, invstd = row_invstd;
                if (!stat_by_row) {
                    if (stats_from == BN_STATS_RUNNING) {
                        mean = (double)running_mean[col];
                        invstd = inverse_std((double)running_var[col], eps);
                        if (row == 0) {
                            saved_mean[col] = mean;
                            saved_invstd[col] = invstd;
                        }
                    } else {
                        mean = saved_mean[col];
                        invstd = saved_invstd[col];
                    }
                }
                forward_one(x[k], mean, invstd, gamma, beta, stat_by_row ? row_stat : col, pre, output,
                            offset + col, activation);
            }
        }
    }
}

// SPATIAL inference (the running statistics) where every row of the apply (a channel plane of
// one image, cols elements) is a whole number of V-element packs (common.cuh's Pack, 16 bytes)
// and input, output and pre are aligned to them. A block of blockDim.x threads (a multiple of
// 32 up to BN_BLOCK: as many as a row's packs need, so that short rows keep their threads busy)
// covers blockDim.x packs of a row, one a thread. Its first thread computes the row's mean and
// invstd once for the block, with bn_forward_apply's operations; ACT, the activation code
// (KERNELS_ACTIVATION_NONE or _SILU), is fixed at compile time. Each element's operations are
// forward_value's, as in bn_forward_apply: the same bits, with far fewer instructions an
// element (docs/performance.md#batch-norm-inference-kernel).
template <typename T, typename I, int V, int ACT>
__global__ void bn_inference_apply(const T* __restrict__ input, double eps,
                                   const compute_t<T>* __restrict__ running_mean,
                                   const compute_t<T>* __restrict__ running_var,
                                   double* __restrict__ saved_mean, double* __restrict__ saved_invstd,
                                   const compute_t<T>* __restrict__ gamma, const compute_t<T>* __restrict__ beta,
                                   T* __restrict__ pre, T* __restrict__ output, I rows, I cols, I stats) {
    using P = Pack<T, V>;
    __shared__ double row_stats[2];
    const bool affine = gamma != nullptr;
    for (I row = blockIdx.y; row < rows; row += gridDim.y) {
        const I s = row % stats;
        if (threadIdx.x == 0) {
            const double mean = (double)running_mean[s], invstd = inverse_std((double)running_var[s], eps);
            row_stats[0] = mean;
            row_stats[1] = invstd;
            if (blockIdx.x == 0 && row < stats) {
                saved_mean[row] = mean;
                saved_invstd[row] = invstd;
            }
        }
        __syncthreads();
        const double mean = row_stats[0], invstd = row_stats[1];
        const double g = affine ? (double)gamma[s] : 0.0, b = affine ? (double)beta[s] : 0.0;
        const I offset = row * cols;
        for (I base = ((I)blockIdx.x * blockDim.x + threadIdx.x) * V; base < cols; base += (I)gridDim.x * blockDim.x * V) {
            const P x = *reinterpret_cast<const P*>(input + offset + base);
            P y, kept;
#pragma unroll
            for (int v = 0; v < V; ++v) y.v[v] = forward_value(x.v[v], mean, invstd, affine, g, b, ACT, kept.v[v]);
            *reinterpret_cast<P*>(output + offset + base) = y;
            if (ACT != KERNELS_ACTIVATION_NONE && pre) *reinterpret_cast<P*>(pre + offset + base) = kept;
        }
        __syncthreads();  // row_stats is written again for the block's next row
    }
}

// SPATIAL training where a channel is one part (parts == 1: N == 1 and H*W <= the chunk): block c
// sums channel c as the one block of bn_spatial_partials would (both passes), finalizes as
// bn_forward_apply (BN_STATS_PARTIALS) does from those one-term sums (sum_in_order of one value
// is 0.0 + it), and applies: the same operations, so the same bits as those three launches, in one.
template <typename T, typename I>
__global__ void bn_spatial_forward_one_part(const T* __restrict__ input, double count, double eps, double momentum,
                                            compute_t<T>* __restrict__ running_mean,
                                            compute_t<T>* __restrict__ running_var,
                                            double* __restrict__ saved_mean, double* __restrict__ saved_invstd,
                                            const compute_t<T>* __restrict__ gamma,
                                            const compute_t<T>* __restrict__ beta,
                                            T* __restrict__ pre, T* __restrict__ output, I channels, I inner,
                                            int activation) {
    __shared__ double shared[BN_BLOCK];
    for (I c = blockIdx.y; c < channels; c += gridDim.y) {
        const T* row = input + c * inner;
        const double sum = __dadd_rn(0.0, part_sum(row, (I)0, inner, false, 0.0, shared));
        const double mean = __ddiv_rn(sum, count);
        const double var_sum = __dadd_rn(0.0, part_sum(row, (I)0, inner, true, mean, shared));
        const double invstd = inverse_std(__ddiv_rn(var_sum, count), eps);
        if (threadIdx.x == 0) {
            spatial_finalize_one((long long)c, sum, var_sum, count, eps, momentum, running_mean, running_var,
                                 saved_mean, saved_invstd);
        }
        for (I s = threadIdx.x; s < inner; s += BN_BLOCK) {
            forward_one(row[s], mean, invstd, gamma, beta, c, pre, output, c * inner + s, activation);
        }
    }
}

// ----------------------------------------------------------------------------- backward

// The gradient at the normalization's output: output_grad through the activation (pre not null,
// f' in bn_act_t<T> at the kept pre-activation, not rounded to T) or as is.
template <typename T, typename I>
__device__ __forceinline__ double upstream_grad(const T* output_grad, const T* pre, int activation, I index) {
    using A = bn_act_t<T>;
    const double g = to_double(output_grad[index]);
    return pre ? (double)kernels_activation::activation_backward<A>(activation, (A)to_double(pre[index]), (A)g) : g;
}

// Writes gamma_grad = dot * invstd and beta_grad = sum_g (each when not null), and
// the coefficients of the input gradient: coef[f] = sum_g / count (grad_mean) and
// coef[stats + f] = dot * invstd * invstd / count (k); zero after an inference forward.
template <typename P>
__device__ __forceinline__ void grad_finalize(long long f, long long stats, double sum_g, double dot, double invstd,
                                              double count, int training, P* gamma_grad, P* beta_grad, double* coef) {
    if (gamma_grad) gamma_grad[f] = from_double<P>(__dmul_rn(dot, invstd));
    if (beta_grad) beta_grad[f] = from_double<P>(sum_g);
    coef[f] = training ? __ddiv_rn(sum_g, count) : 0.0;
    coef[stats + f] = training ? __ddiv_rn(__dmul_rn(__dmul_rn(dot, invstd), invstd), count) : 0.0;
}

// SPATIAL: block (p, c) sums g and g * (x - mean) over its part of channel c
// (the parts of bn_spatial_partials); partials[c * parts + p] and
// partials[channels * parts + c * parts + p].
template <typename T, typename I>
__global__ void bn_spatial_grad_partials(const T* __restrict__ output_grad, const T* __restrict__ pre, int activation,
                                         const T* __restrict__ input,
                                         const double* __restrict__ mean, double* __restrict__ partials,
                                         I channels, I inner, I chunk, I parts_per_row, I parts) {
    __shared__ double shared[BN_BLOCK];
    for (I c = blockIdx.y; c < channels; c += gridDim.y) {
        const double channel_mean = mean[c];
        for (I p = blockIdx.x; p < parts; p += gridDim.x) {
            const I n = p / parts_per_row;
            const I begin = (p - n * parts_per_row) * chunk;
            const I end = begin + chunk < inner ? begin + chunk : inner;
            const I offset = (n * channels + c) * inner;
            double sum_g = 0.0, dot = 0.0;
            for (I s = begin + threadIdx.x; s < end; s += BN_BLOCK) {
                const double g = upstream_grad(output_grad, pre, activation, offset + s);
                sum_g = __dadd_rn(sum_g, g);
                dot = __dadd_rn(dot, __dmul_rn(g, __dsub_rn(to_double(input[offset + s]), channel_mean)));
            }
            sum_g = block_sum(sum_g, shared);
            dot = block_sum(dot, shared);
            if (threadIdx.x == 0) {
                partials[c * parts + p] = sum_g;
                partials[channels * parts + c * parts + p] = dot;
            }
        }
    }
}

template <typename T>
__global__ void bn_spatial_grad_finalize(const double* __restrict__ partials, long long parts, long long channels,
                                         const double* __restrict__ invstd, double count, int training,
                                         T* __restrict__ gamma_grad, T* __restrict__ beta_grad,
                                         double* __restrict__ coef) {
    for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < channels;
         c += (long long)gridDim.x * blockDim.x) {
        const double sum_g = sum_in_order(partials + c * parts, parts);
        const double dot = sum_in_order(partials + channels * parts + c * parts, parts);
        grad_finalize(c, channels, sum_g, dot, invstd[c], count, training, gamma_grad, beta_grad, coef);
    }
}

// PER_ACTIVATION: one thread per statistic f sums over the rows.
template <typename T, typename I>
__global__ void bn_feature_grad(const T* __restrict__ output_grad, const T* __restrict__ pre, int activation,
                                const T* __restrict__ input,
                                const double* __restrict__ mean, const double* __restrict__ invstd, I rows,
                                I features, double count, int training, compute_t<T>* __restrict__ gamma_grad,
                                compute_t<T>* __restrict__ beta_grad, double* __restrict__ coef) {
    for (I f = (I)blockIdx.x * blockDim.x + threadIdx.x; f < features; f += (I)gridDim.x * blockDim.x) {
        const double feature_mean = mean[f];
        double sum_g = 0.0, dot = 0.0;
        for (I n = 0; n < rows; ++n) {
            const double g = upstream_grad(output_grad, pre, activation, n * features + f);
            sum_g = __dadd_rn(sum_g, g);
            dot = __dadd_rn(dot, __dmul_rn(g, __dsub_rn(to_double(input[n * features + f]), feature_mean)));
        }
        grad_finalize((long long)f, (long long)features, sum_g, dot, invstd[f], count, training, gamma_grad,
                      beta_grad, coef);
    }
}

// Where bn_backward_apply takes the coefficients of the input gradient from:
//   BN_COEF_SAVED     coef, written by a launch before (or none: after an inference forward)
//   BN_COEF_PARTIALS  the channel sums of bn_spatial_grad_partials (SPATIAL): grad_finalize's
//                     operations, and its gamma_grad / beta_grad written once a channel by block x 0
#if !defined(BN_COEF_SAVED) || !defined(BN_COEF_PARTIALS)
#error "BN_COEF_* are defined by kernels/batch_norm/gpu.py (CudaModule's -D options)"
#endif

// input_grad = ((g - grad_mean) - (x - mean) * k) * invstd * gamma after a training
// forward, g * invstd * gamma after an inference one (gamma null when not affine),
// for a (rows, cols) view as bn_forward_apply's.
template <typename T, typename I>
__global__ void bn_backward_apply(const T* __restrict__ output_grad, const T* __restrict__ pre, int activation,
                                  const T* __restrict__ input, int coef_from, const double* __restrict__ partials,
                                  I parts, double count, const double* __restrict__ mean,
                                  const double* __restrict__ invstd, const double* __restrict__ coef,
                                  const compute_t<T>* __restrict__ gamma, compute_t<T>* __restrict__ gamma_grad,
                                  compute_t<T>* __restrict__ beta_grad, T* __restrict__ input_grad, I rows, I cols,
                                  I stats,
                                  int stat_by_row, int training) {
    __shared__ double shared[2 * BN_BLOCK];
    for (I row = blockIdx.y; row < rows; row += gridDim.y) {
        const I row_stat = stat_by_row ? row % stats : 0;
        double row_grad_mean = 0.0, row_k = 0.0;
        if (stat_by_row && coef_from == BN_COEF_PARTIALS) {
            double sum_g, dot;
            block_sums_in_order(partials + row_stat * parts, stats * parts, parts, shared, sum_g, dot);
            const double channel_invstd = invstd[row_stat];
            if (training) {
                row_grad_mean = __ddiv_rn(sum_g, count);
                row_k = __ddiv_rn(__dmul_rn(__dmul_rn(dot, channel_invstd), channel_invstd), count);
            }
            if (blockIdx.x == 0 && threadIdx.x == 0 && row < stats) {
                if (gamma_grad) gamma_grad[row] = from_double<compute_t<T>>(__dmul_rn(dot, channel_invstd));
                if (beta_grad) beta_grad[row] = from_double<compute_t<T>>(sum_g);
            }
        } else if (stat_by_row && training) {
            row_grad_mean = coef[row_stat];
            row_k = coef[stats + row_stat];
        }
        const I offset = row * cols;
        const I step = (I)gridDim.x * (BN_APPLY_UNROLL * BN_BLOCK);
        for (I base = (I)blockIdx.x * (BN_APPLY_UNROLL * BN_BLOCK) + threadIdx.x; base < cols; base += step) {
            double g[BN_APPLY_UNROLL];
            T x[BN_APPLY_UNROLL];
#pragma unroll
            for (int k = 0; k < BN_APPLY_UNROLL; ++k) {
                if (cols - base > k * BN_BLOCK) {
                    g[k] = upstream_grad(output_grad, pre, activation, offset + base + k * BN_BLOCK);
                    if (training) x[k] = input[offset + base + k * BN_BLOCK];
                }
            }
#pragma unroll
            for (int k = 0; k < BN_APPLY_UNROLL; ++k) {
                if (cols - base <= k * BN_BLOCK) break;
                const I col = base + k * BN_BLOCK;
                const I f = stat_by_row ? row_stat : col;
                double value;
                if (training) {
                    const double grad_mean = stat_by_row ? row_grad_mean : coef[f];
                    const double k_f = stat_by_row ? row_k : coef[stats + f];
                    const double projection = __dmul_rn(__dsub_rn(to_double(x[k]), mean[f]), k_f);
                    value = __dmul_rn(__dsub_rn(__dsub_rn(g[k], grad_mean), projection), invstd[f]);
                } else {
                    value = __dmul_rn(g[k], invstd[f]);
                }
                if (gamma) value = __dmul_rn(value, (double)gamma[f]);
                input_grad[offset + col] = from_double<T>(value);
            }
        }
    }
}
