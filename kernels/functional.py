"""The functional layer: one call per op, named and keyworded like ``torch.nn.functional``.

It sits above the ops (docs/architecture.md) and does what every caller of the
four-function API would otherwise do by hand: work out attrs and output shapes,
allocate outputs and gradients, keep states, streams and handles::

    import kernels.functional as F

    ctx = F.Context()
    y = F.conv2d(x, w, b, stride=2, padding=1, ctx=ctx)     # forward, saving for backward
    grads = F.conv2d_backward(grad_y, ctx)                  # Conv2dGrads(input, weight, bias)

Contract:

- **Arrays in and out.** Tensors are NumPy arrays (CPU) or CuPy arrays (GPU), or any
  object with ``__dlpack__`` (a torch tensor, a JAX array), taken without a copy
  (``numpy.from_dlpack`` or ``cupy.from_dlpack``, by ``__dlpack_device__``). Results
  are new arrays of the input's device and array module; where the (first) tensor
  argument was a torch tensor, they are torch tensors (``torch.from_dlpack``, no copy).
  The kernels refuse arrays that are not C-contiguous; this convenience layer makes a
  contiguous copy of such an input instead. A torch tensor that requires grad is
  detached first (this layer computes its own gradients).
- **Backward.** A forward given ``ctx=Context()`` records in it what its backward needs:
  the tensors it reads (references, as torch's ``save_for_backward``; do not modify
  them in place before backward) and the op's state, which for ops that keep data of
  the forward in it (batch_norm's batch statistics, max pooling's argmax, a fused
  activation's pre-activation) is held by that context alone until it is released, so
  that later forwards of the same shape cannot overwrite it. ``<op>_backward(grad_output,
  ctx)`` returns the gradients (one array for one-input ops, a named tuple otherwise;
  ``needs=`` picks which, None entries for those not computed) and then releases the
  context unless ``retain=True``. ``Context`` is also a context manager (``release()``
  on exit). A forward without ``ctx`` saves nothing.
- **States** are cached per (op, attrs, input shapes and dtypes, device, stream) and
  reused: repeated calls make no new state. ``clear_cache()`` releases them all.
- **Plans.** A CPU forward without ctx keeps, per form of its arguments (the dims and
  dtypes of its arrays, its other arguments with their types), what it worked out from
  them and its op's CPU compute for the form (the op's cpu.forward_plan); a repeated call
  of that form on C-contiguous NumPy arrays runs that compute, skipping this layer's
  checks and the kernel's entry point and checks (_Plan; docs/performance.md). A GPU
  forward without ctx on C-contiguous CuPy arrays keeps one per form too (their devices
  in it), in the runtime of its stream: a repeated call runs the op's gpu_forward_kernel
  with the stream entered once and the arrays' checks skipped (_GpuPlan).
- **Streams and handles.** CPU calls use ``kernels.cpu_stream()``/``cpu_handle()``. A GPU
  call runs on the ``stream=`` given, or, as a ``torch.nn.functional`` call runs on torch's
  current stream, on CuPy's current stream of the input's device (``default_stream(device)``:
  that stream as a kernels GPU stream, made once per CuPy stream and dropped with it), so
  that a ``cupy.asarray`` upload of its input before it and a ``cupy.asnumpy`` of its result
  after it are ordered with it by the stream itself: no event, no host synchronization.
  Outputs are allocated inside the call's stream's context, so CuPy's pool ties their
  memory to it. Each GPU stream gets its own handle (and cache of states), since a
  handle's workspace and library handles must not be shared by streams that run at once.
  A call given another ``stream=`` is ordered by its caller: make its inputs and read its
  results on that stream. Torch
  tensors are ordered on the way in (DLPack hands ``cupy.from_dlpack`` the producer's
  stream) and on the way out (torch's current stream waits for ours) either way.
- **Errors** are the kernels' own ``kernels.KernelError`` subclasses, in the caller's terms: a
  kernel's message naming itself and its argument (``conv_2d: filter: ...``) is raised again, as the
  same class, naming the function called and the argument passed (``conv2d: weight: ...``), the
  kernel's error as its ``__cause__`` (kernels/functional_errors.py); what this layer checks itself
  (argument forms torch accepts but the kernels do not, like ``ceil_mode=True``) raises them too,
  naming the function and the argument.
- **batch_norm** keeps torch's signature: ``running_mean``/``running_var`` are the
  caller's arrays, updated in place when training (the kernel updates the state's
  running statistics; the state is pointed at the caller's arrays for the call).
  ``momentum`` is a number, as in ``torch.nn.functional.batch_norm`` (a cumulative
  average is the caller's ``1 / steps``, as ``torch.nn.BatchNorm2d`` computes it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import batch_matmul, concat, conv_2d, element_binary, element_unary, functional_errors, pool_2d, registry
from . import batch_norm as batch_norm_op
from . import gradient_reduction as gradient_reduction_op
from . import reshape as reshape_op
from . import softmax as softmax_op
from . import split as split_op
from . import top_k as top_k_op
from . import transpose as transpose_op
from . import upsample as upsample_op
from .activation import Activation
from .batch_matmul import BatchMatmulAttrs
from .batch_norm import BatchNormAttrs, BatchNormMode
from .concat import ConcatAttrs
from .conv_2d import Conv2DAttrs
from .element_binary import BinaryOpType, ElementBinaryAttrs
from .element_unary import ElementUnaryAttrs, UnaryOpType
from .gradient_reduction import GradientReductionAttrs
from .pool_2d import Pool2DAttrs, PoolOp
from .reshape import ReshapeAttrs
from .runtime import core, cpu, dlpack, gpu, handle
from .runtime.core import AttrsError, DeviceError, KernelError, ShapeError, StateError, TensorShape, fail
from .softmax import SoftmaxAttrs
from .split import SplitAttrs
from .top_k import TopKAttrs
from .transpose import TransposeAttrs
from .upsample import UpsampleAttrs, UpsampleMode

# A NumPy or CuPy array, or anything with __dlpack__ (a torch tensor, a JAX array).
Tensor = Any
# An int, or a pair (h, w) of ints, as torch's conv and pooling arguments.
IntPair = int | tuple[int, int] | Sequence[int]
ActivationArg = Activation | str | None

__all__ = [
    "Context", "clear_cache", "cache_info", "default_stream", "backward",
    "Conv2dGrads", "BatchNormGrads", "BinaryGrads", "TopK",
    "conv2d", "conv2d_backward", "batch_norm", "batch_norm_backward",
    "max_pool2d", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward",
    "interpolate", "interpolate_backward", "upsample", "upsample_backward",
    "softmax", "softmax_backward", "topk", "topk_backward", "cat", "cat_backward", "split", "split_backward",
    "reshape", "reshape_backward", "permute", "permute_backward", "transpose", "transpose_backward",
    "matmul", "matmul_backward", "gradient_reduction", "gradient_reduction_backward",
    "add", "add_backward", "sub", "sub_backward", "mul", "mul_backward", "div", "div_backward",
    "maximum", "maximum_backward", "minimum", "minimum_backward",
    "relu", "relu_backward", "sigmoid", "sigmoid_backward", "tanh", "tanh_backward", "elu", "elu_backward",
    "gelu", "gelu_backward", "silu", "silu_backward", "exp", "exp_backward", "rsqrt", "rsqrt_backward",
    "sin", "sin_backward", "cos", "cos_backward", "pow", "pow_backward",
]

# DLDeviceType codes (dlpack.h).
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


# --------------------------------------------------------------------------- runtimes: handle and state pool


class _Runtime:
    """What calls on one stream share: a handle and a pool of states, free ones listed per key.

    A state is taken from the pool for a call and given back after it, or, when a
    Context must keep it for its backward, when that context is released.
    """

    def __init__(self, handle: Any):
        self.handle = handle
        self.free: dict[tuple, list[Any]] = {}
        self.made: dict[tuple, int] = {}
        self.plans: dict[tuple, Any] = {}  # a GPU stream's plans, form -> _GpuPlan (the CPU's are in _PLANS)
        self.lock = threading.RLock()  # re-entrant: a Context released by the GC may give back mid-call
        self.closed = False

    def acquire(self, module: Any, attrs: Any, shapes: tuple, key: tuple | None = None) -> tuple[tuple, Any]:
        """A state for (module, attrs, shapes), free or new; `key` is their pool key where the caller has it."""
        if key is None:
            key = (module.OP, attrs, _freeze(shapes))
        with self.lock:
            free = self.free.get(key)
            if free:
                return key, free.pop()
        state = module.init_kernel(self.handle, attrs, *shapes)  # looked up per call: tests may count it
        with self.lock:
            self.made[key] = self.made.get(key, 0) + 1
        return key, state

    def give_back(self, key: tuple, module: Any, state: Any) -> None:
        with self.lock:
            if not self.closed:
                self.free.setdefault(key, []).append(state)
                return
        module.cleanup_kernel(self.handle, state)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            pools, self.free = self.free, {}
            self.plans = {}
        for key, states in pools.items():
            _drain(states, _OP_MODULES[key[0]], self.handle)
        self.handle.close()


def _drain(states: list[Any], module: Any, handle: Any) -> None:
    """Clean up the states of a free list of a closed runtime, popping each: a plan's call may pop one of
    them or append one at the same time (list.pop and list.append are atomic under the GIL), and each
    state is then cleaned up once, by whoever popped it (_Plan.take, _Plan.give_back)."""
    while True:
        try:
            state = states.pop()
        except IndexError:
            return
        module.cleanup_kernel(handle, state)


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


# Every op's module, by name (kernels.registry): the states and contexts name their op.
_OP_MODULES = {name: importlib.import_module(spec.module) for name, spec in registry.OPS.items()}
_KERNEL_OPS = frozenset(_OP_MODULES)

_LOCK = threading.Lock()
_CPU: dict[str, Any] = {}  # "stream", "runtime"
# CuPy's stream -> its _CurrentStream: held while the CuPy stream lives (its runtime with it, _GPU_RUNTIMES).
_CURRENT_STREAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GPU_RUNTIMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # GpuStream -> _Runtime


def _cpu_runtime() -> _Runtime:
    with _LOCK:
        if "runtime" not in _CPU:
            _CPU["stream"], _CPU["runtime"] = cpu.cpu_stream(), _Runtime(cpu.cpu_handle())
        return _CPU["runtime"]


class _CurrentStream(gpu.GpuStream):
    """CuPy's stream `cupy_stream` of GPU `device` as a kernels GPU stream, which calls without stream= run on.
    It refers to the CuPy stream weakly: the CuPy stream's entry in _CURRENT_STREAMS holds it, and a CuPy
    stream the caller drops takes it, and its runtime, with it. Kept past that by a caller (a
    default_stream() result held on to), it refuses to be used, by name."""

    def __init__(self, device: int, cupy_stream: Any):
        self.device = device
        self._cupy_stream = weakref.ref(cupy_stream)

    @property
    def cupy_stream(self) -> Any:
        stream = self._cupy_stream()
        if stream is None:
            raise fail(StateError, "default_stream", "stream", f"CuPy's stream of GPU {self.device} still alive",
                       "one the caller has dropped")
        return stream


def _current_stream(device: int) -> Any:  # pragma: no cover - GPU: a GPU ordinal
    cupy_stream = gpu.cupy.cuda.get_current_stream(device)
    stream = _CURRENT_STREAMS.get(cupy_stream)
    if stream is None:
        with _LOCK:
            stream = _CURRENT_STREAMS.setdefault(cupy_stream, _CurrentStream(device, cupy_stream))
    return stream


def default_stream(device: int | str = 0) -> Any:
    """The stream calls on `device` ("cpu" or a GPU ordinal) use when given none, in this thread now: the
    layer's CPU stream, made on first use; on a GPU, CuPy's current stream of the device, as a kernels GPU
    stream (one per CuPy stream, with its own handle and states, gone with the CuPy stream)."""
    if device == "cpu":
        _cpu_runtime()
        return _CPU["stream"]
    return _current_stream(int(device))  # pragma: no cover - GPU: a GPU ordinal


def _gpu_runtime(stream: Any) -> _Runtime:  # pragma: no cover - GPU: a GPU handle
    with _LOCK:
        runtime = _GPU_RUNTIMES.get(stream)
        if runtime is None:
            runtime = _GPU_RUNTIMES[stream] = _Runtime(handle.gpu_handle(stream.device))
            # The stream's states and handle go with it; not at exit, where CUDA may already be torn down.
            weakref.finalize(stream, runtime.close).atexit = False
        return runtime


def clear_cache() -> None:
    """Release every cached state and handle (the streams stay). States that a live Context
    holds are released with the context; a backward on a shared state released here raises StateError."""
    with _LOCK:
        runtimes = ([_CPU.pop("runtime")] if "runtime" in _CPU else []) + list(_GPU_RUNTIMES.values())
        _CPU.pop("stream", None)
        _GPU_RUNTIMES.clear()
        _PLANS.clear()  # each holds the CPU runtime just closed
    for runtime in runtimes:
        runtime.close()


def cache_info() -> dict[str, int]:
    """How many states each op has made since the cache was last cleared, over every device and stream."""
    with _LOCK:
        runtimes = ([_CPU["runtime"]] if "runtime" in _CPU else []) + list(_GPU_RUNTIMES.values())
    counts: dict[str, int] = {}
    for runtime in runtimes:
        with runtime.lock:
            for key, made in runtime.made.items():
                counts[key[0]] = counts.get(key[0], 0) + made
    return counts


# --------------------------------------------------------------------------- arrays in and out


def _is_torch(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _cupy_module() -> Any:
    return sys.modules.get("cupy")


def _device_of(op: str, name: str, obj: Any) -> Any:
    """'cpu' or the GPU ordinal of an array or DLPack producer."""
    if isinstance(obj, np.ndarray):
        return "cpu"
    cupy = _cupy_module()
    if cupy is not None and isinstance(obj, cupy.ndarray):
        return obj.device.id
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        kind, index = obj.__dlpack_device__()
        if int(kind) in (_DL_CPU, _DL_CUDA_HOST):
            return "cpu"
        if int(kind) in (_DL_CUDA, _DL_CUDA_MANAGED):
            return int(index)
        raise fail(DeviceError, op, name, "a CPU or CUDA tensor", f"DLPack device type {int(kind)}")
    raise fail(DeviceError, op, name, "a NumPy or CuPy array or an object with __dlpack__",
               f"{type(obj).__module__}.{type(obj).__name__}")


class _Env:
    """One call's device, stream, runtime and array module, and whether results go back as torch tensors."""

    def __init__(self, op: str, first: Any, stream: Any, runtime: _Runtime | None = None, first_name: str = "input"):
        self.op = op
        self.device = _device_of(op, first_name, first)
        self.torch = _is_torch(first)
        if stream is None:
            stream = default_stream(self.device)
        else:
            stream_device = core.device_of(op, stream, "stream")
            if stream_device != self.device:
                raise fail(DeviceError, op, "stream", f"a stream of the input's device ({_where(self.device)})",
                           _where(stream_device))
        self.stream = stream
        if self.device == "cpu":
            self.xp = np
            self.runtime = _cpu_runtime() if runtime is None else runtime
        else:  # pragma: no cover - GPU: a GPU input
            self.xp = gpu.cupy
            self.runtime = _gpu_runtime(stream) if runtime is None else runtime
        self.handle = self.runtime.handle

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The stream's context on the GPU (allocations, DLPack exchanges, kernel calls); nothing on the CPU."""
        if self.device == "cpu":
            yield
        else:  # pragma: no cover - GPU: a GPU stream's context
            with self.stream:
                yield

    def array(self, name: str, obj: Any) -> Any:
        """`obj` as a C-contiguous array of this call's device (no copy unless it is not contiguous)."""
        if _is_torch(obj) and obj.requires_grad:
            obj = obj.detach()
        if self.device == "cpu":
            if not isinstance(obj, np.ndarray):
                if _device_of(self.op, name, obj) != "cpu":
                    raise fail(DeviceError, self.op, name, "a CPU tensor (as the input)", _where(_device_of(self.op, name, obj)))
                obj = dlpack.from_dlpack(obj, np)  # a torch bfloat16 tensor through uint16 (kernels/runtime/dlpack.py)
            return obj if obj.flags.c_contiguous else np.ascontiguousarray(obj)
        cupy = self.xp  # pragma: no cover - GPU: CuPy arrays
        with self.stream:  # pragma: no cover - GPU: CuPy arrays
            if not isinstance(obj, cupy.ndarray):
                device = _device_of(self.op, name, obj)
                if device != self.device:
                    raise fail(DeviceError, self.op, name, f"a tensor on GPU {self.device} (as the input)", _where(device))
                obj = dlpack.from_dlpack(obj, cupy)  # under our stream: the producer's work is ordered before ours
            return obj if obj.flags.c_contiguous else cupy.ascontiguousarray(obj)

    def empty(self, dims: Sequence[int], dtype: Any) -> Any:
        if self.device == "cpu":
            return np.empty(tuple(dims), dtype)
        with self.stream:  # pragma: no cover - GPU: CuPy arrays
            return self.xp.empty(tuple(dims), dtype)

    def zeros(self, dims: Sequence[int], dtype: Any) -> Any:
        if self.device == "cpu":
            return np.zeros(tuple(dims), dtype)
        with self.stream:  # pragma: no cover - GPU: CuPy arrays
            return self.xp.zeros(tuple(dims), dtype)

    def out(self, array: Any) -> Tensor:
        """A result as the caller gave its input: a torch tensor sharing the memory, or the array itself."""
        if array is None or not self.torch:
            return array
        with self.active():  # torch's stream waits for ours (CuPy's __dlpack__ sees our stream as current)
            return dlpack.to_torch(array)


