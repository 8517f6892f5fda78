// Standalone activation passes (activation.gpu_forward / gpu_backward): one
// grid-stride elementwise kernel per direction, the activation a template
// parameter so that each instantiation is branch-free.
#include "activation.cuh"

template <typename T, int CODE>
__global__ void activation_forward_kernel(const T* pre, T* output, long long count) {
    // output may be pre itself (in place): each element is read before it is written, by one thread.
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x) {
        output[i] = kernels_activation::activation_forward<T>(CODE, pre[i]);
    }
}

template <typename T, int CODE>
__global__ void activation_backward_kernel(const T* pre, const T* output_grad, T* pre_grad, long long count) {
    // pre_grad may alias pre or output_grad (no __restrict__): same element, same thread.
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x) {
        pre_grad[i] = kernels_activation::activation_backward<T>(CODE, pre[i], output_grad[i]);
    }
}
