"""A network built from op calls: its parameters and buffers (in state_dict order), its device
and dtype, and the plans compiled for each (input shape, mode) it has been called with.

`Network` is the base of `YOLOv10`; a subclass declares its parameters in a `Registry` and says
how to trace itself into a Graph (`trace`). Everything else (loading, initialisation, train/eval,
forward, backward, gradients, cleanup) is here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..runtime import cpu as cpu_runtime
from ..runtime import dlpack
from ..runtime import gpu as gpu_runtime
from ..runtime import handle as gpu_handles
from ..runtime.core import (
    ALL_FLOAT_DTYPES,
    HALF_DTYPES,
    DeviceError,
    DTypeError,
    KernelError,
    ShapeError,
    StateError,
    TensorShape,
    check_tensor,
    compute_dtype,
    fail,
)
from . import checkpoint
from .graph import Graph, Plan


class StateDictError(KernelError):
    """load_state_dict was given a mapping with a missing, extra or misshapen entry (each one named)."""


@dataclass(frozen=True)
class Entry:
    """One state_dict entry. kind: "param" (trainable), "frozen" (a parameter without gradient, as the DFL
    conv's), "running_mean", "running_var" or "count" (num_batches_tracked). init: how init_random fills a
    parameter: "weight" and "bias" uniform in +-1/sqrt(fan_in), "gamma", "beta", "arange"."""

    name: str
    dims: tuple[int, ...]
    kind: str
    init: str = ""
    fan_in: int = 1

    @property
    def master(self) -> bool:
        """A BatchNorm's parameter or running statistic: float32 in a half-precision network (the batch_norm
        op's mixed-precision contract, as PyTorch's), the network's dtype otherwise."""
        return self.init in ("gamma", "beta") or self.kind in ("running_mean", "running_var")


@dataclass(frozen=True)
class Fold:
    """One convolution of a fused (BN-folded) inference graph: the sum of `parts`, each a conv without bias
    (its weight's name) followed by a BatchNorm (its prefix and eps), folded into one conv's weight of dims
    `dims` and bias. A part's kernel smaller than dims is centred in it (zeros around: RepVGGDW's 3x3 in
    its 7x7), which is exact where the padding is kernel // 2 on both."""

    weight: str
    bias: str
    dims: tuple[int, ...]
    parts: tuple[tuple[str, str, float], ...]


