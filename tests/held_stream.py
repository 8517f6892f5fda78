"""Every GPU test runs with CuPy's current stream held back (tests/conftest.py uses the fixture below).

A test that uploads with ``cupy.asarray``, allocates with ``cupy.zeros`` or reads with ``cupy.asnumpy`` does
so on CuPy's current stream; the kernels run on the library's non-blocking stream. Nothing orders the two
unless the test does (``with stream:``, or a synchronization), and on an idle GPU an unordered upload still
lands before the kernel reads it: the test passes, and fails only when the GPU is busy. Here, for the
length of each GPU test, CuPy's current stream of every device is a non-blocking stream that a spin
kernel (conformance.harness.spin) keeps busy: an upload or a fill on it lands at least HOLD_NS / 2 after
it is enqueued, long after a kernel launched next on the kernels' stream has read the array. So such a
test fails every time.

The hold is renewed before each pool allocation (so an upload or fill of a new array always starts held),
before each GPU kernel call (kernels.runtime.core.before_gpu_call) and when the test begins: whenever less than
half of HOLD_NS is left, another spin is queued behind the last. Host time is a safe estimate of where the
spins end: a spin starts no earlier than it is enqueued and lasts at least its length. A read on the held
stream (``cupy.asnumpy`` without a stream) waits for at most 1.5 HOLD_NS.

KERNELS_GPU_TEST_HOLD_MS sets the hold in milliseconds (default 5; 0 turns it off). A test that must run
on CuPy's own default stream says so with ``@pytest.mark.default_stream`` (none does today). Benchmarks
(tests/bench) run unheld.

Nothing here imports CuPy unless a GPU test runs where CuPy and a CUDA device are present.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import pytest

import kernels
from conformance.harness import device_unavailable, spin

DEFAULT_HOLD_MS = 5.0


def hold_ns(environ: Any = None) -> int:
    """The hold's length in nanoseconds, from KERNELS_GPU_TEST_HOLD_MS (milliseconds; 0 turns it off)."""
    environ = os.environ if environ is None else environ
    text = environ.get("KERNELS_GPU_TEST_HOLD_MS", "").strip()
    try:
        milliseconds = DEFAULT_HOLD_MS if text == "" else float(text)
    except ValueError:
        raise ValueError(f"KERNELS_GPU_TEST_HOLD_MS: expected a number of milliseconds, found {text!r}") from None
    if not milliseconds >= 0:  # also NaN
        raise ValueError(f"KERNELS_GPU_TEST_HOLD_MS: expected a number of milliseconds >= 0, found {text!r}")
    return int(milliseconds * 1e6)


def wants_hold(node: Any, nanoseconds: int, fixtures: Any = ()) -> bool:
    """Whether a test runs on the held current stream: it is marked gpu, not default_stream, it is not a
    benchmark (timings are taken as a user calls, without the hooks' cost in them), and the hold is on."""
    return (nanoseconds > 0 and node.get_closest_marker("gpu") is not None
            and node.get_closest_marker("default_stream") is None and "benchmark" not in fixtures)


class _Device:
    """One device's held stream, as conformance.harness.spin takes a stream (device, cupy_stream)."""

    def __init__(self, cupy: Any, device: int):
        self.device = device
        with cupy.cuda.Device(device):
            self.cupy_stream = cupy.cuda.Stream(non_blocking=True)
        self.held_until = 0.0  # host seconds (perf_counter) by which the last spin queued is over, at the earliest


class HeldStreams:
    """The held current streams of every device, made once per process and used by every GPU test: one
    stream per device keeps CuPy's pool ties (a block freed on a stream is reused on that stream) within
    a few streams, not one more per test."""

    def __init__(self, cupy: Any, nanoseconds: int):
        self.cupy, self.nanoseconds = cupy, nanoseconds
        self.devices = [_Device(cupy, d) for d in range(cupy.cuda.runtime.getDeviceCount())]
        hook_base = cupy.cuda.MemoryHook

        class RenewBeforeAllocation(hook_base):
            name = "kernels_tests_held_stream"

            def malloc_preprocess(hook, **kwargs: Any) -> None:
                self.renew()

        self.memory_hook = RenewBeforeAllocation()

    def stream(self, device: int = 0) -> Any:
        """The held (CuPy) stream of `device`."""
        return self.devices[device].cupy_stream

    def renew(self) -> None:
        """Queue another spin on each device's held stream where less than half the hold is left."""
        now = time.perf_counter()
        length = self.nanoseconds * 1e-9
        for held in self.devices:
            if held.held_until - now < length / 2:
                with self.cupy.cuda.Device(held.device):
                    spin(held, self.nanoseconds)
                held.held_until = max(held.held_until, now) + length

    def synchronize(self) -> None:
        """Wait for everything on the held streams (the spins and what queued behind them)."""
        for held in self.devices:
            held.cupy_stream.synchronize()
            held.held_until = 0.0

    @contextlib.contextmanager
    def current(self) -> Any:
        """The held streams current (CuPy's current stream of each device), renewed as the module's
        docstring says; on exit the previous streams are current again and the held ones synchronized."""
        cupy = self.cupy
        try:
            with contextlib.ExitStack() as stack:
                for held in self.devices:
                    with cupy.cuda.Device(held.device):  # CuPy enters a stream only on its own device
                        held.cupy_stream.__enter__()
                    stack.callback(self._leave, held)
                stack.enter_context(kernels.runtime.core.before_gpu_call(lambda stream: self.renew()))
                stack.enter_context(self.memory_hook)
                self.renew()
                yield self
        finally:
            self.synchronize()

    def _leave(self, held: _Device) -> None:
        with self.cupy.cuda.Device(held.device):  # CuPy restores the previous stream of the current device
            held.cupy_stream.__exit__(None, None, None)


_HELD: dict[int, HeldStreams] = {}


def held_streams(nanoseconds: int) -> HeldStreams:
    """This process's HeldStreams of that hold (CuPy and a CUDA device must be there)."""
    if nanoseconds not in _HELD:
        import cupy

        _HELD[nanoseconds] = HeldStreams(cupy, nanoseconds)
    return _HELD[nanoseconds]


@pytest.fixture(autouse=True)
def held_current_stream(request):
    """For a test marked gpu (not default_stream, not a benchmark) where CuPy and a CUDA device are present: the test runs
    with CuPy's current stream held back (this module's docstring); the value is the HeldStreams. Else
    None, and nothing is done."""
    nanoseconds = hold_ns()
    if not wants_hold(request.node, nanoseconds, request.fixturenames) or device_unavailable("gpu") is not None:
        yield None
        return
    with held_streams(nanoseconds).current() as held:
        yield held
