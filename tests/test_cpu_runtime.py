"""kernels.runtime.cpu: the handle's thread count, how cpu_kernel makes it current for a call, the parts
cpu_parallel shares out to that many threads, and the BLAS thread count set through threadpoolctl."""

import threading

import numpy as np
import pytest

import kernels
from kernels import AttrsError
from kernels.runtime import cpu


def test_handle_threads_default_to_the_available_cores():
    import os

    with kernels.cpu_handle() as handle:
        assert handle.threads == len(os.sched_getaffinity(0)) == cpu.available_cores()
        assert repr(handle) == f"CpuHandle(threads={handle.threads})"
    assert kernels.cpu_handle(3).threads == 3


@pytest.mark.parametrize("threads", [0, -2, 1.5, "2", True])
def test_handle_refuses_a_thread_count_that_is_not_a_positive_int(threads):
    with pytest.raises(AttrsError, match=r"^cpu_handle: threads: expected a positive int or None"):
        kernels.cpu_handle(threads)


def _parts_seen(handle, count):
    """The (first, last) parts cpu_parallel makes of range(count) inside a kernel run on `handle`,
    with the thread each ran on. Every part waits for all the others (a barrier), so the test fails
    (BrokenBarrierError) unless the parts run at the same time, each in its own thread."""
    seen = []
    barrier = threading.Barrier(min(handle.threads, count), timeout=10)

    def part(first, last):
        seen.append((first, last, threading.get_ident()))
        barrier.wait()

    @cpu.cpu_kernel
    def kernel(stream, handle):
        assert cpu.cpu_threads() == handle.threads
        cpu.cpu_parallel(part, count)

    kernel(kernels.cpu_stream(), handle)
    return sorted(seen)


def test_cpu_parallel_shares_out_to_the_handles_threads():
    one = _parts_seen(kernels.cpu_handle(1), 10)
    assert [part[:2] for part in one] == [(0, 10)]
    three = _parts_seen(kernels.cpu_handle(3), 10)
    assert [part[:2] for part in three] == [(0, 3), (3, 6), (6, 10)]
    # More threads than the pool had: it is replaced by a larger one; never more parts than items.
    five = _parts_seen(kernels.cpu_handle(5), 4)
    assert [part[:2] for part in five] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert len({part[2] for part in five}) == 4, "each part in its own thread"
    assert cpu.cpu_threads() == cpu.available_cores(), "outside a kernel: the available cores"


def test_cpu_kernel_restores_the_count_after_a_nested_call_and_passes_other_handles_through():
    @cpu.cpu_kernel
    def inner(stream, handle):
        return cpu.cpu_threads()

    @cpu.cpu_kernel
    def outer(stream, handle):
        nested = inner(stream, kernels.cpu_handle(7))
        return nested, cpu.cpu_threads()

    assert outer(kernels.cpu_stream(), kernels.cpu_handle(2)) == (7, 2)
    assert inner(kernels.cpu_stream(), object()) == cpu.available_cores()  # the op's checks refuse it


def test_blas_threads_sets_the_handles_count_for_the_block_and_restores_it():
    controllers = cpu.blas_controllers()
    assert controllers, "NumPy's BLAS is found"
    assert all(info["user_api"] == "blas" for info in cpu.blas_info())
    before = [c.get_num_threads() for c in controllers]
    inside = {}

    @cpu.cpu_kernel
    def kernel(stream, handle):
        with cpu.blas_threads():
            inside[handle.threads] = [c.get_num_threads() for c in controllers]
            np.ones((64, 64)) @ np.ones((64, 64))

    kernel(kernels.cpu_stream(), kernels.cpu_handle(1))
    kernel(kernels.cpu_stream(), kernels.cpu_handle(before[0]))  # already so: nothing to set
    assert inside == {1: [1] * len(controllers), before[0]: [before[0]] * len(controllers)}
    assert [c.get_num_threads() for c in controllers] == before


def test_blas_controllers_fall_back_to_every_blas_when_none_is_numpys(monkeypatch):
    import threadpoolctl

    class Found:
        filepath = "/usr/lib/libopenblas.so.0"

    class Controller:
        def select(self, user_api):
            assert user_api == "blas"
            return type("Selected", (), {"lib_controllers": [Found()]})()

    monkeypatch.setattr(threadpoolctl, "ThreadpoolController", Controller)
    monkeypatch.setattr(cpu, "_BLAS", None)
    assert [c.filepath for c in cpu.blas_controllers()] == ["/usr/lib/libopenblas.so.0"]


