"""Shared machinery of every op: shapes, errors, CPU streams and handles, states,
argument checks and device dispatch.

Nothing here imports CuPy; the GPU half of the machinery lives in
:mod:`kernels.runtime.gpu` and is imported only when a GPU object is used.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import math
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import ml_dtypes
import numpy as np

# --------------------------------------------------------------------------- per-thread values


def thread_local(**defaults: Any) -> threading.local:
    """A threading.local whose attributes read as `defaults` in a thread that has not set them (immutable
    values only: a default is shared by every thread). Reading one is a plain attribute lookup; the
    getattr(local, name, default) it replaces raised and caught an AttributeError in every thread that had
    not set the attribute, about 0.33 us a read, several times a GPU call (docs/performance.md#host-time-of-one-gpu-call)."""
    return type("ThreadLocal", (threading.local,), dict(defaults))()


# --------------------------------------------------------------------------- errors


class KernelError(Exception):
    """Base of every error a kernel raises on bad input or a failed library call."""


class ShapeError(KernelError):
    """A tensor's rank or dims do not fit the attrs, the state or the other tensors."""


class DTypeError(KernelError):
    """A tensor's dtype is not supported or differs from the one it must equal."""


class DeviceError(KernelError):
    """A tensor or the stream is on another device, or is not an array of it."""


class AttrsError(KernelError):
    """Attrs out of range, or attrs that differ from the ones the state was made for."""


class StateError(KernelError):
    """The state cannot serve this call: cleaned up, or a backward with no forward before it."""


class CudaError(KernelError):
    """CUDA, NVRTC, cuDNN or cuBLAS reported a failure; `status` is the library's status name."""

    def __init__(self, library: str, status: str, message: str = ""):
        self.library = library
        self.status = status
        super().__init__(f"{library} failed with {status}" + (f": {message}" if message else ""))


def fail(error: type[KernelError], op: str, argument: str, expected: str, found: Any) -> KernelError:
    """Build an error whose message names op, argument, what was expected and what was found."""
    return error(f"{op}: {argument}: expected {expected}, found {found}")


# --------------------------------------------------------------------------- shapes and dtypes

# What a kernel reads and writes: a numpy.ndarray on the CPU, a cupy.ndarray on the GPU (CuPy is
# optional, so the annotation cannot name it), C-contiguous, used in place.
Array = Any


FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# bfloat16 is ml_dtypes' NumPy dtype (the one JAX and TensorFlow use; CuPy takes it too). Its
# dtype.kind is "V", not "f": ask is_floating, never dtype.kind, whether a dtype is a float.
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
# The half-precision storage dtypes: stored in 16 bits, computed in float32 (see compute_dtype).
HALF_DTYPES = (np.dtype(np.float16), BFLOAT16)
# What the compute ops take once their half-precision code exists: half, single and double.
ALL_FLOAT_DTYPES = HALF_DTYPES + FLOAT_DTYPES


def is_floating(dtype: Any) -> bool:
    """True for every real floating dtype this library knows: float16, bfloat16, float32, float64."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == BFLOAT16


def compute_dtype(dtype: Any) -> np.dtype:
    """The dtype a kernel computes and accumulates in for tensors stored in `dtype`: float32 for
    the half dtypes (as on the GPU: each value is widened when read and rounded once when
    written), the dtype itself otherwise."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in HALF_DTYPES else dtype

# The dtypes data-movement ops accept: every NumPy numeric type and bool.
MOVABLE_DTYPES = tuple(
    np.dtype(t)
    for t in (
        np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
        np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
    )
) + (BFLOAT16,)


@dataclass(frozen=True)
class TensorShape:
    """The dims and dtype of a tensor: what `init_kernel` is told instead of data."""

    dims: tuple[int, ...]
    dtype: np.dtype

    def __init__(self, dims: Iterable[int], dtype: Any):
        dims = tuple(int(d) for d in dims)
        if any(d < 0 for d in dims):
            raise ShapeError(f"TensorShape: dims: expected non-negative sizes, found {dims}")
        try:
            dtype = np.dtype(dtype)
        except TypeError as error:
            raise DTypeError(f"TensorShape: dtype: expected a NumPy dtype, found {dtype!r}") from error
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "dtype", dtype)

    @classmethod
    def of(cls, array: Any) -> "TensorShape":
        """The shape of a NumPy or CuPy array."""
        return cls(array.shape, array.dtype)

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    def with_dims(self, dims: Iterable[int]) -> "TensorShape":
        return TensorShape(dims, self.dtype)

    def __repr__(self) -> str:
        return f"TensorShape({self.dims}, {self.dtype.name})"


