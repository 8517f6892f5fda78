// Definitions shared by the CUDA sources of every op. Included through NVRTC's
// -I option pointing at this folder.
#pragma once

#include "half.cuh"

// Up to KERNELS_MAX_RANK dims travel by value in one kernel argument (gpu.ints_arg). Its value
// is gpu.MAX_RANK, passed by CudaModule as -DKERNELS_MAX_RANK=...
#ifndef KERNELS_MAX_RANK
#error "KERNELS_MAX_RANK is defined by kernels/runtime/gpu.py (CudaModule's -D options)"
#endif

// V consecutive elements of T moved by one aligned load or store (V * sizeof(T) bytes, up to 16):
// the unit of the vectorized kernels, used only where the host found every pointer it moves
// (and every row it starts) aligned to it. 16-byte accesses keep enough bytes in flight to reach
// the memory bandwidth that 2- and 4-byte ones do not.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
    T v[V];
};
template <typename T> using Pack16 = Pack<T, 16 / sizeof(T)>;  // 16 bytes of T

struct Ints {
    long long v[KERNELS_MAX_RANK];
};