def test_parts_grow_with_the_square_root_of_the_bytes():
    mb = 1 << 20
    assert [cpu.parts_for(n) for n in (0, mb - 1, mb, 4 * mb - 1, 4 * mb, 24 * mb, 64 * mb, 256 * mb)] == \
        [1, 1, 1, 1, 2, 4, 8, 16]
    seen = []

    @cpu.cpu_kernel
    def kernel(stream, handle, nbytes):
        cpu.cpu_parallel(lambda first, last: seen.append((first, last)), 12, nbytes)

    kernel(kernels.cpu_stream(), kernels.cpu_handle(3), 24 * mb)  # 4 parts' worth: the handle's 3
    kernel(kernels.cpu_stream(), kernels.cpu_handle(3), 4 * mb)   # 2 parts
    kernel(kernels.cpu_stream(), kernels.cpu_handle(3), mb)       # 1: not worth a hand-off
    assert sorted(seen) == sorted([(0, 4), (4, 8), (8, 12), (0, 6), (6, 12), (0, 12)])


def test_blocks_are_cut_for_the_parts_that_run_not_for_the_threads(monkeypatch):
    """A softmax along dim 1 of (1, 16, 4, 8400) moves 4.3 MB: 2 parts' worth on any handle of 2 threads
    or more. On 16 threads its blocks were once cut 16 ways for 2 parts (8 short blocks each); they are
    now cut in a multiple of the 2 parts, as on a handle of 2 threads: 4 blocks of 8400 columns (parts
    beside each other run blocks of softmax.cpu.PARALLEL_BLOCK_ELEMENTS, 16384 columns of 16 rows at most).
    One thread runs 5 cache-sized blocks (softmax.cpu.CPU_BLOCK_ELEMENTS: 8192 columns), with the same bits."""
    from kernels import SoftmaxAttrs, TensorShape, softmax

    calls = []
    real = cpu.cpu_parallel

    def spy(function, count, nbytes=None):
        calls.append((count, cpu.parallel_parts(nbytes)))
        real(function, count, nbytes)

    monkeypatch.setattr(cpu, "cpu_parallel", spy)
    x = np.random.default_rng(0).standard_normal((1, 16, 4, 8400)).astype(np.float32)
    attrs = SoftmaxAttrs(1)
    expected = None
    for threads in (16, 2, 1):
        y = np.full_like(x, np.nan)
        handle = kernels.cpu_handle(threads)
        state = softmax.init_kernel(handle, attrs, TensorShape(x.shape, np.float32), TensorShape(x.shape, np.float32))
        softmax.forward_kernel(kernels.cpu_stream(), handle, state, attrs, x, y)
        softmax.cleanup_kernel(handle, state)
        expected = y if expected is None else expected
        np.testing.assert_array_equal(y, expected)  # the blocks never change a bit
    assert calls == [(4, 2), (4, 2), (5, 1)]
    assert cpu.parallel_parts(None) == cpu.handle_threads()


def test_cpu_parts_counts_a_concats_pieces_as_they_are(monkeypatch):
    """cpu_parts' bytes, which size its parts: an operand broadcast to the output counts at the output's
    size, the pieces of a concat (skip_axis) at their own, so that 4 pieces joined into a 16 MiB whole
    count 32 MiB (read and written once: 5 parts' worth), not 5 x 16 MiB."""
    seen = []
    real = cpu.cpu_parallel
    monkeypatch.setattr(cpu, "cpu_parallel", lambda function, count, nbytes=None: (
        seen.append(nbytes), real(function, count, nbytes)))
    whole = np.empty((16, 4, 1 << 16), np.float32)  # 16 MiB
    pieces = [np.full((16, 1, 1 << 16), i, np.float32) for i in range(4)]

    def rows(part, *piece_parts):
        for i, piece in enumerate(piece_parts):
            part[:, i:i + 1] = piece

    @cpu.cpu_kernel
    def kernel(stream, handle):
        cpu.cpu_parts(rows, whole, *pieces, skip_axis=1)
        cpu.cpu_parts(lambda out, a: np.add(out, a, out=out), whole, np.ones((1, 4, 1), np.float32))

    kernel(kernels.cpu_stream(), kernels.cpu_handle(16))
    assert seen == [32 << 20, 32 << 20]
    assert cpu.parts_for(32 << 20) == 5
    np.testing.assert_array_equal(whole, np.arange(4, dtype=np.float32)[None, :, None] + 1 + np.zeros_like(whole))


def _in_kernel(threads, call):
    """call() inside a CPU kernel run on a handle of `threads` threads."""
    @cpu.cpu_kernel
    def kernel(stream, handle):
        return call()

    return kernel(kernels.cpu_stream(), kernels.cpu_handle(threads))


