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

Each GEMM is first offered to cuBLASLt (``libcublasLt``, the library that libcublas itself is built
on): a MatmulPlan per GEMM geometry, made on the geometry's first call and kept in the handle, holds
the operation's descriptors and the algorithm cuBLASLt's heuristics chose for it, so that a call is
one ``cublasLtMatmul`` with nothing left to decide. The legacy call decides its algorithm again on
every call, which costs several microseconds of host time (docs/performance.md#cublaslt-plans).
A plan computes what the legacy call does: the same compute types (pedantic float32 and float64,
float32 compute for the half types, TF32 only where asked), split-K partial sums reduced only in the
compute type (never in the half storage type, never through atomics), the workspace the handle's.
A GEMM with no such algorithm, a call whose pointers are not LT_ALIGNMENT-byte aligned (the plan's
algorithm is chosen for that alignment) and every call under KERNELS_CUBLASLT=0 (lt_mode) take the
legacy call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
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

CUBLAS_STATUS_NOT_SUPPORTED = 15
# 32 MiB: cuBLAS's documented workspace recommendation for Hopper (4 MiB for older architectures).
WORKSPACE_BYTES = 32 * 1024 * 1024

# cuBLASLt (cublasLt.h, cublas_api.h): the enum values the plans use.
LT_LIBRARY = "cuBLASLt"
LT_SONAMES = ("libcublasLt.so.13", "libcublasLt.so.12")
LT_ENV = "KERNELS_CUBLASLT"
LT_MODES = {"": "on", "1": "on", "0": "off"}
# The byte alignment a plan's algorithm is chosen for (each matrix's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*):
# CuPy's pool and the library's buffers are 512-byte aligned; a GEMM at an offset that is not a multiple of
# this (conv_2d's per-image steps at odd sizes) takes the legacy call.
LT_ALIGNMENT = 16
CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_COMPUTE_64F_PEDANTIC = 69, 71
CUDA_R_64F = 1
LT_DESC_TRANSA, LT_DESC_TRANSB = 3, 4
LT_LAYOUT_BATCH_COUNT, LT_LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
LT_PREF_MAX_WORKSPACE_BYTES, LT_PREF_REDUCTION_SCHEME_MASK = 1, 3
LT_PREF_MIN_ALIGNMENT = (5, 6, 7, 8)  # A, B, C, D
# Split-K partial sums reduced in the compute type, in a workspace, in a fixed order; not in place in the
# output (in its storage type: a half's) nor in the output type.
LT_REDUCTION_SCHEME_COMPUTE_TYPE = 2

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


class _LtAlgo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]  # cublasLtMatmulAlgo_t


