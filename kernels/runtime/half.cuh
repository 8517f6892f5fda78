// Half-precision storage: float16 and bfloat16 as 16-bit structs, widened to float
// when read and rounded once (to nearest even) when written. Every op computes and
// accumulates half tensors in float (compute_t), as the CPU reference does.
//
// The conversions are the hardware's own (PTX cvt, sm_80 and later for bfloat16),
// so the sources need no CUDA toolkit headers: NVRTC compiles them from this file.
#pragma once

struct half_t {
    unsigned short bits;
};

struct bfloat16_t {
    unsigned short bits;
};

// The type a kernel computes in for values stored as T.
template <class T> struct Compute { using type = T; };
template <> struct Compute<half_t> { using type = float; };
template <> struct Compute<bfloat16_t> { using type = float; };
template <class T> using compute_t = typename Compute<T>::type;

// widen: a stored value as its compute type (exact).
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ double widen(double x) { return x; }
__device__ __forceinline__ float widen(half_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float widen(bfloat16_t x) {
    return __uint_as_float(static_cast<unsigned int>(x.bits) << 16);
}

// narrow<T>: a computed value rounded to the storage type T (round to nearest even;
// overflow gives inf, NaN stays NaN).
template <class T> __device__ __forceinline__ T narrow(compute_t<T> x);
template <> __device__ __forceinline__ float narrow<float>(float x) { return x; }
template <> __device__ __forceinline__ double narrow<double>(double x) { return x; }
template <> __device__ __forceinline__ half_t narrow<half_t>(float x) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(x));
    return h;
}
template <> __device__ __forceinline__ bfloat16_t narrow<bfloat16_t>(float x) {
    bfloat16_t b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(x));
    return b;
}
