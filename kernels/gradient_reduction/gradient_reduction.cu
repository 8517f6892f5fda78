// gradient_reduction: output = inputs[0] + inputs[1] + ... elementwise, summed left
// to right in each element's own thread, exactly as the CPU does (no reassociation,
// no atomics), so both devices give the same bits. Up to KERNELS_MAX_RANK input
// pointers travel by value in `struct Ints`; the host chains launches for more,
// passing the output as the first input of the next launch.
#include "common.cuh"

// V elements a thread as one aligned load (common.cuh's Pack; 16 bytes when every pointer allows).

// __grid_constant__: the pointer table is read in parameter space even where a
// loop indexes it, never copied to local memory.
//
// Integer sums run in the unsigned type of the same width: two's complement
// addition gives the same bits for signed inputs and wraps like NumPy, with no
// signed-overflow undefined behaviour.
template <typename T, typename I, int V>
__global__ void gradient_reduction_sum(T* output, I count, int input_count, const __grid_constant__ Ints inputs) {
    using P = Pack<T, V>;
    const I packs = count / V;
    const I stride = (I)gridDim.x * blockDim.x;
    const I first = (I)blockIdx.x * blockDim.x + threadIdx.x;
    for (I index = first; index < packs; index += stride) {
        P sum = reinterpret_cast<const P*>(inputs.v[0])[index];
#pragma unroll
        for (int k = 1; k < KERNELS_MAX_RANK; ++k) {
            if (k < input_count) {
                const P term = reinterpret_cast<const P*>(inputs.v[k])[index];
#pragma unroll
                for (int j = 0; j < V; ++j) sum.v[j] = sum.v[j] + term.v[j];
            }
        }
        reinterpret_cast<P*>(output)[index] = sum;
    }
    if constexpr (V > 1) {
        // The last count % V elements, one a thread.
        const I index = packs * V + first;
        if (index < count) {
            T sum = reinterpret_cast<const T*>(inputs.v[0])[index];
            for (int k = 1; k < input_count; ++k) sum = sum + reinterpret_cast<const T*>(inputs.v[k])[index];
            output[index] = sum;
        }
    }
}

// Half precision (T = half_t, bfloat16_t): the sum runs in float, left to right, and is
// rounded once. Where there are more than KERNELS_MAX_RANK terms the host chains
// launches through `carry` (float, one per element): a launch starts from the carry
// when carry_in is set (else from inputs[0]) and writes the carry when carry_out is
// set (else the rounded output), so no partial sum is ever rounded to T.
template <typename T, typename I, int V>
__global__ void gradient_reduction_sum_wide(T* output, float* carry, I count, int input_count, int carry_in,
                                            int carry_out, const __grid_constant__ Ints inputs) {
    using P = Pack<T, V>;
    using W = Pack<float, V>;
    const I packs = count / V;
    const I stride = (I)gridDim.x * blockDim.x;
    const I first = (I)blockIdx.x * blockDim.x + threadIdx.x;
    const int start = carry_in ? 0 : 1;  // the first input added to the starting value
    for (I index = first; index < packs; index += stride) {
        W sum;
        if (carry_in) {
            sum = reinterpret_cast<const W*>(carry)[index];
        } else {
            const P term = reinterpret_cast<const P*>(inputs.v[0])[index];
#pragma unroll
            for (int j = 0; j < V; ++j) sum.v[j] = widen(term.v[j]);
        }
#pragma unroll
        for (int k = 0; k < KERNELS_MAX_RANK; ++k) {
            if (k >= start && k < input_count) {
                const P term = reinterpret_cast<const P*>(inputs.v[k])[index];
#pragma unroll
                for (int j = 0; j < V; ++j) sum.v[j] = sum.v[j] + widen(term.v[j]);
            }
        }
        if (carry_out) {
            reinterpret_cast<W*>(carry)[index] = sum;
        } else {
            P rounded;
#pragma unroll
            for (int j = 0; j < V; ++j) rounded.v[j] = narrow<T>(sum.v[j]);
            reinterpret_cast<P*>(output)[index] = rounded;
        }
    }
    if constexpr (V > 1) {
        const I index = packs * V + first;
        if (index < count) {
            float sum = carry_in ? carry[index] : widen(reinterpret_cast<const T*>(inputs.v[0])[index]);
            for (int k = start; k < input_count; ++k) sum = sum + widen(reinterpret_cast<const T*>(inputs.v[k])[index]);
            if (carry_out) carry[index] = sum;
            else output[index] = narrow<T>(sum);
        }
    }
}

// Backward: every gradient is a copy of output_grad; read it once, write it to up
// to KERNELS_MAX_RANK destinations. T is a copy unit (1 to 16 bytes).
template <typename T, typename I>
__global__ void gradient_reduction_fanout(const T* __restrict__ source, I count, int output_count,
                                          const __grid_constant__ Ints outputs) {
    const I stride = (I)gridDim.x * blockDim.x;
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count; index += stride) {
        const T value = source[index];
#pragma unroll
        for (int k = 0; k < KERNELS_MAX_RANK; ++k) {
            if (k < output_count) reinterpret_cast<T*>(outputs.v[k])[index] = value;
        }
    }
}
