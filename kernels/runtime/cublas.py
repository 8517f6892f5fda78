"""cuBLAS: the one place the library makes cuBLAS handles and calls cuBLAS.

cuBLAS is called through ctypes, on the same ``libcublas`` that CuPy is linked against (found
in the process's mapped libraries once CuPy's cuBLAS module is imported; else by soname).
CuPy's own wrappers are not used: they refuse every call while a stream is being captured into
a CUDA graph, and they rebind the handle to CuPy's current stream before each call.

Each handle (one per GpuHandle) has its own workspace, allocated once with the handle
(gpu.device_empty, WORKSPACE_BYTES: cuBLAS's recommended size for Hopper), so that no cuBLAS
call allocates: a call captured into a CUDA graph must not, and cuBLAS would otherwise draw
from a pool of its own. The handle is bound to a call's stream only when that stream changed;
``cublasSetStream`` resets the workspace to cuBLAS's default, so the workspace is set again
right after it.

float32 and float64 GEMMs compute in pedantic math (no TF32, no reduced-precision reductions),
so exactly representable products and sums stay exact. Half-precision GEMMs (float16, bfloat16
storage) run through cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F: products and sums in
float32, tensor cores allowed, reduced-precision reductions disallowed, the result rounded once to
the storage type. A float32 GEMM asked for with tf32=True (a GpuHandle's allow_tf32) runs through
the same Ex call with CUBLAS_COMPUTE_32F_FAST_TF32 instead; nothing else ever does. The handle's
math mode is set before each call where it changed (pedantic for the plain GEMMs). alpha and beta
are read from host memory (CUBLAS_POINTER_MODE_HOST, set once). Every status other than CUBLAS_STATUS_SUCCESS raises
``core.CudaError("cuBLAS", <status name>, ...)``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

import numpy as np

from . import gpu, nvlib
from .core import BFLOAT16, HALF_DTYPES, CudaError

LIBRARY = "cuBLAS"
SONAMES = ("libcublas.so.13", "libcublas.so.12")

# cublas_api.h
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_POINTER_MODE_HOST = 0
CUBLAS_DEFAULT_MATH = 0
CUBLAS_PEDANTIC_MATH = 2
CUBLAS_TF32_TENSOR_OP_MATH = 3
CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
# library_types.h (cudaDataType) and cublas_api.h (cublasComputeType_t, cublasGemmAlgo_t)
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_32F_FAST_TF32 = 77
CUBLAS_GEMM_DEFAULT = -1
# The math mode of a half-precision or TF32 Ex GEMM: tensor cores allowed, but every reduction in
# float32 (PyTorch's setting with allow_fp16_reduced_precision_reduction off).
EX_MATH = CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
STATUS_NAMES = {
    0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED",
    16: "CUBLAS_STATUS_LICENSE_ERROR",
}

# 32 MiB: cuBLAS's documented workspace recommendation for Hopper (4 MiB for older architectures).
WORKSPACE_BYTES = 32 * 1024 * 1024

_p, _i, _i64, _status = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_int
_GEMM_ARGS = (_p, _i, _i, _i, _i, _i, _p, _p, _i, _i64, _p, _i, _i64, _p, _p, _i, _i64, _i)
# handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc,
# strideC, batchCount, computeType, algo
_GEMM_EX_ARGS = (_p, _i, _i, _i, _i, _i, _p, _p, _i, _i, _i64, _p, _i, _i, _i64, _p, _p, _i, _i, _i64, _i, _i, _i)
FUNCTIONS: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "cublasCreate_v2": (_status, (ctypes.POINTER(_p),)),
    "cublasDestroy_v2": (_status, (_p,)),
    "cublasSetStream_v2": (_status, (_p, _p)),
    "cublasSetWorkspace_v2": (_status, (_p, _p, ctypes.c_size_t)),
    "cublasSetMathMode": (_status, (_p, _i)),
    "cublasSetPointerMode_v2": (_status, (_p, _i)),
    "cublasSgemmStridedBatched": (_status, _GEMM_ARGS),
    "cublasDgemmStridedBatched": (_status, _GEMM_ARGS),
    "cublasGemmStridedBatchedEx": (_status, _GEMM_EX_ARGS),
}

# The cudaDataType of each storage dtype the Ex GEMM takes (bfloat16 is ml_dtypes' dtype).
_EX_TYPES = {np.dtype(np.float16): CUDA_R_16F, BFLOAT16: CUDA_R_16BF, np.dtype(np.float32): CUDA_R_32F}

# Host alpha and beta (pointer mode host): cuBLAS reads them during the call (and a captured
# graph when it is made); they live as long as the process.
_SCALARS = {(np.dtype(t), v): ctypes.c_float(v) if t is np.float32 else ctypes.c_double(v)
            for t in (np.float32, np.float64) for v in (0.0, 1.0)}


class _Library:
    def __init__(self, path: str, cdll: ctypes.CDLL):
        self.path = path
        nvlib.bind_functions(self, cdll, FUNCTIONS, LIBRARY, path)
        self.cdll = cdll


def _wheel_files() -> list[str]:
    """libcublas of the nvidia-cublas wheels (nvidia/cublas/lib, nvidia/cu13/lib), without importing them."""
    return [os.path.join(folder, soname) for soname in SONAMES
            for folder in nvlib.wheel_folders(("cublas/lib", "cu13/lib", "cu12/lib"), soname)]


def candidates() -> list[str]:
    """Where libcublas is looked for, in order: the one CuPy's cuBLAS module mapped into this
    process, the nvidia wheels' files, the system search path, then the sonames."""
    found = []
    try:
        import cupy_backends.cuda.libs.cublas  # noqa: F401  (maps CuPy's libcublas)

        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/libcublas.so" in path and path not in found:
                    found.append(path)
    except (ImportError, OSError):
        pass
    found += _wheel_files()
    system = ctypes.util.find_library("cublas")
    if system:
        found.append(system)
    return found + list(SONAMES)