class _LtHeuristicResult(ctypes.Structure):
    _fields_ = [("algo", _LtAlgo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]  # cublasLtMatmulHeuristicResult_t


_set_attribute = (_status, (_p, _i, _p, ctypes.c_size_t))
LT_FUNCTIONS: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "cublasLtCreate": (_status, (ctypes.POINTER(_p),)),
    "cublasLtDestroy": (_status, (_p,)),
    "cublasLtMatmulDescCreate": (_status, (ctypes.POINTER(_p), _i, _i)),
    "cublasLtMatmulDescDestroy": (_status, (_p,)),
    "cublasLtMatmulDescSetAttribute": _set_attribute,
    "cublasLtMatrixLayoutCreate": (_status, (ctypes.POINTER(_p), _i, ctypes.c_uint64, ctypes.c_uint64, _i64)),
    "cublasLtMatrixLayoutDestroy": (_status, (_p,)),
    "cublasLtMatrixLayoutSetAttribute": _set_attribute,
    "cublasLtMatmulPreferenceCreate": (_status, (ctypes.POINTER(_p),)),
    "cublasLtMatmulPreferenceDestroy": (_status, (_p,)),
    "cublasLtMatmulPreferenceSetAttribute": _set_attribute,
    "cublasLtMatmulAlgoGetHeuristic": (_status, (_p,) * 7 + (_i, ctypes.POINTER(_LtHeuristicResult),
                                                              ctypes.POINTER(_i))),
    # handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, workspace bytes, stream
    "cublasLtMatmul": (_status, (_p,) * 14 + (ctypes.c_size_t, _p)),
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


def _mapped(fragment: str) -> list[str]:
    """The files whose path holds `fragment` among those CuPy's cuBLAS module mapped into this process
    (libcublas, and libcublasLt, which libcublas loads)."""
    found: list[str] = []
    try:
        import cupy_backends.cuda.libs.cublas  # noqa: F401  (maps CuPy's libcublas)

        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if fragment in path and path not in found:
                    found.append(path)
    except (ImportError, OSError):
        pass
    return found


def _places(name: str, sonames: tuple[str, ...]) -> list[str]:
    """Where lib<name> is looked for, in order: the one CuPy's cuBLAS module mapped into this process,
    the nvidia-cublas wheels' files (nvidia/cublas/lib, nvidia/cu13/lib, nvidia/cu12/lib, found without
    importing them), the system search path, then the sonames."""
    found = _mapped(f"/lib{name}.so")
    found += [os.path.join(folder, soname) for soname in sonames
              for folder in nvlib.wheel_folders(("cublas/lib", "cu13/lib", "cu12/lib"), soname)]
    system = ctypes.util.find_library(name)
    if system:
        found.append(system)
    return found + list(sonames)


def candidates() -> list[str]:
    """Where libcublas is looked for (_places)."""
    return _places("cublas", SONAMES)


def lt_candidates() -> list[str]:
    """Where libcublasLt is looked for: the same places as libcublas, the one libcublas mapped first."""
    return _places("cublasLt", LT_SONAMES)


class _LtLibrary:
    def __init__(self, path: str, cdll: ctypes.CDLL):
        self.path = path
        nvlib.bind_functions(self, cdll, LT_FUNCTIONS, LT_LIBRARY, path)


# The loaded libraries, each loading on first use; CudaError where none can be loaded.
library = nvlib.Loader(LIBRARY, candidates, lambda candidate: _Library(candidate, ctypes.CDLL(candidate)), "libcublas")
lt_library = nvlib.Loader(LT_LIBRARY, lt_candidates, lambda candidate: _LtLibrary(candidate, ctypes.CDLL(candidate)),
                          "libcublasLt")


def lt_mode(environ: Any = None) -> str:
    """What KERNELS_CUBLASLT asks of every GEMM: "on" (unset, empty or "1": a cuBLASLt plan where one
    is found, else the legacy call) or "off" ("0": the legacy call). Any other value: ValueError."""
    return nvlib.switch(LT_ENV, LT_MODES, environ)


def check(status: int, what: str, library_name: str = LIBRARY) -> None:
    if status != 0:
        raise CudaError(library_name, STATUS_NAMES.get(int(status), f"status {int(status)}"), what)


# A GEMM's geometry, the key of its plan: (dtype, trans_a, trans_b, m, n, k, lda, stride_a, ldb, stride_b, beta, ldc,
# stride_c, batch, tf32).
GemmKey = tuple


class MatmulPlan:
    """One GEMM geometry in cuBLASLt: its operation descriptor (compute type, transposes), the layouts of
    A, B and C (C is also D: the result is written in place of C, as the legacy call writes it), and the
    algorithm the heuristics ranked first among those that reduce split-K sums in the compute type and
    take LT_ALIGNMENT-byte aligned matrices and at most the handle's workspace. `found` is False where the
    heuristics offered none (the GEMM then takes the legacy call). A call enqueues the GEMM on a stream."""

    __slots__ = ("found", "workspace_bytes", "_lt", "_handle", "_desc", "_layouts", "_result", "_algo", "_scalars",
                 "_alpha", "_beta")

    def __init__(self, lt_handle: int, key: GemmKey, workspace_bytes: int):
        dtype, trans_a, trans_b, m, n, k, lda, stride_a, ldb, stride_b, beta, ldc, stride_c, batch, tf32 = key
        lt = lt_library()
        self._lt, self._handle, self._desc, self._layouts = lt, lt_handle, None, []
        self.found, self.workspace_bytes = False, 0
        if dtype in HALF_DTYPES or (tf32 and dtype == np.float32):
            compute, scale, kind = (CUBLAS_COMPUTE_32F if dtype in HALF_DTYPES else CUBLAS_COMPUTE_32F_FAST_TF32,
                                    CUDA_R_32F, _EX_TYPES[dtype])
        elif dtype == np.float32:
            compute, scale, kind = CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F, CUDA_R_32F
        else:
            compute, scale, kind = CUBLAS_COMPUTE_64F_PEDANTIC, CUDA_R_64F, CUDA_R_64F
        scalar = ctypes.c_double if scale == CUDA_R_64F else ctypes.c_float
        self._scalars = (scalar(1.0), scalar(float(beta)))  # host alpha and beta, read during each call
        self._alpha, self._beta = (ctypes.addressof(value) for value in self._scalars)
        try:
            desc = _p()
            check(lt.cublasLtMatmulDescCreate(ctypes.byref(desc), compute, scale), "cublasLtMatmulDescCreate",
                  LT_LIBRARY)
            self._desc = desc.value
            for attribute, trans in ((LT_DESC_TRANSA, trans_a), (LT_DESC_TRANSB, trans_b)):
                _lt_set(lt.cublasLtMatmulDescSetAttribute, self._desc, attribute, ctypes.c_int32(int(trans)))
            # Column-major rows x columns of each stored matrix: op(A) is m x k, op(B) k x n, C m x n.
            for rows, columns, ld, stride in ((k if trans_a else m, m if trans_a else k, lda, stride_a),
                                              (n if trans_b else k, k if trans_b else n, ldb, stride_b),
                                              (m, n, ldc, stride_c)):
                layout = _p()
                check(lt.cublasLtMatrixLayoutCreate(ctypes.byref(layout), kind, rows, columns, ld),
                      "cublasLtMatrixLayoutCreate", LT_LIBRARY)
                self._layouts.append(layout.value)
                _lt_set(lt.cublasLtMatrixLayoutSetAttribute, layout.value, LT_LAYOUT_BATCH_COUNT, ctypes.c_int32(batch))
                _lt_set(lt.cublasLtMatrixLayoutSetAttribute, layout.value, LT_LAYOUT_STRIDED_BATCH_OFFSET,
                        ctypes.c_int64(stride))
            self._choose(workspace_bytes)
        except BaseException:
            self.destroy()
            raise

    def _choose(self, workspace_bytes: int) -> None:
        lt = self._lt
        preference = _p()
        check(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), "cublasLtMatmulPreferenceCreate",
              LT_LIBRARY)
        try:
            set_preference = lt.cublasLtMatmulPreferenceSetAttribute
            _lt_set(set_preference, preference.value, LT_PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(workspace_bytes))
            _lt_set(set_preference, preference.value, LT_PREF_REDUCTION_SCHEME_MASK,
                    ctypes.c_uint32(LT_REDUCTION_SCHEME_COMPUTE_TYPE))
            for attribute in LT_PREF_MIN_ALIGNMENT:
                _lt_set(set_preference, preference.value, attribute, ctypes.c_uint32(LT_ALIGNMENT))
            result, count = _LtHeuristicResult(), _i(0)
            a, b, c = self._layouts
            status = lt.cublasLtMatmulAlgoGetHeuristic(self._handle, self._desc, a, b, c, c, preference.value, 1,
                                                       ctypes.byref(result), ctypes.byref(count))
        finally:
            lt.cublasLtMatmulPreferenceDestroy(preference.value)
        if status == CUBLAS_STATUS_NOT_SUPPORTED:  # no heuristic for this configuration
            return
        check(status, "cublasLtMatmulAlgoGetHeuristic", LT_LIBRARY)
        if count.value >= 1 and result.state == 0:
            self._result, self._algo = result, ctypes.addressof(result.algo)
            self.found, self.workspace_bytes = True, int(result.workspace_size)

    def __call__(self, stream_ptr: int, a: int, b: int, c: int, workspace: int) -> int:
        """Enqueue C = op(A) @ op(B) + beta * C on the stream; returns cuBLAS's status."""
        la, lb, lc = self._layouts
        return self._lt.cublasLtMatmul(self._handle, self._desc, self._alpha, a, la, b, lb, self._beta, c, lc, c, lc,
                                       self._algo, workspace, self.workspace_bytes, stream_ptr)

    def destroy(self) -> None:
        lt = self._lt
        for layout in self._layouts:
            lt.cublasLtMatrixLayoutDestroy(layout)
        self._layouts = []
        if self._desc is not None:
            lt.cublasLtMatmulDescDestroy(self._desc)
            self._desc = None
        self.found = False


