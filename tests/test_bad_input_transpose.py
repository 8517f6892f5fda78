"""transpose refuses bad input before writing anything."""

import numpy as np
import pytest

from kernels import AttrsError, DeviceError, DTypeError, ShapeError, StateError, TensorShape, TransposeAttrs, transpose

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = TransposeAttrs((2, 0, 1))
IN, OUT = (2, 3, 4), (4, 2, 3)


def _forward(input_dims=IN, output_dims=OUT, input_dtype=np.float32, output_dtype=np.float32,
             input_transform=None, state_dims=(IN, OUT), attrs=ATTRS, other_device=False):
    def build(dev):
        state = transpose.init_kernel(dev.handle, ATTRS, TensorShape(state_dims[0], np.float32),
                                      TensorShape(state_dims[1], np.float32))
        input = dev.array(np.arange(np.prod(input_dims), dtype=input_dtype).reshape(input_dims))
        if input_transform:
            input = input_transform(input)
        if other_device:
            input = np.asarray(dev.host(input)) if dev.name == "gpu" else input
        output = poisoned(dev, output_dims, output_dtype)
        return (lambda: transpose.forward_kernel(dev.stream, dev.handle, state, attrs, input, output)), [output]
    return build


def _backward_on_cleaned_state(dev):
    state = transpose.init_kernel(dev.handle, ATTRS, TensorShape(IN, np.float32), TensorShape(OUT, np.float32))
    transpose.cleanup_kernel(dev.handle, state)
    grad, input_grad = poisoned(dev, OUT), poisoned(dev, IN)
    return (lambda: transpose.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, grad, None, input_grad)), [input_grad]


class _GpuHandle:
    """A handle of GPU 0 as core's checks see one (a device ordinal and close): no device needed to be refused."""

    device = 0

    def close(self):
        pass


def _cpu_call_with(handle=None, state_handle=None):
    """A CPU forward given a GPU handle, or a state made on a GPU handle."""
    def build(dev):
        state = transpose.init_kernel(state_handle or dev.handle, ATTRS, TensorShape(IN, np.float32),
                                      TensorShape(OUT, np.float32))
        input, output = dev.array(np.zeros(IN, np.float32)), poisoned(dev, OUT)
        return (lambda: transpose.forward_kernel(dev.stream, handle or dev.handle, state, ATTRS, input, output)), [output]
    return build


def _init_with(handle=None, input_shape=None):
    def build(dev):
        shape = TensorShape(IN, np.float32) if input_shape is None else input_shape
        return (lambda: transpose.init_kernel(handle or dev.handle, ATTRS, shape, TensorShape(OUT, np.float32))), []
    return build


def _cleanup_of(state):
    return lambda dev: ((lambda: transpose.cleanup_kernel(dev.handle, state)), [])


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(4, 3, 2)), ShapeError, r"output: expected dims \(4, 2, 3\)"),
    Row("wrong_input_rank", _forward(input_dims=(6, 4)), ShapeError, r"input: expected dims \(2, 3, 4\)"),
    Row("dtype_mismatch", _forward(output_dtype=np.float64), DTypeError, r"output: expected dtype float32"),
    Row("non_contiguous", _forward(input_dims=(4, 3, 2), input_transform=lambda x: x.transpose(2, 1, 0)),
        ShapeError, r"input: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(attrs=TransposeAttrs((1, 2, 0))), AttrsError, r"attrs: expected the attrs"),
    Row("cleaned_up_state", _backward_on_cleaned_state, StateError, r"state: expected a live state"),
    Row("other_device", _forward(other_device=True), DeviceError, r"input: expected a CuPy array", devices=("gpu",)),
    Row("handle_of_another_device", _cpu_call_with(handle=_GpuHandle()), DeviceError,
        r"handle: expected a handle of the stream's device cpu, found 0", devices=("cpu",)),
    Row("state_of_another_device", _cpu_call_with(state_handle=_GpuHandle()), DeviceError,
        r"state: expected a state made for device cpu, found 0", devices=("cpu",)),
    Row("init_not_a_handle", _init_with(handle=object()), DeviceError, r"handle: expected a kernels handle"),
    Row("init_given_an_array_for_a_shape", _init_with(input_shape=np.zeros(IN, np.float32)), ShapeError,
        r"input_shape: expected a TensorShape, found ndarray"),
    Row("cleanup_not_a_state", _cleanup_of("a state"), StateError, r"state: expected a state from init_kernel, found str"),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "transpose")


@pytest.mark.parametrize("permutation, pattern", [
    ((0, 0, 1), r"permutation: expected a permutation of 0..2"),
    ((0, 3, 1), r"permutation: expected a permutation"),
    ((0, 1.5), r"permutation\[1\]: expected an integer"),
])
def test_bad_attrs(permutation, pattern):
    with pytest.raises(AttrsError, match=pattern) as raised:
        TransposeAttrs(permutation)
    assert str(raised.value).startswith("transpose: ")  # the message names the op


def test_init_refuses_rank_and_dims():
    handle = __import__("kernels").cpu_handle()
    with pytest.raises(ShapeError, match=r"transpose: input_shape: expected rank 3"):
        transpose.init_kernel(handle, ATTRS, TensorShape((2, 3), np.float32), TensorShape((3, 2), np.float32))
    with pytest.raises(ShapeError, match=r"transpose: output_shape: expected dims \(4, 2, 3\)"):
        transpose.init_kernel(handle, ATTRS, TensorShape(IN, np.float32), TensorShape(IN, np.float32))
    with pytest.raises(DTypeError, match=r"transpose: output_shape: expected dtype float32"):
        transpose.init_kernel(handle, ATTRS, TensorShape(IN, np.float32), TensorShape(OUT, np.int32))


def test_cleanup_twice_is_harmless():
    handle = __import__("kernels").cpu_handle()
    state = transpose.init_kernel(handle, ATTRS, TensorShape(IN, np.float32), TensorShape(OUT, np.float32))
    transpose.cleanup_kernel(handle, state)
    transpose.cleanup_kernel(handle, state)
    assert state.closed
