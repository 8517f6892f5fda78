"""The CPU half of the runtime: the CPU stream and handle, and the thread pool that shares a
kernel's blocks out across the cores. :mod:`kernels.gpu` is its GPU twin."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable


class CpuStream:
    """The CPU 'stream': work runs at once, in call order."""

    device = "cpu"

    def synchronize(self) -> None:
        pass

    def __repr__(self) -> str:
        return "CpuStream()"


class CpuHandle:
    """The CPU handle: holds nothing, kept so that every op is called the same way."""

    device = "cpu"

    def close(self) -> None:
        pass

    def __enter__(self) -> "CpuHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def cpu_stream() -> CpuStream:
    """A stream for CPU kernels."""
    return CpuStream()


def cpu_handle() -> CpuHandle:
    """A handle for CPU kernels."""
    return CpuHandle()


# --------------------------------------------------------------------------- threads

_CPU_POOL: Any = None
_CPU_WORKER = threading.local()


def cpu_threads() -> int:
    """The cores this process may run on (PyTorch's CPU twin uses as many)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_parallel(function: Callable[[int, int], None], count: int) -> None:
    """Call function(first, last) on contiguous parts [first, last) of range(count), one part per
    core, in threads (NumPy releases the GIL in its loops); returns when all are done, raising the
    first error. The parts are disjoint, so each output element is computed once, by the same
    arithmetic whatever the thread. Runs in the calling thread when nested or with one core."""
    global _CPU_POOL
    parts = min(cpu_threads(), count)
    if parts <= 1 or getattr(_CPU_WORKER, "busy", False):
        function(0, count)
        return
    if _CPU_POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _CPU_POOL = ThreadPoolExecutor(max_workers=cpu_threads() - 1, thread_name_prefix="kernels-cpu")
    bounds = [count * i // parts for i in range(parts + 1)]

    def part(i: int) -> None:
        _CPU_WORKER.busy = True
        try:
            function(bounds[i], bounds[i + 1])
        finally:
            _CPU_WORKER.busy = False

    futures = [_CPU_POOL.submit(part, i) for i in range(1, parts)]
    try:
        part(0)
    finally:
        for future in futures:
            future.result()
