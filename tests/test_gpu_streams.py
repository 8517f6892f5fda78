"""Stream discipline: every GPU kernel call runs on its stream whatever the caller has
current, two host threads with their own streams and handles give the serial bits, and
1,000 init/forward/backward/cleanup cycles of every op leave no device memory, cuDNN
descriptor or library handle behind.

The schedules that catch work on the wrong stream (delayed, foreign current stream) run
in every GPU conformance case (conformance/runner.py); the first tests here check the
machinery itself without a device."""

from __future__ import annotations

import gc
import textwrap
import threading
import types

import numpy as np
import pytest

from conformance.cases import CASE_MODULES, all_cases
from conformance.harness import Env, execute
from conformance.runner import produce
from kernels.runtime import core, handle
from kernels.runtime import cpu as kernels_cpu

from .conftest import require

# --------------------------------------------------------------------------- without a device


class RecordingStream:
    """Stands in for a GpuStream: records when it is entered and left."""

    device = 0

    def __init__(self, log):
        self.log = log

    def synchronize(self):
        pass

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, *exc):
        self.log.append("exit")


def test_gpu_kernel_runs_inside_its_stream_after_the_hook():
    log = []
    stream = RecordingStream(log)

    @core.gpu_kernel
    def kernel(stream, value):
        log.append(("kernel", value))
        return value * 2

    with core.before_gpu_call(lambda s: log.append(("hook", s is stream))):
        assert kernel(stream, 21) == 42
    assert log == [("hook", True), "enter", ("kernel", 21), "exit"]
    log.clear()
    assert kernel(stream, 1) == 2  # the hook is gone after its block
    assert log == ["enter", ("kernel", 1), "exit"]


def test_gpu_kernel_leaves_a_stream_when_the_kernel_raises():
    log = []

    @core.gpu_kernel
    def kernel(stream):
        raise core.ShapeError("bad")

    with pytest.raises(core.ShapeError):
        kernel(RecordingStream(log))
    assert log == ["enter", "exit"]


def test_replaying_enters_its_gpu_stream_once_for_the_calls_on_it():
    """core.replaying (a plan's later runs): the stream is entered once around the calls made on it, the
    hook still runs before each, a call on another stream enters that one as usual, the arrays are not
    checked inside, and everything is as before after the block, also when a call raises."""
    log = []
    stream, other = RecordingStream(log), RecordingStream(log)

    @core.gpu_kernel
    def kernel(stream, value):
        log.append(("kernel", value, core.arrays_are_checked()))
        if value is None:
            raise core.ShapeError("bad")

    with core.before_gpu_call(lambda s: log.append(("hook", s is stream))):
        with core.replaying(stream):
            kernel(stream, 1)
            kernel(stream, 2)
            kernel(other, 3)
    assert log == ["enter", ("hook", True), ("kernel", 1, True), ("hook", True), ("kernel", 2, True),
                   ("hook", False), "enter", ("kernel", 3, True), "exit", "exit"]
    log.clear()
    with pytest.raises(core.ShapeError):
        with core.replaying(stream):
            kernel(stream, None)
    assert log == ["enter", ("kernel", None, True), "exit"]
    log.clear()
    kernel(stream, 4)
    assert log == ["enter", ("kernel", 4, False), "exit"]


def test_replaying_restores_what_it_set_when_nested_or_when_its_stream_refuses_to_be_entered():
    """Nested blocks on two streams: inside the inner one a call on the outer stream enters it again, and
    leaving the inner block gives the outer stream back its hold. A stream whose entry raises leaves
    neither the arrays' checks off nor itself held."""
    log = []
    outer, inner = RecordingStream(log), RecordingStream(log)

    @core.gpu_kernel
    def kernel(stream, value):
        log.append(("kernel", value, core.arrays_are_checked()))

    with core.replaying(outer):
        with core.replaying(inner):
            kernel(inner, 1)
            kernel(outer, 2)
        kernel(outer, 3)
        assert core.arrays_are_checked()
    assert log == ["enter", "enter", ("kernel", 1, True), "enter", ("kernel", 2, True), "exit", "exit",
                   ("kernel", 3, True), "exit"]

    class Refusing(RecordingStream):
        def __enter__(self):
            raise core.DeviceError("no such device")

    refusing = Refusing(log)
    log.clear()
    with pytest.raises(core.DeviceError, match="no such device"):
        with core.replaying(refusing):
            log.append("inside")
    assert log == [] and not core.arrays_are_checked()
    with pytest.raises(core.DeviceError, match="no such device"):  # not held: a call on it enters it, and fails
        kernel(refusing, 4)
    assert log == []


