// Standalone activation passes (activation.gpu_forward / gpu_backward): one
// grid-stride elementwise kernel per direction, the activation a template
// parameter so that each instantiation is branch-free. Where every pointer is
// 16-byte aligned (`aligned`), each thread moves 16-byte packs, then the
// remainder goes one element at a time. Half types (half_t, bfloat16_t) are
// widened to float as read, activated in float, and rounded once as written
// (16-byte packs of 8 halves).
//
// No __restrict__: output may be pre (in place) and pre_grad may be pre or
// output_grad; every element is read before it is written, by the same thread.
#include "activation.cuh"
#include "common.cuh"

template <typename T, int CODE>
__global__ void activation_forward_kernel(const T* pre, T* output, long long count, int aligned) {
    constexpr int width = 16 / sizeof(T);
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long packs = aligned ? count / width : 0;
    for (long long i = first; i < packs; i += stride) {
        Pack16<T> pack = reinterpret_cast<const Pack16<T>*>(pre)[i];
#pragma unroll
        for (int k = 0; k < width; ++k) pack.v[k] = kernels_activation::activate<T>(CODE, pack.v[k]);
        reinterpret_cast<Pack16<T>*>(output)[i] = pack;
    }
    for (long long i = packs * width + first; i < count; i += stride) {
        output[i] = kernels_activation::activate<T>(CODE, pre[i]);
    }
}

template <typename T, int CODE>
__global__ void activation_backward_kernel(const T* pre, const T* output_grad, T* pre_grad, long long count,
                                           int aligned) {
    constexpr int width = 16 / sizeof(T);
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long packs = aligned ? count / width : 0;
    for (long long i = first; i < packs; i += stride) {
        Pack16<T> x = reinterpret_cast<const Pack16<T>*>(pre)[i];
        Pack16<T> dy = reinterpret_cast<const Pack16<T>*>(output_grad)[i];
#pragma unroll
        for (int k = 0; k < width; ++k) dy.v[k] = kernels_activation::activate_backward<T>(CODE, x.v[k], dy.v[k]);
        reinterpret_cast<Pack16<T>*>(pre_grad)[i] = dy;
    }
    for (long long i = packs * width + first; i < count; i += stride) {
        pre_grad[i] = kernels_activation::activate_backward<T>(CODE, pre[i], output_grad[i]);
    }
}
