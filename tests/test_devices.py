"""Any device: the runner's device names (gpu, gpu:N) and what they mean, the refusal of a call that
mixes devices, and (on the GPU) every op on device k while another device is current."""

import types

import numpy as np
import pytest

import conformance.harness as harness
import kernels
from conformance.cases import all_cases
from conformance.golden import GoldenStore
from conformance.runner import run_case
from kernels import DeviceError, TensorShape, transpose
from kernels.transpose import TransposeAttrs

# --------------------------------------------------------------------------- names (CPU)


@pytest.mark.parametrize("name, kind, ordinal", [("cpu", "cpu", None), ("gpu", "gpu", 0), ("gpu:1", "gpu", 1),
                                                 ("gpu:12", "gpu", 12)])
def test_device_kind_and_ordinal(name, kind, ordinal):
    assert harness.device_kind(name) == kind
    if ordinal is not None:
        assert harness.device_ordinal(name) == ordinal


def test_every_gpu_device_runs_the_gpu_schedules():
    assert harness.runs("gpu:3") == harness.runs("gpu")
    assert len(harness.runs("gpu:3")) == 13 and len(harness.runs("cpu")) == 6
    assert [run for run in harness.runs("gpu") if run[0] == "small"] == [
        ("small", "aligned", "random"), ("small", "aligned", "nan"), ("small", "misaligned", "random")]


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine that reports two CUDA devices (CuPy and the kernels' availability faked)."""
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 2)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)
    monkeypatch.setattr(kernels, "gpu_unavailable_reason", lambda: None)


@pytest.mark.parametrize("name, reason", [("gpu", None), ("gpu:1", None), ("gpu:2", "no CUDA device 2 (2 visible)"),
                                          ("gpu:7", "no CUDA device 7 (2 visible)")])
def test_a_device_past_the_visible_ones_cannot_run(two_gpus, name, reason):
    assert harness.device_unavailable(name) == reason


def test_without_a_gpu_every_gpu_device_gives_the_reason(monkeypatch):
    monkeypatch.setattr(kernels, "gpu_unavailable_reason", lambda: "no CUDA device (test)")
    assert harness.device_unavailable("gpu:3") == "no CUDA device (test)"
    assert harness.device_unavailable("cpu") is None


# --------------------------------------------------------------------------- mixing devices (CPU, fakes)


class FakeStream:
    """What core.device_of takes for a GPU stream of `device` (no CUDA behind it: the checks run first)."""

    def __init__(self, device):
        self.device = device

    def synchronize(self):
        raise AssertionError("a refused call must not reach the stream")


class FakeHandle:
    def __init__(self, device):
        self.device = device

    def close(self):
        pass


ATTRS = TransposeAttrs((1, 0))
SHAPES = (TensorShape((2, 3), np.float32), TensorShape((3, 2), np.float32))


@pytest.mark.parametrize("stream, handle, state_device, argument, pattern", [
    (1, 0, 0, "handle", r"handle: expected a handle of the stream's device 1, found 0"),
    (0, 1, 1, "handle", r"handle: expected a handle of the stream's device 0, found 1"),
    (1, 1, 0, "state", r"state: expected a state made for device 1, found 0"),
], ids=["stream1_handle0", "stream0_handle1", "state_of_device0"])
def test_a_call_mixing_devices_is_refused_naming_the_argument(stream, handle, state_device, argument, pattern):
    state = transpose.init_kernel(FakeHandle(state_device), ATTRS, *SHAPES)
    assert state.device == state_device
    with pytest.raises(DeviceError, match=r"^transpose: " + pattern):
        transpose.forward_kernel(FakeStream(stream), FakeHandle(handle), state, ATTRS, None, None)


# --------------------------------------------------------------------------- the GPU


def _gpu_count():
    if kernels.gpu_unavailable_reason() is not None:
        return 0
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def _pairs():
    """(device the ops run on, device current in the caller) for the GPU runs: device 0 with 0 current,
    and each other ordered pair of two devices (skipped with the reason where fewer GPUs are visible)."""
    return [(0, 0), (1, 0), (0, 1)]


def _needs(count):
    reason = kernels.gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    visible = _gpu_count()
    if visible < count:
        pytest.skip(f"needs {count} CUDA devices, {visible} visible")


