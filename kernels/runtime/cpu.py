"""The CPU half of the runtime: the CPU stream and handle, the thread pool that shares a kernel's
blocks out across the cores, and the BLAS thread count of the GEMMs (through threadpoolctl).
:mod:`kernels.runtime.gpu` is its GPU twin.

A handle carries the number of threads its kernels use (default: the cores this process may run
on). Every op's cpu_forward_kernel / cpu_backward_kernel is decorated with :func:`cpu_kernel`,
which makes its handle's count current for the call: :func:`cpu_parallel` shares blocks out to
that many threads, and :func:`blas_threads` gives NumPy's BLAS that many for the GEMMs inside it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from typing import Any, Callable, Iterator

import numpy as np

from . import cpu_paths
from .core import AttrsError, fail, thread_local

# The size-gated paths of the runtime's passes (kernels.runtime.cpu_paths): the ops' own are declared beside them.
PARTS_PATH, PIECES_PATH, PLANES_PATH, BESIDE_PATH = cpu_paths.declare("cpu", {
    "parts.threads": "cpu_parts: an output past PARALLEL_MIN_BYTES cut along an axis, its parts (operands "
                     "broadcast to it) shared out to the threads",
    "parts.pieces.threads": "cpu_parts with skip_axis: a whole past PARALLEL_MIN_BYTES and its pieces (a "
                            "concat's) cut alike, the parts shared out to the threads",
    "planes.threads": "cpu_planes: (n, c) planes past PARALLEL_MIN_BYTES shared out to the threads",
    "block_length.beside": "block_length: a pass worth two parts or more gets blocks up to `beside` long",
})


def available_cores() -> int:
    """The cores this process may run on (os.sched_getaffinity where the OS has it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class CpuStream:
    """The CPU 'stream': work runs at once, in call order."""

    device = "cpu"

    def synchronize(self) -> None:
        pass

    def __repr__(self) -> str:
        return "CpuStream()"


class CpuHandle:
    """The CPU handle: the number of threads its kernels share their work out to (blocks of the
    elementwise and data-movement passes, and NumPy's BLAS for the GEMMs)."""

    device = "cpu"

    def __init__(self, threads: int | None = None):
        if threads is None:
            threads = available_cores()
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise fail(AttrsError, "cpu_handle", "threads", "a positive int or None (the available cores)",
                       repr(threads))
        self.threads = threads

    def close(self) -> None:
        pass

    def __enter__(self) -> "CpuHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CpuHandle(threads={self.threads})"


def cpu_stream() -> CpuStream:
    """A stream for CPU kernels."""
    return CpuStream()


def cpu_handle(threads: int | None = None) -> CpuHandle:
    """A handle for CPU kernels, running them on `threads` threads (None: the cores this process may use)."""
    return CpuHandle(threads)


# --------------------------------------------------------------------------- scratch kept across calls
# Some kernels keep per-thread scratch buffers from call to call (conv_2d's im2col and padded input,
# the activations' and batch norm's blocks, max pooling's targets), so what a call finds in them is
# whatever the last call left. A kernel that reads scratch it has not written this call is as wrong
# as one that reads an output it should only write, and usually passes: the last call left the same
# values. So every such buffer goes through scratch() as a kernel takes it, and inside
# scratch_filled(fill) (the conformance runs: their poison) each one is filled first.
_SCRATCH_FILL: Callable[[np.ndarray], None] | None = None


@contextlib.contextmanager
def scratch_filled(fill: Callable[[np.ndarray], None]) -> Iterator[None]:
    """Inside the block, fill(array) runs on every scratch array a CPU kernel takes (scratch()), in
    whichever thread takes it: the setting is the process's, not the thread's (a kernel's worker threads
    take scratch too), so two threads must not run such blocks at once (the conformance runs' workers
    are processes)."""
    global _SCRATCH_FILL
    previous, _SCRATCH_FILL = _SCRATCH_FILL, fill
    try:
        yield
    finally:
        _SCRATCH_FILL = previous


def scratch(array: np.ndarray) -> np.ndarray:
    """`array`, a kernel's scratch as the kernel takes it: filled inside scratch_filled, else as it is."""
    fill = _SCRATCH_FILL
    if fill is not None:
        fill(array)
    return array


# --------------------------------------------------------------------------- threads

_CPU_WORKER = thread_local(busy=False)  # busy: this thread runs a part (a nested cpu_parallel runs inline)
_CALL = thread_local(threads=None)  # the thread count of the CPU kernel running in this thread


def handle_threads() -> int:
    """The thread count of the CPU kernel running in this thread (its handle's), else the available cores."""
    threads = _CALL.threads
    return available_cores() if threads is None else threads


def cpu_threads() -> int:
    """The parts cpu_parallel makes: the handle's thread count (handle_threads). Kept apart from the
    BLAS count so that a test may change one alone: the parts never change a result's bits, the
    BLAS thread count may (see blas_threads)."""
    return handle_threads()


# np.errstate(all="ignore") at a tenth of its cost, for the calls of the functional layer's plans on tiny
# tensors (kernels/functional.py), where errstate's making of its error-state object (0.8 us) cost more
# than the ufuncs. NumPy 2 keeps the floating-point error modes of the running context in a context
# variable, which errstate sets on entry to an object it makes from the current one and resets on exit:
# ignore_fp_errors() sets that very object, made once for the current one (the last kept: a new current
# one, set by the caller's own errstate or seterr, gets its own), and returns the token that
# restore_fp_errors(token) resets, as errstate's exit does.
try:
    from numpy._core.umath import _extobj_contextvar, _make_extobj
except ImportError:  # pragma: no cover - a NumPy without them (NumPy 2 has them): errstate itself
    def ignore_fp_errors() -> Any:
        state = np.errstate(all="ignore")
        state.__enter__()
        return state

    def restore_fp_errors(token: Any) -> None:
        token.__exit__(None, None, None)
else:
    _IGNORING: tuple[Any, Any] = (None, None)  # (an error state, that state with every error ignored)

    def ignore_fp_errors() -> Any:
        """As entering np.errstate(all="ignore"); returns the token to give restore_fp_errors (in a finally)."""
        global _IGNORING
        current = _extobj_contextvar.get()
        last = _IGNORING
        if last[0] is not current:
            last = _IGNORING = (current, _make_extobj(all="ignore"))  # one tuple: threads see both or neither
        return _extobj_contextvar.set(last[1])

    restore_fp_errors = _extobj_contextvar.reset


def with_threads(function: Callable[..., Any], threads: int) -> Callable[..., Any]:
    """function, called with `threads` as the thread count of the CPU kernel running in this thread, as
    cpu_kernel makes its handle's for a call: for an op's CPU code run past its entry point, on a count
    decided once (the functional layer's plans: kernels/functional.py, _Plan)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        previous = _CALL.threads
        _CALL.threads = threads
        try:
            return function(*args, **kwargs)
        finally:
            _CALL.threads = previous

    return call


def cpu_kernel(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates every op's cpu_forward_kernel and cpu_backward_kernel (the twin of core.gpu_kernel):
    the call runs with its handle's thread count current (cpu_threads). A handle that is not a CPU
    handle is passed through to the kernel, whose checks refuse it."""

    @functools.wraps(function)
    def call(stream: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(handle, CpuHandle):
            return function(stream, handle, *args, **kwargs)
        previous = _CALL.threads
        _CALL.threads = handle.threads
        try:
            return function(stream, handle, *args, **kwargs)
        finally:
            _CALL.threads = previous

    return call


class _Worker:
    """A pool thread that runs one part at a time: it waits on its own lock (`go`), which the caller
    releases once the part is set, and releases `done` when the part has run. A part costs the caller
    two lock releases and one acquire, and the worker as little Python as it can: every line a part
    runs outside NumPy's loops holds the GIL, which the other parts wait for."""

    def __init__(self, index: int):
        self.go, self.done = threading.Lock(), threading.Lock()
        self.go.acquire()
        self.done.acquire()
        self.part: tuple[Callable[[int, int], None], int, int] | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._loop, name=f"kernels-cpu-{index}", daemon=True).start()

    def _loop(self) -> None:
        _CPU_WORKER.busy = True
        while True:
            self.go.acquire()
            function, first, last = self.part  # type: ignore[misc]
            self.part = None
            try:
                function(first, last)
            except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
                self.error = error
            self.done.release()

    def start(self, function: Callable[[int, int], None], first: int, last: int) -> None:
        self.part = (function, first, last)
        self.go.release()

    def wait(self) -> tuple[BaseException | None, BaseException | None]:
        """Wait for the part to have run, even through an interrupt (say Ctrl-C: the part still writes
        into the caller's arrays); (the part's error, the interrupt), each None where there was none."""
        interrupted = None
        while True:
            try:
                self.done.acquire()
                break
            except BaseException as error:  # noqa: BLE001 - raised by the caller once every part is done
                interrupted = interrupted or error
        error, self.error = self.error, None
        return error, interrupted


class _Pool:
    """The pool threads of cpu_parallel, made on demand and kept. One call uses them at a time (`lock`);
    a call from another thread meanwhile runs its range in its own thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workers: list[_Worker] = []

    def take(self, count: int) -> list[_Worker] | None:
        """`count` workers, the pool held for them (release it with `lock.release()`), or None where
        another call holds it."""
        if not self.lock.acquire(blocking=False):
            return None
        try:
            while len(self.workers) < count:
                self.workers.append(_Worker(len(self.workers)))
        except BaseException:  # no thread could be started (say, a process limit): the pool stays usable
            self.lock.release()
            raise
        return self.workers[:count]


_POOL = _Pool()


def _new_pool() -> None:
    """After a fork, the child has none of the parent's pool threads: it makes its own."""
    global _POOL
    _POOL = _Pool()
    _CPU_WORKER.busy = False


getattr(os, "register_at_fork", lambda **_: None)(after_in_child=_new_pool)  # POSIX; Windows has no fork


# Handing a part to a pool thread costs the calling thread tens of microseconds (the wake-up and the
# GIL), so parts grow with the square root of the work, not with the threads: about
# sqrt(bytes / PIECE_BYTES) parts. Smaller pieces (more parts) lost on most benchmark rows
# (docs/performance.md#pool-hand-off-and-part-count).
PIECE_BYTES = 1 << 20


def parts_for(nbytes: int) -> int:
    """How many parts a pass over `nbytes` bytes (read and written) is worth: isqrt(nbytes / PIECE_BYTES), at least 1."""
    return max(1, math.isqrt(nbytes // PIECE_BYTES))


def parallel_parts(nbytes: int | None = None) -> int:
    """The parts cpu_parallel makes of a pass over `nbytes` bytes (read and written) when it has at
    least that many items: the handle's threads (cpu_threads), and at most parts_for(nbytes). A kernel
    that cuts its work into blocks or picks an axis to cut along sizes them by this, not by the
    threads: cut for every thread, the few parts a pass is worth would each run many short blocks,
    whose calls wait on the GIL (docs/performance.md#pool-hand-off-and-part-count)."""
    threads = cpu_threads()
    return threads if nbytes is None else min(threads, parts_for(nbytes))


def block_length(nbytes: int, elements: int, alone: int, beside: int) -> int:
    """The elements of a block of a pass over `elements` elements that reads and writes `nbytes` bytes:
    `alone` where the pass runs in one part (cache-sized); where its parts run beside each other, up to
    `beside` (fewer, longer NumPy calls: each takes the GIL to begin and to end, which the other parts
    wait for), and short enough to leave a block for every part, never under `alone`."""
    parts = parallel_parts(nbytes)
    if parts < 2:
        return alone
    cpu_paths.reach(BESIDE_PATH)
    return max(alone, min(beside, elements // parts))


def cpu_parallel(function: Callable[[int, int], None], count: int, nbytes: int | None = None) -> None:
    """Call function(first, last) on contiguous parts [first, last) of range(count), one part per
    thread (cpu_threads; with nbytes, the bytes the call reads and writes, at most parts_for(nbytes)
    parts: parallel_parts), in threads (NumPy releases the GIL in its loops); returns when all are
    done, raising the first error. The parts are disjoint, so each output element is computed once,
    by the same arithmetic whatever the thread. Runs in the calling thread when nested, with one
    thread, or while another thread's call has the pool threads."""
    parts = min(parallel_parts(nbytes), count)
    if parts <= 1 or _CPU_WORKER.busy:
        function(0, count)
        return
    pool = _POOL
    workers = pool.take(parts - 1)
    if workers is None:  # another thread's call has the pool: this one runs in its own thread
        function(0, count)
        return
    try:
        bounds = [count * i // parts for i in range(parts + 1)]
        for i, worker in enumerate(workers, 1):
            worker.start(function, bounds[i], bounds[i + 1])
        errors: list[BaseException | None] = []
        _CPU_WORKER.busy = True
        try:
            function(bounds[0], bounds[1])
        except BaseException as error:  # noqa: BLE001 - raised below, once every part is done
            errors.append(error)
        finally:
            _CPU_WORKER.busy = False
            for worker in workers:
                error, interrupted = worker.wait()
                errors += [interrupted, error]
    finally:
        pool.lock.release()
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first


# Bytes of output below which a copy or an elementwise pass runs in one call: past them, the
# hand-off to the pool is small beside the work (docs/performance.md#smallest-parallel-pass).
PARALLEL_MIN_BYTES = 1 << 21


def cpu_parts(function: Callable[..., None], output: np.ndarray, *operands: np.ndarray,
              skip_axis: int | None = None) -> None:
    """function(output part, *operand parts) over parts of the output cut along its first axis at least
    as long as the parts (parallel_parts), shared out to the threads; one call on the whole where the output is small
    or no axis is long enough. The operands are broadcast to the output's shape (views of any strides)
    and cut alike; with skip_axis, the output is never cut along it and the operands, which may differ
    from the output along it only (the pieces of a concat), are cut as they are. Elementwise work
    only: each element gets the same arithmetic whatever the parts."""
    if output.nbytes < PARALLEL_MIN_BYTES:  # first: the cheapest test, and small calls are the common ones
        function(output, *operands)
        return
    # The bytes the pass moves: the output, and each operand read at the output's size where it is
    # broadcast to it, or as it is where it is a piece along skip_axis (a concat's pieces sum to the whole).
    nbytes = output.nbytes * (1 + len(operands)) if skip_axis is None else \
        output.nbytes + sum(operand.nbytes for operand in operands)
    parts = parallel_parts(nbytes)
    shape = output.shape
    axis = next((i for i, size in enumerate(shape) if size >= parts and i != skip_axis), None)
    if parts < 2 or axis is None:
        function(output, *operands)
        return
    views = [np.broadcast_to(operand, shape) for operand in operands] if skip_axis is None else operands

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(PARTS_PATH if skip_axis is None else PIECES_PATH, first, last, shape[axis])
        index = (slice(None),) * axis + (slice(first, last),)
        function(output[index], *(view[index] for view in views))

    cpu_parallel(run, shape[axis], nbytes)


def cpu_planes(function: Callable[..., None], *arrays: np.ndarray) -> None:
    """function(*parts) over parts of whole (n, c) planes: each C-contiguous (N, C, ...) array seen as
    (1, N * C, ...) and cut alike along the planes, the parts shared out to the threads (one call on
    the whole arrays where they are small). For ops whose every output element is computed within its
    own plane, so the parts never change a result."""
    planes = arrays[0].shape[0] * arrays[0].shape[1]
    if cpu_threads() < 2 or planes < 2 or max(a.nbytes for a in arrays) < PARALLEL_MIN_BYTES:
        function(*arrays)
        return
    views = [a.reshape(1, planes, *a.shape[2:]) for a in arrays]

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(PLANES_PATH, first, last, planes)
        function(*(view[:, first:last] for view in views))

    cpu_parallel(run, planes, sum(a.nbytes for a in arrays))


def _copy(destination: np.ndarray, source: np.ndarray) -> None:
    np.copyto(destination, source)


def cpu_copy(destination: np.ndarray, source: np.ndarray) -> None:
    """destination[...] = source (a view of the same shape, any strides), in parts shared out to the threads."""
    cpu_parts(_copy, destination, source)


def copy_plan(nbytes: int, threads: int) -> Callable[[np.ndarray, np.ndarray], None]:
    """cpu_copy(destination, source) for the calls of a functional plan (kernels/functional.py) whose
    destinations are `nbytes` bytes, with `threads` as the handle's count: np.copyto itself where cpu_parts
    makes one call of it (under PARALLEL_MIN_BYTES)."""
    return np.copyto if nbytes < PARALLEL_MIN_BYTES else with_threads(cpu_copy, threads)


# --------------------------------------------------------------------------- BLAS

_BLAS: list[Any] | None = None  # threadpoolctl's controllers of NumPy's BLAS, found on first use


def blas_controllers() -> list[Any]:
    """threadpoolctl's controllers of the BLAS NumPy calls: the BLAS libraries loaded from NumPy's
    own folders (a wheel's bundled OpenBLAS), else every BLAS loaded (a NumPy built on a system
    BLAS). Another library's BLAS in the process (PyTorch's, say) is left alone where it can be told apart."""
    global _BLAS
    if _BLAS is None:
        import numpy
        from threadpoolctl import ThreadpoolController

        found = ThreadpoolController().select(user_api="blas").lib_controllers
        root = os.path.dirname(os.path.dirname(os.path.realpath(numpy.__file__)))
        package = os.path.basename(os.path.dirname(os.path.realpath(numpy.__file__)))
        own = [c for c in found if os.path.realpath(c.filepath).startswith(
            tuple(os.path.join(root, name) + os.sep for name in (package, package + ".libs")))]
        _BLAS = own or list(found)
    return _BLAS


def blas_info() -> list[dict[str, Any]]:
    """What NumPy's BLAS is and how many threads it uses now (threadpoolctl's info of each library)."""
    return [controller.info() for controller in blas_controllers()]


class blas_threads:  # noqa: N801 - a context manager used as the function it was (a class: a third of a generator's cost)
    """Inside the block NumPy's BLAS uses `threads` threads (None: handle_threads(), the running kernel's
    handle's); the counts it had are restored after. The GEMMs of conv_2d and batch_matmul run inside one.
    OpenBLAS may sum a GEMM in another order with another thread count (conv_2d's filter gradient
    differs in the last bits between 1 and 3 threads), so a result's bits depend on the handle's
    threads wherever a GEMM computes it; for a given count they are the same on every run."""

    __slots__ = ("threads", "changed")

    def __init__(self, threads: int | None = None):
        self.threads = handle_threads() if threads is None else threads

    def __enter__(self) -> None:
        threads = self.threads
        self.changed = changed = []
        for controller in blas_controllers():
            before = controller.get_num_threads()
            if before != threads:
                controller.set_num_threads(threads)
                changed.append((controller, before))

    def __exit__(self, *exc: Any) -> None:
        for controller, before in self.changed:
            controller.set_num_threads(before)


def widened(function: Any) -> Any:
    """function(*inputs, output) on blocks of a half dtype, run in float32: the inputs widened (exact),
    the result computed into a float32 buffer and rounded once (to nearest even) into output, which
    may alias an input (each is read before output is written)."""

    def run(*blocks: np.ndarray, **options: Any) -> None:
        *inputs, output = blocks
        wide = np.empty(output.shape, np.float32)
        function(*(block.astype(np.float32) for block in inputs), wide, **options)
        output[...] = wide

    return run
