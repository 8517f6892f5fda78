"""A network built from op calls: its parameters and buffers (in state_dict order), its device
and dtype, and the plans compiled for each (input shape, mode) it has been called with.

`Network` is the base of `YOLOv10`; a subclass declares its parameters in a `Registry` and says
how to trace itself into a Graph (`trace`). Everything else (loading, initialisation, train/eval,
forward, backward, gradients, cleanup) is here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import cpu as cpu_runtime
from .. import gpu as gpu_runtime
from ..core import FLOAT_DTYPES, DeviceError, DTypeError, KernelError, ShapeError, StateError, TensorShape, check_tensor, fail
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


class Registry:
    """The parameters and buffers of a network, in the order they are declared (the state_dict's)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

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
        if parsed is None or dtype is None or parsed not in FLOAT_DTYPES:  # (np.dtype(None) is float64)
            raise fail(DTypeError, self.OP, "dtype", "float32 or float64", repr(dtype))
        self.dtype = parsed
        if self.device == "cpu":
            self.stream, self.handle, self.xp = cpu_runtime.cpu_stream(), cpu_runtime.cpu_handle(), np
            self.prefix, self._context = "cpu_", contextlib.nullcontext()
        else:  # pragma: no cover - GPU: a CUDA device and CuPy
            self.stream, self.handle = gpu_runtime.gpu_stream(self.device), gpu_runtime.gpu_handle(self.device)
            self.xp, self.prefix, self._context = gpu_runtime.cupy, "gpu_", self.stream
        self.training = True  # as a torch module: training until eval()
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
                    self.params[entry.name] = self.xp.zeros(entry.dims, self.dtype)
                elif entry.kind == "running_mean":
                    prefix = entry.name[: -len(".running_mean")]
                    self.running[prefix] = (self.xp.zeros(entry.dims, self.dtype), self.xp.ones(entry.dims, self.dtype))
                    self.counts[prefix] = 0

    # ----------------------------------------------------------------- the runtime plans use

    def active(self) -> Any:
        """A context in which arrays are allocated and copies enqueued on the network's stream (GPU)."""
        return self._context

    def empty(self, dims: Sequence[int]) -> Any:
        return self.xp.empty(tuple(dims), self.dtype)

    def zeros(self, dims: Sequence[int]) -> Any:
        return self.xp.zeros(tuple(dims), self.dtype)

    def place(self, host: np.ndarray) -> Any:
        """A device copy of a host constant, in the network's dtype."""
        return self.xp.array(host, dtype=self.dtype)

    def grad(self, name: str) -> Any:
        """The gradient array of a parameter, made once and shared by every plan."""
        if name not in self._grads:
            self._grads[name] = self.empty(self.params[name].shape)
        return self._grads[name]

    # ----------------------------------------------------------------- modes, weights

    def train(self, mode: bool = True) -> "Network":
        """Training mode (batch statistics, running ones updated; both heads' raw outputs); returns self."""
        self.training = bool(mode)
        return self

    def eval(self) -> "Network":
        """Inference mode (running statistics); returns self."""
        return self.train(False)

    def _require_open(self) -> None:
        if self.closed:
            raise fail(StateError, self.OP, "model", "an open model", "one already closed")

    def init_random(self, seed: int = 0) -> "Network":
        """Fill every parameter and running statistic from a seeded generator (the same values on every
        device, rounded to the dtype): weights and biases uniform in +-1/sqrt(fan_in), BN gamma in
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
                self._target(entry)[...] = self.xp.asarray(host.astype(self.dtype))
        return self

    def _target(self, entry: Entry) -> Any:
        """The array that holds an entry (not num_batches_tracked, a host count)."""
        if entry.kind in ("param", "frozen"):
            return self.params[entry.name]
        prefix, _, stat = entry.name.rpartition(".")
        return self.running[prefix][0 if stat == "running_mean" else 1]

    def state_dict(self) -> dict[str, Any]:
        """Every parameter and buffer by ultralytics' name, in its order: the network's own arrays (as
        torch's state_dict, they are not copies), num_batches_tracked as a new int64 array of shape ()."""
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
        """A NumPy (CPU) or CuPy (GPU) view or copy of a state_dict value."""
        if self.xp is np:
            if type(value).__module__.startswith("cupy"):  # pragma: no cover - GPU: a CuPy array given to a CPU model
                value = value.get()
            return np.asarray(value)
        return self.xp.asarray(value)  # pragma: no cover - GPU: NumPy or CuPy arrays to the device

    def load_state_dict(self, mapping: Any) -> "Network":
        """Copy every entry of `mapping` (ultralytics' names -> arrays: NumPy, CuPy on the GPU, anything
        numpy.asarray takes) into the network, cast to its dtype. Raises StateDictError, naming them, for
        missing, extra or misshapen entries, before anything is copied. Returns self."""
        self._require_open()
        expected = {entry.name: entry for entry in self.registry.entries}
        with self.active():
            arrays = {name: self._as_array(value) for name, value in mapping.items()}
        missing = [name for name in expected if name not in arrays]
        extra = [name for name in arrays if name not in expected]
        misshapen = [f"{name} (expected {expected[name].dims}, found {tuple(array.shape)})"
                     for name, array in arrays.items() if name in expected and tuple(array.shape) != expected[name].dims]
        problems = [f"{what}: {', '.join(names)}" for what, names in
                    (("missing", missing), ("unexpected", extra), ("misshapen", misshapen)) if names]
        if problems:
            raise StateDictError(f"{self.OP}: load_state_dict: " + "; ".join(problems))
        with self.active():
            for entry in self.registry.entries:
                array = arrays[entry.name]
                if entry.kind == "count":
                    self.counts[entry.name[: -len(".num_batches_tracked")]] = int(array)
                else:
                    self._target(entry)[...] = array
        return self

    # ----------------------------------------------------------------- running

    def trace(self, graph: Graph, x: Any, training: bool) -> dict[str, Any]:
        raise NotImplementedError

    def check_input_dims(self, dims: tuple[int, ...]) -> None:
        """Refuse an input shape the network cannot take (ShapeError); subclasses say which."""

    def plan(self, dims: tuple[int, ...]) -> Plan:
        """The plan for this input shape in the current mode, compiled on first use."""
        key = (dims, self.training)
        plan = self.plans.get(key)
        if plan is None:
            graph = Graph()
            outputs = self.trace(graph, graph.input(dims), self.training)
            plan = self.plans[key] = Plan(graph, outputs, self, self.training,
                                          self.GRAD_OUTPUTS if self.training else ())
        return plan

    def forward(self, x: Any, **options: Any) -> dict[str, Any]:
        """Run the network on x (an array on the network's device, in its dtype). Returns the plan's output
        buffers: valid until the next call with the same input shape and mode. `options` go to finish()."""
        self._require_open()
        dims = tuple(getattr(x, "shape", ()))
        check_tensor(self.OP, "x", x, TensorShape(dims, self.dtype), self.device)
        self.check_input_dims(dims)
        plan = self.plan(dims)
        with self.active():
            plan.input[...] = x
        plan.forward()
        if self.training:
            for name in plan.bn_names:
                self.counts[name] += 1
        self._last = plan
        return self.finish(plan, **options)

    def __call__(self, x: Any, **options: Any) -> dict[str, Any]:
        return self.forward(x, **options)

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
        empty before the first training plan. The arrays are the network's own, overwritten by each backward."""
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
