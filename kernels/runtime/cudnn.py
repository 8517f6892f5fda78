"""The cuDNN binding: ctypes over cuDNN 9's legacy (v7/v8-style) API, loaded on first use, and
over its backend (graph) API for one operation: a convolution's forward, backward data or backward
filter as an execution plan (ConvolutionPlan).

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

# The backend API (cudnn_graph.h; values read from cuDNN 9.19's header, not from memory).
# cudnnBackendDescriptorType_t
BACKEND_CONVOLUTION_DESCRIPTOR = 1
BACKEND_ENGINE_DESCRIPTOR = 2
BACKEND_ENGINECFG_DESCRIPTOR = 3
BACKEND_ENGINEHEUR_DESCRIPTOR = 4
BACKEND_EXECUTION_PLAN_DESCRIPTOR = 5
BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR = 10
BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR = 11
BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR = 12
BACKEND_OPERATIONGRAPH_DESCRIPTOR = 15
BACKEND_VARIANT_PACK_DESCRIPTOR = 16
BACKEND_TENSOR_DESCRIPTOR = 17
# cudnnBackendAttributeType_t
TYPE_HANDLE = 0
TYPE_DATA_TYPE = 1
TYPE_INT64 = 3
TYPE_FLOAT = 4
TYPE_DOUBLE = 5
TYPE_VOID_PTR = 6
TYPE_CONVOLUTION_MODE = 7
TYPE_HEUR_MODE = 8
TYPE_NUMERICAL_NOTE = 11
TYPE_BACKEND_DESCRIPTOR = 15
TYPE_BEHAVIOR_NOTE = 19
# cudnnBackendAttributeName_t
ATTR_CONVOLUTION_COMP_TYPE = 100
ATTR_CONVOLUTION_CONV_MODE = 101
ATTR_CONVOLUTION_DILATIONS = 102
ATTR_CONVOLUTION_FILTER_STRIDES = 103
ATTR_CONVOLUTION_POST_PADDINGS = 104
ATTR_CONVOLUTION_PRE_PADDINGS = 105
ATTR_CONVOLUTION_SPATIAL_DIMS = 106
ATTR_ENGINEHEUR_MODE = 200
ATTR_ENGINEHEUR_OPERATION_GRAPH = 201
ATTR_ENGINEHEUR_RESULTS = 202
ATTR_ENGINECFG_ENGINE = 300
ATTR_EXECUTION_PLAN_HANDLE = 400
ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401
ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402
ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA = 700
ATTR_OPERATION_CONVOLUTION_FORWARD_BETA = 701
ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC = 702
ATTR_OPERATION_CONVOLUTION_FORWARD_W = 703
ATTR_OPERATION_CONVOLUTION_FORWARD_X = 704
ATTR_OPERATION_CONVOLUTION_FORWARD_Y = 705
ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA = 706
ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA = 707
ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC = 708
ATTR_OPERATION_CONVOLUTION_BWD_DATA_W = 709
ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX = 710
ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY = 711
ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA = 712
ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA = 713
ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC = 714
ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW = 715
ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X = 716
ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY = 717
ATTR_OPERATIONGRAPH_HANDLE = 800
ATTR_OPERATIONGRAPH_OPS = 801
ATTR_TENSOR_BYTE_ALIGNMENT = 900
ATTR_TENSOR_DATA_TYPE = 901
ATTR_TENSOR_DIMENSIONS = 902
ATTR_TENSOR_STRIDES = 903
ATTR_TENSOR_UNIQUE_ID = 906
ATTR_VARIANT_PACK_UNIQUE_IDS = 1000
ATTR_VARIANT_PACK_DATA_POINTERS = 1001
ATTR_VARIANT_PACK_WORKSPACE = 1003
ATTR_ENGINE_GLOBAL_INDEX = 1301
ATTR_ENGINE_NUMERICAL_NOTE = 1303
ATTR_ENGINE_BEHAVIOR_NOTE = 1305
# cudnnBackendHeurMode_t
HEUR_MODE_FALLBACK = 2
HEUR_MODE_A = 3
# cudnnBackendNumericalNote_t
NUMERICAL_NOTE_TENSOR_CORE = 0
NUMERICAL_NOTE_DOWN_CONVERT_INPUTS = 1
NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION = 2
NUMERICAL_NOTE_FFT = 3
NUMERICAL_NOTE_NONDETERMINISTIC = 4
NUMERICAL_NOTE_WINOGRAD = 5
NUMERICAL_NOTE_WINOGRAD_TILE_4x4 = 6
NUMERICAL_NOTE_WINOGRAD_TILE_6x6 = 7
NUMERICAL_NOTE_WINOGRAD_TILE_13x13 = 8
NUMERICAL_NOTE_STRICT_NAN_PROP = 9
NUMERICAL_NOTE_TYPE_COUNT = 10
# cudnnBackendBehaviorNote_t
BEHAVIOR_NOTE_RUNTIME_COMPILATION = 0
BEHAVIOR_NOTE_TYPE_COUNT = 5

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
    # cudnnBackend*: descriptor, attributeName, attributeType (enums), elementCount (int64_t), arrays
    "cudnnBackendCreateDescriptor": (_status, (_i, ctypes.POINTER(_p))),  # descriptorType, *descriptor
    "cudnnBackendDestroyDescriptor": (_status, (_p,)),
    "cudnnBackendFinalize": (_status, (_p,)),
    # descriptor, attributeName, attributeType, elementCount, arrayOfElements
    "cudnnBackendSetAttribute": (_status, (_p, _i, _i, ctypes.c_int64, _p)),
    # descriptor, attributeName, attributeType, requestedElementCount, *elementCount, arrayOfElements
    "cudnnBackendGetAttribute": (_status, (_p, _i, _i, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), _p)),
    "cudnnBackendExecute": (_status, (_p, _p, _p)),  # handle, executionPlan, variantPack
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

_LIVE = {"tensor": 0, "filter": 0, "convolution": 0, "backend": 0}  # backend: every BackendDescriptor
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


# --------------------------------------------------------------------------- the backend (graph) API
# A convolution direction as an execution plan, built once (ConvolutionPlan): a call is then one
# cudnnBackendExecute on a variant pack (the data pointers), rebuilt only when the pointers change.
# The legacy cudnnConvolutionForward / BackwardData / BackwardFilter rebuild cuDNN 9's plan inside
# every call.

# Read when a conv_2d state is made (backend_mode): unset or empty, each cuDNN direction's execution plan
# where an engine qualifies, else the legacy call; "1", the plans or CudaError; "0", the legacy calls always.
BACKEND_ENV = "KERNELS_CUDNN_BACKEND"
BACKEND_MODES = {"": "auto", "1": "on", "0": "off"}
# The dtypes whose gradients (backward_data, backward_filter) take backend plans; the forward takes one in
# every dtype. On the H200 (cuDNN 9.19) a float32 backward-filter engine whose numerical notes named neither
# tensor cores nor inputs converted down gave TF32-like values (0.50053 for 0.5, 287 of 288 off) on the
# conformance case conv_2d/medium_wide_rows_groups2_threads, so the notes are not trusted there: float32 and
# float64 gradients keep the legacy calls, whose math type (FMA) rules tensor cores out. They cost nothing there:
# on YOLOv10x's batch-16 float32 training step, float32 gradient plans gave the same step time and the same bits
# as the legacy calls (docs/models.md, after the table of the x batch-16 training step).
GRADIENT_PLAN_DTYPES = HALF_DTYPES
# The byte alignment the plan's tensors are described with. Engines with vector loads (every tensor-core
# engine for the half dtypes) need 16; a call whose pointers (or workspace) are not all 16-byte aligned
# (a view at an odd offset) takes the legacy call instead (ConvolutionPlan.run returns False).
BACKEND_ALIGNMENT = 16
# The tensors' unique ids in a plan's graph and variant pack, by role: x the input (backward_data: its
# gradient), w the filter (backward_filter: its gradient), y the output (the backward ones: its gradient).
X_UID, W_UID, Y_UID = 1, 2, 3


@dataclass(frozen=True)
class Operation:
    """A convolution direction's backend operation: its descriptor type and the attribute names of its
    alpha, beta, convolution and the tensors in the x, w and y roles."""

    kind: int
    alpha: int
    beta: int
    conv: int
    x: int
    w: int
    y: int


OPERATIONS = {
    "forward": Operation(BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                         ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                         ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                         ATTR_OPERATION_CONVOLUTION_FORWARD_W, ATTR_OPERATION_CONVOLUTION_FORWARD_Y),
    # dx = conv_transpose(dy, w)
    "backward_data": Operation(BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                               ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                               ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                               ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY),
    # dw = correlate(x, dy)
    "backward_filter": Operation(BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                                 ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                                 ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                                 ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                                 ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY),
}

# Numerical notes that break the library's rules for a convolution: not a plain sum of products in
# the compute type, or not the same bits every run.
_REJECTED_NOTES = {
    NUMERICAL_NOTE_DOWN_CONVERT_INPUTS: "DOWN_CONVERT_INPUTS",
    NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: "REDUCED_PRECISION_REDUCTION",
    NUMERICAL_NOTE_FFT: "FFT",
    NUMERICAL_NOTE_NONDETERMINISTIC: "NONDETERMINISTIC",
    NUMERICAL_NOTE_WINOGRAD: "WINOGRAD",
    NUMERICAL_NOTE_WINOGRAD_TILE_4x4: "WINOGRAD_TILE_4x4",
    NUMERICAL_NOTE_WINOGRAD_TILE_6x6: "WINOGRAD_TILE_6x6",
    NUMERICAL_NOTE_WINOGRAD_TILE_13x13: "WINOGRAD_TILE_13x13",
}


def backend_mode(environ: Any = None) -> str:
    """What KERNELS_CUDNN_BACKEND asks of each direction a conv_2d state runs in cuDNN: "auto" (unset or
    empty: the backend plan where an engine qualifies, else the legacy call), "on" ("1": the plan, or
    CudaError where no engine qualifies) or "off" ("0": the legacy call). Any other value: ValueError,
    naming the three (a typo must not silently pick one)."""
    return nvlib.switch(BACKEND_ENV, BACKEND_MODES, environ)


def packed_strides(dims: Sequence[int]) -> tuple[int, ...]:
    """The element strides of a packed (C-contiguous) tensor: NCHW data, the KCRS filter."""
    strides, step = [], 1
    for extent in reversed(dims):
        strides.append(step)
        step *= max(int(extent), 1)
    return tuple(reversed(strides))


def engine_rejection(numerical_notes: Sequence[int], dtype: Any, tf32: bool) -> str | None:
    """Why an engine with these numerical notes may not run a convolution of `dtype` data (None: it
    may). Rejected: FFT, Winograd, nondeterministic, reduced-precision reductions, inputs converted
    down; tensor cores for float32 (TF32) unless `tf32`, and for float64. Behaviour notes are not
    looked at: runtime compilation (NVRTC, once, at init) changes no result."""
    for note in numerical_notes:
        if note in _REJECTED_NOTES:
            return _REJECTED_NOTES[note]
    if NUMERICAL_NOTE_TENSOR_CORE in numerical_notes and np.dtype(dtype) not in HALF_DTYPES:
        if not (tf32 and np.dtype(dtype) == np.float32):
            return "TENSOR_CORE"
    return None


def aligned(alignment: int, *pointers: int) -> bool:
    """Whether every pointer is a multiple of `alignment` bytes (a power of two)."""
    mask = alignment - 1
    return not any(int(pointer) & mask for pointer in pointers)


class BackendDescriptor:
    """Owns one cudnnBackendDescriptor_t from creation until destroy() (idempotent); counted in
    live_descriptors()["backend"]."""

    def __init__(self, kind: int):
        pointer = ctypes.c_void_p()
        _call("cudnnBackendCreateDescriptor", int(kind), ctypes.byref(pointer))
        self.kind = int(kind)
        self.ptr: int | None = int(pointer.value)
        with _LIVE_LOCK:
            _LIVE["backend"] += 1

    def set(self, name: int, kind: int, ctype: Any, values: Sequence[Any]) -> None:
        """cudnnBackendSetAttribute with `values` as an array of `ctype`."""
        array = (ctype * len(values))(*values)
        _call("cudnnBackendSetAttribute", self.ptr, int(name), int(kind), len(values), ctypes.cast(array, _p))

    def set_descriptors(self, name: int, descriptors: Sequence["BackendDescriptor"]) -> None:
        self.set(name, TYPE_BACKEND_DESCRIPTOR, _p, [d.ptr for d in descriptors])

    def get(self, name: int, kind: int, ctype: Any, count: int) -> list[Any]:
        """cudnnBackendGetAttribute of at most `count` elements of `ctype`: the elements returned."""
        array = (ctype * max(count, 1))()
        returned = ctypes.c_int64()
        _call("cudnnBackendGetAttribute", self.ptr, int(name), int(kind), count, ctypes.byref(returned),
              ctypes.cast(array, _p))
        return list(array[: min(returned.value, count)])

    def count(self, name: int, kind: int) -> int:
        """How many elements an attribute holds (cudnnBackendGetAttribute with none requested)."""
        returned = ctypes.c_int64()
        _call("cudnnBackendGetAttribute", self.ptr, int(name), int(kind), 0, ctypes.byref(returned), None)
        return int(returned.value)

    def get_descriptors(self, name: int, descriptors: Sequence["BackendDescriptor"]) -> int:
        """Fill descriptors made by the caller (cuDNN's rule for descriptor-valued attributes); how many
        it filled."""
        array = (_p * max(len(descriptors), 1))(*[d.ptr for d in descriptors])
        returned = ctypes.c_int64()
        _call("cudnnBackendGetAttribute", self.ptr, int(name), TYPE_BACKEND_DESCRIPTOR, len(descriptors),
              ctypes.byref(returned), ctypes.cast(array, _p))
        return min(int(returned.value), len(descriptors))

    def finalize(self) -> None:
        _call("cudnnBackendFinalize", self.ptr)

    def try_finalize(self) -> int:
        """cudnnBackendFinalize's status, not raised (an engine config that cannot run these shapes)."""
        return int(library().cudnnBackendFinalize(self.ptr))

    def destroy(self) -> None:
        if self.ptr is None:
            return
        pointer, self.ptr = self.ptr, None
        with _LIVE_LOCK:
            _LIVE["backend"] -= 1
        _call("cudnnBackendDestroyDescriptor", pointer)

    @property
    def alive(self) -> bool:
        return self.ptr is not None


@dataclass(frozen=True)
class EngineChoice:
    """One engine config the heuristics offered: its engine's global index, the heuristics mode that
    offered it, and why it was passed over (None: the chosen one)."""

    engine: int
    mode: int
    rejected: str | None


def tensor_descriptor(uid: int, dims: Sequence[int], dtype: Any, alignment: int = BACKEND_ALIGNMENT,
                      owner: list[BackendDescriptor] | None = None) -> BackendDescriptor:
    """A finalized backend tensor: packed (C-contiguous) `dims` of `dtype` data, unique id `uid`.
    Appended to `owner` as soon as it is made (whoever owns the list destroys it on failure)."""
    tensor = BackendDescriptor(BACKEND_TENSOR_DESCRIPTOR)
    if owner is not None:
        owner.append(tensor)
    try:
        tensor.set(ATTR_TENSOR_DATA_TYPE, TYPE_DATA_TYPE, _i, [data_type(dtype)])
        tensor.set(ATTR_TENSOR_DIMENSIONS, TYPE_INT64, ctypes.c_int64, [int(d) for d in dims])
        tensor.set(ATTR_TENSOR_STRIDES, TYPE_INT64, ctypes.c_int64, packed_strides(dims))
        tensor.set(ATTR_TENSOR_UNIQUE_ID, TYPE_INT64, ctypes.c_int64, [int(uid)])
        tensor.set(ATTR_TENSOR_BYTE_ALIGNMENT, TYPE_INT64, ctypes.c_int64, [int(alignment)])
        tensor.finalize()
    except BaseException:
        if owner is None:
            tensor.destroy()
        raise
    return tensor


def convolution_descriptor(padding: Sequence[int], stride: Sequence[int], dilation: Sequence[int], dtype: Any,
                           owner: list[BackendDescriptor] | None = None) -> BackendDescriptor:
    """A finalized backend 2-D cross-correlation computing in compute_type(dtype), symmetric padding."""
    conv = BackendDescriptor(BACKEND_CONVOLUTION_DESCRIPTOR)
    if owner is not None:
        owner.append(conv)
    try:
        int64 = ctypes.c_int64
        conv.set(ATTR_CONVOLUTION_COMP_TYPE, TYPE_DATA_TYPE, _i, [compute_type(dtype)])
        conv.set(ATTR_CONVOLUTION_CONV_MODE, TYPE_CONVOLUTION_MODE, _i, [CROSS_CORRELATION])
        conv.set(ATTR_CONVOLUTION_SPATIAL_DIMS, TYPE_INT64, int64, [2])
        conv.set(ATTR_CONVOLUTION_DILATIONS, TYPE_INT64, int64, [int(v) for v in dilation])
        conv.set(ATTR_CONVOLUTION_FILTER_STRIDES, TYPE_INT64, int64, [int(v) for v in stride])
        conv.set(ATTR_CONVOLUTION_PRE_PADDINGS, TYPE_INT64, int64, [int(v) for v in padding])
        conv.set(ATTR_CONVOLUTION_POST_PADDINGS, TYPE_INT64, int64, [int(v) for v in padding])
        conv.finalize()
    except BaseException:
        if owner is None:
            conv.destroy()
        raise
    return conv


def _operation(direction: str) -> Operation:
    try:
        return OPERATIONS[direction]
    except KeyError:
        raise ValueError(f"cuDNN: direction: expected forward, backward_data or backward_filter, found {direction!r}") \
            from None


def operation_descriptor(direction: str, x: BackendDescriptor, w: BackendDescriptor, y: BackendDescriptor,
                         conv: BackendDescriptor, dtype: Any,
                         owner: list[BackendDescriptor] | None = None) -> BackendDescriptor:
    """A finalized convolution operation of `direction` (alpha 1, beta 0) on the tensors in the x, w and y
    roles (see X_UID), appended to `owner` as soon as it is made. ValueError for another direction."""
    operation = _operation(direction)
    op = BackendDescriptor(operation.kind)
    if owner is not None:
        owner.append(op)
    try:
        op.set_descriptors(operation.x, [x])
        op.set_descriptors(operation.w, [w])
        op.set_descriptors(operation.y, [y])
        op.set_descriptors(operation.conv, [conv])
        # alpha and beta: double for double data, float otherwise (the half dtypes compute in float)
        scalar_type, scalar_ctype = (TYPE_DOUBLE, ctypes.c_double) if np.dtype(dtype) == np.float64 else \
            (TYPE_FLOAT, ctypes.c_float)
        op.set(operation.alpha, scalar_type, scalar_ctype, [1.0])
        op.set(operation.beta, scalar_type, scalar_ctype, [0.0])
        op.finalize()
    except BaseException:
        if owner is None:
            op.destroy()
        raise
    return op


class ConvolutionPlan:
    """One direction of a convolution (alpha 1, beta 0) through cuDNN's backend API: "forward"
    y = conv(x, w), "backward_data" dx = conv_transpose(dy, w), "backward_filter" dw = correlate(x, dy).
    The operation graph, the engine and the execution plan are built once here; run() is one
    cudnnBackendExecute on a variant pack kept for the last (x, w, y, workspace) pointers, given by
    role whatever the direction (X_UID).

    The engine: the first config of the heuristics (mode A, then the fallback list) whose engine's
    numerical notes engine_rejection accepts, whose plan finalizes for these shapes and whose
    workspace fits `workspace_limit`; CudaError("cuDNN", "CUDNN_STATUS_NOT_SUPPORTED") where none
    does, naming the direction and each config passed over. Every descriptor made is owned until
    destroy(); a failure here destroys them before raising. `x_dims`, `w_dims` and `y_dims` are the
    input's, the filter's and the output's in every direction. ValueError for another direction.
    """

    def __init__(self, direction: str, handle: int, dtype: Any, x_dims: Sequence[int], w_dims: Sequence[int],
                 y_dims: Sequence[int], padding: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                 tf32: bool, workspace_limit: int):
        _operation(direction)  # refused before anything is made
        self.direction = direction
        self.handle = int(handle)  # the cuDNN handle the graph and plan were built with
        self.dtype = np.dtype(dtype)
        self._owned: list[BackendDescriptor] = []
        self.plan: BackendDescriptor | None = None
        self.pack: BackendDescriptor | None = None
        self.workspace = 0
        self.engine = -1  # the chosen engine's global index
        self.choices: list[EngineChoice] = []
        self._key: tuple[int, ...] | None = None
        self.executions = 0  # cudnnBackendExecute calls made
        self.packs = 0  # variant packs built
        try:
            graph = self._graph(x_dims, w_dims, y_dims, padding, stride, dilation)
            self._choose(graph, tf32, int(workspace_limit))
            self._execute = library().cudnnBackendExecute
        except BaseException:
            self.destroy()
            raise

    def _make(self, kind: int) -> BackendDescriptor:
        descriptor = BackendDescriptor(kind)
        self._owned.append(descriptor)
        return descriptor

    def _graph(self, x_dims: Sequence[int], w_dims: Sequence[int], y_dims: Sequence[int], padding: Sequence[int],
               stride: Sequence[int], dilation: Sequence[int]) -> BackendDescriptor:
        x, w, y = (tensor_descriptor(uid, dims, self.dtype, owner=self._owned)
                   for uid, dims in ((X_UID, x_dims), (W_UID, w_dims), (Y_UID, y_dims)))
        conv = convolution_descriptor(padding, stride, dilation, self.dtype, owner=self._owned)
        op = operation_descriptor(self.direction, x, w, y, conv, self.dtype, owner=self._owned)
        graph = self._make(BACKEND_OPERATIONGRAPH_DESCRIPTOR)
        graph.set_descriptors(ATTR_OPERATIONGRAPH_OPS, [op])
        graph.set(ATTR_OPERATIONGRAPH_HANDLE, TYPE_HANDLE, _p, [self.handle])
        graph.finalize()
        return graph

    def _configs(self, graph: BackendDescriptor, mode: int) -> list[BackendDescriptor]:
        """The engine configs the heuristics of `mode` offer, best first (none where that mode has none
        for this graph)."""
        heuristics = self._make(BACKEND_ENGINEHEUR_DESCRIPTOR)
        heuristics.set_descriptors(ATTR_ENGINEHEUR_OPERATION_GRAPH, [graph])
        heuristics.set(ATTR_ENGINEHEUR_MODE, TYPE_HEUR_MODE, _i, [mode])
        status = heuristics.try_finalize()
        if status != STATUS_SUCCESS:
            self.choices.append(EngineChoice(-1, mode, f"heuristics: {status_name(status)}"))
            return []
        count = heuristics.count(ATTR_ENGINEHEUR_RESULTS, TYPE_BACKEND_DESCRIPTOR)
        configs = [self._make(BACKEND_ENGINECFG_DESCRIPTOR) for _ in range(count)]
        filled = heuristics.get_descriptors(ATTR_ENGINEHEUR_RESULTS, configs) if configs else 0
        return configs[:filled]

    def _choose(self, graph: BackendDescriptor, tf32: bool, workspace_limit: int) -> None:
        int64 = ctypes.c_int64
        for mode in (HEUR_MODE_A, HEUR_MODE_FALLBACK):
            for config in self._configs(graph, mode):
                engine = self._make(BACKEND_ENGINE_DESCRIPTOR)
                config.get_descriptors(ATTR_ENGINECFG_ENGINE, [engine])
                index = engine.get(ATTR_ENGINE_GLOBAL_INDEX, TYPE_INT64, int64, 1)
                index = int(index[0]) if index else -1
                notes = engine.get(ATTR_ENGINE_NUMERICAL_NOTE, TYPE_NUMERICAL_NOTE, _i, NUMERICAL_NOTE_TYPE_COUNT)
                rejected = engine_rejection(notes, self.dtype, tf32)
                if rejected is None:
                    plan = self._make(BACKEND_EXECUTION_PLAN_DESCRIPTOR)
                    plan.set(ATTR_EXECUTION_PLAN_HANDLE, TYPE_HANDLE, _p, [self.handle])
                    plan.set_descriptors(ATTR_EXECUTION_PLAN_ENGINE_CONFIG, [config])
                    status = plan.try_finalize()
                    if status != STATUS_SUCCESS:
                        rejected = f"plan: {status_name(status)}"
                    else:
                        size = plan.get(ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, TYPE_INT64, int64, 1)
                        workspace = int(size[0]) if size else 0
                        if workspace > workspace_limit:
                            rejected = f"workspace {workspace} > {workspace_limit}"
                        else:
                            self.plan, self.workspace, self.engine = plan, workspace, index
                            self.choices.append(EngineChoice(index, mode, None))
                            return
                self.choices.append(EngineChoice(index, mode, rejected))
        passed = "; ".join(f"engine {c.engine}: {c.rejected}" for c in self.choices) or "none offered"
        raise CudaError(LIBRARY, "CUDNN_STATUS_NOT_SUPPORTED",
                        f"no deterministic sum-of-products {self.direction} engine for these shapes ({passed})")

    def _variant_pack(self, key: tuple[int, int, int, int]) -> None:
        """A finalized variant pack for (x, w, y, workspace) pointers, replacing the last one."""
        x_ptr, w_ptr, y_ptr, workspace_ptr = key
        pack = BackendDescriptor(BACKEND_VARIANT_PACK_DESCRIPTOR)
        try:  # cuDNN copies the values at each set
            pack.set(ATTR_VARIANT_PACK_UNIQUE_IDS, TYPE_INT64, ctypes.c_int64, [X_UID, W_UID, Y_UID])
            pack.set(ATTR_VARIANT_PACK_DATA_POINTERS, TYPE_VOID_PTR, _p, [x_ptr, w_ptr, y_ptr])
            pack.set(ATTR_VARIANT_PACK_WORKSPACE, TYPE_VOID_PTR, _p, [workspace_ptr])
            pack.finalize()
        except BaseException:
            pack.destroy()
            raise
        old, self.pack, self._key = self.pack, pack, key
        self.packs += 1
        if old is not None:
            old.destroy()

    def run(self, handle: int, x_ptr: int, w_ptr: int, y_ptr: int, workspace_ptr: int) -> bool:
        """Enqueue the direction's convolution on the handle's stream, the pointers given by role: forward
        (x, w, y -> written), backward_data (dx -> written, w, dy), backward_filter (x, dw -> written, dy).
        False (nothing done) where the plan cannot take this call: another cuDNN handle than the plan's,
        or a pointer not BACKEND_ALIGNMENT-aligned."""
        key = (x_ptr, w_ptr, y_ptr, workspace_ptr)
        if key != self._key:
            if handle != self.handle or not aligned(BACKEND_ALIGNMENT, *key):
                return False
            self._variant_pack(key)
        elif handle != self.handle:
            return False
        status = self._execute(handle, self.plan.ptr, self.pack.ptr)  # type: ignore[union-attr]
        if status != STATUS_SUCCESS:
            check(status, "cudnnBackendExecute")
        self.executions += 1
        return True

    def destroy(self) -> None:
        """Destroy every descriptor made (the variant pack first, then the rest newest first); the first
        failure is raised after all are destroyed."""
        errors = []
        owned = ([self.pack] if self.pack is not None else []) + self._owned[::-1]
        self.pack, self._owned, self.plan, self._key = None, [], None, None
        for descriptor in owned:
            try:
                descriptor.destroy()
            except CudaError as error:
                errors.append(error)
        if errors:
            raise errors[0]

    @property
    def alive(self) -> bool:
        return self.plan is not None