def as_shape(op: str, argument: str, shape: Any) -> TensorShape:
    if not isinstance(shape, TensorShape):
        raise fail(ShapeError, op, argument, "a TensorShape", type(shape).__name__)
    return shape


def check_dtype(op: str, argument: str, shape: TensorShape, allowed: Sequence[np.dtype]) -> None:
    if shape.dtype not in allowed:
        names = ", ".join(np.dtype(d).name for d in allowed)
        raise fail(DTypeError, op, argument, f"one of {names}", shape.dtype.name)


def check_same_dtype(op: str, argument: str, shape: TensorShape, reference: TensorShape, reference_name: str) -> None:
    if shape.dtype != reference.dtype:
        raise fail(DTypeError, op, argument, f"dtype {reference.dtype.name} (as {reference_name})", shape.dtype.name)


def check_dims(op: str, argument: str, shape: TensorShape, dims: Sequence[int]) -> None:
    if shape.dims != tuple(dims):
        raise fail(ShapeError, op, argument, f"dims {tuple(dims)}", shape.dims)


def check_rank(op: str, argument: str, shape: TensorShape, rank: int | None = None, min_rank: int | None = None) -> None:
    if rank is not None and shape.rank != rank:
        raise fail(ShapeError, op, argument, f"rank {rank}", f"rank {shape.rank} {shape.dims}")
    if min_rank is not None and shape.rank < min_rank:
        raise fail(ShapeError, op, argument, f"rank >= {min_rank}", f"rank {shape.rank} {shape.dims}")


def normalize_axis(op: str, argument: str, axis: int, rank: int) -> int:
    """A negative axis counts from the end; anything but an integer (a bool, a float) or an integer outside
    [-rank, rank) is an AttrsError."""
    axis = attr_int(op, argument, axis)
    if not -rank <= axis < rank:
        raise fail(AttrsError, op, argument, f"an axis in [{-rank}, {rank})", axis)
    return axis % rank


# --------------------------------------------------------------------------- attrs


def attr_int(op: str, name: str, value: Any, minimum: int | None = None) -> int:
    """Validate an integer attr (bools refused) and return it as a Python int."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise fail(AttrsError, op, name, "an integer", repr(value))
    if minimum is not None and value < minimum:
        raise fail(AttrsError, op, name, f"an integer >= {minimum}", value)
    return int(value)


def attr_bool(op: str, name: str, value: Any) -> bool:
    """Validate a bool attr (NumPy bools too; 0 and 1 refused) and return it as a Python bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise fail(AttrsError, op, name, "a bool", repr(value))
    return bool(value)


def attr_ints(op: str, name: str, value: Any, minimum: int | None = None) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise fail(AttrsError, op, name, "a sequence of integers", repr(value))
    return tuple(attr_int(op, f"{name}[{i}]", v, minimum) for i, v in enumerate(value))


def attr_enum(op: str, name: str, value: Any, enum_type: type[enum.Enum], optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str) and value in enum_type.__members__:
        return enum_type[value]
    names = ", ".join(enum_type.__members__)
    raise fail(AttrsError, op, name, f"a {enum_type.__name__} ({names}){' or None' if optional else ''}", repr(value))


def set_attr(instance: Any, name: str, value: Any) -> None:
    """Normalize a field of a frozen attrs dataclass inside its __post_init__."""
    object.__setattr__(instance, name, value)


