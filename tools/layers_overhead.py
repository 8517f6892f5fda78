"""The library's own Python in one GPU call, timed without a GPU: element_binary's ADD forward on 4x4 arrays
through its public forward_kernel, with stand-ins for what the call reads of CuPy (an array's type, memory,
flag, dims and dtype; the stream; the device calls of the stream's entry) and for CuPy's binding of
cuLaunchKernel (a no-op that keeps its arguments). What it prints is the Python above the driver, in parts,
the best of several runs: run it in one checkout, then in another, on one machine, to compare two versions of
the layers (docs/performance.md#fewer-layers-a-call).

    python3 tools/layers_overhead.py [--calls N] [--runs R]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import types
from typing import Any, Callable, Iterator

import numpy as np

sys.path.insert(0, ".")
from kernels import BinaryOpType, ElementBinaryAttrs, TensorShape, element_binary  # noqa: E402
from kernels.element_binary import gpu as element_binary_gpu  # noqa: E402
from kernels.runtime import core, gpu  # noqa: E402


class StandInArray:
    """What a GPU call reads of a CuPy array: its memory (address, device), C-contiguity, dims and dtype."""

    def __init__(self, dims: tuple[int, ...], dtype: Any, ptr: int):
        self.shape, self.dtype = tuple(dims), np.dtype(dtype)
        self.data = types.SimpleNamespace(ptr=ptr, device_id=0)
        self._c_contiguous, self.size = True, int(np.prod(dims))
        self.strides = tuple(s * self.dtype.itemsize for s in core.c_strides(dims))


class _CupyStream:
    ptr = 0x5000

    def __enter__(self) -> "_CupyStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class _Handle:
    device = 0

    def close(self) -> None:
        pass


@contextlib.contextmanager
def stand_ins(launches: list) -> Iterator[types.SimpleNamespace]:
    """Inside the block, a GPU call of element_binary's ADD on 4x4 float32 arrays: yields its `arguments`
    (stream, handle, state, attrs, lhs, rhs, output) and `call`, its public forward_kernel on them (the state's
    launch planned as a first call plans it). Each launch appends its arguments to `launches`. What the block
    replaced is put back on leaving."""
    saved = (core._CUPY_ARRAY, gpu.cupy, gpu._launch_kernel)
    runtime = types.SimpleNamespace(getDevice=lambda: 0, setDevice=lambda device: None)
    gpu.cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=runtime, driver=types.SimpleNamespace(CUDADriverError=RuntimeError)))
    gpu._launch_kernel = lambda *arguments: launches.append(arguments)
    core._CUPY_ARRAY = StandInArray
    try:
        stream = gpu.GpuStream.__new__(gpu.GpuStream)
        stream.device, stream.cupy_stream = 0, _CupyStream()
        handle, attrs, shape = _Handle(), ElementBinaryAttrs(BinaryOpType.ADD), TensorShape((4, 4), np.float32)
        state = core.make_state(element_binary.OP, handle, attrs, ElementBinaryAttrs, element_binary.ElementBinaryState,
                                lhs_shape=shape, rhs_shape=shape, output_shape=shape)
        state.device = 0
        kernel = types.SimpleNamespace(ptr=0x99)  # the compiled binary_same, as far as the launch reads it
        state.gpu_forward = (element_binary_gpu._FORWARD_SAME, gpu.packed_by_flag(
            kernel, 1, gpu.BLOCK, 3, (np.int32(16), np.int32(BinaryOpType.ADD.value))))
        lhs, rhs, out = (StandInArray((4, 4), np.float32, 0x1000 * (i + 1)) for i in range(3))
        arguments = (stream, handle, state, attrs, lhs, rhs, out)
        yield types.SimpleNamespace(arguments=arguments, call=lambda: element_binary.forward_kernel(*arguments))
    finally:
        core._CUPY_ARRAY, gpu.cupy, gpu._launch_kernel = saved


def best_us(function: Callable[[], Any], calls: int, runs: int) -> float:
    """The best of `runs` runs of `calls` calls, in us a call."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def parts(calls: int, runs: int, launches: list | None = None) -> dict[str, float]:
    """us a call: the whole public call, the op's GPU code (its checks and its launch), the checks alone, the
    state's PackedLaunch alone. Every launch the timed calls reach appends its arguments to `launches`."""
    launches = [] if launches is None else launches
    with stand_ins(launches) as made:
        arguments = made.arguments
        stream, state, lhs, rhs, out = arguments[0], arguments[2], arguments[4], arguments[5], arguments[6]
        wrapper = element_binary.gpu_forward_kernel
        code = getattr(wrapper, "gpu_code", None) or wrapper.__wrapped__  # a checkout before gpu_code: __wrapped__
        launch = state.gpu_forward[1][1]  # 16-byte aligned addresses: the vector launch
        times = {
            "the whole call": best_us(made.call, calls, runs),
            "the op's GPU code (checks and launch)": best_us(lambda: code(*arguments), calls, runs),
            "the checks (_check_forward)": best_us(lambda: element_binary._check_forward(*arguments), calls, runs),
            "the state's PackedLaunch": best_us(lambda: launch(stream, lhs, rhs, out), calls, runs),
        }
    times["the layers above the op's code"] = times["the whole call"] - times["the op's GPU code (checks and launch)"]
    return times


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=60000)
    parser.add_argument("--runs", type=int, default=15)
    options = parser.parse_args(argv[1:])
    print(f"us of Python a call, the best of {options.runs} runs of {options.calls} calls")
    for name, us in parts(options.calls, options.runs).items():
        print(f"{name:45s} {us:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
