"""`--backend c:PATH`: a shared library of the C ABI of kernels_backend.h (beside this file), loaded
with ctypes. Each kb_<op>_forward / kb_<op>_backward it exports is an op direction it supports; the
arguments are the op's tensors in the order kernels.registry declares them, as raw pointers with
their shapes, strides (in elements) and dtype codes; attrs and options go as JSON."""

from __future__ import annotations

import ctypes
import json
import os
from typing import Any

import numpy as np

from kernels.registry import OPS
from kernels.runtime.core import BFLOAT16, TensorShape

from ..case import attrs_to_jsonable
from . import Backend, Unsupported, running_statistics

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels_backend.h")
ABI_VERSION = 1
OK, ERROR, UNSUPPORTED = 0, 1, 2
# enum kb_dtype, in its order.
DTYPES = [np.dtype(name) for name in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                                      "uint64", "float16")] + [BFLOAT16] + [
    np.dtype(name) for name in ("float32", "float64", "complex64", "complex128")]
ROLES = ("input", "weight", "output", "output_grad", "grad")  # enum kb_role
ERROR_SIZE = 4096


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64))]


class Arg(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("role", ctypes.c_int32), ("count", ctypes.c_int32),
                ("tensors", ctypes.POINTER(Tensor))]


class Call(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_int32), ("op", ctypes.c_char_p), ("attrs", ctypes.c_char_p),
                ("options", ctypes.c_char_p), ("stream", ctypes.c_void_p), ("device", ctypes.c_int32),
                ("state", ctypes.c_void_p), ("nargs", ctypes.c_int32), ("args", ctypes.POINTER(Arg)),
                ("error", ctypes.c_char_p), ("error_size", ctypes.c_size_t)]


