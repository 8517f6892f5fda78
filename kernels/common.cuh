// Definitions shared by the CUDA sources of every op. Included through NVRTC's
// -I option pointing at this folder.
#pragma once

#include "half.cuh"

// Up to KERNELS_MAX_RANK dims travel by value in one kernel argument (gpu.ints_arg). Its value
// is gpu.MAX_RANK, passed by CudaModule as -DKERNELS_MAX_RANK=...
#ifndef KERNELS_MAX_RANK
#error "KERNELS_MAX_RANK is defined by kernels/gpu.py (CudaModule's -D options)"
#endif

struct Ints {
    long long v[KERNELS_MAX_RANK];
};