@pytest.mark.parametrize("failing", [0, 2])
def test_cpu_parallel_raises_a_parts_error_after_every_part_has_run(failing):
    finished = []

    def part(first, last):
        if first == failing:
            raise ValueError(f"part {first}")
        threading.Event().wait(0.05)  # the failing part returns first: the call must still wait for this one
        finished.append(first)

    with pytest.raises(ValueError, match=f"^part {failing}$"):
        _in_kernel(4, lambda: cpu.cpu_parallel(part, 4))
    assert sorted(finished) == sorted({0, 1, 2, 3} - {failing})
    assert [p[:2] for p in _parts_seen(kernels.cpu_handle(4), 4)] == [(0, 1), (1, 2), (2, 3), (3, 4)], "the pool works on"


def test_a_call_while_another_thread_has_the_pool_runs_in_its_own_thread():
    holding, release = threading.Event(), threading.Event()
    seen = []

    def slow(first, last):
        holding.set()
        release.wait(10)

    def second(first, last):
        seen.append((first, last, threading.get_ident()))

    other = threading.Thread(target=_in_kernel, args=(2, lambda: cpu.cpu_parallel(slow, 2)))
    other.start()
    try:
        assert holding.wait(10)
        _in_kernel(3, lambda: cpu.cpu_parallel(second, 6))
    finally:
        release.set()
        other.join(10)
    assert seen == [(0, 6, threading.get_ident())]
    assert [p[:2] for p in _parts_seen(kernels.cpu_handle(3), 6)] == [(0, 2), (2, 4), (4, 6)], "the pool is free again"


def test_an_interrupt_while_waiting_for_the_parts_is_raised_once_they_have_run(monkeypatch):
    _in_kernel(2, lambda: cpu.cpu_parallel(lambda first, last: None, 2))  # the pool has its worker
    worker = cpu._POOL.workers[0]
    real, interrupts, finished = worker.done, [], []

    class Interrupted:
        """The worker's done lock, whose first wait is interrupted (as Ctrl-C interrupts a lock wait)."""

        def acquire(self):
            if not interrupts:
                interrupts.append(1)
                raise KeyboardInterrupt
            return real.acquire()

        def release(self):
            real.release()

    monkeypatch.setattr(worker, "done", Interrupted())

    def part(first, last):
        if first == 1:
            threading.Event().wait(0.05)
            finished.append(first)

    with pytest.raises(KeyboardInterrupt):
        _in_kernel(2, lambda: cpu.cpu_parallel(part, 2))
    assert interrupts == [1] and finished == [1], "raised only once the worker's part had run"


