// conv_2d's own kernel: the bias gradient. The convolutions themselves run in
// cuDNN (kernels/cudnn.py); the fused activation in activation.cu.

#define CONV_BIAS_GRAD_BLOCK 512

// bias_grad[c] = sum over n, and the spatial positions of output_grad (N, C, spatial).
// One block per channel (grid-stride over channels): each thread sums a fixed
// strided subset in double, then a fixed tree in shared memory adds the
// threads' sums. No atomics: the same bits on every run. Double accumulation
// for float too, so the result is the float64 sum rounded once.
template <typename T>
__global__ void conv_bias_grad(const T* __restrict__ output_grad, T* __restrict__ bias_grad,
                               long long batch, long long channels, long long spatial) {
    __shared__ double partial[CONV_BIAS_GRAD_BLOCK];
    for (long long channel = blockIdx.x; channel < channels; channel += gridDim.x) {
        double sum = 0.0;
        for (long long n = 0; n < batch; ++n) {
            const T* plane = output_grad + (n * channels + channel) * spatial;
            for (long long i = threadIdx.x; i < spatial; i += blockDim.x) sum += (double)plane[i];
        }
        partial[threadIdx.x] = sum;
        __syncthreads();
        for (int half = blockDim.x / 2; half > 0; half >>= 1) {
            if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
            __syncthreads();
        }
        if (threadIdx.x == 0) bias_grad[channel] = (T)partial[0];
        __syncthreads();  // partial is reused by the block's next channel
    }
}