# The loaded library, loading it on first use; CudaError where none can be loaded.
library = nvlib.Loader(LIBRARY, candidates, lambda candidate: _Library(candidate, ctypes.CDLL(candidate)), "libcublas")


def check(status: int, what: str) -> None:
    if status != 0:
        raise CudaError(LIBRARY, STATUS_NAMES.get(int(status), f"status {int(status)}"), what)


class CublasHandle:
    """A cuBLAS handle of one device with its own workspace, and the stream it is bound to."""

    def __init__(self, device: int):
        import cupy

        self.device = device
        self.stream: int | None = None
        self.math_mode = CUBLAS_PEDANTIC_MATH
        lib = library()
        pointer = _p()
        with cupy.cuda.Device(device):
            check(lib.cublasCreate_v2(ctypes.byref(pointer)), f"cublasCreate on GPU {device}")
            self.ptr = pointer.value
            try:
                check(lib.cublasSetMathMode(self.ptr, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode")
                check(lib.cublasSetPointerMode_v2(self.ptr, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode")
                self.workspace = gpu.device_empty((WORKSPACE_BYTES,), np.uint8, device)
            except BaseException:
                lib.cublasDestroy_v2(self.ptr)
                raise

    def bind(self, stream_ptr: int) -> None:
        """Bind to a stream (and set the workspace again, which cublasSetStream resets)."""
        if stream_ptr != self.stream:
            lib = library()
            check(lib.cublasSetStream_v2(self.ptr, stream_ptr), "cublasSetStream")
            check(lib.cublasSetWorkspace_v2(self.ptr, self.workspace.data.ptr, self.workspace.nbytes),
                  "cublasSetWorkspace")
            self.stream = stream_ptr

    def set_math_mode(self, mode: int) -> None:
        """Set the handle's math mode where it differs from the one set last."""
        if mode != self.math_mode:
            check(library().cublasSetMathMode(self.ptr, mode), "cublasSetMathMode")
            self.math_mode = mode

    def destroy(self) -> None:
        import cupy

        if self.ptr is not None:
            with cupy.cuda.Device(self.device):
                status = library().cublasDestroy_v2(self.ptr)
            self.ptr = None
            self.workspace = None
            check(status, "cublasDestroy")


def create_handle(device: int) -> CublasHandle:
    """A new cuBLAS handle on `device`, in pedantic math and host pointer mode, with its workspace."""
    return CublasHandle(device)


def destroy_handle(handle: CublasHandle, device: int) -> None:
    handle.destroy()


def gemm_strided_batched(stream: Any, handle: Any, dtype: np.dtype, trans_a: bool, trans_b: bool, m: int, n: int,
                         k: int, a: int, lda: int, stride_a: int, b: int, ldb: int, stride_b: int, beta: float, c: int,
                         ldc: int, stride_c: int, batch: int, caller: str, tf32: bool = False) -> None:
    """Enqueue on `stream` the column-major C = op(A) @ op(B) + beta * C for `batch` matrices
    `stride_*` elements apart (a, b, c are device addresses; alpha is 1), through the cuBLAS
    handle of `handle` (a GpuHandle), with the handle's device current. `caller` names the op in errors.
    float32 and float64 in pedantic math; float16 and bfloat16 storage with float32 compute; float32
    with TF32 tensor cores only where tf32 is True."""
    import cupy

    blas = handle.cublas()
    if cupy.cuda.runtime.getDevice() != blas.device:
        with cupy.cuda.Device(blas.device):
            gemm_strided_batched(stream, handle, dtype, trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b,
                                 beta, c, ldc, stride_c, batch, caller, tf32)
        return
    blas.bind(stream.ptr)
    lib = library()
    dtype = np.dtype(dtype)
    ops = (CUBLAS_OP_N, CUBLAS_OP_T)[trans_a], (CUBLAS_OP_N, CUBLAS_OP_T)[trans_b]
    if dtype in HALF_DTYPES or (tf32 and dtype == np.float32):
        blas.set_math_mode(EX_MATH)
        kind = _EX_TYPES[dtype]
        compute = CUBLAS_COMPUTE_32F if dtype in HALF_DTYPES else CUBLAS_COMPUTE_32F_FAST_TF32
        scalar = np.dtype(np.float32)  # alpha and beta are float for a float32 compute type
        status = lib.cublasGemmStridedBatchedEx(
            blas.ptr, *ops, m, n, k, ctypes.byref(_SCALARS[(scalar, 1.0)]), a, kind, lda, stride_a, b, kind, ldb,
            stride_b, ctypes.byref(_SCALARS[(scalar, float(beta))]), c, kind, ldc, stride_c, batch, compute,
            CUBLAS_GEMM_DEFAULT)
        name = "cublasGemmStridedBatchedEx"
    else:
        blas.set_math_mode(CUBLAS_PEDANTIC_MATH)
        single = dtype == np.float32
        function = lib.cublasSgemmStridedBatched if single else lib.cublasDgemmStridedBatched
        status = function(blas.ptr, *ops, m, n, k, ctypes.byref(_SCALARS[(dtype, 1.0)]), a, lda, stride_a, b, ldb,
                          stride_b, ctypes.byref(_SCALARS[(dtype, float(beta))]), c, ldc, stride_c, batch)
        name = "cublasSgemmStridedBatched" if single else "cublasDgemmStridedBatched"
    if status != 0:
        check(status, f"{caller}: {name} ({dtype.name}, m={m}, n={n}, k={k}, batch={batch})")
