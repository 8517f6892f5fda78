// The activations fused into conv_2d, batch_norm and pool_2d and used by
// element_unary: device functions on one value, for float and double (the compute
// types). A half-precision value (half_t, bfloat16_t) is activated in float:
// activate<T> / activate_backward<T> widen, call the float functions, and round
// once; an epilogue holding a float already calls activation_forward<float>.
// Include it ("activation.cuh") from any op's .cu file; the codes are the
// values of kernels.activation.Activation (activation.code() in Python), and
// KERNELS_ACTIVATION_NONE (-1) stands for no activation.
//
// Formulas follow PyTorch's (ATen) forward and autograd formulas:
//   relu(x)    = x < 0 ? 0 : x               relu'     = x > 0 (0 at x == 0; NaN x passes dy)
//   sigmoid(x) = 1 / (1 + exp(-x))           sigmoid'  = s (1 - s)
//   tanh(x)                                  tanh'     = 1 - t^2
//   gelu(x)    = x/2 (1 + erf(x / sqrt 2))   gelu'     = Phi(x) + x phi(x)
//   silu(x)    = x / (1 + exp(-x))           silu'     = s (1 + x (1 - s))
// Accurate CUDA math only (erff/erf, expf/exp, tanhf/tanh): never the
// __expf-style intrinsics, and NVRTC is not given -use_fast_math.
#pragma once

#include "half.cuh"

// KERNELS_ACTIVATION_NONE, _RELU, _SIGMOID, _TANH, _GELU and _SILU are the codes of
// kernels.activation.Activation, passed by CudaModule as -D options.
#if !defined(KERNELS_ACTIVATION_NONE) || !defined(KERNELS_ACTIVATION_SILU)
#error "the activation codes are defined by kernels/activation/ (CudaModule's -D options)"
#endif

namespace kernels_activation {

__device__ __forceinline__ float math_exp(float x) { return expf(x); }
__device__ __forceinline__ double math_exp(double x) { return exp(x); }
__device__ __forceinline__ float math_erf(float x) { return erff(x); }
__device__ __forceinline__ double math_erf(double x) { return erf(x); }
__device__ __forceinline__ float math_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double math_tanh(double x) { return tanh(x); }

// 1 / sqrt(2) and 1 / sqrt(2 pi), rounded to double (and from there to float).
#define KERNELS_SQRT1_2 0.70710678118654752440
#define KERNELS_INV_SQRT_2PI 0.39894228040143267794

template <typename T>
__device__ __forceinline__ T sigmoid(T x) {
    return T(1) / (T(1) + math_exp(-x));
}

// f(x) for an activation code; KERNELS_ACTIVATION_NONE (or any other code) is the identity.
template <typename T>
__device__ __forceinline__ T activation_forward(int code, T x) {
    static_assert(sizeof(T) >= 4, "activation_forward computes in float or double: widen a half value first");
    switch (code) {
    case KERNELS_ACTIVATION_RELU:
        return x < T(0) ? T(0) : x;  // NaN stays NaN, as torch.relu
    case KERNELS_ACTIVATION_SIGMOID:
        return sigmoid(x);
    case KERNELS_ACTIVATION_TANH:
        return math_tanh(x);
    case KERNELS_ACTIVATION_GELU:
        return x * T(0.5) * (T(1) + math_erf(x * T(KERNELS_SQRT1_2)));
    case KERNELS_ACTIVATION_SILU:
        return x / (T(1) + math_exp(-x));
    default:
        return x;
    }
}

// output_grad * f'(x), where x is the pre-activation value.
template <typename T>
__device__ __forceinline__ T activation_backward(int code, T x, T output_grad) {
    static_assert(sizeof(T) >= 4, "activation_backward computes in float or double: widen half values first");
    switch (code) {
    case KERNELS_ACTIVATION_RELU:
        return x <= T(0) ? T(0) : output_grad;  // torch's threshold_backward
    case KERNELS_ACTIVATION_SIGMOID: {
        T s = sigmoid(x);
        return output_grad * ((T(1) - s) * s);
    }
    case KERNELS_ACTIVATION_TANH: {
        T t = math_tanh(x);
        return output_grad * (T(1) - t * t);
    }
    case KERNELS_ACTIVATION_GELU: {
        T cdf = T(0.5) * (T(1) + math_erf(x * T(KERNELS_SQRT1_2)));
        T pdf = T(KERNELS_INV_SQRT_2PI) * math_exp(T(-0.5) * x * x);
        return output_grad * (cdf + x * pdf);
    }
    case KERNELS_ACTIVATION_SILU: {
        T s = sigmoid(x);
        return output_grad * s * (T(1) + x * (T(1) - s));
    }
    default:
        return output_grad;
    }
}

// A stored value of any float type T (half_t, bfloat16_t, float, double): widened to
// compute_t<T>, activated, rounded once to T.
template <typename T>
__device__ __forceinline__ T activate(int code, T x) {
    return narrow<T>(activation_forward<compute_t<T>>(code, widen(x)));
}

template <typename T>
__device__ __forceinline__ T activate_backward(int code, T x, T output_grad) {
    return narrow<T>(activation_backward<compute_t<T>>(code, widen(x), widen(output_grad)));
}

}  // namespace kernels_activation
