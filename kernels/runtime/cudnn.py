"""The cuDNN binding: ctypes over cuDNN 9's legacy (v7/v8-style) API, loaded on first use.

Where the library comes from, first found wins:

1. ``KERNELS_CUDNN_PATH``: a ``libcudnn.so*`` file, or a folder holding ``libcudnn.so.9``;
2. the ``nvidia-cudnn-cu13``/``-cu12`` wheel: ``nvidia/cudnn/lib`` (or ``nvidia/cu13/lib``)
   in the ``nvidia`` namespace package;
3. the system search path (``ctypes.util.find_library("cudnn")``, then ``libcudnn.so.9``).

cuDNN 9 is split: ``libcudnn.so.9`` is a thin front that dlopens ``libcudnn_graph``,
``libcudnn_ops``, ``libcudnn_cnn``, ... from its own folder. From a folder we
preload those three, RTLD_GLOBAL, before the front, so that the front finds them
loaded whatever its search path.

Every function used is declared with its argtypes and restype, copied from
cuDNN 9's headers (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h); every status other
than CUDNN_STATUS_SUCCESS raises ``core.CudaError("cuDNN", <status name>, ...)``.
Descriptors are small classes that own their cuDNN object until ``destroy()``;
``live_descriptors()`` counts the ones not yet destroyed, so tests can show that
cleanup leaves nothing behind. Nothing here enqueues work by itself or
synchronizes: the convolution functions run on the stream bound to the handle.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from . import nvlib
from .core import BFLOAT16, HALF_DTYPES, CudaError, DTypeError

LIBRARY = "cuDNN"
ENV_PATH = "KERNELS_CUDNN_PATH"
SONAME = "libcudnn.so.9"
# Loaded before the front library, in dependency order (cnn needs ops and graph).
SUBLIBRARIES = ("libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9")
MIN_VERSION = 90000  # cuDNN 9 numbers its versions major * 10000 + minor * 100 + patch

# --------------------------------------------------------------------------- enums (cuDNN 9 headers)

# cudnnStatus_t (cudnn_graph.h). Names for codes this table lacks come from cudnnGetErrorString.
STATUS_SUCCESS = 0
STATUS_NAMES = {
    0: "CUDNN_STATUS_SUCCESS",
    1001: "CUDNN_STATUS_NOT_INITIALIZED",
    1002: "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
    1003: "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH",
    1004: "CUDNN_STATUS_DEPRECATED",
    1005: "CUDNN_STATUS_LICENSE_ERROR",
    1006: "CUDNN_STATUS_RUNTIME_IN_PROGRESS",
    1007: "CUDNN_STATUS_RUNTIME_FP_OVERFLOW",
    1008: "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
    2000: "CUDNN_STATUS_BAD_PARAM",
    2001: "CUDNN_STATUS_INVALID_VALUE",
    2002: "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
    2003: "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
    2004: "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED",
    2005: "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND",
    2006: "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
    2007: "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH",
    2008: "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
    2009: "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES",
    2010: "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE",
    2011: "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH",
    2012: "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE",
    3000: "CUDNN_STATUS_NOT_SUPPORTED",
    3001: "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN",
    3002: "CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
    3003: "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE",
    3004: "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT",
    3005: "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
    3006: "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART",
    3007: "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH",
    3008: "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
    3009: "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE",
    3010: "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT",
    3011: "CUDNN_STATUS_NOT_SUPPORTED_PADDING",
    3012: "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM",
    3013: "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API",
    3014: "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE",
    4000: "CUDNN_STATUS_INTERNAL_ERROR",
    4001: "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED",
    4002: "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE",
    4003: "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    4004: "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    4005: "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM",
    4006: "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED",
    5000: "CUDNN_STATUS_EXECUTION_FAILED",
    5001: "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER",
    5002: "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS",
    5003: "CUDNN_STATUS_EXECUTION_FAILED_CUDART",
    5004: "CUDNN_STATUS_EXECUTION_FAILED_CURAND",
}

# cudnnDataType_t (cudnn_graph.h)
DATA_FLOAT = 0
DATA_DOUBLE = 1
DATA_HALF = 2
DATA_BFLOAT16 = 9
# cudnnTensorFormat_t (cudnn_graph.h)
TENSOR_NCHW = 0
# cudnnMathType_t (cudnn_graph.h)
DEFAULT_MATH = 0
TENSOR_OP_MATH = 1
TENSOR_OP_MATH_ALLOW_CONVERSION = 2
FMA_MATH = 3
# cudnnConvolutionMode_t (cudnn_graph.h)
CONVOLUTION = 0
CROSS_CORRELATION = 1
# cudnnDeterminism_t (cudnn_ops.h)
NON_DETERMINISTIC = 0
DETERMINISTIC = 1
# cudnnConvolutionFwdAlgo_t (cudnn_ops.h)
FWD_ALGO_IMPLICIT_GEMM = 0
FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1
FWD_ALGO_GEMM = 2
FWD_ALGO_DIRECT = 3
FWD_ALGO_FFT = 4
FWD_ALGO_FFT_TILING = 5
FWD_ALGO_WINOGRAD = 6
FWD_ALGO_WINOGRAD_NONFUSED = 7
# cudnnConvolutionBwdDataAlgo_t (cudnn_ops.h)
BWD_DATA_ALGO_0 = 0
BWD_DATA_ALGO_1 = 1
BWD_DATA_ALGO_FFT = 2
BWD_DATA_ALGO_FFT_TILING = 3
BWD_DATA_ALGO_WINOGRAD = 4
BWD_DATA_ALGO_WINOGRAD_NONFUSED = 5
# cudnnConvolutionBwdFilterAlgo_t (cudnn_ops.h)
BWD_FILTER_ALGO_0 = 0
BWD_FILTER_ALGO_1 = 1
BWD_FILTER_ALGO_FFT = 2
BWD_FILTER_ALGO_3 = 3
BWD_FILTER_ALGO_WINOGRAD = 4
BWD_FILTER_ALGO_WINOGRAD_NONFUSED = 5
BWD_FILTER_ALGO_FFT_TILING = 6

_DATA_TYPES = {np.dtype(np.float32): DATA_FLOAT, np.dtype(np.float64): DATA_DOUBLE, np.dtype(np.float16): DATA_HALF,
               BFLOAT16: DATA_BFLOAT16}


class AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (cudnn_cnn.h): the three share this layout."""

    _fields_ = [
        ("algo", ctypes.c_int),
        ("status", ctypes.c_int),
        ("time", ctypes.c_float),
        ("memory", ctypes.c_size_t),
        ("determinism", ctypes.c_int),
        ("mathType", ctypes.c_int),
        ("reserved", ctypes.c_int * 3),
    ]


