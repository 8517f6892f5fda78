"""The harness side of a case: the Env through which a case module's ``run`` gets
its tensors, and the harnesses shared by ops with the same signature.

Each case module's ``run(case, env)`` calls the kernels. Through `env` it asks
for the tensors it reads (``env.read``: copies of the golden inputs, checked
unchanged afterwards) and the tensors it writes (``env.write``: poisoned buffers,
compared with the golden afterwards). The runner runs every case several times (see
`runs`): with written tensors poisoned with random values and with NaN (the largest
value for integer dtypes), so that a kernel that reads what it should only write
fails; and with every tensor in red zones (conformance.red_zones) at aligned and
misaligned offsets, so that a kernel that reads or writes past either end of a
tensor fails, and both the 16-byte-pack and the element-wise GPU paths run.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import sys
from typing import Any, Iterator

import numpy as np

import kernels
from kernels import TensorShape
from kernels.registry import OPS
from kernels.runtime.core import is_floating

from . import red_zones
from .backends import KERNELS, Backend, KernelsBackend
from .case import Case, Golden

POISONS = ("random", "nan")
# The guard around read-only tensors in each poison's runs (red_zones.GUARDS): NaN margins with NaN
# poison, +-inf ones with random values, so every layout runs with both, and an out-of-bounds read
# that feeds a max (which drops NaN) shows too.
GUARD_OF = {"random": "inf", "nan": "nan"}

# Where each tensor starts, in elements past a 256-byte boundary (red_zones.place). "aligned":
# every tensor at 0, as a fresh allocation, so the GPU kernels' 16-byte-pack paths run.
# "misaligned": every tensor one element past (4 bytes for float32, 8 for int64, 1 for uint8),
# which fails every kernel's (ptr & 15) == 0 test, so the element-wise paths run. "staggered":
# every other tensor, in the order the case asks for them, one element past, the others at 0 (the
# first, third ... with the random poison; the second, fourth ... with NaN): a kernel that leaves
# one of its pointers out of its alignment test takes a pack path through a misaligned tensor.
LAYOUTS = ("aligned", "misaligned", "staggered")

# How the GPU work of a case is scheduled. "plain": as a user would. "delayed": a spin kernel of
# SPIN_NS on the kernels' stream before the case's first transfer and right before every kernel
# call, so any work a kernel enqueues on another stream runs before the work it depends on (and
# the harness, which reads results after synchronizing the kernels' stream only, reads before
# such work is done). "foreign": delayed, and CuPy's current stream is another non-blocking stream
# for the whole case, so a kernel that relies on CuPy's current stream lands on the wrong one.
# "small": plain streams, every launch planned as for a small device (kernels.runtime.gpu.simulated_device:
# SMALL_DEVICE's one SM, grids of at most two blocks), so that the golden cases' small tensors, in
# their red zones, run the grid-stride loops round, the unrolled bodies and the multi-block paths
# that the real device's grids only run on large tensors.
SCHEDULES = {"cpu": ("plain",), "gpu": ("plain", "delayed", "foreign", "small")}
SPIN_NS = 2_000_000
SMALL_DEVICE = {"sm_count": 1, "max_blocks": 2}
# The schedules about streams (the rest are about launch geometry).
_STREAM_SCHEDULES = ("plain", "delayed", "foreign")


def runs(device: str, backend: Backend = KERNELS) -> list[tuple[str, str, str]]:
    """The (schedule, layout, poison) runs of every case on `device`, in order.

    Aligned: every schedule with both poisons, as before red zones had layouts. The layout is about
    addresses, the schedules about streams and the poisons about unwritten values: each new layout
    runs with each poison once, the misaligned one also under the device's strictest schedule
    (foreign on the GPU, where the element-wise paths' own work meets a held-back stream and a
    foreign current stream), the rest plain, the cheapest. On the GPU the small device runs too:
    aligned with both poisons (the pack paths) and misaligned with random values (the element-wise
    paths). On the GPU: 13 runs; on the CPU: 6 runs.

    Only the schedules `backend` runs under (Backend.schedules: the small device is this library's);
    a backend that takes no views (Backend.views) runs the aligned layout only, and one that names its
    layouts on a device (Backend.layouts) those alone.
    """
    schedules = [s for s in SCHEDULES[device_kind(device)] if s == "plain" or s in backend.schedules]
    streams = [schedule for schedule in schedules if schedule in _STREAM_SCHEDULES]
    strictest = streams[-1]
    result = [(schedule, "aligned", poison) for schedule in streams for poison in POISONS]
    if not backend.views:
        return result
    result += [("plain", "misaligned", "random"), (strictest, "misaligned", "nan")]
    result += [("plain", "staggered", poison) for poison in POISONS]
    if "small" in schedules:
        result += [("small", "aligned", poison) for poison in POISONS] + [("small", "misaligned", "random")]
    layouts = backend.layouts(device)
    return result if layouts is None else [run for run in result if run[1] in layouts]


_SPIN_SOURCE = r"""
extern "C" __global__ void conformance_spin(unsigned long long nanoseconds) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanoseconds);
}
"""
_SPIN_KERNELS: dict[int, Any] = {}


def spin(stream: Any, nanoseconds: int = SPIN_NS) -> None:
    """Enqueue a single-thread kernel that occupies `stream` for `nanoseconds` of GPU time."""
    import cupy

    kernel = _SPIN_KERNELS.get(stream.device)
    if kernel is None:
        with cupy.cuda.Device(stream.device):
            kernel = _SPIN_KERNELS[stream.device] = cupy.RawKernel(_SPIN_SOURCE, "conformance_spin")
            kernel.compile()
    kernel((1,), (1,), (np.uint64(nanoseconds),), stream=stream.cupy_stream)


def device_kind(device: str) -> str:
    """"cpu" or "gpu": the kind of a runner device name (cpu, gpu, gpu:N)."""
    return "cpu" if device == "cpu" else "gpu"


def device_ordinal(device: str) -> int:
    """The CUDA ordinal of a GPU runner device: 0 for "gpu", N for "gpu:N"."""
    return int(device[4:]) if device.startswith("gpu:") else 0


def device_unavailable(device: str) -> str | None:
    """Why a device cannot run cases here, or None: no CuPy or CUDA device, or (gpu:N) no device N."""
    if device == "cpu":
        return None
    reason = kernels.gpu_unavailable_reason()
    if reason is not None:
        return reason
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    ordinal = device_ordinal(device)
    if ordinal >= count:
        return f"no CUDA device {ordinal} ({count} visible)"
    return None


def poison_array(shape: tuple[int, ...], dtype: np.dtype, poison: str, seed: int) -> np.ndarray:
    """Values a kernel must overwrite: random ones, or NaN (the dtype's maximum for integers)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    floating = dtype.kind == "c" or is_floating(dtype)
    if poison == "nan":
        if floating:
            return np.full(shape, np.nan, dtype=dtype)
        if dtype.kind == "b":
            return np.ones(shape, dtype=dtype)
        return np.full(shape, np.iinfo(dtype).max, dtype=dtype)
    if floating:  # (within float16's range: 1e3 times a normal sample stays far below 65504)
        return (rng.standard_normal(shape) * 1e3).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def release_gpu_memory() -> None:
    """Give back the blocks CuPy's memory pools keep for reuse (of arrays already freed), so that a
    leak check at exit (compute-sanitizer --leak-check full) reports only memory still held."""
    cupy = sys.modules.get("cupy")
    if cupy is None or kernels.gpu_unavailable_reason() is not None:
        return
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()


class _Delayed:
    """An op's functions with a spin on the kernels' stream before each forward and backward call: the
    delayed schedule for a backend other than this library (whose every launch is held back by
    kernels.runtime.core.before_gpu_call instead)."""

    def __init__(self, functions: Any, stream: Any):
        self._functions, self._stream = functions, stream

    def __getattr__(self, name: str) -> Any:
        function = getattr(self._functions, name)
        if name not in ("forward_kernel", "backward_kernel"):
            return function

        def delayed(*args: Any, **kwargs: Any) -> Any:
            spin(self._stream)
            return function(*args, **kwargs)

        return delayed


class Env:
    """What a case's ``run`` sees: the device, its stream and handle, the backend's ops (`op`), and
    tensor factories."""

    def __init__(self, case: Case, golden: Golden, device: str, poison: str, schedule: str = "plain",
                 layout: str = "aligned", backend: Backend = KERNELS):
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
        self.case, self.golden, self.device, self.poison, self.schedule = case, golden, device, poison, schedule
        self.layout, self.backend = layout, backend
        self.attrs = case.attrs
        if device == "cpu":
            self.stream, self.handle = kernels.cpu_stream(), kernels.cpu_handle()
            self.xp = np
        else:
            import cupy

            ordinal = device_ordinal(device)
            self.stream, self.handle = kernels.gpu_stream(ordinal), kernels.gpu_handle(ordinal)
            self.xp = cupy
            if schedule in ("delayed", "foreign"):
                spin(self.stream)  # every transfer of the case queues behind it
        self.reads: dict[str, Any] = {}
        self.writes: dict[str, Any] = {}
        self.observed: dict[str, np.ndarray] = {}
        # Each tensor's red zone, by role and name (a written tensor asked for again replaces its zone).
        self.zones: dict[tuple[str, str], red_zones.RedZone] = {}
        self._seed = 0
        self._placed = 0  # tensors placed so far: the staggered layout alternates over them

    def _shift(self) -> int:
        """Elements past the 256-byte boundary for the next tensor, by the layout."""
        index, self._placed = self._placed, self._placed + 1
        if self.layout == "aligned":
            return 0
        if self.layout == "misaligned":
            return 1
        return int((index + POISONS.index(self.poison)) % 2 == 0)

    def address(self, array: Any) -> int:
        """The data pointer of a device array."""
        return array.ctypes.data if self.device == "cpu" else array.data.ptr

    def op(self, name: str | None = None) -> Any:
        """The backend's functions of op `name` (the case's op by default), held back by the delayed
        schedules where the backend is not this library."""
        functions = self.backend.op(name or self.case.op)
        if self.schedule in ("delayed", "foreign") and not isinstance(self.backend, KernelsBackend):
            return _Delayed(functions, self.stream)
        return functions

    def _place(self, name: str, values: np.ndarray, role: str) -> Any:
        """A device copy of `values` in a red zone (red_zones.place); the view, C-contiguous. For a
        backend that takes no views, an allocation of its own with no margins (red_zones.alone)."""
        place = red_zones.place if self.backend.views else red_zones.alone
        if self.device == "cpu":
            zone, _ = place(values, role, self._shift(), np.empty, self.address, GUARD_OF[self.poison])
        else:
            # On the kernels' stream: a copy from pageable memory may still be in flight when the
            # call returns, and our non-blocking stream is not ordered after the legacy default stream.
            with self.stream:
                zone, host = place(values, role, self._shift(), self.xp.empty, self.address, GUARD_OF[self.poison])
                zone.buffer.set(host, stream=self.stream.cupy_stream)
            zone.host = host
        self.zones[(role, name)] = zone
        view = zone.view
        if not view.flags.c_contiguous:  # kernels refuse other arrays; a zone must never hand one out
            raise AssertionError(f"{name}: red-zone view of shape {view.shape} is not C-contiguous")
        return view

    def to_host(self, array: Any) -> np.ndarray:
        if self.device == "cpu":
            return array.copy()
        with self.stream:
            return self.xp.asnumpy(array, stream=self.stream.cupy_stream)

    def read(self, name: str) -> Any:
        """A device copy of golden input `name` between guard margins; it and they must be
        unchanged when the case ends."""
        if name not in self.reads:
            self.reads[name] = self._place(name, self.golden.inputs[name], "read")
        return self.reads[name]

    def reads_list(self, prefix: str) -> list[Any]:
        """Inputs named prefix.0, prefix.1, ... as a list."""
        count = sum(1 for k in self.golden.inputs if k.startswith(prefix + "."))
        return [self.read(f"{prefix}.{i}") for i in range(count)]

    def write(self, name: str, dims: tuple[int, ...] | None = None, dtype: Any = None) -> Any:
        """A poisoned device buffer for written tensor `name`, shaped like its golden by default,
        between canary margins that must be unchanged when the case ends."""
        expected = self.golden.expected.get(name)
        if dims is None:
            dims = expected.shape
        if dtype is None:
            dtype = expected.dtype if expected is not None else self.case.dtype
        self._seed += 1
        array = self._place(name, poison_array(tuple(dims), np.dtype(dtype), self.poison, self._seed), "written")
        self.writes[name] = array
        return array

    def writes_list(self, prefix: str) -> list[Any]:
        count = sum(1 for k in self.golden.expected if k.startswith(prefix + "."))
        return [self.write(f"{prefix}.{i}") for i in range(count)]

    def observe(self, name: str, array: Any) -> None:
        """Compare the current value of `array` (say, a running statistic) with golden `name`."""
        self.stream.synchronize()
        self.observed[name] = self.to_host(array)

    def collect(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[tuple[str, str]]]:
        """After the kernels' stream is synchronized: (written tensors, read tensors, margin
        problems as (tensor, what changed)), from one host copy of each red zone's buffer."""
        written: dict[str, np.ndarray] = {}
        read: dict[str, np.ndarray] = {}
        problems: list[tuple[str, str]] = []
        for (role, name), zone in self.zones.items():
            host_buffer = self.to_host(zone.buffer)
            (written if role == "written" else read)[name] = zone.tensor_of(host_buffer)
            problems += [(name, line) for line in zone.problems(host_buffer)]
        return written, read, problems

    def shape(self, name: str) -> TensorShape:
        """The TensorShape of a golden input or expected tensor."""
        array = self.golden.inputs.get(name)
        if array is None:
            array = self.golden.expected[name]
        return TensorShape(array.shape, array.dtype)

    def scratch_poisoned(self) -> Any:
        """A context in which every scratch array this library's CPU kernels keep across calls is filled
        with the run's poison as a kernel takes it (kernels.runtime.cpu.scratch_filled): a kernel that
        reads scratch it has not written in this call fails, as one that reads an output it should
        only write does. Another backend's scratch is its own."""
        if self.device != "cpu" or not isinstance(self.backend, KernelsBackend):
            return contextlib.nullcontext()
        seeds = itertools.count(1 << 20)  # apart from the written tensors' seeds; next() is atomic for the threads

        def fill(array: np.ndarray) -> None:
            np.copyto(array, poison_array(array.shape, array.dtype, self.poison, next(seeds)), casting="unsafe")

        return kernels.runtime.cpu.scratch_filled(fill)

    @contextlib.contextmanager
    def scheduled(self) -> Iterator[None]:
        """The block (a case's run) under this Env's schedule."""
        if self.schedule == "plain":
            yield
            return
        if not isinstance(self.backend, KernelsBackend):  # held back call by call instead (op)
            with contextlib.ExitStack() as stack:
                if self.schedule == "foreign":
                    stack.enter_context(self._foreign())
                yield
            return
        if self.schedule == "small":  # the case's states are made inside: they keep the small plans
            with kernels.runtime.gpu.simulated_device(**SMALL_DEVICE):
                yield
            return
        with contextlib.ExitStack() as stack:
            stack.enter_context(kernels.runtime.core.before_gpu_call(spin))
            if self.schedule == "foreign":
                stack.enter_context(self._foreign())
            yield

    def _foreign(self) -> Any:
        """Another non-blocking CuPy stream of the case's device, to be entered as the current one."""
        import cupy

        with cupy.cuda.Device(self.stream.device):
            return cupy.cuda.Stream(non_blocking=True)

    def close(self) -> None:
        self.handle.close()


# --------------------------------------------------------------------------- the harness of a case


def _listed(pool: Any, name: str) -> int:
    """How many tensors of list `name` (name.0, name.1, ...) `pool` holds."""
    return sum(1 for key in pool if key.startswith(name + "."))


def has_backward(case: Case, golden: Golden) -> bool:
    """Whether the case calls backward: its golden inputs hold an output gradient (a case declared
    forward only, conv's attrs.backward False, has none). batch_norm's own run always does."""
    if case.op == "batch_norm":
        return True
    spec = OPS[case.op]
    return any(arg.name in golden.inputs or _listed(golden.inputs, arg.name)
               for arg in spec.args("backward", "output_grad"))


def run_op(case: Case, env: Env) -> None:
    """The harness of an op as kernels.registry declares it: init with the shapes of its tensors, forward
    with its tensors in the declared order, then (where the case has output gradients) backward, and
    cleanup, all through the backend's functions (env.op).

    Tensors are asked for in the order of the arguments, so the staggered layout alternates over them in
    that order. Read: inputs, weights and output gradients (an optional one the case does not hold is
    None); written: outputs, and each gradient the golden expects (else None: a gradient not wanted).
    A forward tensor that backward takes again is the same array."""
    spec = OPS[case.op]
    functions = env.op()
    inputs, expected = env.golden.inputs, env.golden.expected
    tensors: dict[str, Any] = {}

    def tensor(arg: Any) -> Any:
        if arg.name in tensors:
            return tensors[arg.name]
        if arg.role == "output":
            value = env.writes_list(arg.name) if arg.many else env.write(arg.name)
        elif arg.role == "grad":
            names = [f"{arg.name}.{i}" for i in range(_listed(inputs, arg.of))] if arg.many else [arg.name]
            value = [env.write(name) if name in expected else None for name in names]
            value = value if arg.many else value[0]
        elif arg.many:
            value = env.reads_list(arg.name)
        else:
            value = env.read(arg.name) if arg.name in inputs else None
        tensors[arg.name] = value
        return value

    def shape(name: str) -> Any:
        tensor_name = name.replace("_shape", "")  # input_shape -> input, input_shapes -> inputs
        pool = inputs if _listed(inputs, tensor_name) else expected
        if _listed(pool, tensor_name):
            return [env.shape(f"{tensor_name}.{i}") for i in range(_listed(pool, tensor_name))]
        return env.shape(tensor_name)

    forward = [tensor(arg) for arg in spec.forward]
    state = functions.init_kernel(env.handle, case.attrs, *[shape(name) for name in spec.shapes])
    functions.forward_kernel(env.stream, env.handle, state, case.attrs, *forward)
    if has_backward(case, env.golden):
        functions.backward_kernel(env.stream, env.handle, state, case.attrs, *[tensor(arg) for arg in spec.backward])
    functions.cleanup_kernel(env.handle, state)


def execute(case: Case, env: Env) -> None:
    """Run a case once in `env`: its module's own `run` where it has one (batch_norm's steps), else
    `run_op`."""
    from .cases import CASE_MODULES

    getattr(CASE_MODULES[case.op], "run", run_op)(case, env)