# Whether this host thread is inside a public call: the outermost one puts a kernel's error in its terms.
_OUTER = core.thread_local(inside=False)


def _public(function: Any) -> Any:
    """A public function: a kernel's error raised inside the outermost such call is raised again in that call's
    terms (kernels/functional_errors.py)."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _OUTER.inside:  # nested: the outermost call translates
            return function(*args, **kwargs)
        _OUTER.inside = True
        try:
            return function(*args, **kwargs)
        except KernelError as error:  # a kernel's error in the terms of this call (kernels/functional_errors.py)
            translated = functional_errors.in_user_terms(error, function.__name__, _KERNEL_OPS)
            if translated is None:
                raise
            raise translated from error
        finally:
            _OUTER.inside = False

    return call


def _where(device: Any) -> str:
    return "cpu" if device == "cpu" else f"GPU {device}"


# --------------------------------------------------------------------------- contexts


class Context:
    """What one forward saved for its backward: the op's state and the tensors backward reads.

    Pass a new one to a forward as ``ctx=``; give it to the matching ``*_backward``. A state
    that keeps data of the forward is held by this context alone until ``release()`` (which
    backward calls unless ``retain=True``), then goes back to the cache for reuse.
    """

    def __init__(self) -> None:
        self.op: str | None = None  # the functional name of the forward recorded, e.g. "conv2d"
        self._runtime: _Runtime | None = None
        self._module: Any = None
        self._key: tuple | None = None
        self._state: Any = None
        self._owns = False
        self._stream: Any = None
        self.saved: dict[str, Any] = {}

    def _record(self, op: str, env: _Env, module: Any, key: tuple, state: Any, owns: bool, **saved: Any) -> None:
        self.release()
        self.op, self._runtime, self._module, self._key, self._state, self._owns = op, env.runtime, module, key, state, owns
        self._stream = env.stream
        self.saved = saved

    @property
    def state(self) -> Any:
        """The kernel state of the forward recorded (None when none is, or once released)."""
        return self._state

    def release(self) -> None:
        """Drop the saved tensors and give the state back to the cache; backward then raises StateError."""
        state, self._state = self._state, None
        self.saved = {}
        if state is not None and self._owns and self._runtime is not None:
            self._runtime.give_back(self._key, self._module, state)
        self._runtime = None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - never raise from the garbage collector
            pass

    def __repr__(self) -> str:
        return f"Context(op={self.op!r}, live={self._state is not None})"


def _run_forward(env: _Env, op: str, module: Any, attrs: Any, shapes: tuple, call: Any, ctx: Context | None,
                 keeps_forward: bool, **saved: Any) -> Any:
    """Take a state from the cache, call `call(state)` in the stream's context, then give the state back,
    or leave it to `ctx` where the state keeps what this forward's backward needs."""
    if ctx is not None and not isinstance(ctx, Context):
        raise fail(StateError, op, "ctx", "a kernels.functional.Context or None", type(ctx).__name__)
    key, state = env.runtime.acquire(module, attrs, shapes)
    try:
        with env.active():
            result = call(state)
    except BaseException:
        env.runtime.give_back(key, module, state)  # kernels check before they write: the state is intact
        raise
    owns = ctx is not None and keeps_forward
    if not owns:
        env.runtime.give_back(key, module, state)
    if ctx is not None:
        ctx._record(op, env, module, key, state, owns, **saved)
    return result


