"""cuBLAS: the one place the library makes cuBLAS handles and calls cuBLAS.

cuBLAS is reached through CuPy's bindings (`cupy.cuda.cublas`). Those wrappers call
`cublasSetStream(handle, <CuPy's current stream>)` before every call, so a handle
bound once to a stream does not stay bound: a call made while CuPy's current stream
is another one (the legacy default stream, a user's stream) runs there, unordered
with the kernels' stream. `gemm_strided_batched` therefore always calls with the
call's stream current: GPU kernel calls already run inside their stream
(core.gpu_kernel), and a call from anywhere else enters it here.

Handles compute in pedantic math (no TF32, no reduced-precision reductions), so
exactly representable products and sums stay exact, and read alpha and beta from
host memory (CUBLAS_POINTER_MODE_HOST, set once).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .core import CudaError

# cublasMath_t's CUBLAS_PEDANTIC_MATH (cublas_api.h); CuPy 14 does not name it.
PEDANTIC_MATH = 2

# Host alpha and beta (pointer mode host): cuBLAS reads them during the call; they live as
# long as the process.
_SCALARS = {(np.dtype(t), v): np.array(v, dtype=t) for t in (np.float32, np.float64) for v in (0.0, 1.0)}


def _cupy_cublas() -> Any:
    from cupy.cuda import cublas

    return cublas


def create_handle(device: int) -> int:
    """A new cuBLAS handle on `device`, in pedantic math and host pointer mode."""
    import cupy

    cublas = _cupy_cublas()
    try:
        with cupy.cuda.Device(device):
            handle = cublas.create()
            cublas.setMathMode(handle, PEDANTIC_MATH)
            cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    except cublas.CUBLASError as error:
        raise CudaError("cuBLAS", str(error), f"creating a handle on GPU {device}") from error
    return handle


def destroy_handle(handle: int, device: int) -> None:
    import cupy

    cublas = _cupy_cublas()
    try:
        with cupy.cuda.Device(device):
            cublas.destroy(handle)
    except cublas.CUBLASError as error:
        raise CudaError("cuBLAS", str(error), "destroying a handle") from error


def gemm_strided_batched(stream: Any, handle: Any, dtype: np.dtype, trans_a: bool, trans_b: bool, m: int, n: int,
                         k: int, a: int, lda: int, stride_a: int, b: int, ldb: int, stride_b: int, beta: float, c: int,
                         ldc: int, stride_c: int, batch: int, caller: str) -> None:
    """Enqueue on `stream` the column-major C = op(A) @ op(B) + beta * C for `batch` matrices
    `stride_*` elements apart (a, b, c are device addresses; alpha is 1), through the cuBLAS
    handle of `handle` (a GpuHandle). `caller` names the op in errors."""
    import cupy

    if cupy.cuda.get_current_stream().ptr != stream.ptr:
        with stream:
            gemm_strided_batched(stream, handle, dtype, trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b,
                                 beta, c, ldc, stride_c, batch, caller)
        return
    cublas = _cupy_cublas()
    single = dtype == np.float32
    function = cublas.sgemmStridedBatched if single else cublas.dgemmStridedBatched
    operations = (cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T)
    try:
        function(handle.cublas(), operations[trans_a], operations[trans_b], m, n, k, _SCALARS[(dtype, 1.0)].ctypes.data,
                 a, lda, stride_a, b, ldb, stride_b, _SCALARS[(dtype, float(beta))].ctypes.data, c, ldc, stride_c,
                 batch)
    except cublas.CUBLASError as error:
        name = "sgemmStridedBatched" if single else "dgemmStridedBatched"
        raise CudaError("cuBLAS", str(error), f"{caller}: {name} (m={m}, n={n}, k={k}, batch={batch})") from error
