"""The harness side of a case: the Env through which a case module's ``run`` gets
its tensors, and the harnesses shared by ops with the same signature.

Each case module's ``run(case, env)`` calls the kernels. Through `env` it asks
for the tensors it reads (``env.read``: copies of the golden inputs, checked
unchanged afterwards) and the tensors it writes (``env.write``: poisoned buffers,
compared with the golden afterwards). The runner runs every case twice: once
with written tensors poisoned with random values and once with NaN (the largest
value for integer dtypes), so that a kernel that reads what it should only write
fails.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from typing import Any, Iterator

import numpy as np

import kernels
from kernels import TensorShape

from .case import Case, Golden

POISONS = ("random", "nan")

# How the GPU work of a case is scheduled. "plain": as a user would. "delayed": a spin kernel of
# SPIN_NS on the kernels' stream before the case's first transfer and right before every kernel
# call, so any work a kernel enqueues on another stream runs before the work it depends on (and
# the harness, which reads results after synchronizing the kernels' stream only, reads before
# such work is done). "foreign": delayed, and CuPy's current stream is another non-blocking stream
# for the whole case, so a kernel that relies on CuPy's current stream lands on the wrong one.
SCHEDULES = {"cpu": ("plain",), "gpu": ("plain", "delayed", "foreign")}
SPIN_NS = 2_000_000

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


def device_unavailable(device: str) -> str | None:
    """Why a device cannot run cases here, or None."""
    if device == "cpu":
        return None
    return kernels.gpu_unavailable_reason()


def poison_array(shape: tuple[int, ...], dtype: np.dtype, poison: str, seed: int) -> np.ndarray:
    """Values a kernel must overwrite: random ones, or NaN (the dtype's maximum for integers)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if poison == "nan":
        if dtype.kind in "fc":
            return np.full(shape, np.nan, dtype=dtype)
        if dtype.kind == "b":
            return np.ones(shape, dtype=dtype)
        return np.full(shape, np.iinfo(dtype).max, dtype=dtype)
    if dtype.kind in "fc":
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


class Env:
    """What a case's ``run`` sees: the device, its stream and handle, and tensor factories."""

    def __init__(self, case: Case, golden: Golden, device: str, poison: str, schedule: str = "plain"):
        self.case, self.golden, self.device, self.poison, self.schedule = case, golden, device, poison, schedule
        self.attrs = case.attrs
        if device == "cpu":
            self.stream, self.handle = kernels.cpu_stream(), kernels.cpu_handle()
            self.xp = np
        else:
            import cupy

            self.stream, self.handle = kernels.gpu_stream(0), kernels.gpu_handle(0)
            self.xp = cupy
            if schedule != "plain":
                spin(self.stream)  # every transfer of the case queues behind it
        self.reads: dict[str, Any] = {}
        self.writes: dict[str, Any] = {}
        self.observed: dict[str, np.ndarray] = {}
        self._seed = 0

    def _to_device(self, array: np.ndarray) -> Any:
        if self.device == "cpu":
            return array.copy()
        # On the kernels' stream: a copy from pageable memory may still be in flight when asarray
        # returns, and our non-blocking stream is not ordered after the legacy default stream.
        with self.stream:
            return self.xp.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        if self.device == "cpu":
            return array.copy()
        with self.stream:
            return self.xp.asnumpy(array, stream=self.stream.cupy_stream)

    def read(self, name: str) -> Any:
        """A device copy of golden input `name`; it must be unchanged when the case ends."""
        if name not in self.reads:
            self.reads[name] = self._to_device(self.golden.inputs[name])
        return self.reads[name]

    def reads_list(self, prefix: str) -> list[Any]:
        """Inputs named prefix.0, prefix.1, ... as a list."""
        count = sum(1 for k in self.golden.inputs if k.startswith(prefix + "."))
        return [self.read(f"{prefix}.{i}") for i in range(count)]

    def write(self, name: str, dims: tuple[int, ...] | None = None, dtype: Any = None) -> Any:
        """A poisoned device buffer for written tensor `name`, shaped like its golden by default."""
        expected = self.golden.expected.get(name)
        if dims is None:
            dims = expected.shape
        if dtype is None:
            dtype = expected.dtype if expected is not None else self.case.dtype
        self._seed += 1
        array = self._to_device(poison_array(tuple(dims), np.dtype(dtype), self.poison, self._seed))
        self.writes[name] = array
        return array

    def writes_list(self, prefix: str) -> list[Any]:
        count = sum(1 for k in self.golden.expected if k.startswith(prefix + "."))
        return [self.write(f"{prefix}.{i}") for i in range(count)]

    def observe(self, name: str, array: Any) -> None:
        """Compare the current value of `array` (say, a running statistic) with golden `name`."""
        self.stream.synchronize()
        self.observed[name] = self.to_host(array)

    def shape(self, name: str) -> TensorShape:
        """The TensorShape of a golden input or expected tensor."""
        array = self.golden.inputs.get(name)
        if array is None:
            array = self.golden.expected[name]
        return TensorShape(array.shape, array.dtype)

    @contextlib.contextmanager
    def scheduled(self) -> Iterator[None]:
        """The block (a case's run) under this Env's schedule."""
        if self.schedule == "plain":
            yield
            return
        import cupy

        with contextlib.ExitStack() as stack:
            stack.enter_context(kernels.core.before_gpu_call(spin))
            if self.schedule == "foreign":
                with cupy.cuda.Device(self.stream.device):
                    foreign = cupy.cuda.Stream(non_blocking=True)
                stack.enter_context(foreign)
            yield

    def close(self) -> None:
        self.handle.close()


# --------------------------------------------------------------------------- harnesses shared by ops


def run_unary(module: Any, case: Case, env: Env) -> None:
    """The harness of every op with one input and one output (DESIGN.md section 3's row
    'reshape, transpose, upsample, element_unary, softmax'): init, forward, backward, cleanup."""
    input = env.read("input")
    output = env.write("output")
    state = module.init_kernel(env.handle, case.attrs, env.shape("input"), env.shape("output"))
    module.forward_kernel(env.stream, env.handle, state, case.attrs, input, output)
    if "input_grad" in env.golden.expected:
        output_grad = env.read("output_grad")
        input_grad = env.write("input_grad")
        module.backward_kernel(env.stream, env.handle, state, case.attrs, output, output_grad, input, input_grad)
    module.cleanup_kernel(env.handle, state)


def run_binary(module: Any, case: Case, env: Env) -> None:
    """The harness of ops with lhs, rhs -> output (batch_matmul, element_binary)."""
    lhs, rhs = env.read("lhs"), env.read("rhs")
    output = env.write("output")
    state = module.init_kernel(env.handle, case.attrs, env.shape("lhs"), env.shape("rhs"), env.shape("output"))
    module.forward_kernel(env.stream, env.handle, state, case.attrs, lhs, rhs, output)
    if "lhs_grad" in env.golden.expected:
        output_grad = env.read("output_grad")
        lhs_grad, rhs_grad = env.write("lhs_grad"), env.write("rhs_grad")
        module.backward_kernel(env.stream, env.handle, state, case.attrs, output, output_grad,
                               lhs, lhs_grad, rhs, rhs_grad)
    module.cleanup_kernel(env.handle, state)
