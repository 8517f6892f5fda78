// transpose: output dim d is input dim perm[d]. Dims are collapsed on the host
// first, so most calls reach one of two kernels with rank <= 4.
#include "common.cuh"

// The innermost dim stays innermost: each thread gathers one output element.
// out_dims are the output's dims; in_strides[d] is the input stride of output dim d.
// __grid_constant__ (here and in transpose_tiled): the dims and strides, indexed by a
// run-time d, are read in parameter space rather than copied to each thread's local
// memory, a copy that made the gather several times slower
// (docs/performance.md#transpose-parameters).
template <typename T, typename I>
__global__ void transpose_gather(const T* __restrict__ input, T* __restrict__ output,
                                 I count, int rank, const __grid_constant__ Ints out_dims,
                                 const __grid_constant__ Ints in_strides) {
    for (I index = (I)blockIdx.x * blockDim.x + threadIdx.x; index < count;
         index += (I)gridDim.x * blockDim.x) {
        I rest = index, offset = 0;
        for (int d = rank - 1; d >= 0; --d) {
            I size = (I)out_dims.v[d];
            I coordinate = rest % size;
            rest /= size;
            offset += coordinate * (I)in_strides.v[d];
        }
        output[index] = input[offset];
    }
}

// TILE x TILE tiles: 64 (16 elements a thread) or 32 (4 a thread, for more blocks when a
// transpose has few tiles, and for 16-byte elements, to stay within 48 KB of static shared memory).
// THREADS_X, THREADS_Y: a tile's threads, transpose.THREADS_X/Y, passed by CudaModule as -D options.
#if !defined(THREADS_X) || !defined(THREADS_Y)
#error "THREADS_X and THREADS_Y are defined by kernels/transpose/ (CudaModule's -D options)"
#endif

// The innermost dims differ: a 64x64 tile through shared memory so that both the
// read (along the input's last dim, x) and the write (along the output's last
// dim, which is input dim a) are coalesced. Each thread moves 16 elements, so
// that enough loads are in flight to approach the memory bandwidth. The other
// dims are batch dims, enumerated by blockIdx.y: batch_sizes, and their strides
// in input and output. Block: THREADS_X x THREADS_Y.
template <typename T, typename I, int TILE>
__global__ void transpose_tiled(const T* __restrict__ input, T* __restrict__ output,
                                I size_x, I size_a, I in_stride_a, I out_stride_x,
                                I batch_count, int batch_rank, const __grid_constant__ Ints batch_sizes,
                                const __grid_constant__ Ints batch_in_strides,
                                const __grid_constant__ Ints batch_out_strides) {
    __shared__ T tile[TILE][TILE + 1];
    const I tiles_x = (size_x + TILE - 1) / TILE;
    const I tile_x0 = ((I)blockIdx.x % tiles_x) * TILE;
    const I tile_a0 = ((I)blockIdx.x / tiles_x) * TILE;
    for (I batch = blockIdx.y; batch < batch_count; batch += gridDim.y) {
        I rest = batch, in_base = 0, out_base = 0;
        for (int d = batch_rank - 1; d >= 0; --d) {
            I size = (I)batch_sizes.v[d];
            I coordinate = rest % size;
            rest /= size;
            in_base += coordinate * (I)batch_in_strides.v[d];
            out_base += coordinate * (I)batch_out_strides.v[d];
        }
        // Constant trip counts, so that the loops unroll and every load is in flight at once.
#pragma unroll
        for (int i = 0; i < TILE / THREADS_Y; ++i) {
#pragma unroll
            for (int j = 0; j < TILE / THREADS_X; ++j) {
                const int row = threadIdx.y + i * THREADS_Y, column = threadIdx.x + j * THREADS_X;
                I a = tile_a0 + row, x = tile_x0 + column;
                if (a < size_a && x < size_x) tile[row][column] = input[in_base + a * in_stride_a + x];
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TILE / THREADS_Y; ++i) {
#pragma unroll
            for (int j = 0; j < TILE / THREADS_X; ++j) {
                const int row = threadIdx.y + i * THREADS_Y, column = threadIdx.x + j * THREADS_X;
                I x = tile_x0 + row, a = tile_a0 + column;
                if (a < size_a && x < size_x) output[out_base + x * out_stride_x + a] = tile[column][row];
            }
        }
        __syncthreads();
    }
}
