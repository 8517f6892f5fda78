"""The shared machinery in kernels.runtime.core and kernels.runtime.cpu that no op's table reaches on its own:
TensorShape, the device checks of a GPU stream (on a fake CuPy, since CI has no device),
entry_point's contract, the CPU stream and handle, and the version of a source tree."""

import os
import sys
import threading
import types
from importlib import metadata

import numpy as np
import pytest

import kernels
from kernels import DeviceError, DTypeError, KernelError, ShapeError, TensorShape, transpose
from kernels.runtime import core


def test_tensor_shape_refuses_negative_dims_and_non_dtypes():
    with pytest.raises(ShapeError, match=r"TensorShape: dims: expected non-negative sizes, found \(2, -1\)"):
        TensorShape((2, -1), np.float32)
    with pytest.raises(DTypeError, match=r"TensorShape: dtype: expected a NumPy dtype, found 'no such type'"):
        TensorShape((2,), "no such type")


def test_tensor_shape_numel_with_dims_and_repr():
    shape = TensorShape([2, 3, 4], "float32")
    assert shape.dims == (2, 3, 4) and shape.rank == 3 and shape.numel == 24
    assert TensorShape((), np.float64).numel == 1
    assert shape.with_dims((6, 4)) == TensorShape((6, 4), np.float32)
    assert repr(shape) == "TensorShape((2, 3, 4), float32)"


def test_cpu_stream_and_handle():
    assert repr(kernels.cpu_stream()) == "CpuStream()"
    with kernels.cpu_handle() as handle:
        assert handle.device == "cpu"


class _FakeCupyArray:
    """What check_tensor may read of a CuPy array: its module (by type, or by isinstance), its memory's device,
    its dims, dtype and _c_contiguous flag, and its strides for a message. No public `device` or `flags`:
    those cost a CuPy array's checks 0.6 us more, and a check that reads them fails here."""

    def __init__(self, device_id, dims=(2,), dtype=np.float32, contiguous=True):
        self.data = types.SimpleNamespace(device_id=device_id)
        self.shape, self.dtype, self._c_contiguous = tuple(dims), np.dtype(dtype), contiguous
        self.strides = (4,) * len(dims)


@pytest.fixture
def fake_cupy(monkeypatch):
    module = types.SimpleNamespace(ndarray=_FakeCupyArray)
    monkeypatch.setitem(sys.modules, "cupy", module)
    monkeypatch.setattr(core, "_CUPY_ARRAY", None)  # check_tensor's CuPy type, as in a process that saw none yet
    return module


def test_check_tensor_on_a_gpu_stream_refuses_numpy_and_other_devices(fake_cupy):
    shape = TensorShape((2,), np.float32)
    with pytest.raises(DeviceError, match=r"^op: x: expected a CuPy array on GPU 0, found numpy.ndarray"):
        core.check_tensor("op", "x", np.zeros(2, np.float32), shape, 0)
    with pytest.raises(DeviceError, match=r"^op: x: expected an array on GPU 0, found GPU 1"):
        core.check_tensor("op", "x", _FakeCupyArray(1), shape, 0)


def test_check_tensor_reads_a_cupy_arrays_cheapest_attributes(fake_cupy):
    """A matching CuPy array passes on its memory's device, dims, dtype and _c_contiguous alone, whether its type
    is known yet or not; each one that does not match is refused with what is wrong."""
    shape = TensorShape((2, 3), np.float32)
    core.check_tensor("op", "x", _FakeCupyArray(0, (2, 3)), shape, 0)  # found by isinstance, its type kept
    assert core._CUPY_ARRAY is _FakeCupyArray
    core.check_tensor("op", "x", _FakeCupyArray(3, (2, 3)), shape, 3)  # found by its type
    for array, error, match in [
        (_FakeCupyArray(1, (2, 3)), DeviceError, r"^op: x: expected an array on GPU 0, found GPU 1"),
        (_FakeCupyArray(0, (3, 2)), ShapeError, r"^op: x: expected dims \(2, 3\), found \(3, 2\)"),
        (_FakeCupyArray(0, (2, 3), np.float64), DTypeError, r"^op: x: expected dtype float32, found float64"),
        (_FakeCupyArray(0, (2, 3), contiguous=False), ShapeError, r"^op: x: expected a C-contiguous array"),
    ]:
        with pytest.raises(error, match=match):
            core.check_tensor("op", "x", array, shape, 0)
    with pytest.raises(DeviceError, match=r"^op: x: expected a NumPy array \(CPU stream\), found .*_FakeCupyArray"):
        core.check_tensor("op", "x", _FakeCupyArray(0, (2, 3)), shape, "cpu")


