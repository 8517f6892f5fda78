"""reshape refuses bad input before writing anything."""

import numpy as np
import pytest

import kernels
from kernels import AttrsError, DeviceError, DTypeError, ReshapeAttrs, ShapeError, StateError, TensorShape, reshape

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = ReshapeAttrs((4, -1))
IN, OUT = (2, 3, 4), (4, 6)


def _forward(input_dims=IN, output_dims=OUT, input_dtype=np.float32, output_dtype=np.float32,
             input_transform=None, attrs=ATTRS, other_device=False):
    def build(dev):
        state = reshape.init_kernel(dev.handle, ATTRS, TensorShape(IN, np.float32), TensorShape(OUT, np.float32))
        input = dev.array(np.arange(np.prod(input_dims), dtype=input_dtype).reshape(input_dims))
        if input_transform:
            input = input_transform(input)
        if other_device:
            input = np.asarray(dev.host(input)) if dev.name == "gpu" else input
        output = poisoned(dev, output_dims, output_dtype)
        return (lambda: reshape.forward_kernel(dev.stream, dev.handle, state, attrs, input, output)), [output]
    return build


def _backward(output_grad_dims=OUT, input_grad_dims=IN, input_grad_dtype=np.float32, cleaned=False):
    def build(dev):
        state = reshape.init_kernel(dev.handle, ATTRS, TensorShape(IN, np.float32), TensorShape(OUT, np.float32))
        if cleaned:
            reshape.cleanup_kernel(dev.handle, state)
        output_grad = dev.array(np.arange(np.prod(output_grad_dims), dtype=np.float32).reshape(output_grad_dims))
        input_grad = poisoned(dev, input_grad_dims, input_grad_dtype)
        return (lambda: reshape.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, output_grad, None,
                                                input_grad)), [input_grad]
    return build


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(6, 4)), ShapeError, r"output: expected dims \(4, 6\)"),
    Row("wrong_input_dims", _forward(input_dims=(6, 4)), ShapeError, r"input: expected dims \(2, 3, 4\)"),
    Row("dtype_mismatch", _forward(output_dtype=np.int32), DTypeError, r"output: expected dtype float32"),
    Row("non_contiguous", _forward(input_dims=(4, 3, 2), input_transform=lambda x: x.transpose(2, 1, 0)),
        ShapeError, r"input: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(attrs=ReshapeAttrs((4, 6))), AttrsError, r"attrs: expected the attrs"),
    Row("backward_wrong_output_grad", _backward(output_grad_dims=(24,)), ShapeError, r"output_grad: expected dims \(4, 6\)"),
    Row("backward_wrong_input_grad_dtype", _backward(input_grad_dtype=np.float64), DTypeError,
        r"input_grad: expected dtype float32"),
    Row("cleaned_up_state", _backward(cleaned=True), StateError, r"state: expected a live state"),
    Row("other_device", _forward(other_device=True), DeviceError, r"input: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "reshape")


@pytest.mark.parametrize("shape, pattern", [
    ((-1, 2, -1), r"shape: expected at most one -1"),
    ((2, -2), r"shape\[1\]: expected an integer >= -1"),
    ((2, 1.5), r"shape\[1\]: expected an integer"),
    ((2, True), r"shape\[1\]: expected an integer"),
    (6, r"shape: expected a sequence of integers"),
])
def test_bad_attrs(shape, pattern):
    with pytest.raises(AttrsError, match=pattern) as raised:
        ReshapeAttrs(shape)
    assert str(raised.value).startswith("reshape: ")  # the message names the op


@pytest.mark.parametrize("attrs, input_dims, output_dims, error, pattern", [
    (ReshapeAttrs((5, 5)), (2, 3, 4), (5, 5), ShapeError, r"reshape: input_shape: expected 25 elements"),
    (ReshapeAttrs((5, -1)), (2, 3, 4), (5, 5), ShapeError, r"reshape: input_shape: expected an element count divisible by 5"),
    (ReshapeAttrs((0, -1)), (2, 0, 4), (0, 1), ShapeError, r"reshape: input_shape: expected a shape whose -1 is defined"),
    (ReshapeAttrs((4, -1)), (2, 3, 4), (6, 4), ShapeError, r"reshape: output_shape: expected dims \(4, 6\)"),
])
def test_init_refuses_shapes(attrs, input_dims, output_dims, error, pattern):
    with pytest.raises(error, match=pattern):
        reshape.init_kernel(kernels.cpu_handle(), attrs, TensorShape(input_dims, np.float32),
                            TensorShape(output_dims, np.float32))


def test_init_refuses_dtypes():
    handle = kernels.cpu_handle()
    with pytest.raises(DTypeError, match=r"reshape: output_shape: expected dtype float32"):
        reshape.init_kernel(handle, ATTRS, TensorShape(IN, np.float32), TensorShape(OUT, np.int32))
    with pytest.raises(DTypeError, match=r"reshape: input_shape: expected one of"):
        reshape.init_kernel(handle, ATTRS, TensorShape(IN, np.str_), TensorShape(OUT, np.str_))


def test_minus_one_resolves():
    assert reshape.output_dims(ReshapeAttrs((-1, 3)), (2, 3, 4)) == (8, 3)
    assert reshape.output_dims(ReshapeAttrs((0, 5)), (2, 0, 3)) == (0, 5)
