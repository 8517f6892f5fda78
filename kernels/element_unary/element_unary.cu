// element_unary: one forward and one backward kernel, templated on the dtype and
// the op code (kernels.element_unary.UnaryOpType values), so that each
// instantiation is a branch-free elementwise loop. The activations shared with
// the fused ops come from activation.cuh. Math is done in compute_t<T> (float for
// the half types, widened on read and rounded once on write) with CUDA's accurate
// functions (never the __expf-style intrinsics; NVRTC has no -use_fast_math),
// and 1/sqrt is IEEE sqrt then IEEE division (not rsqrt), so exact where the math is.
#include "activation.cuh"
#include "common.cuh"

// OP_RELU .. OP_SCALAR_TRUE_DIV: the codes of kernels.element_unary.UnaryOpType, passed by
// CudaModule as -D options.
#if !defined(OP_RELU) || !defined(OP_SCALAR_TRUE_DIV)
#error "the op codes are defined by kernels/element_unary/ (CudaModule's -D options)"
#endif

namespace element_unary_math {

__device__ __forceinline__ float expm1_(float x) { return expm1f(x); }
__device__ __forceinline__ double expm1_(double x) { return expm1(x); }
__device__ __forceinline__ float sqrt_(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_(double x) { return sqrt(x); }
__device__ __forceinline__ float sin_(float x) { return sinf(x); }
__device__ __forceinline__ double sin_(double x) { return sin(x); }
__device__ __forceinline__ float cos_(float x) { return cosf(x); }
__device__ __forceinline__ double cos_(double x) { return cos(x); }
__device__ __forceinline__ float pow_(float x, float p) { return powf(x, p); }
__device__ __forceinline__ double pow_(double x, double p) { return pow(x, p); }
using kernels_activation::math_exp;

// x^p with PyTorch's exact shortcuts for the common exponents (p is uniform: no divergence).
template <typename T>
__device__ __forceinline__ T power(T x, T p) {
    if (p == T(0)) return T(1);
    if (p == T(1)) return x;
    if (p == T(2)) return x * x;
    if (p == T(3)) return x * x * x;
    if (p == T(0.5)) return sqrt_(x);
    if (p == T(-0.5)) return T(1) / sqrt_(x);
    if (p == T(-1)) return T(1) / x;
    if (p == T(-2)) return T(1) / (x * x);
    return pow_(x, p);
}

template <typename T, int OP>
__device__ __forceinline__ T forward(T x, T scalar) {
    using namespace kernels_activation;
    if constexpr (OP == OP_RELU) return activation_forward<T>(KERNELS_ACTIVATION_RELU, x);
    else if constexpr (OP == OP_SIGMOID) return activation_forward<T>(KERNELS_ACTIVATION_SIGMOID, x);
    else if constexpr (OP == OP_TANH) return activation_forward<T>(KERNELS_ACTIVATION_TANH, x);
    else if constexpr (OP == OP_GELU) return activation_forward<T>(KERNELS_ACTIVATION_GELU, x);
    else if constexpr (OP == OP_SILU) {
        if (scalar == T(1)) return activation_forward<T>(KERNELS_ACTIVATION_SILU, x);
        return x / (T(1) + math_exp(-(scalar * x)));
    }
    else if constexpr (OP == OP_ELU) return x > T(0) ? x : scalar * expm1_(x);
    else if constexpr (OP == OP_EXP) return math_exp(x);
    else if constexpr (OP == OP_IDENTITY) return x;
    else if constexpr (OP == OP_RSQRT) return T(1) / sqrt_(x);
    else if constexpr (OP == OP_SIN) return sin_(x);
    else if constexpr (OP == OP_COS) return cos_(x);
    else if constexpr (OP == OP_POW) return power(x, scalar);
    else if constexpr (OP == OP_SCALAR_MULTIPLY) return x * scalar;
    else if constexpr (OP == OP_SCALAR_ADD) return x + scalar;
    else if constexpr (OP == OP_SCALAR_SUB) return x - scalar;
    else return x / scalar;  // OP_SCALAR_TRUE_DIV
}

// output_grad * f'(x), in PyTorch's order of operations.
template <typename T, int OP>
__device__ __forceinline__ T backward(T x, T dy, T scalar) {
    using namespace kernels_activation;
    if constexpr (OP == OP_RELU) return activation_backward<T>(KERNELS_ACTIVATION_RELU, x, dy);
    else if constexpr (OP == OP_SIGMOID) return activation_backward<T>(KERNELS_ACTIVATION_SIGMOID, x, dy);
    else if constexpr (OP == OP_TANH) return activation_backward<T>(KERNELS_ACTIVATION_TANH, x, dy);
    else if constexpr (OP == OP_GELU) return activation_backward<T>(KERNELS_ACTIVATION_GELU, x, dy);
    else if constexpr (OP == OP_SILU) {
        if (scalar == T(1)) return activation_backward<T>(KERNELS_ACTIVATION_SILU, x, dy);
        T s = T(1) / (T(1) + math_exp(-(scalar * x)));
        return dy * s * (T(1) + scalar * x * (T(1) - s));
    }
    // alpha at x == 0, and a NaN x passes dy through, as torch (its test is x <= 0)
    else if constexpr (OP == OP_ELU) return x <= T(0) ? dy * scalar * math_exp(x) : dy;
    else if constexpr (OP == OP_EXP) return dy * math_exp(x);
    else if constexpr (OP == OP_IDENTITY) return dy;
    else if constexpr (OP == OP_RSQRT) {
        T r = T(1) / sqrt_(x);
        return (T(-0.5) * dy) * (r * r * r);
    }
    else if constexpr (OP == OP_SIN) return dy * cos_(x);
    else if constexpr (OP == OP_COS) return dy * -sin_(x);
    else if constexpr (OP == OP_POW) return scalar == T(0) ? T(0) : dy * (scalar * power(x, scalar - T(1)));
    else if constexpr (OP == OP_SCALAR_MULTIPLY) return dy * scalar;
    else if constexpr (OP == OP_SCALAR_ADD || OP == OP_SCALAR_SUB) return dy;
    else return dy / scalar;  // OP_SCALAR_TRUE_DIV
}

// Whether backward reads x: not where the derivative is a constant (the host may pass a stand-in).
template <int OP>
__device__ constexpr bool reads_input() {
    return !(OP == OP_IDENTITY || OP == OP_SCALAR_MULTIPLY || OP == OP_SCALAR_ADD || OP == OP_SCALAR_SUB ||
             OP == OP_SCALAR_TRUE_DIV);
}

}  // namespace element_unary_math

// Packs of 16 bytes first (when `aligned`), then the remaining elements one by one.
// Values are computed in C = compute_t<T> (float for half_t and bfloat16_t: widened
// as read, rounded once as written); the scalar comes in C.
template <typename T, int OP>
__global__ void element_unary_forward(const T* __restrict__ input, T* __restrict__ output, long long count,
                                      compute_t<T> scalar, int aligned) {
    using namespace element_unary_math;
    using C = compute_t<T>;
    constexpr int width = 16 / sizeof(T);
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long packs = aligned ? count / width : 0;
    const Pack16<T>* input_packs = reinterpret_cast<const Pack16<T>*>(input);
    Pack16<T>* output_packs = reinterpret_cast<Pack16<T>*>(output);
    for (long long i = first; i < packs; i += stride) {
        Pack16<T> pack = input_packs[i];
#pragma unroll
        for (int k = 0; k < width; ++k) pack.v[k] = narrow<T>(forward<C, OP>(widen(pack.v[k]), scalar));
        output_packs[i] = pack;
    }
    for (long long i = packs * width + first; i < count; i += stride)
        output[i] = narrow<T>(forward<C, OP>(widen(input[i]), scalar));
}

template <typename T, int OP>
__global__ void element_unary_backward(const T* __restrict__ input, const T* __restrict__ output_grad,
                                       T* __restrict__ input_grad, long long count, compute_t<T> scalar, int aligned) {
    using namespace element_unary_math;
    using C = compute_t<T>;
    constexpr int width = 16 / sizeof(T);
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long packs = aligned ? count / width : 0;
    const Pack16<T>* input_packs = reinterpret_cast<const Pack16<T>*>(input);
    const Pack16<T>* grad_packs = reinterpret_cast<const Pack16<T>*>(output_grad);
    Pack16<T>* input_grad_packs = reinterpret_cast<Pack16<T>*>(input_grad);
    for (long long i = first; i < packs; i += stride) {
        Pack16<T> dy = grad_packs[i];
        Pack16<T> x;
        if constexpr (reads_input<OP>()) x = input_packs[i];
        else x = dy;  // never used
#pragma unroll
        for (int k = 0; k < width; ++k) dy.v[k] = narrow<T>(backward<C, OP>(widen(x.v[k]), widen(dy.v[k]), scalar));
        input_grad_packs[i] = dy;
    }
    for (long long i = packs * width + first; i < count; i += stride) {
        const C x = reads_input<OP>() ? widen(input[i]) : C(0);
        input_grad[i] = narrow<T>(backward<C, OP>(x, widen(output_grad[i]), scalar));
    }
}