def test_check_call_passes_matching_cupy_arrays_without_check_tensor(fake_cupy, monkeypatch):
    """check_call reads a CuPy array that passes itself (no call of check_tensor a row); an array that does not
    pass, or that is not a CuPy array, goes to check_tensor, which refuses it in its own terms."""
    stream = types.SimpleNamespace(device=0, synchronize=None)
    handle = types.SimpleNamespace(device=0, close=None)
    state = core.KernelState(op="op", attrs=None, device=0, shapes={})
    shape = TensorShape((2, 3), np.float32)
    core.check_tensor("op", "x", _FakeCupyArray(0, (2, 3)), shape, 0)  # the process has seen CuPy's type
    calls = []
    check_tensor = core.check_tensor
    monkeypatch.setattr(core, "check_tensor", lambda *args: calls.append(args[1]) or check_tensor(*args))
    rows = [("a", _FakeCupyArray(0, (2, 3)), shape, True), ("b", None, shape, False),
            ("c", _FakeCupyArray(0, (2, 3)), shape, True)]
    assert core.check_call("op", stream, handle, state, None, rows) == 0
    assert calls == []
    for array, error, match in [
        (_FakeCupyArray(1, (2, 3)), DeviceError, r"^op: x: expected an array on GPU 0, found GPU 1"),
        (_FakeCupyArray(0, (3, 2)), ShapeError, r"^op: x: expected dims \(2, 3\), found \(3, 2\)"),
        (_FakeCupyArray(0, (2, 3), np.float64), DTypeError, r"^op: x: expected dtype float32, found float64"),
        (_FakeCupyArray(0, (2, 3), contiguous=False), ShapeError, r"^op: x: expected a C-contiguous array"),
        (np.zeros((2, 3), np.float32), DeviceError, r"^op: x: expected a CuPy array on GPU 0, found numpy.ndarray"),
    ]:
        calls.clear()
        with pytest.raises(error, match=match):
            core.check_call("op", stream, handle, state, None, rows[:1] + [("x", array, shape, True)])
        assert calls == ["x"]
    for bad, argument in [(types.SimpleNamespace(device=0), "stream"), (types.SimpleNamespace(close=None), "handle")]:
        with pytest.raises(DeviceError, match=rf"^op: {argument}: expected a kernels {argument}"):
            core.check_call("op", bad if argument == "stream" else stream, bad if argument == "handle" else handle,
                            state, None, rows)


def test_check_tensor_refuses_a_numpy_array_that_does_not_match():
    shape = TensorShape((2, 3), np.float32)
    core.check_tensor("op", "x", np.zeros((2, 3), np.float32), shape, "cpu")
    subclass = np.zeros((2, 3), np.float32).view(type("Sub", (np.ndarray,), {}))  # told by isinstance, not its type
    core.check_tensor("op", "x", subclass, shape, "cpu")
    with pytest.raises(ShapeError, match=r"^op: x: expected dims \(2, 3\), found \(6,\)"):
        core.check_tensor("op", "x", subclass.reshape(6), shape, "cpu")
    for array, error, match in [
        (np.zeros((3, 2), np.float32), ShapeError, r"^op: x: expected dims \(2, 3\), found \(3, 2\)"),
        (np.zeros((2, 3), np.float64), DTypeError, r"^op: x: expected dtype float32, found float64"),
        (np.zeros((3, 2), np.float32).T, ShapeError, r"^op: x: expected a C-contiguous array"),
    ]:
        with pytest.raises(error, match=match):
            core.check_tensor("op", "x", array, shape, "cpu")