def test_a_forked_child_makes_its_own_pool_threads():
    import os
    import warnings

    _in_kernel(2, lambda: cpu.cpu_parallel(lambda first, last: None, 2))  # the parent's pool has a worker
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12: fork() of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: its pool threads must be its own (the parent's do not exist here)
        status = 1
        try:
            status = 0 if [p[:2] for p in _parts_seen(kernels.cpu_handle(2), 2)] == [(0, 1), (1, 2)] else 1
        finally:
            os._exit(status)
    for _ in range(200):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        threading.Event().wait(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the child hung: it waited on the parent's pool threads")
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_thread_that_cannot_start_leaves_the_pool_usable(monkeypatch):
    monkeypatch.setattr(cpu, "_POOL", cpu._Pool())  # a new pool: it must start its threads

    def refuse(self):
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", refuse)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            _in_kernel(3, lambda: cpu.cpu_parallel(lambda first, last: None, 3))
    assert cpu._POOL.workers == [] and not cpu._POOL.lock.locked()
    assert [p[:2] for p in _parts_seen(kernels.cpu_handle(3), 3)] == [(0, 1), (1, 2), (2, 3)]


def test_kernels_called_from_several_threads_at_once_give_their_one_thread_results(monkeypatch):
    """Four threads run softmax and batch_norm at once on handles of 3 threads, every pass split (PIECE_BYTES
    = 1): whichever call holds the pool, the others run in their own threads, and every result has the
    bits of the same call run alone."""
    from kernels import BatchNormAttrs, SoftmaxAttrs, TensorShape, batch_norm, softmax

    monkeypatch.setattr(cpu, "PIECE_BYTES", 1)
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal((2, 8, 96, 96)).astype(np.float32) for _ in range(4)]
    bn_attrs, sm_attrs = BatchNormAttrs(eps=1e-3, momentum=0.03, activation="SILU"), SoftmaxAttrs(-1)

    def run(x):
        handle, stream = kernels.cpu_handle(3), kernels.cpu_stream()
        shape = TensorShape(x.shape, np.float32)
        bn, sm = batch_norm.init_kernel(handle, bn_attrs, shape, shape), softmax.init_kernel(handle, sm_attrs, shape, shape)
        y, z = np.full_like(x, np.nan), np.full_like(x, np.nan)
        for _ in range(5):
            batch_norm.forward_kernel(stream, handle, bn, bn_attrs, x, np.ones(8, np.float32), np.zeros(8, np.float32), y)
            softmax.forward_kernel(stream, handle, sm, sm_attrs, y, z)
        return y.tobytes() + z.tobytes()

    alone = [run(x) for x in inputs]
    together = [None] * 4

    def worker(i):
        together[i] = run(inputs[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert together == alone


def test_the_at_fork_handler_gives_a_new_pool_and_clears_the_busy_flag(monkeypatch):
    """What a forked child runs (in the child, which coverage does not follow): a new pool without the
    parent's threads, and this thread no longer marked as running a part."""
    _in_kernel(2, lambda: cpu.cpu_parallel(lambda first, last: None, 2))
    parents = cpu._POOL
    monkeypatch.setattr(cpu, "_POOL", parents)  # restored after the test
    assert parents.workers
    cpu._CPU_WORKER.busy = True
    try:
        cpu._new_pool()
        assert cpu._POOL is not parents and cpu._POOL.workers == [] and not cpu._CPU_WORKER.busy
    finally:
        cpu._CPU_WORKER.busy = False


@pytest.mark.parametrize("dims, dim", [
    ((4, 16, 4, 3000), 1),  # one thread: parts of inner; beside others: whole (16, 12000) slices
    ((3, 5, 400, 400), -1),
    ((2, 7, 50, 700), 2),
    ((5, 3, 90000), 1),
    ((700, 300), 0),
])
def test_softmax_blocks_change_no_bit_on_any_thread_count(monkeypatch, dims, dim):
    """softmax's blocks differ with the parts (cache-sized alone, PARALLEL_BLOCK_ELEMENTS beside others),
    and the cut along inner or over whole slices with them: forward and backward keep their bits on 1, 2,
    3 and 5 threads, every pass split (PIECE_BYTES = 1)."""
    from kernels import SoftmaxAttrs, TensorShape, softmax

    monkeypatch.setattr(cpu, "PIECE_BYTES", 1)
    rng = np.random.default_rng(3)
    x, g = (rng.standard_normal(dims) * 4).astype(np.float32), rng.standard_normal(dims).astype(np.float32)
    results = []
    for threads in (1, 2, 3, 5):
        handle, stream, attrs = kernels.cpu_handle(threads), kernels.cpu_stream(), SoftmaxAttrs(dim)
        state = softmax.init_kernel(handle, attrs, TensorShape(dims, np.float32), TensorShape(dims, np.float32))
        y, dx = np.full(dims, np.nan, np.float32), np.full(dims, np.nan, np.float32)
        softmax.forward_kernel(stream, handle, state, attrs, x, y)
        softmax.backward_kernel(stream, handle, state, attrs, y, g, None, dx)
        assert not np.isnan(y).any() and not np.isnan(dx).any()
        results.append(y.tobytes() + dx.tobytes())
    assert all(result == results[0] for result in results)


def test_block_length_is_cache_sized_alone_and_longer_beside_others_with_a_block_for_every_part(monkeypatch):
    """cpu.block_length, which batch_norm and softmax cut their passes by: `alone` on one part; on several,
    `beside` at most, the elements over the parts where that is shorter, `alone` at least."""
    mb = 1 << 20

    @cpu.cpu_kernel
    def lengths(stream, handle, elements, nbytes):
        return cpu.block_length(nbytes, elements, 1 << 16, 1 << 18)

    def at(threads, elements, nbytes):
        return lengths(kernels.cpu_stream(), kernels.cpu_handle(threads), elements, nbytes)

    assert at(1, 1 << 24, 256 * mb) == 1 << 16  # one thread: one part
    assert at(16, 1 << 24, 3 * mb) == 1 << 16  # worth one part (parts_for)
    assert at(16, 1 << 24, 256 * mb) == 1 << 18  # 16 parts of 2^20: capped at `beside`
    assert at(2, 3 << 17, 32 * mb) == 3 << 16  # 2 parts of 3 * 2^16: a block for each
    assert at(5, 200_000, 32 * mb) == 1 << 16  # 40000 a part is under `alone`: `alone`


def test_scratch_is_filled_inside_scratch_filled_only_in_any_thread_and_the_outer_fill_comes_back():
    outside = np.zeros(4)
    assert cpu.scratch(outside) is outside and not outside.any()
    with cpu.scratch_filled(lambda array: array.fill(7)):
        with cpu.scratch_filled(lambda array: array.fill(9)):
            other = np.zeros(3)
            thread = threading.Thread(target=cpu.scratch, args=(other,))
            thread.start()
            thread.join()
            assert (other == 9).all()
        assert (cpu.scratch(np.zeros(2)) == 7).all()
    assert not cpu.scratch(np.zeros(2)).any()
