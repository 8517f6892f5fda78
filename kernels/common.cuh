// Definitions shared by the CUDA sources of every op. Included through NVRTC's
// -I option pointing at this folder.
#pragma once

// Up to this many dims travel by value in one kernel argument (gpu.ints_arg).
#define KERNELS_MAX_RANK 12

struct Ints {
    long long v[KERNELS_MAX_RANK];
};