def test_gpu_kernel_passes_a_non_gpu_stream_to_the_kernels_checks():
    seen = []

    @core.gpu_kernel
    def kernel(stream):
        seen.append(stream)

    cpu = kernels_cpu.cpu_stream()
    with core.before_gpu_call(lambda s: seen.append("hook")):
        kernel(cpu)
    assert seen == [cpu]


def _op_module(log, decorator="@core.gpu_kernel"):
    """A module with an op's two twins, as entry_point finds them (by name, in the module)."""
    module = types.ModuleType("fake_op")
    module.log = log
    exec(textwrap.dedent(f"""
        from kernels.runtime import core

        def cpu_forward_kernel(stream, value):
            log.append(("cpu", value))

        {decorator}
        def gpu_forward_kernel(stream, value):
            log.append(("gpu", value))
            return value
    """), module.__dict__)
    return module


def test_a_public_gpu_call_runs_the_ops_code_inside_its_stream_in_one_frame():
    """entry_point's kernel on a GPU stream does what gpu_kernel's wrapper does (the hook, then the op's code
    inside the stream, or inside replaying() without entering it again) without calling that wrapper; a GPU
    twin replaced in the module is called as it is; the other streams go where the entry point sends them."""
    log = []
    module = _op_module(log)
    public = core.entry_point("op", "forward_kernel", module.cpu_forward_kernel, module.gpu_forward_kernel, "doc")
    stream = RecordingStream(log)
    with core.before_gpu_call(lambda s: log.append(("hook", s is stream))):
        assert public(stream, 1) == 1
        assert log == [("hook", True), "enter", ("gpu", 1), "exit"]
        log.clear()
        with core.replaying(stream):
            public(stream, 2)
        assert log == ["enter", ("hook", True), ("gpu", 2), "exit"]
    log.clear()

    class Unenterable:  # an int device but no context manager: passed to the op's code, whose checks refuse it
        device = 0

    unenterable = Unenterable()
    public(unenterable, 3)
    public(kernels_cpu.cpu_stream(), 4)
    assert log == [("gpu", 3), ("cpu", 4)]
    log.clear()
    module.gpu_forward_kernel = lambda stream, value: log.append(("replaced", value))
    public(stream, 5)
    assert log == [("replaced", 5)]
    with pytest.raises(core.DeviceError, match=r"^op: stream: expected a kernels CPU or GPU stream"):
        public(object(), 6)
    log.clear()  # a GPU twin that gpu_kernel does not wrap is called as it is, outside any stream
    plain = _op_module(log, decorator="")
    public = core.entry_point("op", "forward_kernel", plain.cpu_forward_kernel, plain.gpu_forward_kernel, "doc")
    public(stream, 7)
    public(kernels_cpu.cpu_stream(), 8)
    assert log == [("gpu", 7), ("cpu", 8)]


def test_before_gpu_call_is_per_thread():
    seen = []
    with core.before_gpu_call(lambda s: seen.append("main")):
        other = []

        def worker():
            other.append(getattr(core._GPU_CALL_HOOKS, "hook", None))

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert other == [None]


def test_every_gpu_entry_point_is_wrapped():
    import kernels

    for name, module in kernels.OPS.items():
        for function in ("gpu_forward_kernel", "gpu_backward_kernel"):
            wrapped = getattr(getattr(module, function), "__wrapped__", None)
            assert wrapped is not None, f"{name}.{function} does not run inside its stream (core.gpu_kernel)"


# --------------------------------------------------------------------------- on the device