# --------------------------------------------------------------------------- streams, handles, states


def device_of(op: str, obj: Any, argument: str) -> Any:
    """'cpu' for a CPU stream or handle, the device ordinal for a GPU one."""
    device = getattr(obj, "device", None)
    if device is None or not hasattr(obj, "synchronize" if argument == "stream" else "close"):
        raise fail(DeviceError, op, argument, f"a kernels {argument} (cpu_{argument}() or gpu_{argument}())",
                   type(obj).__name__)
    return device


@dataclass(eq=False)
class KernelState:
    """What init_kernel made: the attrs and shapes it was given, and the device it is for.

    Ops that keep more (descriptors, saved statistics, a pre-activation) subclass it.
    """

    op: str
    attrs: Any
    device: Any  # "cpu" or a GPU ordinal
    shapes: dict[str, Any]
    closed: bool = False
    saved: dict[str, Any] = field(default_factory=dict)

    def release(self) -> None:
        """Free what the state holds; subclasses with descriptors extend it."""
        self.saved.clear()
        self.closed = True


def make_state(op: str, handle: Any, attrs: Any, attrs_type: type, state_type: type = KernelState, **shapes: Any) -> Any:
    """Check the handle and attrs and record the shapes `init_kernel` was given."""
    device = device_of(op, handle, "handle")
    if not isinstance(attrs, attrs_type):
        raise fail(AttrsError, op, "attrs", attrs_type.__name__, type(attrs).__name__)
    for name, shape in shapes.items():
        if isinstance(shape, (list, tuple)):
            if not shape:
                raise fail(ShapeError, op, name, "a non-empty list of TensorShape", "an empty list")
            for i, s in enumerate(shape):
                as_shape(op, f"{name}[{i}]", s)
        else:
            as_shape(op, name, shape)
    return state_type(op=op, attrs=attrs, device=device, shapes=shapes)


def cleanup_state(op: str, handle: Any, state: Any) -> None:
    device_of(op, handle, "handle")
    if not isinstance(state, KernelState):
        raise fail(StateError, op, "state", "a state from init_kernel", type(state).__name__)
    if not state.closed:
        state.release()


# --------------------------------------------------------------------------- argument checks


# cupy.ndarray, once _array_module has seen CuPy imported: check_tensor tells a CuPy array by its type alone.
_CUPY_ARRAY: Any = None


def _array_module(array: Any) -> str | None:
    """'numpy' or 'cupy' for an array of either, None for anything else."""
    global _CUPY_ARRAY
    if isinstance(array, np.ndarray):
        return "numpy"
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(array, cupy.ndarray):
        _CUPY_ARRAY = cupy.ndarray
        return "cupy"
    return None


def check_tensor(op: str, name: str, array: Any, expected: TensorShape, device: Any) -> None:
    """One tensor: an array of the stream's device, C-contiguous, with the expected dims and dtype.

    Each check reads the attribute that costs least: the exact type before isinstance, and for a CuPy
    array its memory's device_id and its _c_contiguous flag, not its public `device` and `flags` objects,
    which made its checks 1.0 us against 0.4 (docs/performance.md#host-time-of-one-gpu-call)."""
    kind = type(array)
    module = "numpy" if kind is np.ndarray else "cupy" if kind is _CUPY_ARRAY else _array_module(array)
    if device == "cpu":
        if module != "numpy":
            raise fail(DeviceError, op, name, "a NumPy array (CPU stream)", f"{type(array).__module__}.{type(array).__name__}")
        contiguous = array.flags.c_contiguous
    else:
        if module != "cupy":
            raise fail(DeviceError, op, name, f"a CuPy array on GPU {device}", f"{type(array).__module__}.{type(array).__name__}")
        if array.data.device_id != device:
            raise fail(DeviceError, op, name, f"an array on GPU {device}", f"GPU {array.data.device_id}")
        contiguous = array._c_contiguous
    if array.shape != expected.dims:
        raise fail(ShapeError, op, name, f"dims {expected.dims}", tuple(array.shape))
    if array.dtype != expected.dtype:
        raise fail(DTypeError, op, name, f"dtype {expected.dtype.name}", array.dtype.name)
    if not contiguous:
        raise fail(ShapeError, op, name, "a C-contiguous array (no implicit copies)", f"strides {array.strides}")