@pytest.mark.gpu
@pytest.mark.parametrize("run_on, current", _pairs(), ids=lambda d: str(d))
def test_every_case_on_a_device_while_another_is_current(run_on, current):
    """Every conformance case of every op, plain schedule, on device `run_on` with `current` current in the
    calling thread: each kernel makes its stream's device current for its work and restores the caller's."""
    _needs(max(run_on, current) + 1)
    import cupy

    store = GoldenStore()
    device = "gpu" if run_on == 0 else f"gpu:{run_on}"
    failed = []
    with cupy.cuda.Device(current):
        for case in all_cases():
            result = run_case(case, store.get(case), device, ["plain"])
            assert cupy.cuda.runtime.getDevice() == current, f"{result.key} left another device current"
            if result.status == "failed":
                failed.append(result.message)
            else:
                assert result.status == "passed" or "declared for" in result.message, result.message
    assert not failed, "\n".join(failed[:5])


@pytest.mark.gpu
def test_a_gpu_handle_of_another_device_is_refused_on_one_gpu():
    """The mismatch is checked before any work: a handle whose device is 1 (faked on a one-GPU machine)
    and a real stream of device 0."""
    _needs(1)
    with kernels.gpu_handle(0) as handle:
        state = transpose.init_kernel(handle, ATTRS, *SHAPES)
        with pytest.raises(DeviceError, match=r"^transpose: handle: expected a handle of the stream's device 0, found 1"):
            transpose.forward_kernel(kernels.gpu_stream(0), FakeHandle(1), state, ATTRS, None, None)
        transpose.cleanup_kernel(handle, state)


@pytest.mark.gpu
def test_arrays_of_another_device_are_refused_naming_them():
    _needs(2)
    import cupy

    stream, handle = kernels.gpu_stream(1), kernels.gpu_handle(1)
    state = transpose.init_kernel(handle, ATTRS, *SHAPES)
    with cupy.cuda.Device(1):
        on_1 = cupy.zeros((2, 3), np.float32), cupy.zeros((3, 2), np.float32)
    with cupy.cuda.Device(0):
        on_0 = cupy.zeros((2, 3), np.float32), cupy.zeros((3, 2), np.float32)
    with pytest.raises(DeviceError, match=r"^transpose: input: expected an array on GPU 1, found GPU 0"):
        transpose.forward_kernel(stream, handle, state, ATTRS, on_0[0], on_1[1])
    with pytest.raises(DeviceError, match=r"^transpose: output: expected an array on GPU 1, found GPU 0"):
        transpose.forward_kernel(stream, handle, state, ATTRS, on_1[0], on_0[1])
    transpose.forward_kernel(stream, handle, state, ATTRS, on_1[0], on_1[1])  # all of device 1: runs
    stream.synchronize()
    transpose.cleanup_kernel(handle, state)
    handle.close()


@pytest.mark.gpu
@pytest.mark.parametrize("run_on, current", [(1, 0), (0, 1)], ids=str)
def test_the_model_on_a_device_while_another_is_current(run_on, current):
    """yolov10n's training step on device `run_on`, called with `current` current, gives the same bits as on
    device 0 with 0 current (same kernels, same algorithms: the GPUs are of one kind)."""
    _needs(2)
    import cupy

    from kernels.models import YOLOv10

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
    results = []
    for device, caller in ((0, 0), (run_on, current)):
        with cupy.cuda.Device(caller), YOLOv10("n", device=f"gpu:{device}") as model:
            with model.stream:
                out = model(cupy.asarray(x))
                grads = {key: [cupy.ones_like(a) * 0.01 for a in out[key]] for key in out}
            model.backward(grads)
            model.stream.synchronize()
            assert cupy.cuda.runtime.getDevice() == caller
            results.append({name: cupy.asnumpy(g) for name, g in model.grads.items()})
    for name in results[0]:
        np.testing.assert_array_equal(results[1][name], results[0][name], err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("run_on, current", [(1, 0), (0, 1)], ids=str)
def test_functional_default_stream_on_a_device_while_another_is_current(run_on, current):
    """kernels.functional without stream= on device `run_on`, called with `current` current: the calls run on
    CuPy's current stream of `run_on` (not of the current device), the values are right, the caller's device
    stays."""
    _needs(2)
    import cupy

    import kernels.functional as F

    x = np.arange(-12, 12, dtype=np.float32).reshape(2, 3, 4) / 4
    with cupy.cuda.Device(run_on):
        device_x = cupy.asarray(x)
    with cupy.cuda.Device(current):
        got = F.relu(F.relu(device_x))
        assert cupy.cuda.runtime.getDevice() == current
        assert got.device.id == run_on
        host = cupy.asnumpy(got)  # on device run_on's current stream, which waited for the calls
    np.testing.assert_array_equal(host, np.maximum(x, 0))