def _gpu_cases():
    return [c for c in all_cases() if "gpu" in c.extra.get("devices", ("gpu",))]


@pytest.mark.gpu
def test_two_threads_give_the_serial_bits(store):
    """Two host threads, each with its own stream and handle (one Env per case), run different
    cases at the same time under the delayed-foreign schedule; every tensor equals the serial run's."""
    require("gpu")
    cases = _gpu_cases()
    serial = {c.key: produce(c, store.get(c), "gpu")[0] for c in cases}
    results: dict[str, dict] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker(part):
        try:
            barrier.wait()
            for case in part:
                results[case.key] = produce(case, store.get(case), "gpu", schedule="foreign")[0]
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(cases[i::2],)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert results.keys() == serial.keys()
    for key, tensors in serial.items():
        for name, expected in tensors.items():
            got = results[key][name]
            assert got.dtype == expected.dtype and got.shape == expected.shape, (key, name)
            assert got.tobytes() == expected.tobytes(), f"{key}: {name} differs between the threaded and serial runs"


CYCLES = 1000


def _device_state():
    import cupy

    from kernels.runtime import cudnn, gpu

    gc.collect()
    return {"pool bytes": cupy.get_default_memory_pool().used_bytes(), "allocations": gpu.live_allocations(),
            "cudnn descriptors": cudnn.live_descriptors(), "library handles": handle.live_library_handles()}


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(CASE_MODULES))
def test_a_thousand_cycles_leave_nothing_behind(op, store):
    """1,000 init/forward/backward/cleanup cycles of the op's first case (its run function), on
    one stream and handle: device memory (CuPy's pool and the states' own allocations), live
    cuDNN descriptors and library handles are back where they started; the last cycle's
    results still equal the first's."""
    require("gpu")
    case = next(c for c in CASE_MODULES[op].TABLE if "gpu" in c.extra.get("devices", ("gpu",)))
    golden = store.get(case)
    before = _device_state()
    env = Env(case, golden, "gpu", "random")
    first = None
    for cycle in range(CYCLES):
        env.writes.clear()
        env.observed.clear()
        execute(case, env)
        if cycle in (0, CYCLES - 1):
            env.stream.synchronize()
            produced = {name: env.to_host(array) for name, array in env.writes.items()}
            if first is None:
                first = produced
    env.stream.synchronize()
    for name, expected in first.items():
        assert produced[name].tobytes() == expected.tobytes(), f"{op}: {name} changed over {CYCLES} cycles"
    env.close()
    del env, produced
    after = _device_state()
    assert after == before, f"{op}: {before} before, {after} after {CYCLES} cycles"


@pytest.mark.gpu
def test_a_foreign_current_stream_and_device_context_are_left_as_they_were():
    """A kernel call leaves CuPy's current stream and the current device as the caller had them."""
    require("gpu")
    import cupy

    import kernels

    stream, handle = kernels.gpu_stream(0), kernels.gpu_handle(0)
    foreign = cupy.cuda.Stream(non_blocking=True)
    attrs = kernels.BatchMatmulAttrs()
    with stream:
        lhs = cupy.arange(24, dtype=np.float32).reshape(2, 3, 4)
        rhs = cupy.arange(40, dtype=np.float32).reshape(2, 4, 5)
        output = cupy.full((2, 3, 5), np.nan, dtype=np.float32)
    stream.synchronize()
    state = kernels.batch_matmul.init_kernel(handle, attrs, kernels.TensorShape.of(lhs), kernels.TensorShape.of(rhs),
                                            kernels.TensorShape.of(output))
    with foreign:
        kernels.batch_matmul.forward_kernel(stream, handle, state, attrs, lhs, rhs, output)
        assert cupy.cuda.get_current_stream().ptr == foreign.ptr
    stream.synchronize()
    expected = np.arange(24, dtype=np.float32).reshape(2, 3, 4) @ np.arange(40, dtype=np.float32).reshape(2, 4, 5)
    np.testing.assert_array_equal(cupy.asnumpy(output, stream=stream.cupy_stream), expected)
    kernels.batch_matmul.cleanup_kernel(handle, state)
    handle.close()