class Registry:
    """The parameters and buffers of a network, in the order they are declared (the state_dict's), and
    the folds of its fused inference graph."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.folds: list[Fold] = []

    def fold(self, weight: str, bias: str, dims: Sequence[int], parts: Sequence[tuple[str, str, float]]) -> None:
        self.folds.append(Fold(weight, bias, tuple(dims), tuple(parts)))

    def param(self, name: str, dims: Sequence[int], init: str, fan_in: int = 1, frozen: bool = False) -> str:
        self.entries.append(Entry(name, tuple(dims), "frozen" if frozen else "param", init, fan_in))
        return name

    def batch_norm(self, prefix: str, channels: int) -> str:
        """gamma, beta, running_mean, running_var and num_batches_tracked of a BatchNorm2d named prefix."""
        self.param(f"{prefix}.weight", (channels,), "gamma")
        self.param(f"{prefix}.bias", (channels,), "beta")
        self.entries.append(Entry(f"{prefix}.running_mean", (channels,), "running_mean"))
        self.entries.append(Entry(f"{prefix}.running_var", (channels,), "running_var"))
        self.entries.append(Entry(f"{prefix}.num_batches_tracked", (), "count"))
        return prefix


def parse_device(op: str, device: Any) -> Any:
    """"cpu" -> "cpu"; "gpu" -> 0; "gpu:N" -> N."""
    if device == "cpu":
        return "cpu"
    if device == "gpu":
        return 0
    if isinstance(device, str) and device.startswith("gpu:") and device[4:].isdigit():
        return int(device[4:])
    raise fail(DeviceError, op, "device", '"cpu", "gpu" or "gpu:N"', repr(device))


class Network:
    """Parameters, buffers and compiled plans of a network on one device, in one dtype.

    Subclasses set OP (the name errors carry), build `self.registry` before calling this
    __init__, and implement trace(graph, x, training) -> outputs (a dict of Tensors and lists
    of Tensors) and GRAD_OUTPUTS (the output keys backward takes gradients for).
    """

    OP = "network"
    GRAD_OUTPUTS: tuple[str, ...] = ()

    def __init__(self, registry: Registry, device: Any = "cpu", dtype: Any = "float32"):
        self.registry = registry
        self.device = parse_device(self.OP, device)
        try:
            parsed = np.dtype(dtype)
        except TypeError:
            parsed = None
        if parsed is None or dtype is None or parsed not in ALL_FLOAT_DTYPES:  # (np.dtype(None) is float64)
            raise fail(DTypeError, self.OP, "dtype", "float16, bfloat16, float32 or float64", repr(dtype))
        self.dtype = parsed  # of the activations, gradients and every parameter but the BatchNorms' (dtype_of)
        if self.device == "cpu":
            self.stream, self.handle, self.xp = cpu_runtime.cpu_stream(), cpu_runtime.cpu_handle(), np
            self.prefix, self._context = "cpu_", contextlib.nullcontext()
        else:  # pragma: no cover - GPU: a CUDA device and CuPy
            self.stream, self.handle = gpu_runtime.gpu_stream(self.device), gpu_handles.gpu_handle(self.device)
            self.xp, self.prefix, self._context = gpu_runtime.cupy, "gpu_", self.stream
        self.training = True  # as a torch module: training until eval()
        self.fused = False  # eval plans trace the fused graph (fuse())
        # GPU inference: a call after a plan's first replays a CUDA graph of it (Plan.run); False: every
        # call makes its op calls (docs/models.md#cuda-graphs).
        self.graphs = True
        self.fused_params: dict[str, Any] = {}  # the folded weights and biases, made by fuse()
        self.closed = False
        self.plans: dict[tuple, Plan] = {}
        self._last: Plan | None = None  # the plan of the last forward
        self._grads: dict[str, Any] = {}
        self.params: dict[str, Any] = {}
        self.running: dict[str, tuple[Any, Any]] = {}
        self.counts: dict[str, int] = {}
        with self.active():
            for entry in registry.entries:
                if entry.kind in ("param", "frozen"):
                    self.params[entry.name] = self.xp.zeros(entry.dims, self.dtype_of(entry))
                elif entry.kind == "running_mean":
                    prefix = entry.name[: -len(".running_mean")]
                    stat = self.dtype_of(entry)
                    self.running[prefix] = (self.xp.zeros(entry.dims, stat), self.xp.ones(entry.dims, stat))
                    self.counts[prefix] = 0

    @property
    def half(self) -> bool:
        """Whether the network runs in float16 or bfloat16 (mixed precision: see dtype_of)."""
        return self.dtype in HALF_DTYPES

    def dtype_of(self, entry: Entry) -> np.dtype:
        """The dtype of a state_dict entry's array: the network's dtype, except a BatchNorm's gamma, beta and
        running statistics in a float16 or bfloat16 network, which are float32 (core.compute_dtype)."""
        return compute_dtype(self.dtype) if entry.master else self.dtype

    # ----------------------------------------------------------------- the runtime plans use

    def active(self) -> Any:
        """A context in which arrays are allocated and copies enqueued on the network's stream (GPU)."""
        return self._context

    def empty(self, dims: Sequence[int], dtype: Any = None) -> Any:
        return self.xp.empty(tuple(dims), self.dtype if dtype is None else dtype)

    def zeros(self, dims: Sequence[int]) -> Any:
        return self.xp.zeros(tuple(dims), self.dtype)

    def place(self, host: np.ndarray) -> Any:
        """A device copy of a host constant, rounded once to the network's dtype on the host (NumPy, ml_dtypes)."""
        return self.xp.asarray(np.asarray(host).astype(self.dtype))

    def grad(self, name: str) -> Any:
        """The gradient array of a parameter (in the parameter's dtype), made once and shared by every plan."""
        if name not in self._grads:
            self._grads[name] = self.empty(self.params[name].shape, self.params[name].dtype)
        return self._grads[name]

    # ----------------------------------------------------------------- modes, weights

    def train(self, mode: bool = True) -> "Network":
        """Training mode (batch statistics, running ones updated; both heads' raw outputs); returns self."""
        self.training = bool(mode)
        return self

    def fuse(self, mode: bool = True) -> "Network":
        """Fused inference (ultralytics' fuse()): fold each BatchNorm (its running statistics, gamma, beta,
        eps) into the conv before it, and the sums of such pairs (RepVGGDW) into one conv, in float64 from
        the current values as stored (in a half network: the half conv weights and the float32 BatchNorm
        ones, each widened exactly), rounded once to the dtype; eval calls then run the fused graph (the activation
        fused into each conv; the subclass says what else: YOLOv10 drops the one-to-many head). Switches
        to eval mode. The folded arrays are made again by fuse() and by load_state_dict / init_random;
        change parameters or running statistics any other way (a training step) and call fuse() again.
        fuse(False) goes back to the unfused eval graph. Returns self."""
        self._require_open()
        if mode:
            self._fold()
            self.training = False
        self.fused = bool(mode)
        return self

    def _fold(self) -> None:
        """Write every Fold's weight and bias into fused_params (in place where they exist, so that compiled
        plans see the new values)."""
        def host(array: Any) -> np.ndarray:
            return np.asarray(array.get() if self.xp is not np else array, dtype=np.float64)

        with self.active():
            for fold in self.registry.folds:
                weight, bias = np.zeros(fold.dims), np.zeros(fold.dims[0])
                for conv, bn, eps in fold.parts:
                    mean, var = (host(a) for a in self.running[bn])
                    scale = host(self.params[f"{bn}.weight"]) / np.sqrt(var + eps)
                    part = host(self.params[conv]) * scale[:, None, None, None]
                    dh, dw = (fold.dims[2] - part.shape[2]) // 2, (fold.dims[3] - part.shape[3]) // 2
                    weight[:, :, dh:dh + part.shape[2], dw:dw + part.shape[3]] += part
                    bias += host(self.params[f"{bn}.bias"]) - mean * scale
                for name, value in ((fold.weight, weight), (fold.bias, bias)):
                    array = self.xp.asarray(value.astype(self.dtype))
                    if name in self.fused_params:
                        self.fused_params[name][...] = array
                    else:
                        self.fused_params[name] = array

    def array(self, name: str) -> Any:
        """A parameter's array, or a folded one (fused_params)."""
        return self.params[name] if name in self.params else self.fused_params[name]

    def eval(self) -> "Network":
        """Inference mode (running statistics); returns self."""
        return self.train(False)

    def _require_open(self) -> None:
        if self.closed:
            raise fail(StateError, self.OP, "model", "an open model", "one already closed")

    def init_random(self, seed: int = 0) -> "Network":
        """Fill every parameter and running statistic from a seeded generator (the same values on every
        device, rounded once to each entry's dtype, dtype_of): weights and biases uniform in +-1/sqrt(fan_in), BN gamma in
        [0.5, 1.5], beta in [-0.5, 0.5], running mean in [-0.5, 0.5], running var in [0.5, 2]; DFL's conv
        arange(16); num_batches_tracked 0. Returns self."""
        self._require_open()
        rng = np.random.default_rng(seed)
        with self.active():
            for entry in self.registry.entries:
                if entry.kind == "count":
                    self.counts[entry.name[: -len(".num_batches_tracked")]] = 0
                    continue
                if entry.init == "arange":
                    host = np.arange(np.prod(entry.dims), dtype=np.float64).reshape(entry.dims)
                elif entry.init in ("weight", "bias"):
                    bound = 1.0 / np.sqrt(entry.fan_in)
                    host = rng.uniform(-bound, bound, entry.dims)
                elif entry.init == "gamma":
                    host = rng.uniform(0.5, 1.5, entry.dims)
                elif entry.init == "beta" or entry.kind == "running_mean":
                    host = rng.uniform(-0.5, 0.5, entry.dims)
                else:  # running_var
                    host = rng.uniform(0.5, 2.0, entry.dims)
                self._target(entry)[...] = self.xp.asarray(host.astype(self.dtype_of(entry)))
        if self.fused_params:
            self._fold()
        return self

    def _target(self, entry: Entry) -> Any:
        """The array that holds an entry (not num_batches_tracked, a host count)."""
        if entry.kind in ("param", "frozen"):
            return self.params[entry.name]
        prefix, _, stat = entry.name.rpartition(".")
        return self.running[prefix][0 if stat == "running_mean" else 1]

    def state_dict(self) -> dict[str, Any]:
        """Every parameter and buffer by ultralytics' name, in its order: the network's own arrays (as
        torch's state_dict, they are not copies), num_batches_tracked as a new int64 array of shape ().
        Each array has its entry's dtype (dtype_of: float32 BatchNorm entries in a half network)."""
        result = {}
        with self.active():
            for entry in self.registry.entries:
                if entry.kind == "count":
                    count = self.counts[entry.name[: -len(".num_batches_tracked")]]
                    result[entry.name] = self.xp.asarray(np.array(count, dtype=np.int64))
                else:
                    result[entry.name] = self._target(entry)
        return result

    def _as_array(self, value: Any) -> Any:
        """A NumPy (CPU) or CuPy (GPU) view or copy of a state_dict value (a torch tensor through DLPack)."""
        if dlpack.is_torch(value):
            value = value.detach()
            if self.xp is np or value.device.type != "cuda":
                return self._as_array(dlpack.from_dlpack(value.cpu(), np))
            return dlpack.from_dlpack(value, self.xp)  # pragma: no cover - GPU: a CUDA tensor to a GPU model
        if self.xp is np:
            if type(value).__module__.startswith("cupy"):  # pragma: no cover - GPU: a CuPy array given to a CPU model
                value = value.get()
            return np.asarray(value)
        return self.xp.asarray(value)  # pragma: no cover - GPU: NumPy or CuPy arrays to the device

    def load_state_dict(self, mapping: Any, strict: bool = True) -> Any:
        """Copy every entry of `mapping` (ultralytics' names -> arrays: NumPy, CuPy on the GPU, torch tensors,
        anything numpy.asarray takes) into the network, cast to each entry's dtype (dtype_of: in a half network
        the BatchNorms' gamma, beta and running statistics float32, every other parameter the half dtype; a
        value of another dtype is rounded once to it, on the host). A checkpoint wrapper or a common key prefix
        is recognised (kernels/models/checkpoint.py). Raises StateDictError, naming them, for misshapen
        entries and (strict, the default) missing or extra ones, before anything is copied; saying why where
        no key is a name at all. Returns self; with strict=False, as torch, the entries it has are loaded
        and IncompatibleKeys(missing_keys, unexpected_keys) is returned."""
        self._require_open()
        expected = {entry.name: entry for entry in self.registry.entries}
        mapping, done = checkpoint.normalize(mapping, list(expected))
        if not isinstance(mapping, Mapping):
            raise fail(StateDictError, self.OP, "load_state_dict", "a mapping of names to arrays (or a checkpoint)",
                       type(mapping).__name__)
        with self.active():
            arrays = {name: self._as_array(value) for name, value in mapping.items()}
        missing = [name for name in expected if name not in arrays]
        extra = [name for name in arrays if name not in expected]
        misshapen = [f"{name} (expected {expected[name].dims}, found {tuple(array.shape)})"
                     for name, array in arrays.items() if name in expected and tuple(array.shape) != expected[name].dims]
        problems = [f"{what}: {', '.join(names)}" for what, names in
                    ((("missing", missing), ("unexpected", extra)) if strict else ()) + (("misshapen", misshapen),)
                    if names]
        if strict and arrays and len(missing) == len(expected):  # nothing matched: say why, not all the names
            raise StateDictError(f"{self.OP}: load_state_dict: {checkpoint.unmatched(arrays, list(expected), done)}")
        if problems:
            raise StateDictError(f"{self.OP}: load_state_dict: " + "; ".join(problems) + (f" (after {done})" if done else ""))
        with self.active():
            for entry in self.registry.entries:
                if entry.name not in arrays:
                    continue  # strict=False: left as it is
                array = arrays[entry.name]
                if entry.kind == "count":
                    self.counts[entry.name[: -len(".num_batches_tracked")]] = int(array)
                else:
                    target = self._target(entry)
                    if array.dtype != target.dtype and (array.dtype in HALF_DTYPES or target.dtype in HALF_DTYPES):
                        # A cast to or from a half dtype on the host (NumPy, ml_dtypes: one rounding), not
                        # through a device cast kernel of the array library.
                        host = array.get() if self.xp is not np else array
                        array = self.xp.asarray(np.asarray(host).astype(target.dtype))
                    target[...] = array
        if self.fused_params:
            self._fold()
        return self if strict else checkpoint.IncompatibleKeys(missing, extra)

    # ----------------------------------------------------------------- running

    def trace(self, graph: Graph, x: Any, training: bool) -> dict[str, Any]:
        raise NotImplementedError

    def check_input_dims(self, dims: tuple[int, ...]) -> None:
        """Refuse an input shape the network cannot take (ShapeError); subclasses say which."""

    def plan(self, dims: tuple[int, ...]) -> Plan:
        """The plan for this input shape in the current mode, compiled on first use."""
        fused = self.fused and not self.training
        key = (dims, self.training) + (("fused",) if fused else ())
        plan = self.plans.get(key)
        if plan is None:
            graph = Graph(fused=fused)
            outputs = self.trace(graph, graph.input(dims), self.training)
            plan = self.plans[key] = Plan(graph, outputs, self, self.training,
                                          self.GRAD_OUTPUTS if self.training else ())
        return plan

    def forward(self, x: Any, **options: Any) -> dict[str, Any]:
        """Run the network on x (an array on the network's device, in its dtype). Returns the plan's output
        buffers: valid until the next call with the same input shape and mode. `options` go to finish().
        On the GPU with `graphs` (the default), an inference call after the first of its shape and options
        replays a CUDA graph of the plan's calls (Plan.run): the same bits, without the host's per-op work."""
        self._require_open()
        dims = tuple(getattr(x, "shape", ()))
        check_tensor(self.OP, "x", x, TensorShape(dims, self.dtype), self.device)
        self.check_input_dims(dims)
        plan = self.plan(dims)
        after = self.runs_after(plan, **options)
        with self.active():
            plan.input[...] = x
        plan.run(after, graphs=self.graphs and self.device != "cpu")
        if self.training:
            for name in plan.bn_names:
                self.counts[name] += 1
        self._last = plan
        return self.finish(plan, **options)

    def __call__(self, x: Any, **options: Any) -> dict[str, Any]:
        return self.forward(x, **options)

    def runs_after(self, plan: Plan) -> bool:
        """Whether a forward with these options runs the plan's calls after the forward (`plan.after`); a
        subclass that has such calls says, from its options (YOLOv10: detections)."""
        return False

    def finish(self, plan: Plan) -> dict[str, Any]:
        """What a forward returns, from the plan's outputs (a subclass may add to it, and take options)."""
        return dict(plan.outputs)

    def backward(self, output_grads: dict[str, Any]) -> dict[str, Any]:
        """After a training forward: the gradient of every parameter (into `grads`) and of the input from
        the gradients of the outputs (a dict like the forward's, GRAD_OUTPUTS keys). Returns {"input": dx}."""
        self._require_open()
        plan = self._last
        if plan is None or not plan.training:
            raise fail(StateError, self.OP, "backward", "a training forward before it",
                       "none" if plan is None else "an eval forward")
        if not isinstance(output_grads, dict) or set(output_grads) != set(plan.output_grads):
            found = sorted(output_grads) if isinstance(output_grads, dict) else type(output_grads).__name__
            raise fail(ShapeError, self.OP, "output_grads", f"a dict of {sorted(plan.output_grads)}", found)
        pairs = []
        for key, buffers in plan.output_grads.items():
            given = output_grads[key]
            if not isinstance(given, (list, tuple)) or len(given) != len(buffers):
                raise fail(ShapeError, self.OP, f"output_grads[{key!r}]", f"a list of {len(buffers)} arrays",
                           type(given).__name__ if not isinstance(given, (list, tuple)) else f"{len(given)} entries")
            for i, (array, buffer) in enumerate(zip(given, buffers)):
                check_tensor(self.OP, f"output_grads[{key!r}][{i}]", array, TensorShape(buffer.shape, self.dtype),
                             self.device)
                pairs.append((buffer, array))
        with self.active():
            for buffer, array in pairs:
                buffer[...] = array
        plan.backward()
        return {"input": plan.input_grad}

    @property
    def grads(self) -> dict[str, Any]:
        """Parameter name -> gradient of the last backward, for every trainable parameter (state_dict order);
        empty before the first training plan. The arrays are the network's own, overwritten by each backward.
        Each has its parameter's dtype, never upcast: in a half network the conv weights' and biases' gradients
        are in the half dtype and the BatchNorms' gamma and beta gradients float32 (as the batch_norm op
        writes them); ``.astype(numpy.float32)`` of a half gradient is exact."""
        return {entry.name: self._grads[entry.name] for entry in self.registry.entries if entry.name in self._grads}

    def close(self) -> None:
        """Clean up every op state of every plan and close the handle; the network is unusable after."""
        if self.closed:
            return
        self.closed = True
        plans, self.plans, self._last = self.plans, {}, None
        for plan in plans.values():
            plan.close()
        self.handle.close()

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