_ARRAYS_CHECKED = thread_local(on=False)


class _ArraysChecked:
    """arrays_checked()'s context manager: a class rather than a generator, as it is entered on every call
    of a plan of the functional layer (a generator's context manager cost 1.1 us, this one 0.3)."""

    __slots__ = ("previous",)

    def __enter__(self) -> None:
        self.previous = _ARRAYS_CHECKED.on
        _ARRAYS_CHECKED.on = True

    def __exit__(self, *exc: Any) -> None:
        _ARRAYS_CHECKED.on = self.previous


def arrays_checked() -> _ArraysChecked:
    """Within the block (in this thread), check_call skips its checks of each array (kind, device, dims,
    dtype, contiguity, presence; and so does batch_norm's of its state's running statistics) and keeps
    those of the stream, handle, state and attrs. For a caller that passes again arrays that an earlier
    call has checked, and that only it holds: a model's plan replays its calls on its own buffers and
    the network's parameters, which it never replaces (see Plan._run).
    A launch-bound GPU network pays the checks a few hundred times a forward, and they are more than half
    of check_call's time (docs/performance.md#array-checks-in-replays)."""
    return _ArraysChecked()


def arrays_are_checked() -> bool:
    """Whether this thread is inside arrays_checked(): an op's own checks of arrays outside check_call's
    rows (batch_norm's running statistics in its state) are skipped there too."""
    return _ARRAYS_CHECKED.on


def check_call(op: str, stream: Any, handle: Any, state: Any, attrs: Any,
               tensors: Sequence[tuple[str, Any, TensorShape | None, bool]]) -> Any:
    """Check a forward or backward call before anything is written; return the device.

    `tensors` rows are (name, array or None, expected shape, required). A None that
    is not required (a gradient the caller does not want) is skipped. Inside arrays_checked()
    the rows are not looked at.
    """
    device = device_of(op, stream, "stream")
    handle_device = device_of(op, handle, "handle")
    if handle_device != device:
        raise fail(DeviceError, op, "handle", f"a handle of the stream's device {device}", handle_device)
    if not isinstance(state, KernelState) or state.op != op:
        raise fail(StateError, op, "state", f"a state from {op}.init_kernel", type(state).__name__)
    if state.closed:
        raise fail(StateError, op, "state", "a live state", "one already cleaned up")
    if state.device != device:
        raise fail(DeviceError, op, "state", f"a state made for device {device}", state.device)
    if attrs is not state.attrs and attrs != state.attrs:
        raise fail(AttrsError, op, "attrs", f"the attrs the state was made with ({state.attrs})", attrs)
    if _ARRAYS_CHECKED.on:
        return device
    cupy_array = _CUPY_ARRAY if device != "cpu" else None
    for name, array, expected, required in tensors:
        if array is None:
            if required:
                raise fail(ShapeError, op, name, f"an array {expected}", None)
            continue
        # A CuPy array that passes, read here rather than in a call of check_tensor (a Python call a
        # row: docs/performance.md#fewer-layers-a-call); any other array, or one that fails, takes
        # check_tensor, which names what is wrong.
        if (type(array) is not cupy_array or array.data.device_id != device or not array._c_contiguous
                or array.shape != expected.dims or array.dtype != expected.dtype):
            check_tensor(op, name, array, expected, device)
    return device


_GPU_CALL_HOOKS = thread_local(hook=None, held=None)


@contextlib.contextmanager
def before_gpu_call(hook: Callable[[Any], None] | None) -> Iterator[None]:
    """Within the block, call hook(stream) in this thread right before each GPU kernel call
    enqueues its work. The conformance harness enqueues a spin kernel there (the delayed-stream
    schedule), so work that a kernel puts on any other stream runs out of order and shows."""
    previous = _GPU_CALL_HOOKS.hook
    _GPU_CALL_HOOKS.hook = hook
    try:
        yield
    finally:
        _GPU_CALL_HOOKS.hook = previous