# --------------------------------------------------------------------------- plans: a form's checks made once


class _Plan:
    """What a CPU forward without ctx works out from its arguments before its kernel runs (the attrs,
    the output's dims and dtype, the key of its states in the cache, the op's CPU compute bound to the
    form), made by the first call of one form (_planned) and reused by the later calls of that form, which
    skip the functional layer's own checks and conversions and the kernel's: they are the first call's,
    on arguments of the same dims, dtypes, types and values, and the outputs are new arrays of the plan's
    dims. A later call runs `compute`, made by the op's `cpu.forward_plan(state, attrs, threads)` (every op
    with plans has one): what its cpu_forward_kernel runs after its checks, with what it works out from
    the form (blocks, spans, thread counts) worked out once, on a state of the pool; the compute makes the
    handle's thread count current where its work is shared out or runs GEMMs (cpu.with_threads,
    blas_threads(threads)), as cpu.cpu_kernel does for a kernel's call.

    Thread-safe without a lock: a call pops a state from the pool's free list of the key and appends it
    back after (list.pop and list.append are atomic under the GIL), so two threads of one form run on two
    states; the compute keeps nothing of a call but in that state and in the call's own arrays."""

    __slots__ = ("runtime", "module", "attrs", "shapes", "key", "free", "dims", "dtype", "compute")

    empty = staticmethod(np.empty)  # a new output: empty(dims, dtype)

    def __init__(self, env: _Env, module: Any, attrs: Any, shapes: tuple, dims: Any, dtype: Any):
        self.runtime, self.module, self.attrs, self.shapes = env.runtime, module, attrs, shapes
        self.key = (module.OP, attrs, _freeze(shapes))
        with self.runtime.lock:  # the pool's list of free states of the key: no hashing of attrs and shapes a call
            self.free = self.runtime.free.setdefault(self.key, [])
        self.dims, self.dtype = dims, dtype  # one output's dims, or split's list of them
        state = self.take()
        try:
            self.compute = self._compute(env, state)
        finally:
            self.give_back(state)

    def _compute(self, env: _Env, state: Any) -> Any:
        """The op's CPU compute of the form."""
        return self.module.cpu.forward_plan(state, self.attrs, env.handle.threads)

    def take(self) -> Any:
        try:
            return self.free.pop()
        except IndexError:  # none free (every one in use, or the runtime's close() emptied the list): a new one
            return self.runtime.acquire(self.module, self.attrs, self.shapes, self.key)[1]

    def give_back(self, state: Any) -> None:
        runtime = self.runtime
        if not runtime.closed:
            self.free.append(state)
            if runtime.closed:  # close() ran meanwhile, and may have drained the list before the append
                _drain(self.free, self.module, runtime.handle)
            return
        self.module.cleanup_kernel(runtime.handle, state)

    def run(self, *arrays: Any) -> None:
        """The op's forward on `arrays` (forward_kernel's, after state and attrs) on a state of the cache:
        take and give_back, their common case written out (a call of each is a tenth of a tiny call's time)."""
        free = self.free
        try:
            state = free.pop()
        except IndexError:
            state = self.take()
        try:
            self.compute(state, *arrays)
        finally:  # the compute leaves the state as usable on an error as the kernel would
            if self.runtime.closed:
                self.give_back(state)
            else:
                free.append(state)
                if self.runtime.closed:  # close() came between, and may have drained the list before the append
                    _drain(free, self.module, self.runtime.handle)


class _GpuPlan(_Plan):  # pragma: no cover - GPU: CuPy arrays
    """A GPU forward's plan, kept in the runtime of its stream (_Runtime.plans; a form's arrays are CuPy
    arrays, their devices in the form): as a CPU plan, the attrs, the output's dims and dtype and the place
    of the form's states in the cache, worked out once. Its compute is the op's gpu_forward_kernel on the
    stream, entered once for the call, with the arrays' checks skipped (core.replaying): the arrays are of
    the form whose first call was checked (C-contiguous CuPy arrays of these dims, dtypes and devices; the
    outputs the plan's own, allocated in the stream's context as the full path's); the checks of the
    stream, handle, state and attrs stay, and so do the kernel's launch plans, kept in its state. The plan
    holds its stream by a weak reference: its
    runtime, which _GPU_RUNTIMES keeps while the stream lives, holds the plan."""

    __slots__ = ("stream", "device", "handle")

    def _compute(self, env: _Env, state: Any) -> Any:
        self.stream, self.device, self.handle = weakref.ref(env.stream), env.device, env.handle
        return self._launch

    def _launch(self, state: Any, *arrays: Any, **keywords: Any) -> None:
        stream = self.stream()
        with core.replaying(stream):  # the kernel looked up per call, as the entry points do: a test may replace it
            self.module.gpu_forward_kernel(stream, self.handle, state, self.attrs, *arrays, **keywords)

    def empty(self, dims: Any, dtype: Any) -> Any:
        with self.stream():
            return gpu.cupy.empty(tuple(dims), dtype)


# form -> _Plan of the CPU (a GPU stream's are in its runtime: _Runtime.plans). Emptied by clear_cache, and
# when it grows past _PLAN_LIMIT forms (a caller whose dims change on every call gains nothing from plans,
# and must not grow the cache without bound); so are a runtime's plans.
_PLANS: dict[tuple, _Plan] = {}
_PLAN_LIMIT = 4096


def _planned(op: str, ctx: Any, stream: Any, arrays: Sequence[Any], values: tuple) -> tuple[Any, Any]:
    """(form, plan) of a forward call: the form is the op, the dims and dtype of each of `arrays`, and
    each of `values` (the other arguments) with its type, since 1, 1.0 and True are equal keys but not
    the same argument to check; the plan is the form's, or None where no call of it has run yet. Arrays
    that are not C-contiguous NumPy arrays, or a GPU stream, make a GPU form, or none (_gpu_planned). The
    form is None where the call takes the full path every time: a ctx, a torch tensor, a strided view, an
    argument that is not hashable."""
    if ctx is not None:
        return None, None
    kinds = tuple(map(type, values))
    if tuple in kinds or list in kinds:  # a pair or a list of ints: its items' types too, (1, True) is not (1, 1)
        values = tuple((tuple(v), tuple(map(type, v))) if type(v) in (tuple, list) else v for v in values)
    if stream is not None and type(stream) is not cpu.CpuStream:
        return _gpu_planned(op, stream, arrays, values, kinds)
    if len(arrays) == 1:  # most calls: the form as one tuple, no list
        array = arrays[0]
        if type(array) is not np.ndarray or not array.flags.c_contiguous:
            return _gpu_planned(op, stream, arrays, values, kinds)
        key: tuple = (op, array.shape, array.dtype, values, kinds)
    else:
        form: list[Any] = [op]
        for array in arrays:
            if type(array) is not np.ndarray or not array.flags.c_contiguous:
                return _gpu_planned(op, stream, arrays, values, kinds)
            form.append(array.shape)
            form.append(array.dtype)
        form.append(values)
        form.append(kinds)
        key = tuple(form)
    try:
        return key, _PLANS.get(key)
    except TypeError:  # an argument that is not hashable: checked on every call
        return None, None


def _gpu_planned(op: str, stream: Any, arrays: Sequence[Any], values: tuple, kinds: tuple) -> tuple[Any, Any]:
    """_planned's (form, plan) of a call on C-contiguous CuPy arrays: the form holds each array's device too,
    and the plan is looked up in the runtime of the call's stream (the one given, or CuPy's current stream of
    the first array's device), where the first call of the form keeps it. (None, None) for anything else."""
    cupy = _cupy_module()
    if cupy is not None:  # pragma: no cover - GPU: CuPy arrays
        form: list[Any] = [op]
        for array in arrays:
            # The cheapest reads of contiguity and device (docs/performance.md#host-time-of-one-gpu-call).
            if type(array) is not cupy.ndarray or not array._c_contiguous:
                return None, None
            form += (array.shape, array.dtype, array.data.device_id)
        form.append(values)
        form.append(kinds)
        key = tuple(form)
        if stream is None:
            stream = _CURRENT_STREAMS.get(cupy.cuda.get_current_stream(form[3]))  # None before its first call
        try:
            runtime = None if stream is None else _GPU_RUNTIMES.get(stream)
            return key, (runtime.plans if runtime is not None else {}).get(key)
        except TypeError:  # an argument that is not hashable, or a stream that is not one (refused on the full path)
            return None, None
    return None, None


def _remember(form: Any, env: _Env, module: Any, attrs: Any, shapes: tuple, dims: Any, dtype: Any) -> None:
    """Keep the plan of a call of `form` that has just run through the full path (a form of None: none)."""
    if form is None:
        return
    if env.device == "cpu":
        plans, plan = _PLANS, _Plan
    else:  # pragma: no cover - GPU: CuPy arrays
        plans, plan = env.runtime.plans, _GpuPlan
    if len(plans) >= _PLAN_LIMIT:
        plans.clear()
    plans[form] = plan(env, module, attrs, shapes, dims, dtype)


def _begin_backward(op: str, ctx: Any, grad_output: Any, stream: Any,
                    name: str = "grad_output") -> tuple[_Env, dict[str, Any]]:
    if not isinstance(ctx, Context):
        raise fail(StateError, op, "ctx", "the Context a forward recorded into", type(ctx).__name__)
    if ctx.op is None or ctx.state is None:
        raise fail(StateError, op, "ctx", f"a context holding a {op.removesuffix('_backward')} forward",
                   "an empty or released context")
    if ctx.op != op.removesuffix("_backward"):
        raise fail(StateError, op, "ctx", f"a context of {op.removesuffix('_backward')}", f"one of {ctx.op}")
    device = _device_of(op, name, grad_output)
    if device != ctx.state.device:
        raise fail(DeviceError, op, name, f"a tensor on the forward's device ({_where(ctx.state.device)})",
                   _where(device))
    # The forward's runtime: its handle and the state it recorded.
    env = _Env(op, grad_output, ctx._stream if stream is None else stream, ctx._runtime, name)
    return env, ctx.saved