def _lt_set(function: Any, target: int, attribute: int, value: Any) -> None:
    """Set one attribute of a cuBLASLt descriptor from a ctypes value."""
    check(function(target, attribute, ctypes.byref(value), ctypes.sizeof(value)), f"{function.__name__} {attribute}",
          LT_LIBRARY)


class CublasHandle:
    """A cuBLAS handle of one device with its own workspace, and the stream it is bound to."""

    def __init__(self, device: int):
        import cupy

        self.device = device
        self.stream: int | None = None
        self.math_mode = CUBLAS_PEDANTIC_MATH
        # cuBLASLt: its handle (None under KERNELS_CUBLASLT=0) and a MatmulPlan per GEMM geometry, made on the
        # geometry's first call (under the lock); a plan that found no algorithm is kept too, so that the
        # heuristics are asked once.
        self.lt: int | None = None
        self.plans: dict[GemmKey, MatmulPlan] = {}
        self._plans_lock = threading.Lock()
        lib = library()
        pointer = _p()
        with cupy.cuda.Device(device):
            check(lib.cublasCreate_v2(ctypes.byref(pointer)), f"cublasCreate on GPU {device}")
            self.ptr = pointer.value
            try:
                check(lib.cublasSetMathMode(self.ptr, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode")
                check(lib.cublasSetPointerMode_v2(self.ptr, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode")
                self.workspace = gpu.device_empty((WORKSPACE_BYTES,), np.uint8, device)
                if lt_mode() == "on":
                    lt_pointer = _p()
                    check(lt_library().cublasLtCreate(ctypes.byref(lt_pointer)), f"cublasLtCreate on GPU {device}",
                          LT_LIBRARY)
                    self.lt = lt_pointer.value
            except BaseException:
                lib.cublasDestroy_v2(self.ptr)
                raise

    def plan(self, key: GemmKey) -> MatmulPlan:
        """The MatmulPlan of a GEMM geometry, made on its first call (self.lt must be set)."""
        plan = self.plans.get(key)
        if plan is None:
            with self._plans_lock:
                plan = self.plans.get(key)
                if plan is None:
                    plan = self.plans[key] = MatmulPlan(self.lt, key, WORKSPACE_BYTES)
        return plan

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
                for plan in self.plans.values():
                    plan.destroy()
                self.plans = {}
                lt_status = lt_library().cublasLtDestroy(self.lt) if self.lt is not None else 0
                self.lt = None
                status = library().cublasDestroy_v2(self.ptr)
            self.ptr = None
            self.workspace = None
            check(status, "cublasDestroy")
            check(lt_status, "cublasLtDestroy", LT_LIBRARY)


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
    dtype = np.dtype(dtype)
    if blas.lt is not None and not (a | b | c) % LT_ALIGNMENT:
        plan = blas.plan((dtype, trans_a, trans_b, m, n, k, lda, stride_a, ldb, stride_b, beta, ldc, stride_c, batch,
                          tf32))
        if plan.found:
            status = plan(stream.ptr, a, b, c, blas.workspace.data.ptr)
            if status != 0:
                check(status, f"{caller}: cublasLtMatmul ({dtype.name}, m={m}, n={n}, k={k}, batch={batch})",
                      LT_LIBRARY)
            return
    blas.bind(stream.ptr)
    lib = library()
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
