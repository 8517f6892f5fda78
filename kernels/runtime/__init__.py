"""What every op builds on, and nothing op-specific: errors, shapes, states and checks (core), the
CPU runtime (cpu: handles, streams, the pool of threads), the GPU runtime (gpu: streams, handles,
NVRTC modules; cudnn and cublas, the NVIDIA libraries through ctypes), the named paths (paths,
gpu_paths, cpu_paths), an op's declaration (spec), and the CUDA headers the ops' sources share.
Nothing here imports an op."""