def _finish_backward(ctx: Context, retain: bool) -> None:
    if not retain:
        ctx.release()


def _needs(op: str, needs: Sequence[str] | str | None, names: tuple[str, ...]) -> set[str]:
    if needs is None:
        return set(names)
    if isinstance(needs, str):
        needs = (needs,)
    unknown = [n for n in needs if n not in names]
    if unknown:
        raise fail(AttrsError, op, "needs", f"names among {names}", unknown)
    return set(needs)


# --------------------------------------------------------------------------- argument forms


def _pair(op: str, name: str, value: Any) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value), int(value)
    if isinstance(value, (tuple, list)) and len(value) == 1:
        return _pair(op, name, value[0])
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        return int(value[0]), int(value[1])
    raise fail(AttrsError, op, name, "an int or a pair of ints", repr(value))


def _rank(op: str, name: str, array: Any, rank: int, what: str) -> None:
    if array.ndim != rank:
        raise fail(ShapeError, op, name, f"rank {rank} {what}", f"rank {array.ndim} {tuple(array.shape)}")


def _refuse(op: str, name: str, value: Any, supported: Any, why: str) -> None:
    if value != supported:
        raise fail(AttrsError, op, name, f"{supported!r} ({why})", repr(value))


# --------------------------------------------------------------------------- conv2d


class Conv2dGrads(NamedTuple):
    input: Tensor | None
    weight: Tensor | None
    bias: Tensor | None