def _is_gpu_stream(stream: Any) -> bool:
    """A GPU stream as gpu_kernel and replaying() enter it: a device ordinal and a context manager."""
    return isinstance(getattr(stream, "device", None), int) and hasattr(stream, "__enter__")


class _Replaying:
    """replaying()'s context manager, a class for the reason _ArraysChecked is: on leaving, the stream held
    before, then the stream left, then the arrays' checks as they were, as entering set them in reverse."""

    __slots__ = ("stream", "checked", "held", "entered")

    def __init__(self, stream: Any):
        self.stream = stream

    def __enter__(self) -> None:
        self.checked = _ARRAYS_CHECKED.on
        _ARRAYS_CHECKED.on = True
        self.entered = _is_gpu_stream(self.stream)
        if self.entered:
            try:
                self.stream.__enter__()
            except BaseException:
                _ARRAYS_CHECKED.on = self.checked
                raise
            self.held = _GPU_CALL_HOOKS.held
            _GPU_CALL_HOOKS.held = self.stream

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.entered:
                _GPU_CALL_HOOKS.held = self.held
                self.stream.__exit__(*exc)
        finally:
            _ARRAYS_CHECKED.on = self.checked


def replaying(stream: Any) -> _Replaying:
    """A run of calls that have all run before, on `stream`, with these very arguments (a model's plan):
    inside the block the calls' arrays are not checked again (arrays_checked), and a GPU stream is
    entered once for the run: a gpu_kernel call on it skips entering and leaving it (its device and
    CuPy's current stream are set already; the before_gpu_call hook still runs first). Nothing else may
    change the thread's current device or CuPy stream inside the block. A CPU stream is not entered."""
    return _Replaying(stream)