def test_check_tensor_on_the_cpu_refuses_what_is_not_an_array():
    with pytest.raises(DeviceError, match=r"^op: x: expected a NumPy array \(CPU stream\), found builtins.list"):
        core.check_tensor("op", "x", [1.0, 2.0], TensorShape((2,), np.float64), "cpu")


def test_entry_point_needs_the_twins_of_the_module():
    def cpu_forward_kernel(stream):
        pass

    def gpu_forward_kernel(stream):
        pass

    with pytest.raises(KernelError, match=r"op: entry_point\('forward_kernel'\) needs cpu_forward_kernel"):
        core.entry_point("op", "forward_kernel", cpu_forward_kernel, gpu_forward_kernel, "doc")


def test_entry_point_refuses_what_is_not_a_stream():
    state = transpose.init_kernel(kernels.cpu_handle(), transpose.TransposeAttrs((1, 0)), TensorShape((2, 3), np.float32),
                                  TensorShape((3, 2), np.float32))
    with pytest.raises(DeviceError, match=r"^transpose: stream: expected a kernels CPU or GPU stream"):
        transpose.forward_kernel(object(), kernels.cpu_handle(), state, state.attrs, np.zeros((2, 3), np.float32),
                                 np.zeros((3, 2), np.float32))


def test_version_of_a_source_tree_comes_from_pyproject(monkeypatch, tmp_path):
    """Not installed: the version is pyproject.toml's; without a readable pyproject.toml, 0+unknown."""
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), encoding="utf-8") as file:
        expected = next(line.split('"')[1] for line in file if line.startswith("version"))
    assert kernels._version() == expected
    monkeypatch.setattr(kernels, "__file__", str(tmp_path / "kernels" / "__init__.py"))  # no pyproject.toml there
    assert kernels._version() == "0+unknown"


def test_arrays_checked_skips_the_array_checks_only_inside_its_block():
    """Inside core.arrays_checked() a call's arrays are not looked at (a plan replaying calls it has run);
    the stream, handle, state and attrs are still checked, and the blocks nest and restore."""
    stream, handle = kernels.cpu_stream(), kernels.cpu_handle()
    attrs = transpose.TransposeAttrs(permutation=(1, 0))
    state = transpose.init_kernel(handle, attrs, TensorShape((2, 3), np.float32), TensorShape((3, 2), np.float32))
    wrong = [("input", np.zeros((3, 2), np.float64), TensorShape((2, 3), np.float32), True),
             ("output", None, TensorShape((3, 2), np.float32), True)]
    with pytest.raises(ShapeError, match=r"^transpose: input: expected dims \(2, 3\), found \(3, 2\)"):
        core.check_call("transpose", stream, handle, state, attrs, wrong)
    with core.arrays_checked():
        with core.arrays_checked():
            assert core.check_call("transpose", stream, handle, state, attrs, wrong) == "cpu"
        assert core.check_call("transpose", stream, handle, state, attrs, wrong) == "cpu"  # the outer block holds
        with pytest.raises(kernels.AttrsError, match=r"^transpose: attrs: expected the attrs the state was made"):
            core.check_call("transpose", stream, handle, state, transpose.TransposeAttrs(permutation=(0, 1)), wrong)
        with pytest.raises(DeviceError, match=r"^transpose: stream: expected a kernels stream"):
            core.check_call("transpose", object(), handle, state, attrs, wrong)
    with pytest.raises(ShapeError, match=r"^transpose: input: expected dims \(2, 3\), found \(3, 2\)"):
        core.check_call("transpose", stream, handle, state, attrs, wrong)

    def in_a_new_thread():  # the block is per thread: one that never entered it checks every array
        raised = []

        def run():
            try:
                core.check_call("transpose", stream, handle, state, attrs, wrong)
            except ShapeError as error:
                raised.append(str(error))

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return raised

    with core.arrays_checked():
        assert in_a_new_thread() == ["transpose: input: expected dims (2, 3), found (3, 2)"]
    assert in_a_new_thread() == ["transpose: input: expected dims (2, 3), found (3, 2)"]
    transpose.cleanup_kernel(handle, state)
