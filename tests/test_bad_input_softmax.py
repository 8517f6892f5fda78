"""softmax refuses bad input before writing anything."""

import numpy as np
import pytest

import kernels
from kernels import AttrsError, DeviceError, DTypeError, ShapeError, SoftmaxAttrs, StateError, TensorShape, softmax
from kernels.runtime.core import BFLOAT16

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = SoftmaxAttrs(1)
DIMS = (2, 3, 4)


def _state(dev):
    return softmax.init_kernel(dev.handle, ATTRS, TensorShape(DIMS, np.float32), TensorShape(DIMS, np.float32))


def _forward(input_dims=DIMS, output_dims=DIMS, input_dtype=np.float32, output_dtype=np.float32,
             input_transform=None, attrs=ATTRS, other_device=False):
    def build(dev):
        state = _state(dev)
        input = dev.array(np.arange(np.prod(input_dims), dtype=input_dtype).reshape(input_dims))
        if input_transform:
            input = input_transform(input)
        if other_device:
            input = np.asarray(dev.host(input)) if dev.name == "gpu" else input
        output = poisoned(dev, output_dims, output_dtype)
        return (lambda: softmax.forward_kernel(dev.stream, dev.handle, state, attrs, input, output)), [output]
    return build


def _backward(output_present=True, grad_dims=DIMS, input_grad_dtype=np.float32):
    def build(dev):
        state = _state(dev)
        output = dev.array(np.full(DIMS, 0.25, dtype=np.float32)) if output_present else None
        grad = dev.array(np.ones(grad_dims, dtype=np.float32))
        input_grad = poisoned(dev, DIMS, input_grad_dtype)
        return (lambda: softmax.backward_kernel(dev.stream, dev.handle, state, ATTRS, output, grad, None, input_grad)), \
            [input_grad]
    return build


def _backward_on_cleaned_state(dev):
    state = _state(dev)
    softmax.cleanup_kernel(dev.handle, state)
    output, grad, input_grad = poisoned(dev, DIMS), poisoned(dev, DIMS), poisoned(dev, DIMS)
    return (lambda: softmax.backward_kernel(dev.stream, dev.handle, state, ATTRS, output, grad, None, input_grad)), \
        [input_grad]


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(2, 4, 3)), ShapeError, r"output: expected dims \(2, 3, 4\)"),
    Row("wrong_input_rank", _forward(input_dims=(6, 4)), ShapeError, r"input: expected dims \(2, 3, 4\)"),
    Row("dtype_mismatch", _forward(output_dtype=np.float64), DTypeError, r"output: expected dtype float32"),
    Row("non_contiguous", _forward(input_dims=(4, 3, 2), input_transform=lambda x: x.transpose(2, 1, 0)),
        ShapeError, r"input: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(attrs=SoftmaxAttrs(2)), AttrsError, r"attrs: expected the attrs"),
    Row("backward_without_output", _backward(output_present=False), ShapeError, r"output: expected an array"),
    Row("backward_wrong_grad_shape", _backward(grad_dims=(2, 3, 5)), ShapeError, r"output_grad: expected dims"),
    Row("backward_grad_dtype_mismatch", _backward(input_grad_dtype=np.float64), DTypeError,
        r"input_grad: expected dtype float32"),
    Row("cleaned_up_state", _backward_on_cleaned_state, StateError, r"state: expected a live state"),
    Row("other_device", _forward(other_device=True), DeviceError, r"input: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "softmax")


@pytest.mark.parametrize("dim, pattern", [
    (1.0, r"softmax: dim: expected an integer"),
    (True, r"softmax: dim: expected an integer"),
    (None, r"softmax: dim: expected an integer"),
])
def test_bad_attrs(dim, pattern):
    with pytest.raises(AttrsError, match=pattern) as raised:
        SoftmaxAttrs(dim)
    assert str(raised.value).startswith("softmax: ")  # the message names the op


@pytest.mark.parametrize("dim", [3, -4, 7])
def test_init_refuses_dim_out_of_range(dim):
    with pytest.raises(AttrsError, match=r"softmax: dim: expected an axis in \[-3, 3\), found " + str(dim)):
        softmax.init_kernel(kernels.cpu_handle(), SoftmaxAttrs(dim), TensorShape(DIMS, np.float32),
                            TensorShape(DIMS, np.float32))


def test_init_refuses_shapes_and_dtypes():
    handle = kernels.cpu_handle()
    with pytest.raises(ShapeError, match=r"softmax: output_shape: expected dims \(2, 3, 4\)"):
        softmax.init_kernel(handle, ATTRS, TensorShape(DIMS, np.float32), TensorShape((2, 4, 3), np.float32))
    with pytest.raises(DTypeError, match=r"softmax: output_shape: expected dtype float32"):
        softmax.init_kernel(handle, ATTRS, TensorShape(DIMS, np.float32), TensorShape(DIMS, np.float64))
    with pytest.raises(DTypeError, match=r"softmax: input_shape: expected one of float16, bfloat16, float32, float64"):
        softmax.init_kernel(handle, ATTRS, TensorShape(DIMS, np.int32), TensorShape(DIMS, np.int32))
    with pytest.raises(DTypeError, match=r"softmax: output_shape: expected dtype bfloat16"):
        softmax.init_kernel(handle, ATTRS, TensorShape(DIMS, BFLOAT16), TensorShape(DIMS, np.float16))