def _conv_padding(op: str, padding: Any, weight_dims: tuple[int, ...], dilation: tuple[int, int],
                  stride: tuple[int, int]) -> tuple[int, int]:
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0
        if padding == "same":
            if stride != (1, 1):
                raise fail(AttrsError, op, "padding", "'same' only with stride 1 (as torch)", f"stride {stride}")
            result = []
            for d, k in zip(dilation, weight_dims[2:]):
                total = d * (k - 1)
                if total % 2:
                    raise fail(AttrsError, op, "padding", "'same' with an even total padding dilation * (kernel - 1) "
                               "(the kernels pad symmetrically)", f"total {total}")
                result.append(total // 2)
            return result[0], result[1]
        raise fail(AttrsError, op, "padding", "an int, a pair, 'valid' or 'same'", repr(padding))
    return _pair(op, "padding", padding)


@_public
def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntPair = 1,
           padding: IntPair | str = 0, dilation: IntPair = 1, groups: int = 1, *,
           activation: ActivationArg = None, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.nn.functional.conv2d, plus an optional fused activation (RELU, SIGMOID, TANH, GELU, SILU)
    applied after the bias."""
    op = "conv2d"
    form, plan = _planned(op, ctx, stream, (input, weight) if bias is None else (input, weight, bias),
                          (bias is None, stride, padding, dilation, groups, activation))
    if plan is not None:
        output = plan.empty(plan.dims, plan.dtype)
        plan.run(input, weight, bias, output)
        return output
    env = _Env(op, input, stream)
    x, w = env.array("input", input), env.array("weight", weight)
    b = None if bias is None else env.array("bias", bias)
    _rank(op, "weight", w, 4, "(out_channels, in_channels / groups, kH, kW)")
    stride_hw, dilation_hw = _pair(op, "stride", stride), _pair(op, "dilation", dilation)
    padding_hw = _conv_padding(op, padding, w.shape, dilation_hw, stride_hw)
    attrs = Conv2DAttrs(w.shape[0], w.shape[2], w.shape[3], *stride_hw, *padding_hw, *dilation_hw, groups=groups,
                        use_bias=b is not None, activation=activation)
    dims = conv_2d.output_dims(attrs, tuple(x.shape))
    output = env.empty(dims, x.dtype)
    shapes = (TensorShape.of(x), TensorShape(dims, x.dtype))
    _run_forward(env, op, conv_2d, attrs, shapes,
                 lambda state: conv_2d.forward_kernel(env.stream, env.handle, state, attrs, x, w, b, output),
                 ctx, attrs.activation is not None, input=x, weight=w, output=output, has_bias=b is not None)
    _remember(form, env, conv_2d, attrs, shapes, dims, x.dtype)
    return env.out(output)


@_public
def conv2d_backward(grad_output: Tensor, ctx: Context, *, needs: Sequence[str] | None = None, retain: bool = False,
                    stream: Any = None) -> Conv2dGrads:
    """Gradients of the conv2d forward recorded in `ctx`: input, weight and bias (where the forward had one)."""
    op = "conv2d_backward"
    env, saved = _begin_backward(op, ctx, grad_output, stream)
    want = _needs(op, needs, ("input", "weight", "bias"))
    g = env.array("grad_output", grad_output)
    x, w = saved["input"], saved["weight"]
    input_grad = env.empty(x.shape, x.dtype) if "input" in want else None
    weight_grad = env.empty(w.shape, w.dtype) if "weight" in want else None
    bias_grad = env.empty((w.shape[0],), w.dtype) if "bias" in want and saved["has_bias"] else None
    with env.active():
        conv_2d.backward_kernel(env.stream, env.handle, ctx.state, ctx.state.attrs, saved["output"], g, x, input_grad,
                                w, weight_grad, bias_grad)
    _finish_backward(ctx, retain)
    return Conv2dGrads(env.out(input_grad), env.out(weight_grad), env.out(bias_grad))


# --------------------------------------------------------------------------- batch_norm


class BatchNormGrads(NamedTuple):
    input: Tensor | None
    weight: Tensor | None
    bias: Tensor | None


@_public
def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float = 0.1, eps: float = 1e-5, *,
               activation: ActivationArg = None, mode: BatchNormMode | str = BatchNormMode.SPATIAL,
               ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.nn.functional.batch_norm: training normalizes with the batch statistics and updates
    running_mean/running_var in place (unbiased variance; either may be None, then nothing is kept);
    inference normalizes with them. Plus a fused activation, and mode PER_ACTIVATION (statistics over
    N only, weight and stats of shape (C, *spatial))."""
    op = "batch_norm"
    given = [a for a in (running_mean, running_var, weight, bias) if a is not None]
    form, plan = _planned(op, ctx, stream, [input] + given, (running_mean is None, running_var is None, weight is None,
                                                              bias is None, training, momentum, eps, activation, mode))
    if plan is not None:
        output = plan.empty(plan.dims, plan.dtype)
        state = plan.take()
        own = state.running_mean, state.running_var
        try:  # as call() below, on the caller's statistics themselves (the plan's first call needed no copy)
            if running_mean is not None:
                state.running_mean = running_mean
            if running_var is not None:
                state.running_var = running_var
            plan.compute(state, input, weight, bias, output, training=training)
        finally:
            state.running_mean, state.running_var = own
            plan.give_back(state)
        return output
    env = _Env(op, input, stream)
    x = env.array("input", input)
    if not training and (running_mean is None or running_var is None):
        raise fail(ShapeError, op, "running_mean" if running_mean is None else "running_var",
                   "an array (training=False normalizes with the running statistics)", None)
    if momentum is None:
        raise fail(AttrsError, op, "momentum", "a number (for a cumulative average pass 1 / steps, as torch's "
                   "BatchNorm2d does)", None)
    attrs = BatchNormAttrs(affine=weight is not None or bias is not None, eps=eps, momentum=momentum, mode=mode,
                           activation=activation)
    if x.ndim < 2:
        raise fail(ShapeError, op, "input", "rank >= 2 (N, C, *spatial)", f"rank {x.ndim} {tuple(x.shape)}")
    stat_dims = batch_norm_op.layout_of(attrs, tuple(x.shape)).stat_dims
    param = core.compute_dtype(x.dtype)  # weight, bias and the running statistics: float32 for half input
    gamma = env.array("weight", weight) if weight is not None else (env.empty(stat_dims, param) if attrs.affine else None)
    beta = env.array("bias", bias) if bias is not None else (env.zeros(stat_dims, param) if attrs.affine else None)
    if weight is None and gamma is not None:
        with env.active():
            gamma.fill(1)
    # The caller's running statistics, as arrays of the state's kind; a copy (written back) where they are not.
    running = {}
    for name, given in (("running_mean", running_mean), ("running_var", running_var)):
        if given is None:
            continue
        view = _stat_view(env, name, given)
        array = view if view.flags.c_contiguous and view.dtype == param else _contiguous_copy(env, view, param)
        running[name] = (view, array)
    output = env.empty(x.shape, x.dtype)

    def call(state: Any) -> None:
        own = state.running_mean, state.running_var
        try:
            for name, (_, array) in running.items():
                setattr(state, name, array)
            batch_norm_op.forward_kernel(env.stream, env.handle, state, attrs, x, gamma, beta, output, training=training)
        finally:
            state.running_mean, state.running_var = own
        if training:
            for view, array in running.values():
                if array is not view:
                    view[...] = array

    shapes = (TensorShape.of(x), TensorShape.of(x))
    _run_forward(env, op, batch_norm_op, attrs, shapes, call, ctx, True,
                 input=x, weight=gamma, bias=beta, output=output, has_weight=weight is not None,
                 has_bias=bias is not None)
    if attrs.affine == (weight is not None) == (bias is not None) and all(a is v for v, a in running.values()):
        _remember(form, env, batch_norm_op, attrs, shapes, x.shape, x.dtype)  # no ones, zeros or copies made
    return env.out(output)


def _stat_view(env: _Env, name: str, given: Any) -> Any:
    """The caller's running statistic as an array sharing its memory (writes reach the caller)."""
    if isinstance(given, np.ndarray) or (_cupy_module() is not None and isinstance(given, _cupy_module().ndarray)):
        return given
    if _is_torch(given) and given.requires_grad:
        given = given.detach()
    if env.device == "cpu":
        view = dlpack.from_dlpack(given, np)
        if not view.flags.writeable and _is_torch(given):
            # NumPy before 2.2.5 imports every DLPack tensor read-only; torch's own view shares the memory writably
            # (a bfloat16 tensor's through its uint16 view, which NumPy has a dtype for).
            view = dlpack.imported(given, dlpack.producer(given).numpy())
        return view
    with env.stream:  # pragma: no cover - GPU: CuPy arrays
        return dlpack.from_dlpack(given, env.xp)


def _contiguous_copy(env: _Env, array: Any, dtype: Any) -> Any:
    with env.active():
        return env.xp.ascontiguousarray(array, dtype=dtype)


@_public
def batch_norm_backward(grad_output: Tensor, ctx: Context, *, needs: Sequence[str] | None = None,
                        retain: bool = False, stream: Any = None) -> BatchNormGrads:
    """Gradients of the batch_norm forward recorded in `ctx` (through the batch statistics after a
    training forward, the fixed running ones after an inference one): input, weight and bias where given."""
    op = "batch_norm_backward"
    env, saved = _begin_backward(op, ctx, grad_output, stream)
    want = _needs(op, needs, ("input", "weight", "bias"))
    g = env.array("grad_output", grad_output)
    x, gamma = saved["input"], saved["weight"]
    input_grad = env.empty(x.shape, x.dtype) if "input" in want else None
    gamma_grad = env.empty(gamma.shape, gamma.dtype) if "weight" in want and saved["has_weight"] else None
    beta_grad = env.empty(gamma.shape, gamma.dtype) if "bias" in want and saved["has_bias"] else None
    with env.active():
        batch_norm_op.backward_kernel(env.stream, env.handle, ctx.state, ctx.state.attrs, saved["output"], g, x,
                                      input_grad, gamma, saved["bias"], gamma_grad, beta_grad)
    _finish_backward(ctx, retain)
    return BatchNormGrads(env.out(input_grad), env.out(gamma_grad), env.out(beta_grad))


# --------------------------------------------------------------------------- pooling


def _pool(op: str, input: Tensor, kernel_size: IntPair, stride: IntPair | None, padding: IntPair, pool_type: PoolOp,
          count_include_pad: bool, activation: ActivationArg, ctx: Context | None, stream: Any, form: Any) -> Tensor:
    env = _Env(op, input, stream)
    x = env.array("input", input)
    kernel_hw = _pair(op, "kernel_size", kernel_size)
    stride_hw = kernel_hw if stride is None or (isinstance(stride, (list, tuple)) and not stride) else _pair(op, "stride", stride)
    attrs = Pool2DAttrs(*kernel_hw, *stride_hw, *_pair(op, "padding", padding), pool_type=pool_type,
                        count_include_pad=count_include_pad, activation=activation)
    dims = pool_2d.output_dims(attrs, tuple(x.shape))
    output = env.empty(dims, x.dtype)
    shapes = (TensorShape.of(x), TensorShape(dims, x.dtype))
    _run_forward(env, op, pool_2d, attrs, shapes,
                 lambda state: pool_2d.forward_kernel(env.stream, env.handle, state, attrs, x, output), ctx,
                 pool_type is PoolOp.MAX or attrs.activation is not None, input=x, output=output)
    _remember(form, env, pool_2d, attrs, shapes, dims, x.dtype)
    return env.out(output)


def _planned_unary(op: str, ctx: Any, stream: Any, input: Any, values: Sequence[Any]) -> tuple[Any, Any]:
    """(form, output): the output of a one-input, one-output forward run on its form's plan, or None where
    the call takes the full path (its form, None or not planned yet, is then for _remember)."""
    form, plan = _planned(op, ctx, stream, (input,), values)
    if plan is None:
        return form, None
    output = plan.empty(plan.dims, plan.dtype)
    plan.run(input, output)
    return form, output


@_public
def max_pool2d(input: Tensor, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               dilation: IntPair = 1, ceil_mode: bool = False, return_indices: bool = False, *,
               activation: ActivationArg = None, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.nn.functional.max_pool2d (stride defaults to kernel_size; padding at most half the kernel;
    NaN propagates; the first maximum in window order takes the gradient), plus a fused activation.
    dilation, ceil_mode and return_indices are accepted at their defaults only."""
    op = "max_pool2d"
    form, output = _planned_unary(op, ctx, stream, input, (kernel_size, stride, padding, dilation, ceil_mode,
                                                          return_indices, activation))
    if output is not None:
        return output
    _refuse(op, "dilation", _pair(op, "dilation", dilation), (1, 1), "the kernel has no dilated pooling")
    _refuse(op, "ceil_mode", ceil_mode, False, "the kernel's output size is the floor formula")
    _refuse(op, "return_indices", return_indices, False, "the argmax stays in the Context's state")
    return _pool(op, input, kernel_size, stride, padding, PoolOp.MAX, True, activation, ctx, stream, form)


@_public
def avg_pool2d(input: Tensor, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None, *,
               activation: ActivationArg = None, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.nn.functional.avg_pool2d, plus a fused activation; ceil_mode and divisor_override are
    accepted at their defaults only."""
    op = "avg_pool2d"
    form, output = _planned_unary(op, ctx, stream, input, (kernel_size, stride, padding, ceil_mode, count_include_pad,
                                                          divisor_override, activation))
    if output is not None:
        return output
    _refuse(op, "ceil_mode", ceil_mode, False, "the kernel's output size is the floor formula")
    _refuse(op, "divisor_override", divisor_override, None, "the kernel divides by the window's count")
    return _pool(op, input, kernel_size, stride, padding, PoolOp.AVG, count_include_pad, activation, ctx, stream, form)


def _unary_like_backward(op: str, module: Any, grad_output: Tensor, ctx: Context, retain: bool, stream: Any) -> Tensor:
    """The backward of an (input -> output) op: (output, output_grad, input, input_grad) -> input_grad."""
    env, saved = _begin_backward(op, ctx, grad_output, stream)
    g = env.array("grad_output", grad_output)
    x = saved["input"]
    input_grad = env.empty(x.shape, x.dtype)
    with env.active():
        module.backward_kernel(env.stream, env.handle, ctx.state, ctx.state.attrs, saved["output"], g, x, input_grad)
    _finish_backward(ctx, retain)
    return env.out(input_grad)


@_public
def max_pool2d_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the max_pool2d forward recorded in `ctx` (its argmax)."""
    return _unary_like_backward("max_pool2d_backward", pool_2d, grad_output, ctx, retain, stream)


@_public
def avg_pool2d_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the avg_pool2d forward recorded in `ctx`."""
    return _unary_like_backward("avg_pool2d_backward", pool_2d, grad_output, ctx, retain, stream)


# --------------------------------------------------------------------------- interpolate / upsample


@_public
def interpolate(input: Tensor, size: IntPair | None = None, scale_factor: float | Sequence[float] | None = None,
                mode: str = "nearest", align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.nn.functional.interpolate of an NCHW input by one integer scale >= 2 on both H and W
    (scale_factor, or a size that is such a multiple): mode 'nearest', or 'bilinear' with
    align_corners False/None."""
    op = "interpolate"
    form, output = _planned_unary(op, ctx, stream, input, (size, scale_factor, mode, align_corners,
                                                          recompute_scale_factor, antialias))
    if output is not None:
        return output
    env = _Env(op, input, stream)
    x = env.array("input", input)
    _rank(op, "input", x, 4, "(N, C, H, W)")
    _refuse(op, "antialias", antialias, False, "no antialiasing kernel")
    if mode not in ("nearest", "bilinear"):
        raise fail(AttrsError, op, "mode", "'nearest' or 'bilinear'", repr(mode))
    if mode == "bilinear" and align_corners:
        raise fail(AttrsError, op, "align_corners", "False or None (the kernel is align_corners=False)", align_corners)
    if (size is None) == (scale_factor is None):
        raise fail(AttrsError, op, "size/scale_factor", "exactly one of them", f"size={size!r}, scale_factor={scale_factor!r}")
    if size is not None:
        out_h, out_w = _pair(op, "size", size)
        in_h, in_w = x.shape[2:]
        scales = {out_h // in_h if in_h and out_h % in_h == 0 else None, out_w // in_w if in_w and out_w % in_w == 0 else None}
        if len(scales) != 1 or None in scales:
            raise fail(AttrsError, op, "size", f"one integer multiple of (H, W) = {(in_h, in_w)} for both", (out_h, out_w))
        scale = scales.pop()
    else:
        factors = scale_factor if isinstance(scale_factor, (list, tuple)) else (scale_factor, scale_factor)
        if len(factors) != 2 or factors[0] != factors[1] or float(factors[0]) != int(factors[0]):
            raise fail(AttrsError, op, "scale_factor", "one integer >= 2 for H and W", repr(scale_factor))
        scale = int(factors[0])
    attrs = UpsampleAttrs(scale, UpsampleMode.NEAREST if mode == "nearest" else UpsampleMode.BILINEAR)
    dims = upsample_op.output_dims(attrs, tuple(x.shape))
    output = env.empty(dims, x.dtype)
    shapes = (TensorShape.of(x), TensorShape(dims, x.dtype))
    _run_forward(env, op, upsample_op, attrs, shapes,
                 lambda state: upsample_op.forward_kernel(env.stream, env.handle, state, attrs, x, output), ctx, False,
                 input=x, output=output)
    _remember(form, env, upsample_op, attrs, shapes, dims, x.dtype)
    return env.out(output)


@_public
def interpolate_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the interpolate forward recorded in `ctx`."""
    return _unary_like_backward("interpolate_backward", upsample_op, grad_output, ctx, retain, stream)


@_public
def upsample(input: Tensor, size: IntPair | None = None, scale_factor: float | Sequence[float] | None = None,
              mode: str = "nearest", align_corners: bool | None = None, *, ctx: Context | None = None,
              stream: Any = None) -> Tensor:
    """torch.nn.functional.upsample (interpolate's older name); its backward is interpolate_backward."""
    return interpolate(input, size, scale_factor, mode, align_corners, ctx=ctx, stream=stream)


upsample_backward = interpolate_backward


# --------------------------------------------------------------------------- softmax


@_public
def softmax(input: Tensor, dim: int, *, dtype: Any = None, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.nn.functional.softmax over `dim` (negative counts from the end); `dtype` casts the input first."""
    op = "softmax"
    form, output = _planned_unary(op, ctx, stream, input, (dim, dtype))
    if output is not None:
        return output
    env = _Env(op, input, stream)
    x = env.array("input", input)
    if dtype is not None and np.dtype(dtype) != x.dtype:
        x = _contiguous_copy(env, x, np.dtype(dtype))
        form = None  # the plans run on the input as given
    attrs = SoftmaxAttrs(dim)
    output = env.empty(x.shape, x.dtype)
    shapes = (TensorShape.of(x), TensorShape.of(x))
    _run_forward(env, op, softmax_op, attrs, shapes,
                 lambda state: softmax_op.forward_kernel(env.stream, env.handle, state, attrs, x, output), ctx, False,
                 input=x, output=output)
    _remember(form, env, softmax_op, attrs, shapes, x.shape, x.dtype)
    return env.out(output)


@_public
def softmax_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the softmax forward recorded in `ctx` (from its output)."""
    return _unary_like_backward("softmax_backward", softmax_op, grad_output, ctx, retain, stream)


# --------------------------------------------------------------------------- topk


class TopK(NamedTuple):
    """topk's result, as torch.topk's: the k largest values of each row and their int64 indices."""

    values: Tensor
    indices: Tensor


@_public
def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, *,
         ctx: Context | None = None, stream: Any = None) -> TopK:
    """torch.topk along the last dim: the k largest of each row, descending, in torch.sort(descending=True,
    stable=True)'s order (equal values lower index first, NaN above +inf, -0.0 equal to +0.0; each value's
    own bits). `dim` must name the last dim and `largest` be True (the kernel's only selection); sorted=False
    is accepted, the result sorted all the same (an order torch allows it)."""
    op = "topk"
    form, plan = _planned(op, ctx, stream, (input,), (k, dim, largest, sorted))
    if plan is not None:
        values, indices = plan.empty(plan.dims, plan.dtype), plan.empty(plan.dims, top_k_op.INDEX_DTYPE)
        plan.run(input, values, indices)
        return TopK(values, indices)
    env = _Env(op, input, stream)
    x = env.array("input", input)
    if x.ndim < 1:
        raise fail(ShapeError, op, "input", "rank >= 1 (rows along the last dim)", "rank 0")
    axis = core.normalize_axis(op, "dim", core.attr_int(op, "dim", dim), x.ndim)
    if axis != x.ndim - 1:
        raise fail(AttrsError, op, "dim", f"the last dim (-1 or {x.ndim - 1}): the kernel selects along the last dim "
                   "(move the dim there first, with permute or transpose)", dim)
    _refuse(op, "largest", largest, True, "the kernel keeps the largest")
    core.attr_bool(op, "sorted", sorted)
    attrs = TopKAttrs(k)
    dims = top_k_op.output_dims(attrs, tuple(x.shape))
    values, indices = env.empty(dims, x.dtype), env.empty(dims, top_k_op.INDEX_DTYPE)
    shapes = (TensorShape.of(x), TensorShape(dims, x.dtype), TensorShape(dims, top_k_op.INDEX_DTYPE))
    _run_forward(env, op, top_k_op, attrs, shapes,
                 lambda state: top_k_op.forward_kernel(env.stream, env.handle, state, attrs, x, values, indices), ctx,
                 False, indices=indices, input_shape=(tuple(x.shape), x.dtype))
    _remember(form, env, top_k_op, attrs, shapes, dims, x.dtype)
    return TopK(env.out(values), env.out(indices))


@_public
def topk_backward(grad_values: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the topk forward recorded in `ctx`: grad_values at the forward's indices, zeros
    elsewhere (the indices are what it reads: do not change them in place before)."""
    op = "topk_backward"
    env, saved = _begin_backward(op, ctx, grad_values, stream, "grad_values")
    g = env.array("grad_values", grad_values)
    dims, dtype = saved["input_shape"]
    input_grad = env.empty(dims, dtype)
    with env.active():
        top_k_op.backward_kernel(env.stream, env.handle, ctx.state, ctx.state.attrs, None, g, saved["indices"], None,
                                 input_grad)
    _finish_backward(ctx, retain)
    return env.out(input_grad)


# --------------------------------------------------------------------------- cat, split


@_public
def cat(tensors: Sequence[Tensor], dim: int = 0, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.cat of two or more tensors along `dim` (any rank, any numeric dtype)."""
    op = "cat"
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise fail(ShapeError, op, "tensors", "a non-empty list of tensors", type(tensors).__name__)
    form, plan = _planned(op, ctx, stream, tensors, (dim,))
    if plan is not None:
        output = plan.empty(plan.dims, plan.dtype)
        plan.run(list(tensors), output)
        return output
    env = _Env(op, tensors[0], stream)
    inputs = [env.array(f"tensors[{i}]", t) for i, t in enumerate(tensors)]
    attrs = ConcatAttrs(axis=dim, num_inputs=len(inputs))
    dims = concat.output_dims(attrs, [tuple(a.shape) for a in inputs]) if inputs[0].ndim else ()
    output = env.empty(dims, inputs[0].dtype)
    shapes = ([TensorShape.of(a) for a in inputs], TensorShape(dims, inputs[0].dtype))
    _run_forward(env, op, concat, attrs, shapes,
                 lambda state: concat.forward_kernel(env.stream, env.handle, state, attrs, inputs, output), ctx, False,
                 piece_shapes=[(tuple(a.shape), a.dtype) for a in inputs])
    _remember(form, env, concat, attrs, shapes, dims, inputs[0].dtype)
    return env.out(output)


@_public
def cat_backward(grad_output: Tensor, ctx: Context, *, needs: Sequence[bool] | None = None, retain: bool = False,
                 stream: Any = None) -> list[Tensor | None]:
    """The gradients of the cat forward recorded in `ctx`, one per tensor (None where `needs[i]` is false)."""
    op = "cat_backward"
    env, saved = _begin_backward(op, ctx, grad_output, stream)
    g = env.array("grad_output", grad_output)
    shapes = saved["piece_shapes"]
    if needs is not None and len(needs) != len(shapes):
        raise fail(AttrsError, op, "needs", f"{len(shapes)} flags, one per tensor", len(needs))
    grads = [env.empty(dims, dtype) if needs is None or needs[i] else None for i, (dims, dtype) in enumerate(shapes)]
    with env.active():
        concat.backward_kernel(env.stream, env.handle, ctx.state, ctx.state.attrs, None, g, None, grads)
    _finish_backward(ctx, retain)
    return [env.out(a) for a in grads]


@_public
def split(tensor: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0, *, ctx: Context | None = None,
          stream: Any = None) -> tuple[Tensor, ...]:
    """torch.split: pieces of `split_size_or_sections` each (the last smaller), or of the sizes listed."""
    op = "split"
    form, plan = _planned(op, ctx, stream, (tensor,), (split_size_or_sections, dim))
    if plan is not None:
        outputs = [plan.empty(d, plan.dtype) for d in plan.dims]
        plan.run(tensor, outputs)
        return tuple(outputs)
    env = _Env(op, tensor, stream)
    x = env.array("tensor", tensor)
    if x.ndim < 1:
        raise fail(ShapeError, op, "tensor", "rank >= 1", "rank 0")
    axis = core.normalize_axis(op, "dim", dim, x.ndim)
    if isinstance(split_size_or_sections, (int, np.integer)) and not isinstance(split_size_or_sections, bool):
        size = int(split_size_or_sections)
        if size < 1:
            raise fail(AttrsError, op, "split_size_or_sections", "a size >= 1", size)
        length = x.shape[axis]
        sections = tuple(min(size, length - start) for start in range(0, length, size)) or (0,)
    else:
        try:
            sections = tuple(split_size_or_sections)
        except TypeError:  # neither an int nor a sequence (a float): refused in the caller's terms
            raise fail(AttrsError, op, "split_size_or_sections", "an int or a sequence of ints",
                       repr(split_size_or_sections)) from None
    attrs = SplitAttrs(splits=sections, axis=dim)
    out_dims = split_op.output_dims(attrs, tuple(x.shape))
    outputs = [env.empty(d, x.dtype) for d in out_dims]
    shapes = (TensorShape.of(x), [TensorShape(d, x.dtype) for d in out_dims])
    _run_forward(env, op, split_op, attrs, shapes,
                 lambda state: split_op.forward_kernel(env.stream, env.handle, state, attrs, x, outputs), ctx, False,
                 input_shape=(tuple(x.shape), x.dtype), output_dims=out_dims)
    _remember(form, env, split_op, attrs, shapes, out_dims, x.dtype)
    return tuple(env.out(o) for o in outputs)


@_public
def split_backward(grad_outputs: Sequence[Tensor | None], ctx: Context, *, retain: bool = False,
                   stream: Any = None) -> Tensor:
    """The input gradient of the split forward recorded in `ctx`; a None entry stands for zeros."""
    op = "split_backward"
    first = next((g for g in grad_outputs if g is not None), None) if isinstance(grad_outputs, (list, tuple)) else None
    if first is None:
        raise fail(ShapeError, op, "grad_outputs", "a list with at least one tensor", repr(grad_outputs))
    env, saved = _begin_backward(op, ctx, first, stream)
    (dims, dtype), out_dims = saved["input_shape"], saved["output_dims"]
    if len(grad_outputs) != len(out_dims):
        raise fail(ShapeError, op, "grad_outputs", f"a list of {len(out_dims)}", f"a list of {len(grad_outputs)}")
    grads = [env.zeros(d, dtype) if g is None else env.array(f"grad_outputs[{i}]", g)
             for i, (g, d) in enumerate(zip(grad_outputs, out_dims))]
    input_grad = env.empty(dims, dtype)
    with env.active():
        split_op.backward_kernel(env.stream, env.handle, ctx.state, ctx.state.attrs, None, grads, None, input_grad)
    _finish_backward(ctx, retain)
    return env.out(input_grad)


# --------------------------------------------------------------------------- reshape, permute, transpose


def _shape_only_forward(op: str, module: Any, env: _Env, x: Any, attrs: Any, dims: tuple[int, ...],
                        ctx: Context | None, form: Any) -> Tensor:
    output = env.empty(dims, x.dtype)
    shapes = (TensorShape.of(x), TensorShape(dims, x.dtype))
    _run_forward(env, op, module, attrs, shapes,
                 lambda state: module.forward_kernel(env.stream, env.handle, state, attrs, x, output), ctx, False,
                 input_shape=(tuple(x.shape), x.dtype))
    _remember(form, env, module, attrs, shapes, dims, x.dtype)
    return env.out(output)


def _shape_only_backward(op: str, module: Any, grad_output: Tensor, ctx: Context, retain: bool, stream: Any) -> Tensor:
    env, saved = _begin_backward(op, ctx, grad_output, stream)
    g = env.array("grad_output", grad_output)
    dims, dtype = saved["input_shape"]
    input_grad = env.empty(dims, dtype)
    with env.active():
        module.backward_kernel(env.stream, env.handle, ctx.state, ctx.state.attrs, None, g, None, input_grad)
    _finish_backward(ctx, retain)
    return env.out(input_grad)


@_public
def reshape(input: Tensor, shape: Sequence[int], *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.reshape (one -1 inferred); always a copy, made on the stream."""
    form, output = _planned_unary("reshape", ctx, stream, input, (shape,))
    if output is not None:
        return output
    env = _Env("reshape", input, stream)
    x = env.array("input", input)
    attrs = ReshapeAttrs(tuple(shape))
    return _shape_only_forward("reshape", reshape_op, env, x, attrs, reshape_op.output_dims(attrs, tuple(x.shape)), ctx,
                               form)


@_public
def reshape_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the reshape forward recorded in `ctx`."""
    return _shape_only_backward("reshape_backward", reshape_op, grad_output, ctx, retain, stream)


@_public
def permute(input: Tensor, dims: Sequence[int], *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.permute: output dim d is input dim dims[d] (negative dims count from the end); a copy."""
    op = "permute"
    form, output = _planned_unary(op, ctx, stream, input, (dims,))
    if output is not None:
        return output
    env = _Env(op, input, stream)
    x = env.array("input", input)
    permutation = tuple(core.normalize_axis(op, f"dims[{i}]", d, x.ndim) for i, d in enumerate(dims))
    attrs = TransposeAttrs(permutation)
    if len(permutation) != x.ndim:
        raise fail(ShapeError, op, "dims", f"{x.ndim} dims (the input's rank)", len(permutation))
    return _shape_only_forward(op, transpose_op, env, x, attrs, transpose_op.output_dims(attrs, tuple(x.shape)), ctx,
                               form)


@_public
def permute_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the permute forward recorded in `ctx` (the inverse permutation)."""
    return _shape_only_backward("permute_backward", transpose_op, grad_output, ctx, retain, stream)


@_public
def transpose(input: Tensor, dim0: int, dim1: int, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.transpose: dims dim0 and dim1 swapped; a copy."""
    op = "transpose"
    form, output = _planned_unary(op, ctx, stream, input, (dim0, dim1))
    if output is not None:
        return output
    env = _Env(op, input, stream)
    x = env.array("input", input)
    a, b = core.normalize_axis(op, "dim0", dim0, x.ndim), core.normalize_axis(op, "dim1", dim1, x.ndim)
    permutation = list(range(x.ndim))
    permutation[a], permutation[b] = b, a
    attrs = TransposeAttrs(tuple(permutation))
    return _shape_only_forward(op, transpose_op, env, x, attrs, transpose_op.output_dims(attrs, tuple(x.shape)), ctx,
                               form)


@_public
def transpose_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the transpose forward recorded in `ctx`."""
    return _shape_only_backward("transpose_backward", transpose_op, grad_output, ctx, retain, stream)


# --------------------------------------------------------------------------- matmul and the binary ops


class BinaryGrads(NamedTuple):
    input: Tensor | None
    other: Tensor | None


def _binary_forward(op: str, module: Any, attrs: Any, env: _Env, lhs: Any, rhs: Any, dims: tuple[int, ...],
                    ctx: Context | None, form: Any) -> Tensor:
    output = env.empty(dims, lhs.dtype)
    shapes = (TensorShape.of(lhs), TensorShape.of(rhs), TensorShape(dims, lhs.dtype))
    _run_forward(env, op, module, attrs, shapes,
                 lambda state: module.forward_kernel(env.stream, env.handle, state, attrs, lhs, rhs, output), ctx,
                 False, input=lhs, other=rhs, output=output)
    _remember(form, env, module, attrs, shapes, output.shape, output.dtype)
    return env.out(output)


def _binary_backward(op: str, grad_output: Tensor, ctx: Context, needs: Sequence[str] | None, retain: bool,
                     stream: Any) -> BinaryGrads:
    env, saved = _begin_backward(op, ctx, grad_output, stream)
    want = _needs(op, needs, ("input", "other"))
    g = env.array("grad_output", grad_output)
    if "scalar" in saved:  # the tensor-and-number form ran as an element_unary op
        x = saved["input"]
        input_grad = env.empty(x.shape, x.dtype) if "input" in want else None
        if input_grad is not None:
            with env.active():
                element_unary.backward_kernel(env.stream, env.handle, ctx.state, ctx.state.attrs, saved["output"], g,
                                              x, input_grad)
        _finish_backward(ctx, retain)
        return BinaryGrads(env.out(input_grad), None)
    lhs, rhs = saved["input"], saved["other"]
    lhs_grad = env.empty(lhs.shape, lhs.dtype) if "input" in want else None
    rhs_grad = env.empty(rhs.shape, rhs.dtype) if "other" in want else None
    module = _OP_MODULES[ctx.state.op]
    with env.active():
        module.backward_kernel(env.stream, env.handle, ctx.state, ctx.state.attrs, saved["output"], g, lhs, lhs_grad,
                               rhs, rhs_grad)
    _finish_backward(ctx, retain)
    return BinaryGrads(env.out(lhs_grad), env.out(rhs_grad))


@_public
def matmul(input: Tensor, other: Tensor, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.matmul of (..., M, K) by (..., K, N), rank >= 3 with identical leading dims (no broadcasting)."""
    op = "matmul"
    form, plan = _planned(op, ctx, stream, (input, other), ())
    if plan is not None:
        output = plan.empty(plan.dims, plan.dtype)
        plan.run(input, other, output)
        return output
    env = _Env(op, input, stream)
    lhs, rhs = env.array("input", input), env.array("other", other)
    attrs = BatchMatmulAttrs()
    if lhs.ndim < 3 or rhs.ndim < 3:
        name, array = ("input", lhs) if lhs.ndim < 3 else ("other", rhs)
        raise fail(ShapeError, op, name, "rank >= 3 (batched, identical leading dims)", f"rank {array.ndim} {tuple(array.shape)}")
    return _binary_forward(op, batch_matmul, attrs, env, lhs, rhs, batch_matmul.output_dims(tuple(lhs.shape), tuple(rhs.shape)),
                           ctx, form)


@_public
def matmul_backward(grad_output: Tensor, ctx: Context, *, needs: Sequence[str] | None = None, retain: bool = False,
                    stream: Any = None) -> BinaryGrads:
    """Gradients of the matmul forward recorded in `ctx`: BinaryGrads(input, other)."""
    return _binary_backward("matmul_backward", grad_output, ctx, needs, retain, stream)


_SCALAR_FORMS = {BinaryOpType.ADD: UnaryOpType.SCALAR_ADD, BinaryOpType.SUB: UnaryOpType.SCALAR_SUB,
                 BinaryOpType.MUL: UnaryOpType.SCALAR_MULTIPLY, BinaryOpType.DIV: UnaryOpType.SCALAR_TRUE_DIV}


def _elementwise(op: str, op_type: BinaryOpType, input: Tensor, other: Tensor | float, ctx: Context | None,
                 stream: Any) -> Tensor:
    number = isinstance(other, (int, float, np.integer, np.floating)) and not isinstance(other, bool)
    form, plan = _planned(op, ctx, stream, (input,), (other,)) if number else _planned(op, ctx, stream, (input, other), ())
    if plan is not None:
        output = plan.empty(plan.dims, plan.dtype)
        if number:
            plan.run(input, output)
        else:
            plan.run(input, other, output)
        return output
    env = _Env(op, input, stream)
    lhs = env.array("input", input)
    if number:
        if op_type not in _SCALAR_FORMS:
            raise fail(AttrsError, op, "other", "a tensor (no scalar form of this op)", repr(other))
        attrs = ElementUnaryAttrs(_SCALAR_FORMS[op_type], float(other))
        output = env.empty(lhs.shape, lhs.dtype)
        shapes = (TensorShape.of(lhs), TensorShape.of(lhs))
        _run_forward(env, op, element_unary, attrs, shapes,
                     lambda state: element_unary.forward_kernel(env.stream, env.handle, state, attrs, lhs, output), ctx,
                     False, input=lhs, output=output, scalar=float(other))
        _remember(form, env, element_unary, attrs, shapes, output.shape, output.dtype)
        return env.out(output)
    rhs = env.array("other", other)
    dims = element_binary.broadcast_dims(tuple(lhs.shape), tuple(rhs.shape))
    if dims is None:
        raise fail(ShapeError, op, "other", f"dims that broadcast with the input's {tuple(lhs.shape)}", tuple(rhs.shape))
    return _binary_forward(op, element_binary, ElementBinaryAttrs(op_type), env, lhs, rhs, dims, ctx, form)


@_public
def add(input: Tensor, other: Tensor | float, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.add (NumPy broadcasting on either side; a number `other` runs as a scalar op)."""
    return _elementwise("add", BinaryOpType.ADD, input, other, ctx, stream)


@_public
def sub(input: Tensor, other: Tensor | float, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.sub (broadcasting; a number `other` runs as a scalar op)."""
    return _elementwise("sub", BinaryOpType.SUB, input, other, ctx, stream)


@_public
def mul(input: Tensor, other: Tensor | float, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.mul (broadcasting; a number `other` runs as a scalar op)."""
    return _elementwise("mul", BinaryOpType.MUL, input, other, ctx, stream)


@_public
def div(input: Tensor, other: Tensor | float, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.div, true division (broadcasting; a number `other` runs as a scalar op)."""
    return _elementwise("div", BinaryOpType.DIV, input, other, ctx, stream)


@_public
def maximum(input: Tensor, other: Tensor, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.maximum (broadcasting; NaN propagates; a tie gives each side half the gradient)."""
    return _elementwise("maximum", BinaryOpType.MAX, input, other, ctx, stream)


@_public
def minimum(input: Tensor, other: Tensor, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.minimum (broadcasting; NaN propagates; a tie gives each side half the gradient)."""
    return _elementwise("minimum", BinaryOpType.MIN, input, other, ctx, stream)


@_public
def add_backward(grad_output: Tensor, ctx: Context, *, needs: Sequence[str] | None = None, retain: bool = False,
                 stream: Any = None) -> BinaryGrads:
    """Gradients of the add forward in `ctx`, summed over broadcast dims (other None for a number)."""
    return _binary_backward("add_backward", grad_output, ctx, needs, retain, stream)


@_public
def sub_backward(grad_output: Tensor, ctx: Context, *, needs: Sequence[str] | None = None, retain: bool = False,
                 stream: Any = None) -> BinaryGrads:
    """Gradients of the sub forward in `ctx`, summed over broadcast dims (other None for a number)."""
    return _binary_backward("sub_backward", grad_output, ctx, needs, retain, stream)


@_public
def mul_backward(grad_output: Tensor, ctx: Context, *, needs: Sequence[str] | None = None, retain: bool = False,
                 stream: Any = None) -> BinaryGrads:
    """Gradients of the mul forward in `ctx`, summed over broadcast dims (other None for a number)."""
    return _binary_backward("mul_backward", grad_output, ctx, needs, retain, stream)


@_public
def div_backward(grad_output: Tensor, ctx: Context, *, needs: Sequence[str] | None = None, retain: bool = False,
                 stream: Any = None) -> BinaryGrads:
    """Gradients of the div forward in `ctx`, summed over broadcast dims (other None for a number)."""
    return _binary_backward("div_backward", grad_output, ctx, needs, retain, stream)


@_public
def maximum_backward(grad_output: Tensor, ctx: Context, *, needs: Sequence[str] | None = None, retain: bool = False,
                     stream: Any = None) -> BinaryGrads:
    """Gradients of the maximum forward in `ctx`, summed over broadcast dims."""
    return _binary_backward("maximum_backward", grad_output, ctx, needs, retain, stream)


@_public
def minimum_backward(grad_output: Tensor, ctx: Context, *, needs: Sequence[str] | None = None, retain: bool = False,
                     stream: Any = None) -> BinaryGrads:
    """Gradients of the minimum forward in `ctx`, summed over broadcast dims."""
    return _binary_backward("minimum_backward", grad_output, ctx, needs, retain, stream)


# --------------------------------------------------------------------------- gradient_reduction


@_public
def gradient_reduction(tensors: Sequence[Tensor], *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """The sum of one or more same-shape tensors, left to right (the gradients of a tensor read more than once)."""
    op = "gradient_reduction"
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise fail(ShapeError, op, "tensors", "a non-empty list of tensors", type(tensors).__name__)
    form, plan = _planned(op, ctx, stream, tensors, ())
    if plan is not None:
        output = plan.empty(plan.dims, plan.dtype)
        plan.run(list(tensors), output)
        return output
    env = _Env(op, tensors[0], stream)
    inputs = [env.array(f"tensors[{i}]", t) for i, t in enumerate(tensors)]
    output = env.empty(inputs[0].shape, inputs[0].dtype)
    attrs = GradientReductionAttrs()
    shapes = ([TensorShape.of(a) for a in inputs], TensorShape.of(inputs[0]))
    _run_forward(env, op, gradient_reduction_op, attrs, shapes,
                 lambda state: gradient_reduction_op.forward_kernel(env.stream, env.handle, state, attrs, inputs, output),
                 ctx, False, piece_shapes=[(tuple(a.shape), a.dtype) for a in inputs])
    _remember(form, env, gradient_reduction_op, attrs, shapes, output.shape, output.dtype)
    return env.out(output)


@_public
def gradient_reduction_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False,
                                stream: Any = None) -> list[Tensor]:
    """The gradients of the gradient_reduction forward in `ctx`: grad_output copied, once per tensor."""
    op = "gradient_reduction_backward"
    env, saved = _begin_backward(op, ctx, grad_output, stream)
    g = env.array("grad_output", grad_output)
    grads = [env.empty(dims, dtype) for dims, dtype in saved["piece_shapes"]]
    with env.active():
        gradient_reduction_op.backward_kernel(env.stream, env.handle, ctx.state, ctx.state.attrs, None, g, None, grads)
    _finish_backward(ctx, retain)
    return [env.out(a) for a in grads]


# --------------------------------------------------------------------------- elementwise unary


def _unary(op: str, op_type: UnaryOpType, input: Tensor, scalar: float | None, ctx: Context | None,
           stream: Any) -> Tensor:
    form, plan = _planned(op, ctx, stream, (input,), (scalar,))
    if plan is not None:
        output = plan.empty(plan.dims, plan.dtype)
        plan.run(input, output)
        return output
    env = _Env(op, input, stream)
    x = env.array("input", input)
    attrs = ElementUnaryAttrs(op_type, scalar)
    output = env.empty(x.shape, x.dtype)
    shapes = (TensorShape.of(x), TensorShape.of(x))
    _run_forward(env, op, element_unary, attrs, shapes,
                 lambda state: element_unary.forward_kernel(env.stream, env.handle, state, attrs, x, output), ctx,
                 False, input=x, output=output)
    _remember(form, env, element_unary, attrs, shapes, output.shape, output.dtype)
    return env.out(output)


def _unary_backward(op: str, grad_output: Tensor, ctx: Context, retain: bool, stream: Any) -> Tensor:
    return _unary_like_backward(op, element_unary, grad_output, ctx, retain, stream)


@_public
def relu(input: Tensor, inplace: bool = False, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.nn.functional.relu (relu'(0) = 0); `inplace` is accepted as False only (outputs are new)."""
    _refuse("relu", "inplace", inplace, False, "the functional layer returns new arrays")
    return _unary("relu", UnaryOpType.RELU, input, None, ctx, stream)


@_public
def relu_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the relu forward recorded in `ctx`."""
    return _unary_backward("relu_backward", grad_output, ctx, retain, stream)


@_public
def sigmoid(input: Tensor, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.sigmoid."""
    return _unary("sigmoid", UnaryOpType.SIGMOID, input, None, ctx, stream)


@_public
def sigmoid_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the sigmoid forward recorded in `ctx`."""
    return _unary_backward("sigmoid_backward", grad_output, ctx, retain, stream)


@_public
def tanh(input: Tensor, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.tanh."""
    return _unary("tanh", UnaryOpType.TANH, input, None, ctx, stream)


@_public
def tanh_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the tanh forward recorded in `ctx`."""
    return _unary_backward("tanh_backward", grad_output, ctx, retain, stream)


@_public
def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False, *, ctx: Context | None = None,
        stream: Any = None) -> Tensor:
    """torch.nn.functional.elu (elu'(0) = alpha, as torch)."""
    _refuse("elu", "inplace", inplace, False, "the functional layer returns new arrays")
    return _unary("elu", UnaryOpType.ELU, input, alpha, ctx, stream)


@_public
def elu_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the elu forward recorded in `ctx`."""
    return _unary_backward("elu_backward", grad_output, ctx, retain, stream)


@_public
def gelu(input: Tensor, approximate: str = "none", *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.nn.functional.gelu, exact (erf) form; approximate='tanh' is refused."""
    _refuse("gelu", "approximate", approximate, "none", "the kernel is the exact erf form")
    return _unary("gelu", UnaryOpType.GELU, input, None, ctx, stream)


@_public
def gelu_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the gelu forward recorded in `ctx`."""
    return _unary_backward("gelu_backward", grad_output, ctx, retain, stream)


@_public
def silu(input: Tensor, inplace: bool = False, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.nn.functional.silu: x * sigmoid(x)."""
    _refuse("silu", "inplace", inplace, False, "the functional layer returns new arrays")
    return _unary("silu", UnaryOpType.SILU, input, None, ctx, stream)


@_public
def silu_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the silu forward recorded in `ctx`."""
    return _unary_backward("silu_backward", grad_output, ctx, retain, stream)


@_public
def exp(input: Tensor, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.exp."""
    return _unary("exp", UnaryOpType.EXP, input, None, ctx, stream)


@_public
def exp_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the exp forward recorded in `ctx`."""
    return _unary_backward("exp_backward", grad_output, ctx, retain, stream)


@_public
def rsqrt(input: Tensor, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.rsqrt."""
    return _unary("rsqrt", UnaryOpType.RSQRT, input, None, ctx, stream)


@_public
def rsqrt_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the rsqrt forward recorded in `ctx`."""
    return _unary_backward("rsqrt_backward", grad_output, ctx, retain, stream)


@_public
def sin(input: Tensor, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.sin."""
    return _unary("sin", UnaryOpType.SIN, input, None, ctx, stream)


@_public
def sin_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the sin forward recorded in `ctx`."""
    return _unary_backward("sin_backward", grad_output, ctx, retain, stream)


@_public
def cos(input: Tensor, *, ctx: Context | None = None, stream: Any = None) -> Tensor:
    """torch.cos."""
    return _unary("cos", UnaryOpType.COS, input, None, ctx, stream)


@_public
def cos_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the cos forward recorded in `ctx`."""
    return _unary_backward("cos_backward", grad_output, ctx, retain, stream)


@_public
def pow(input: Tensor, exponent: float, *, ctx: Context | None = None, stream: Any = None) -> Tensor:  # noqa: A001
    """torch.pow with a number exponent (a tensor exponent is refused)."""
    if not isinstance(exponent, (int, float, np.integer, np.floating)) or isinstance(exponent, bool):
        raise fail(AttrsError, "pow", "exponent", "a number (no tensor exponents)", type(exponent).__name__)
    return _unary("pow", UnaryOpType.POW, input, exponent, ctx, stream)


@_public
def pow_backward(grad_output: Tensor, ctx: Context, *, retain: bool = False, stream: Any = None) -> Tensor:
    """The input gradient of the pow forward recorded in `ctx`."""
    return _unary_backward("pow_backward", grad_output, ctx, retain, stream)


# --------------------------------------------------------------------------- any op's backward


@_public
def backward(ctx: Context, grad_output: Any, *, retain: bool = False, stream: Any = None) -> Any:
    """The backward of whichever forward `ctx` recorded, with every gradient it has
    (split takes the list of output gradients)."""
    if not isinstance(ctx, Context) or ctx.op is None:
        raise fail(StateError, "backward", "ctx", "a Context a forward recorded into", repr(ctx))
    function = globals().get(f"{ctx.op}_backward")
    return function(grad_output, ctx, retain=retain, stream=stream)
