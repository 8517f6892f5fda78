// concat and split: a whole tensor and its pieces along one axis. Each tensor is
// viewed as (outer, width) rows of copy units (1 to 16 bytes: the widest that
// every width, offset and address allows, chosen on the host); a piece's rows
// sit side by side in the whole's rows at column `offset`. One launch moves up
// to KERNELS_MAX_RANK pieces, blockIdx.y picking the piece, so a call costs one
// launch whatever the number of pieces (up to 12).
//
// ToWhole: concat forward and split backward (pieces -> whole);
// otherwise split forward and concat backward (whole -> pieces).
#include "common.cuh"

// CONCAT_UNROLL: concat.UNROLL, passed by CudaModule as a -D option.
#ifndef CONCAT_UNROLL
#error "CONCAT_UNROLL is defined by kernels/concat/ (CudaModule's -D options)"
#endif

// Where unit `index` of a piece sits in the whole. OneRow (outer == 1, YOLOv10's
// channel concats at batch 1) is a plain offset, with no division.
template <bool OneRow, typename I>
__device__ __forceinline__ I whole_index(I index, I width, I whole_width, I offset) {
    if constexpr (OneRow) {
        return offset + index;
    } else {
        const I row = index / width;
        return row * whole_width + offset + (index - row * width);
    }
}

// CONCAT_UNROLL units a thread per round, all loads issued before any store: the
// compiler cannot reorder them itself, not knowing that piece and whole never overlap.
template <bool OneRow, bool ToWhole, typename T, typename I>
__device__ __forceinline__ void copy_piece(T* whole, T* piece, I count, I width, I whole_width, I offset) {
    const I stride = (I)gridDim.x * blockDim.x;
    I index = (I)blockIdx.x * blockDim.x + threadIdx.x;
    for (; index + (CONCAT_UNROLL - 1) * stride < count; index += CONCAT_UNROLL * stride) {
        T values[CONCAT_UNROLL];
#pragma unroll
        for (int u = 0; u < CONCAT_UNROLL; ++u) {
            const I at = index + u * stride;
            if constexpr (ToWhole) values[u] = piece[at];
            else values[u] = whole[whole_index<OneRow>(at, width, whole_width, offset)];
        }
#pragma unroll
        for (int u = 0; u < CONCAT_UNROLL; ++u) {
            const I at = index + u * stride;
            if constexpr (ToWhole) whole[whole_index<OneRow>(at, width, whole_width, offset)] = values[u];
            else piece[at] = values[u];
        }
    }
    for (; index < count; index += stride) {
        if constexpr (ToWhole) whole[whole_index<OneRow>(index, width, whole_width, offset)] = piece[index];
        else piece[index] = whole[whole_index<OneRow>(index, width, whole_width, offset)];
    }
}

// __grid_constant__: the pointer tables are indexed by blockIdx.y in parameter
// space, without the copy to local memory that indexing a by-value struct costs.
template <typename T, typename I, bool ToWhole>
__global__ void concat_copy(T* whole, I whole_width, I outer, const __grid_constant__ Ints pieces,
                            const __grid_constant__ Ints widths, const __grid_constant__ Ints offsets) {
    T* piece = reinterpret_cast<T*>(pieces.v[blockIdx.y]);
    const I width = (I)widths.v[blockIdx.y];
    const I offset = (I)offsets.v[blockIdx.y];
    const I count = outer * width;
    if (outer == 1) copy_piece<true, ToWhole>(whole, piece, count, width, whole_width, offset);
    else copy_piece<false, ToWhole>(whole, piece, count, width, whole_width, offset);
}