def gpu_kernel(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates every op's gpu_forward_kernel and gpu_backward_kernel: the call runs with its
    stream's device and its stream current (a GpuStream is a context manager that makes both
    current), so every CuPy operation, allocation and library call the kernel makes is enqueued
    on the kernels' stream, whatever stream and device the caller has current. The thread's
    before_gpu_call hook, if any, runs first. A stream that is not a GPU stream is passed through
    to the kernel, whose checks refuse it."""

    call = functools.wraps(function)(_in_stream(function))
    call.gpu_code = function  # what entry_point runs in its own frame (_in_stream)
    return call


def _in_stream(function: Callable[..., Any], public: tuple[dict[str, Any], str, str, Any, Callable[..., Any]] | None
               = None) -> Callable[..., Any]:
    """gpu_kernel's call of `function`; with `public`, (namespace, cpu_name, gpu_name, wrapper, dispatch), an op's
    public kernel from entry_point. That one sends a call on a CPU stream to the module's `cpu_name` twin, and
    runs `function` as gpu_kernel's wrapper would where the stream has an int device and the module's `gpu_name`
    is still `wrapper` (gpu_kernel's wrapper of `function`); any other call goes to dispatch(stream, *args,
    **kwargs) (a replaced GPU twin, or the error). So a public GPU call takes one Python frame above the op's
    code where an entry point calling gpu_kernel's wrapper took two (docs/performance.md#fewer-layers-a-call),
    and a CPU call as many as before."""
    hooks = _GPU_CALL_HOOKS
    namespace, cpu_name, gpu_name, wrapper, dispatch = public or (None, "", "", None, None)

    def call(stream: Any, *args: Any, **kwargs: Any) -> Any:
        if namespace is not None:
            device = getattr(stream, "device", None)
            if device == "cpu":
                return namespace[cpu_name](stream, *args, **kwargs)
            if not isinstance(device, int) or namespace[gpu_name] is not wrapper:
                return dispatch(stream, *args, **kwargs)  # type: ignore[misc]
        hook = hooks.hook
        if hooks.held is stream:  # inside replaying(stream): entered once for all
            if hook is not None:
                hook(stream)
            return function(stream, *args, **kwargs)
        # A public call's stream has an int device already: what is left of _is_gpu_stream is its __enter__.
        if not (hasattr(stream, "__enter__") if namespace is not None else _is_gpu_stream(stream)):
            return function(stream, *args, **kwargs)
        if hook is not None:
            hook(stream)
        with stream:
            return function(stream, *args, **kwargs)

    return call


def entry_point(op: str, name: str, cpu_function: Callable[..., Any], gpu_function: Callable[..., Any],
                doc: str) -> Callable[..., None]:
    """An op's public forward_kernel or backward_kernel: calls cpu_function or gpu_function by the
    device of the stream it is given (the twins' signature, shown by help(), is cpu_function's).
    The twins are looked up in the op's module at each call, by name (cpu_<name>, gpu_<name>), as
    a call written out in the module would: replacing one there (a test's monkeypatch) takes effect."""
    namespace = inspect.unwrap(cpu_function).__globals__  # the op module, past cpu.cpu_kernel
    cpu_name, gpu_name = "cpu_" + name, "gpu_" + name
    if namespace.get(cpu_name) is not cpu_function or namespace.get(gpu_name) is not gpu_function:
        raise KernelError(f"{op}: entry_point({name!r}) needs {cpu_name} and {gpu_name} of the op's module")

    def kernel(stream: Any, *args: Any, **kwargs: Any) -> None:
        device = getattr(stream, "device", None)
        if device == "cpu":
            return namespace[cpu_name](stream, *args, **kwargs)
        if isinstance(device, int):
            return namespace[gpu_name](stream, *args, **kwargs)
        raise fail(DeviceError, op, "stream", "a kernels CPU or GPU stream (cpu_stream() or gpu_stream())",
                   type(stream).__name__)

    inner = getattr(gpu_function, "gpu_code", None)  # the op's code, where gpu_function is gpu_kernel's wrapper
    public = kernel if inner is None else _in_stream(inner, (namespace, cpu_name, gpu_name, gpu_function, kernel))
    public.__name__ = public.__qualname__ = name
    public.__module__ = cpu_function.__module__
    public.__doc__ = doc
    public.__signature__ = inspect.signature(cpu_function)  # type: ignore[attr-defined]
    return public


def cleanup_entry_point(op: str, doc: str = "Release everything the state holds (descriptors, device memory).") \
        -> Callable[[Any, KernelState], None]:
    """An op's public cleanup_kernel (the same on both devices)."""

    def cleanup_kernel(handle: Any, state: KernelState) -> None:
        cleanup_state(op, handle, state)

    cleanup_kernel.__doc__ = doc
    return cleanup_kernel


def c_strides(dims: Sequence[int]) -> list[int]:
    """The element strides of a C-contiguous array of `dims`."""
    strides, step = [], 1
    for size in reversed(dims):
        strides.append(step)
        step *= size
    return strides[::-1]


def numel(dims: Sequence[int]) -> int:
    """The element count of dims (math.prod: NumPy's prod costs microseconds a call on the hot path)."""
    return math.prod(int(d) for d in dims)


def check_list(op: str, argument: str, items: Any, count: int | None = None, optional: bool = False) -> list[Any]:
    """A list argument (arrays or TensorShapes): a list or tuple, of `count` entries where
    given, returned as a list. Where `optional`, None stands for a list of `count` Nones."""
    if items is None and optional and count is not None:
        return [None] * count
    if not isinstance(items, (list, tuple)):
        raise fail(ShapeError, op, argument, "a list" + (f" of {count}" if count is not None else ""), type(items).__name__)
    if count is not None and len(items) != count:
        raise fail(ShapeError, op, argument, f"a list of {count}", f"a list of {len(items)}")
    return list(items)


def check_unary_forward(op: str, stream: Any, handle: Any, state: Any, attrs: Any, input: Any, output: Any) -> None:
    """The checks of a forward (input, output): reshape, transpose, upsample, element_unary, softmax, pool_2d."""
    shapes = state_shapes(op, stream, handle, state, attrs)
    check_call(op, stream, handle, state, attrs, [
        ("input", input, shapes["input_shape"], True),
        ("output", output, shapes["output_shape"], True),
    ])


def check_unary_backward(op: str, stream: Any, handle: Any, state: Any, attrs: Any, output: Any, output_grad: Any,
                         input: Any, input_grad: Any, output_required: bool = False, input_required: bool = False) -> None:
    """The checks of a backward (output, output_grad, input, input_grad): output_grad is always required,
    output and input where the op's gradient reads them; input_grad None skips the gradient."""
    shapes = state_shapes(op, stream, handle, state, attrs)
    check_call(op, stream, handle, state, attrs, [
        ("output", output, shapes["output_shape"], output_required),
        ("output_grad", output_grad, shapes["output_shape"], True),
        ("input", input, shapes["input_shape"], input_required),
        ("input_grad", input_grad, shapes["input_shape"], False),
    ])


@functools.lru_cache(maxsize=None)
def _list_row_parts(prefix: str, count: int, required: bool) -> tuple[tuple[str, ...], tuple[bool, ...]]:
    return tuple(f"{prefix}[{i}]" for i in range(count)), (required,) * count


def list_rows(prefix: str, arrays: Sequence[Any], shapes: Sequence[TensorShape], required: bool) -> list[tuple]:
    """check_call rows of a list argument, (f"{prefix}[i]", array, shape, required), names made once."""
    names, flags = _list_row_parts(prefix, len(shapes), required)
    return list(zip(names, arrays, shapes, flags))


def state_shapes(op: str, stream: Any, handle: Any, state: Any, attrs: Any) -> dict[str, Any]:
    """The shapes the state was made with, which an op's check_call rows expect. Anything but a state of `op`
    (another op's, whose shapes have other names, or no state at all) is refused first, by check_call in its
    own order and terms (StateError for the state)."""
    if not (isinstance(state, KernelState) and state.op == op):
        check_call(op, stream, handle, state, attrs, [])
    return state.shapes


def state_list_shapes(op: str, stream: Any, handle: Any, state: Any, attrs: Any, name: str) -> list[TensorShape]:
    """The state's list of shapes `name`, which sizes a list argument (a state of another op is refused first)."""
    return state_shapes(op, stream, handle, state, attrs)[name]


def check_many_to_one_forward(op: str, stream: Any, handle: Any, state: Any, attrs: Any, inputs: Any,
                              output: Any) -> list[Any]:
    """The checks of a forward (inputs[], output) (concat, gradient_reduction); returns inputs as a list."""
    shapes = state_list_shapes(op, stream, handle, state, attrs, "input_shapes")
    inputs = check_list(op, "inputs", inputs, len(shapes))
    check_call(op, stream, handle, state, attrs,
               list_rows("inputs", inputs, shapes, True) + [("output", output, state.shapes["output_shape"], True)])
    return inputs


def check_many_to_one_backward(op: str, stream: Any, handle: Any, state: Any, attrs: Any, output: Any,
                               output_grad: Any, inputs: Any, input_grads: Any) -> list[Any]:
    """The checks of a backward (output, output_grad, inputs[], input_grads[]); returns input_grads as a list
    (entries may be None: those gradients are skipped)."""
    shapes = state_list_shapes(op, stream, handle, state, attrs, "input_shapes")
    inputs = check_list(op, "inputs", inputs, len(shapes), optional=True)
    input_grads = check_list(op, "input_grads", input_grads, len(shapes))
    check_call(op, stream, handle, state, attrs, [
        ("output", output, state.shapes["output_shape"], False),
        ("output_grad", output_grad, state.shapes["output_shape"], True),
    ] + list_rows("inputs", inputs, shapes, False) + list_rows("input_grads", input_grads, shapes, False))
    return input_grads