# --------------------------------------------------------------------------- function table

_p = ctypes.c_void_p  # handles, descriptors, device pointers, host pointers to alpha/beta
_i = ctypes.c_int  # int and every enum
_status = ctypes.c_int  # cudnnStatus_t
_int_p = ctypes.POINTER(ctypes.c_int)
_size_p = ctypes.POINTER(ctypes.c_size_t)
_perf_p = ctypes.POINTER(AlgoPerf)

# name: (restype, argtypes), exactly as declared in cuDNN 9's headers.
FUNCTIONS: dict[str, tuple[Any, tuple[Any, ...]]] = {
    # cudnn_graph.h
    "cudnnGetVersion": (ctypes.c_size_t, ()),
    "cudnnGetErrorString": (ctypes.c_char_p, (_status,)),
    "cudnnGetLastErrorString": (None, (ctypes.c_char_p, ctypes.c_size_t)),
    "cudnnCreate": (_status, (ctypes.POINTER(_p),)),
    "cudnnDestroy": (_status, (_p,)),
    "cudnnSetStream": (_status, (_p, _p)),
    # cudnn_ops.h
    "cudnnCreateTensorDescriptor": (_status, (ctypes.POINTER(_p),)),
    "cudnnSetTensor4dDescriptor": (_status, (_p, _i, _i, _i, _i, _i, _i)),  # desc, format, dataType, n, c, h, w
    "cudnnDestroyTensorDescriptor": (_status, (_p,)),
    "cudnnCreateFilterDescriptor": (_status, (ctypes.POINTER(_p),)),
    "cudnnSetFilter4dDescriptor": (_status, (_p, _i, _i, _i, _i, _i, _i)),  # desc, dataType, format, k, c, h, w
    "cudnnDestroyFilterDescriptor": (_status, (_p,)),
    "cudnnAddTensor": (_status, (_p, _p, _p, _p, _p, _p, _p)),  # handle, alpha, aDesc, A, beta, cDesc, C
    # cudnn_cnn.h
    "cudnnCreateConvolutionDescriptor": (_status, (ctypes.POINTER(_p),)),
    "cudnnDestroyConvolutionDescriptor": (_status, (_p,)),
    # desc, pad_h, pad_w, u, v, dilation_h, dilation_w, mode, computeType
    "cudnnSetConvolution2dDescriptor": (_status, (_p, _i, _i, _i, _i, _i, _i, _i, _i)),
    "cudnnSetConvolutionGroupCount": (_status, (_p, _i)),
    "cudnnSetConvolutionMathType": (_status, (_p, _i)),
    # convDesc, inputTensorDesc, filterDesc, *n, *c, *h, *w
    "cudnnGetConvolution2dForwardOutputDim": (_status, (_p, _p, _p, _int_p, _int_p, _int_p, _int_p)),
    "cudnnGetConvolutionForwardAlgorithmMaxCount": (_status, (_p, _int_p)),
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": (_status, (_p, _int_p)),
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": (_status, (_p, _int_p)),
    # handle, xDesc, wDesc, convDesc, yDesc, requestedAlgoCount, *returnedAlgoCount, *perfResults
    "cudnnGetConvolutionForwardAlgorithm_v7": (_status, (_p, _p, _p, _p, _p, _i, _int_p, _perf_p)),
    # handle, wDesc, dyDesc, convDesc, dxDesc, requestedAlgoCount, *returnedAlgoCount, *perfResults
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": (_status, (_p, _p, _p, _p, _p, _i, _int_p, _perf_p)),
    # handle, xDesc, dyDesc, convDesc, dwDesc, requestedAlgoCount, *returnedAlgoCount, *perfResults
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": (_status, (_p, _p, _p, _p, _p, _i, _int_p, _perf_p)),
    # handle, xDesc, wDesc, convDesc, yDesc, algo, *sizeInBytes
    "cudnnGetConvolutionForwardWorkspaceSize": (_status, (_p, _p, _p, _p, _p, _i, _size_p)),
    # handle, wDesc, dyDesc, convDesc, dxDesc, algo, *sizeInBytes
    "cudnnGetConvolutionBackwardDataWorkspaceSize": (_status, (_p, _p, _p, _p, _p, _i, _size_p)),
    # handle, xDesc, dyDesc, convDesc, dwDesc, algo, *sizeInBytes
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": (_status, (_p, _p, _p, _p, _p, _i, _size_p)),
    # handle, alpha, xDesc, x, wDesc, w, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, yDesc, y
    "cudnnConvolutionForward": (_status, (_p, _p, _p, _p, _p, _p, _p, _i, _p, ctypes.c_size_t, _p, _p, _p)),
    # handle, alpha, wDesc, w, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dxDesc, dx
    "cudnnConvolutionBackwardData": (_status, (_p, _p, _p, _p, _p, _p, _p, _i, _p, ctypes.c_size_t, _p, _p, _p)),
    # handle, alpha, xDesc, x, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dwDesc, dw
    "cudnnConvolutionBackwardFilter": (_status, (_p, _p, _p, _p, _p, _p, _p, _i, _p, ctypes.c_size_t, _p, _p, _p)),
}