class _Call:
    """A kb_call and everything its pointers point into, kept alive while the library runs."""

    def __init__(self, op: str, attrs: Any, options: dict, stream: Any, state: Any,
                 args: list[tuple[str, str, list[Any]]]):
        self.keep: list[Any] = []
        arg_array = (Arg * max(len(args), 1))()
        for slot, (name, role, tensors) in zip(arg_array, args):
            described = (Tensor * max(len(tensors), 1))()
            for into, tensor in zip(described, tensors):
                self._describe(into, tensor)
            slot.name, slot.role, slot.count, slot.tensors = name.encode(), ROLES.index(role), len(tensors), described
            self.keep.append(described)
        self.error = ctypes.create_string_buffer(ERROR_SIZE)
        cupy_stream = getattr(stream, "cupy_stream", None)
        self.call = Call(ABI_VERSION, op.encode(), json.dumps(attrs_to_jsonable(attrs), sort_keys=True).encode(),
                         json.dumps(options, sort_keys=True).encode(),
                         None if cupy_stream is None else cupy_stream.ptr,
                         -1 if cupy_stream is None else int(stream.device), state, len(args), arg_array,
                         ctypes.cast(self.error, ctypes.c_char_p), ERROR_SIZE)
        self.keep.append(arg_array)

    def _describe(self, into: Tensor, tensor: Any) -> None:
        """A kb_tensor of an array (NumPy or CuPy), of a TensorShape (data NULL), or of None (all NULL)."""
        if tensor is None:
            return
        dtype = np.dtype(tensor.dtype)
        if isinstance(tensor, TensorShape):  # init's: no data, C-contiguous strides
            dims = tensor.dims
            strides = tuple(int(np.prod(dims[d + 1:], dtype=np.int64)) for d in range(len(dims)))
        else:
            dims, strides = tuple(tensor.shape), tuple(s // dtype.itemsize for s in tensor.strides)
            into.data = tensor.ctypes.data if isinstance(tensor, np.ndarray) else tensor.data.ptr
        shape, stride = (ctypes.c_int64 * max(len(dims), 1))(*dims), (ctypes.c_int64 * max(len(dims), 1))(*strides)
        into.dtype, into.ndim, into.shape, into.strides = DTYPES.index(dtype), len(dims), shape, stride
        self.keep += [shape, stride]


class _State:
    """The state of one case: the library's own (kb_<op>_init's) and, for batch_norm, the running statistics."""

    def __init__(self, attrs: Any):
        self.attrs, self.pointer = attrs, None
        self.running_mean: Any = None
        self.running_var: Any = None


class _Op:
    """One op of the library: the four functions of the protocol over its kb_<op>_* entries."""

    def __init__(self, backend: CBackend, name: str):
        self.backend, self.name, self.spec = backend, name, OPS[name]
        self.entries = {direction: backend.entry(f"kb_{name}_{direction}")
                        for direction in ("forward", "backward", "init", "cleanup")}
        if self.entries["backward"] is None:
            self.backward_kernel = None  # the cases that call backward are skipped, saying so

    def _run(self, direction: str, entry: Any, stream: Any, state: Any, attrs: Any,
             args: list[tuple[str, str, list[Any]]], options: dict | None = None) -> None:
        call = _Call(self.name, attrs, options or {}, stream, None if state is None else state.pointer, args)
        if direction == "init":
            pointer = ctypes.c_void_p()
            status = entry(ctypes.byref(call.call), ctypes.byref(pointer))
            state.pointer = pointer.value
        else:
            status = entry(ctypes.byref(call.call))
        if status == OK:
            return
        message = call.error.value.decode(errors="replace") or "no message"
        where = f"kb_{self.name}_{direction}"
        if status == UNSUPPORTED:
            raise Unsupported(f"{where}: {message}")
        raise RuntimeError(f"{where} returned {status}: {message}")

    def init_kernel(self, handle: Any, attrs: Any, *shapes: Any) -> _State:
        state = _State(attrs)
        if self.entries["init"] is not None:
            listed = [(name, "input", list(shape) if isinstance(shape, (list, tuple)) else [shape])
                      for name, shape in zip(self.spec.shapes, shapes)]
            self._run("init", self.entries["init"], None, state, attrs, listed)
        return state

    def _args(self, direction: str, tensors: tuple[Any, ...]) -> list[tuple[str, str, list[Any]]]:
        return [(arg.name, arg.role, list(value) if arg.many else [value])
                for arg, value in zip(self.spec.args(direction), tensors)]

    def forward_kernel(self, stream: Any, handle: Any, state: _State, attrs: Any, *tensors: Any, **options: Any) -> None:
        args = self._args("forward", tensors)
        if self.name == "batch_norm":  # the harness's running statistics follow the declared arguments
            if state.running_mean is None:
                state.running_mean, state.running_var = running_statistics(attrs, tensors[0], stream)
            args += [("running_mean", "weight", [state.running_mean]), ("running_var", "weight", [state.running_var])]
        self._run("forward", self.entries["forward"], stream, state, attrs, args,
                  {**self.spec.forward_options, **options})

    def backward_kernel(self, stream: Any, handle: Any, state: _State, attrs: Any, *tensors: Any) -> None:
        self._run("backward", self.entries["backward"], stream, state, attrs, self._args("backward", tensors))

    def cleanup_kernel(self, handle: Any, state: _State) -> None:
        if self.entries["cleanup"] is not None and state.pointer is not None:
            self.entries["cleanup"].restype = None
            self.entries["cleanup"](ctypes.c_void_p(state.pointer))
        state.pointer = None


class CBackend(Backend):
    """A shared library of kernels_backend.h's ABI. A C library can crash the process it runs in, so the
    command line runs it in worker processes by default (isolate: a crash fails the case it hit)."""

    isolate = True

    def __init__(self, path: str):
        self.path = path
        self.name = f"c:{path}"
        try:
            self.library = ctypes.CDLL(os.path.abspath(path))
        except OSError as error:
            raise ValueError(f"cannot load {path}: {error}") from error
        version = self.entry("kb_abi_version")
        if version is None:
            raise ValueError(f"{path} exports no kb_abi_version: not a library of kernels_backend.h")
        version.restype = ctypes.c_int
        if version() != ABI_VERSION:
            raise ValueError(f"{path} is of ABI version {version()}, this harness of version {ABI_VERSION}")
        self._ops: dict[str, _Op] = {}

    def entry(self, symbol: str) -> Any:
        """The exported function `symbol`, returning int, or None where the library does not export it."""
        function = getattr(self.library, symbol, None)
        if function is not None:
            function.restype = ctypes.c_int
        return function

    def op(self, name: str) -> Any:
        if name not in self._ops and self.entry(f"kb_{name}_forward") is not None and name in OPS:
            self._ops[name] = _Op(self, name)
        return self._ops.get(name)

    def supports(self, case: Any, device: str) -> str | None:
        if self.entry(f"kb_{case.op}_forward") is None:
            return f"{self.path} exports no kb_{case.op}_forward"
        return None

    def describe(self, device: str) -> str | None:
        return f"{self.path}: ABI version {ABI_VERSION} (kernels_backend.h)"