# --------------------------------------------------------------------------- loading


class _Library:
    """The loaded front library with every function of FUNCTIONS bound and typed."""

    def __init__(self, path: str, cdll: ctypes.CDLL, preloaded: list[ctypes.CDLL]):
        self.path = path
        self.cdll = cdll
        self.preloaded = preloaded  # kept referenced so that they stay loaded
        nvlib.bind_functions(self, cdll, FUNCTIONS, LIBRARY, path)
        self.version = int(self.cudnnGetVersion())


def _wheel_folders() -> list[str]:
    """lib folders of the nvidia-cudnn wheels, without importing anything of them."""
    return nvlib.wheel_folders(("cudnn/lib", "cu13/lib", "cu12/lib"), SONAME)


def candidates() -> list[str]:
    """Where the library is looked for, in order: paths (a folder's libcudnn.so.9) or bare names."""
    override = os.environ.get(ENV_PATH)
    if override:
        return [os.path.join(override, SONAME) if os.path.isdir(override) else override]
    found = [os.path.join(folder, SONAME) for folder in _wheel_folders()]
    system = ctypes.util.find_library("cudnn")
    if system:
        found.append(system)
    found.append(SONAME)
    return found


def _load(candidate: str) -> _Library:
    mode = os.RTLD_NOW | os.RTLD_GLOBAL
    preloaded = []
    folder = os.path.dirname(candidate)
    if folder:
        for sub in SUBLIBRARIES:
            sub_path = os.path.join(folder, sub)
            if os.path.isfile(sub_path):
                try:
                    preloaded.append(ctypes.CDLL(sub_path, mode=mode))
                except OSError as error:
                    raise CudaError(LIBRARY, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED", str(error)) from error
    return _Library(candidate, ctypes.CDLL(candidate, mode=mode), preloaded)


def _load_usable(candidate: str) -> _Library:
    loaded = _load(candidate)
    if loaded.version < MIN_VERSION:
        raise nvlib.Unusable(f"version {loaded.version}, cuDNN 9 or newer is needed")
    return loaded


# The loaded library, loading it on first use; CudaError where none can be loaded.
library = nvlib.Loader(LIBRARY, candidates, _load_usable,
                       f"{SONAME} in ${ENV_PATH}, the nvidia-cudnn-cu13 wheel or the system library path")


def version() -> int:
    """cudnnGetVersion(): major * 10000 + minor * 100 + patch."""
    return library().version


# --------------------------------------------------------------------------- status checks


def status_name(status: int) -> str:
    """The cudnnStatus_t name of a status code."""
    name = STATUS_NAMES.get(int(status))
    if name is None and library.loaded is not None:
        text = library.loaded.cudnnGetErrorString(int(status))
        name = text.decode(errors="replace") if text else None
    return name or f"CUDNN_STATUS_{int(status)}"


def check(status: int, function: str) -> None:
    """Raise CudaError("cuDNN", <status name>, ...) for every status but CUDNN_STATUS_SUCCESS."""
    if status == STATUS_SUCCESS:
        return
    detail = ""
    if library.loaded is not None:
        buffer = ctypes.create_string_buffer(1024)
        library.loaded.cudnnGetLastErrorString(buffer, ctypes.sizeof(buffer))
        detail = buffer.value.decode(errors="replace").strip()
    raise CudaError(LIBRARY, status_name(status), function + (f": {detail}" if detail else ""))


def _call(name: str, *args: Any) -> None:
    check(getattr(library(), name)(*args), name)


def data_type(dtype: Any) -> int:
    """The cudnnDataType_t of a NumPy float dtype (float16, bfloat16, float32, float64)."""
    try:
        return _DATA_TYPES[np.dtype(dtype)]
    except KeyError:
        raise DTypeError(f"cuDNN: dtype: expected float16, bfloat16, float32 or float64, found {np.dtype(dtype).name}") \
            from None


def compute_type(dtype: Any) -> int:
    """The cudnnDataType_t a convolution of `dtype` data computes in: float for the half dtypes
    (cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 configurations: float32 products and sums), else the data type."""
    return DATA_FLOAT if np.dtype(dtype) in HALF_DTYPES else data_type(dtype)


# Host scalars for alpha and beta: double for double data, float otherwise (cuDNN's rule).
_SCALARS = {
    (np.dtype(np.float32), 0.0): ctypes.c_float(0.0),
    (np.dtype(np.float32), 1.0): ctypes.c_float(1.0),
    (np.dtype(np.float64), 0.0): ctypes.c_double(0.0),
    (np.dtype(np.float64), 1.0): ctypes.c_double(1.0),
}


def scalar(dtype: Any, value: float) -> int:
    """A host pointer to alpha or beta (0 or 1) of the type cuDNN reads for `dtype` data (float for
    the half dtypes)."""
    dtype = np.dtype(dtype)
    if dtype in HALF_DTYPES:
        dtype = np.dtype(np.float32)
    return ctypes.addressof(_SCALARS[(dtype, float(value))])


# --------------------------------------------------------------------------- handles


def create_handle() -> int:
    """cudnnCreate on the current device; the handle as an integer."""
    handle = ctypes.c_void_p()
    _call("cudnnCreate", ctypes.byref(handle))
    return int(handle.value)


def destroy_handle(handle: int) -> None:
    _call("cudnnDestroy", handle)


def set_stream(handle: int, stream_ptr: int) -> None:
    """Bind the handle to a CUDA stream: every later call on it enqueues there."""
    _call("cudnnSetStream", handle, stream_ptr)


# --------------------------------------------------------------------------- descriptors

_LIVE = {"tensor": 0, "filter": 0, "convolution": 0}
_LIVE_LOCK = threading.Lock()


def live_descriptors() -> dict[str, int]:
    """How many descriptors of each kind exist and are not destroyed yet."""
    with _LIVE_LOCK:
        return dict(_LIVE)


class _Descriptor:
    """Owns one cuDNN descriptor from creation until destroy() (idempotent)."""

    kind = ""
    _create = ""
    _destroy = ""

    def __init__(self) -> None:
        pointer = ctypes.c_void_p()
        _call(self._create, ctypes.byref(pointer))
        self.ptr: int | None = int(pointer.value)
        with _LIVE_LOCK:
            _LIVE[self.kind] += 1

    def _configure(self, name: str, *args: Any) -> None:
        """A set-call right after creation; on failure the descriptor is destroyed before raising."""
        try:
            _call(name, self.ptr, *args)
        except BaseException:
            self.destroy()
            raise

    def destroy(self) -> None:
        if self.ptr is None:
            return
        pointer, self.ptr = self.ptr, None
        with _LIVE_LOCK:
            _LIVE[self.kind] -= 1
        _call(self._destroy, pointer)

    @property
    def alive(self) -> bool:
        return self.ptr is not None


class TensorDescriptor(_Descriptor):
    """A packed NCHW 4-D tensor of float32 or float64."""

    kind = "tensor"
    _create = "cudnnCreateTensorDescriptor"
    _destroy = "cudnnDestroyTensorDescriptor"

    def __init__(self, dims: Sequence[int], dtype: Any):
        n, c, h, w = (int(d) for d in dims)
        kind = data_type(dtype)
        super().__init__()
        self._configure("cudnnSetTensor4dDescriptor", TENSOR_NCHW, kind, n, c, h, w)
        self.dims = (n, c, h, w)


class FilterDescriptor(_Descriptor):
    """A packed (K, C/groups, kh, kw) filter of float32 or float64."""

    kind = "filter"
    _create = "cudnnCreateFilterDescriptor"
    _destroy = "cudnnDestroyFilterDescriptor"

    def __init__(self, dims: Sequence[int], dtype: Any):
        k, c, h, w = (int(d) for d in dims)
        kind = data_type(dtype)
        super().__init__()
        self._configure("cudnnSetFilter4dDescriptor", kind, TENSOR_NCHW, k, c, h, w)
        self.dims = (k, c, h, w)


class ConvolutionDescriptor(_Descriptor):
    """A 2-D cross-correlation (PyTorch's conv2d) computed in the data type (float for half data),
    FMA math (no TF32) until find_algorithm picks an algorithm's math type."""

    kind = "convolution"
    _create = "cudnnCreateConvolutionDescriptor"
    _destroy = "cudnnDestroyConvolutionDescriptor"

    def __init__(self, padding: Sequence[int], stride: Sequence[int], dilation: Sequence[int], groups: int,
                 dtype: Any):
        kind = compute_type(dtype)
        super().__init__()
        (pad_h, pad_w), (stride_h, stride_w), (dilation_h, dilation_w) = padding, stride, dilation
        self._configure("cudnnSetConvolution2dDescriptor", int(pad_h), int(pad_w), int(stride_h), int(stride_w),
                        int(dilation_h), int(dilation_w), CROSS_CORRELATION, kind)
        self._configure("cudnnSetConvolutionGroupCount", int(groups))
        self._configure("cudnnSetConvolutionMathType", FMA_MATH)
        self.math_type = FMA_MATH

    def set_math_type(self, math_type: int) -> None:
        if math_type != self.math_type:
            _call("cudnnSetConvolutionMathType", self.ptr, int(math_type))
            self.math_type = math_type


def convolution_output_dims(conv: ConvolutionDescriptor, x: TensorDescriptor, w: FilterDescriptor) -> tuple[int, ...]:
    """cuDNN's own output dims for a convolution (a cross-check of the shape formula)."""
    n, c, h, wd = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _call("cudnnGetConvolution2dForwardOutputDim", conv.ptr, x.ptr, w.ptr,
          ctypes.byref(n), ctypes.byref(c), ctypes.byref(h), ctypes.byref(wd))
    return (n.value, c.value, h.value, wd.value)


# --------------------------------------------------------------------------- algorithms


@dataclass(frozen=True)
class Algorithm:
    """An algorithm picked for one direction: its enum value, math type and workspace bytes."""

    algo: int
    math_type: int
    workspace: int


# Algorithms that form plain sums of products (no FFT, no Winograd transforms): on values whose
# partial sums are exact (the conformance cases), every such algorithm gives the exact result.
EXACT_FWD_ALGOS = (FWD_ALGO_IMPLICIT_GEMM, FWD_ALGO_IMPLICIT_PRECOMP_GEMM, FWD_ALGO_GEMM, FWD_ALGO_DIRECT)
EXACT_BWD_DATA_ALGOS = (BWD_DATA_ALGO_0, BWD_DATA_ALGO_1)
EXACT_BWD_FILTER_ALGOS = (BWD_FILTER_ALGO_0, BWD_FILTER_ALGO_1, BWD_FILTER_ALGO_3)

_DIRECTIONS = {
    # direction: (max-count function, heuristics, workspace size, allowed algorithms, fallback)
    "forward": ("cudnnGetConvolutionForwardAlgorithmMaxCount", "cudnnGetConvolutionForwardAlgorithm_v7",
                "cudnnGetConvolutionForwardWorkspaceSize", EXACT_FWD_ALGOS, FWD_ALGO_IMPLICIT_GEMM),
    "backward_data": ("cudnnGetConvolutionBackwardDataAlgorithmMaxCount",
                      "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                      "cudnnGetConvolutionBackwardDataWorkspaceSize", EXACT_BWD_DATA_ALGOS, BWD_DATA_ALGO_1),
    "backward_filter": ("cudnnGetConvolutionBackwardFilterAlgorithmMaxCount",
                        "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                        "cudnnGetConvolutionBackwardFilterWorkspaceSize", EXACT_BWD_FILTER_ALGOS, BWD_FILTER_ALGO_1),
}


def _workspace_size(function: str, handle: int, descriptors: Sequence[int], algo: int) -> int | None:
    size = ctypes.c_size_t()
    status = getattr(library(), function)(handle, *descriptors, algo, ctypes.byref(size))
    if status == STATUS_SUCCESS:
        return int(size.value)
    if STATUS_NAMES.get(status, "").startswith("CUDNN_STATUS_NOT_SUPPORTED"):
        return None  # this algorithm cannot run this convolution: try the next one
    check(status, function)
    return None


# The math types an algorithm may run in where tensor cores are allowed (half data; float32 with TF32
# asked for). Never TENSOR_OP_MATH_ALLOW_CONVERSION: it would round float32 data to float16.
TENSOR_MATH = (TENSOR_OP_MATH, DEFAULT_MATH, FMA_MATH)


def find_algorithm(direction: str, handle: int, descriptors: Sequence[_Descriptor], conv: ConvolutionDescriptor,
                   dtype: Any, workspace_limit: int, preferred: int | None = None,
                   tensor_ops: bool = False) -> Algorithm:
    """The fastest deterministic, sum-of-products algorithm for a direction by cuDNN's heuristics,
    or `preferred` (in FMA math) where given, supported and its workspace fits.

    `preferred` exists because the v7 heuristics rank by device time alone: on the H200 they put
    IMPLICIT_PRECOMP_GEMM first, whose per-call host cost is about twice IMPLICIT_GEMM's
    (docs/performance.md#implicit_gemm-bound). conv_2d prefers IMPLICIT_GEMM only for forwards below
    conv_2d.plan.IMPLICIT_GEMM_BELOW_FLOPS, where both take a few microseconds of device time.

    Heuristics work from the descriptors alone (cudnnGetConvolution*Algorithm_v7), so no user
    buffer is touched (never the *Find*Ex functions). `descriptors` are the two tensor/filter
    descriptors and the result's, in the order of that direction's v7 call: forward (x, w, y),
    backward_data (w, dy, dx), backward_filter (x, dy, dw). float32 keeps FMA math only (no TF32)
    unless tensor_ops: then (half data, or float32 with TF32 allowed) the heuristics are asked in
    TENSOR_OP_MATH and `preferred` is not used (its FMA math would leave the tensor cores idle).
    """
    max_count_function, heuristics, size_function, allowed, fallback = _DIRECTIONS[direction]
    lib = library()
    a, b, c = (d.ptr for d in descriptors)
    ordered = (a, b, conv.ptr, c)
    if preferred is not None and not tensor_ops:
        if preferred not in allowed:
            raise ValueError(f"cuDNN: {direction} algorithm {preferred} is not among the exact ones {allowed}")
        conv.set_math_type(FMA_MATH)
        size = _workspace_size(size_function, handle, ordered, preferred)
        if size is not None and size <= workspace_limit:
            return Algorithm(int(preferred), FMA_MATH, size)
    count = ctypes.c_int()
    check(getattr(lib, max_count_function)(handle, ctypes.byref(count)), max_count_function)
    results = (AlgoPerf * max(count.value, 1))()
    returned = ctypes.c_int()
    conv.set_math_type(TENSOR_OP_MATH if tensor_ops else FMA_MATH)
    check(getattr(lib, heuristics)(handle, *ordered, len(results), ctypes.byref(returned), results), heuristics)
    if tensor_ops:
        allowed_math = TENSOR_MATH
    else:
        allowed_math = (FMA_MATH,) if np.dtype(dtype) == np.float32 else (FMA_MATH, DEFAULT_MATH)
    for perf in results[: returned.value]:
        if perf.status != STATUS_SUCCESS or perf.determinism != DETERMINISTIC:
            continue
        if perf.algo not in allowed or perf.mathType not in allowed_math:
            continue
        conv.set_math_type(perf.mathType)
        size = _workspace_size(size_function, handle, ordered, perf.algo)
        if size is not None and size <= workspace_limit:
            conv.set_math_type(FMA_MATH)
            return Algorithm(int(perf.algo), int(perf.mathType), size)
    # The heuristics offered nothing usable: the deterministic implicit-GEMM algorithm, as PyTorch's
    # deterministic mode picks, in FMA math.
    conv.set_math_type(FMA_MATH)
    size = _workspace_size(size_function, handle, ordered, fallback)
    if size is None:
        raise CudaError(LIBRARY, "CUDNN_STATUS_NOT_SUPPORTED",
                        f"no deterministic {direction} convolution algorithm for these shapes")
    return Algorithm(fallback, FMA_MATH, size)


# --------------------------------------------------------------------------- operations
# Pointers are integers (CuPy's array.data.ptr); alpha and beta come from scalar().


def convolution_forward(handle: int, alpha: int, x: TensorDescriptor, x_ptr: int, w: FilterDescriptor, w_ptr: int,
                        conv: ConvolutionDescriptor, algorithm: Algorithm, workspace_ptr: int, workspace_size: int,
                        beta: int, y: TensorDescriptor, y_ptr: int) -> None:
    """y = alpha * conv(x, w) + beta * y, enqueued on the handle's stream."""
    conv.set_math_type(algorithm.math_type)
    _call("cudnnConvolutionForward", handle, alpha, x.ptr, x_ptr, w.ptr, w_ptr, conv.ptr, algorithm.algo,
          workspace_ptr, workspace_size, beta, y.ptr, y_ptr)


def convolution_backward_data(handle: int, alpha: int, w: FilterDescriptor, w_ptr: int, dy: TensorDescriptor,
                              dy_ptr: int, conv: ConvolutionDescriptor, algorithm: Algorithm, workspace_ptr: int,
                              workspace_size: int, beta: int, dx: TensorDescriptor, dx_ptr: int) -> None:
    """dx = alpha * conv_transpose(dy, w) + beta * dx, enqueued on the handle's stream."""
    conv.set_math_type(algorithm.math_type)
    _call("cudnnConvolutionBackwardData", handle, alpha, w.ptr, w_ptr, dy.ptr, dy_ptr, conv.ptr, algorithm.algo,
          workspace_ptr, workspace_size, beta, dx.ptr, dx_ptr)


def convolution_backward_filter(handle: int, alpha: int, x: TensorDescriptor, x_ptr: int, dy: TensorDescriptor,
                                dy_ptr: int, conv: ConvolutionDescriptor, algorithm: Algorithm, workspace_ptr: int,
                                workspace_size: int, beta: int, dw: FilterDescriptor, dw_ptr: int) -> None:
    """dw = alpha * correlate(x, dy) + beta * dw, enqueued on the handle's stream."""
    conv.set_math_type(algorithm.math_type)
    _call("cudnnConvolutionBackwardFilter", handle, alpha, x.ptr, x_ptr, dy.ptr, dy_ptr, conv.ptr, algorithm.algo,
          workspace_ptr, workspace_size, beta, dw.ptr, dw_ptr)


def add_tensor(handle: int, alpha: int, a: TensorDescriptor, a_ptr: int, beta: int, c: TensorDescriptor,
               c_ptr: int) -> None:
    """C = alpha * A + beta * C with A broadcast over C's dims of size 1 in A (a bias of (1, K, 1, 1))."""
    _call("cudnnAddTensor", handle, alpha, a.ptr, a_ptr, beta, c.ptr, c_ptr)
