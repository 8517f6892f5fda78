"""element_unary refuses bad input before writing anything."""

import numpy as np
import pytest

from kernels import (
    AttrsError,
    DeviceError,
    DTypeError,
    ElementUnaryAttrs,
    ShapeError,
    StateError,
    TensorShape,
    UnaryOpType,
    element_unary,
)
from kernels.runtime.core import BFLOAT16

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = ElementUnaryAttrs(UnaryOpType.SILU)
DIMS = (2, 3, 4)


def _state(dev, dims=DIMS, dtype=np.float32, attrs=ATTRS):
    return element_unary.init_kernel(dev.handle, attrs, TensorShape(dims, dtype), TensorShape(dims, dtype))


def _forward(input_dims=DIMS, output_dims=DIMS, input_dtype=np.float32, output_dtype=np.float32,
             input_transform=None, attrs=ATTRS, other_device=False):
    def build(dev):
        state = _state(dev)
        input = dev.array(np.arange(np.prod(input_dims), dtype=input_dtype).reshape(input_dims))
        if input_transform:
            input = input_transform(input)
        if other_device:
            input = np.asarray(dev.host(input))
        output = poisoned(dev, output_dims, output_dtype)
        return (lambda: element_unary.forward_kernel(dev.stream, dev.handle, state, attrs, input, output)), [output]
    return build


def _backward(drop_input=False, grad_dims=DIMS, attrs=ATTRS, cleaned=False, grad_transform=None):
    def build(dev):
        state = _state(dev, attrs=attrs)
        if cleaned:
            element_unary.cleanup_kernel(dev.handle, state)
        input = None if drop_input else dev.array(np.ones(DIMS, np.float32))
        output_grad = dev.array(np.ones(grad_dims, np.float32))
        if grad_transform:
            output_grad = grad_transform(output_grad)
        input_grad = poisoned(dev, DIMS)
        return (lambda: element_unary.backward_kernel(dev.stream, dev.handle, state, attrs, None, output_grad,
                                                      input, input_grad)), [input_grad]
    return build


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(2, 4, 3)), ShapeError, r"output: expected dims \(2, 3, 4\)"),
    Row("wrong_input_rank", _forward(input_dims=(6, 4)), ShapeError, r"input: expected dims \(2, 3, 4\)"),
    Row("dtype_mismatch", _forward(output_dtype=np.float64), DTypeError, r"output: expected dtype float32"),
    Row("integer_input", _forward(input_dtype=np.int32), DTypeError, r"input: expected dtype float32"),
    Row("non_contiguous", _forward(input_dims=(4, 3, 2), input_transform=lambda x: x.transpose(2, 1, 0)),
        ShapeError, r"input: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(attrs=ElementUnaryAttrs(UnaryOpType.SILU, 2.0)), AttrsError,
        r"attrs: expected the attrs"),
    Row("backward_needs_input", _backward(drop_input=True), ShapeError, r"input: expected an array"),
    Row("backward_grad_shape", _backward(grad_dims=(2, 3, 5)), ShapeError, r"output_grad: expected dims \(2, 3, 4\)"),
    Row("backward_grad_non_contiguous", _backward(grad_dims=(2, 3, 8), grad_transform=lambda g: g[:, :, ::2]),
        ShapeError, r"output_grad: expected a C-contiguous"),
    Row("cleaned_up_state", _backward(cleaned=True), StateError, r"state: expected a live state"),
    Row("other_device", _forward(other_device=True), DeviceError, r"input: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "element_unary")


@pytest.mark.parametrize("op_type, scalar, pattern", [
    ("POW", None, r"scalar: expected a number \(POW needs one\), found None"),
    ("SCALAR_MULTIPLY", None, r"scalar: expected a number \(SCALAR_MULTIPLY needs one\)"),
    ("SCALAR_ADD", None, r"scalar: expected a number"),
    ("SCALAR_SUB", None, r"scalar: expected a number"),
    ("SCALAR_TRUE_DIV", None, r"scalar: expected a number"),
    ("RELU", 1.0, r"scalar: expected None \(RELU takes no scalar\)"),
    ("GELU", 0.5, r"scalar: expected None \(GELU takes no scalar\)"),
    ("POW", "2", r"scalar: expected a real number"),
    ("POW", True, r"scalar: expected a real number"),
    ("SCALAR_MULTIPLY", float("nan"), r"scalar: expected a finite number"),
    ("ELU", float("inf"), r"scalar: expected a finite number"),
    ("SOFTPLUS", None, r"op_type: expected a UnaryOpType"),
    (3, None, r"op_type: expected a UnaryOpType"),
])
def test_bad_attrs(op_type, scalar, pattern):
    with pytest.raises(AttrsError, match=r"^element_unary: " + pattern):
        ElementUnaryAttrs(op_type, scalar)


def test_attrs_defaults_and_names():
    assert ElementUnaryAttrs(UnaryOpType.ELU).scalar == 1.0
    assert ElementUnaryAttrs("SILU") == ElementUnaryAttrs(UnaryOpType.SILU, 1)
    assert ElementUnaryAttrs(UnaryOpType.POW, 0).scalar == 0.0  # a legitimate 0 is kept, not defaulted
    assert ElementUnaryAttrs(UnaryOpType.RELU).scalar is None


def test_init_refuses_shapes_and_dtypes():
    handle = __import__("kernels").cpu_handle()
    with pytest.raises(DTypeError, match=r"^element_unary: input_shape: expected one of float16, bfloat16, float32, "
                                         r"float64, found int32"):
        element_unary.init_kernel(handle, ATTRS, TensorShape(DIMS, np.int32), TensorShape(DIMS, np.int32))
    # The half dtypes are taken, but not mixed with each other.
    for half in (np.float16, BFLOAT16):
        assert element_unary.init_kernel(handle, ATTRS, TensorShape(DIMS, half), TensorShape(DIMS, half)).shapes
    with pytest.raises(DTypeError, match=r"^element_unary: output_shape: expected dtype float16"):
        element_unary.init_kernel(handle, ATTRS, TensorShape(DIMS, np.float16), TensorShape(DIMS, BFLOAT16))
    with pytest.raises(ShapeError, match=r"^element_unary: output_shape: expected dims \(2, 3, 4\)"):
        element_unary.init_kernel(handle, ATTRS, TensorShape(DIMS, np.float32), TensorShape((2, 12), np.float32))
    with pytest.raises(DTypeError, match=r"^element_unary: output_shape: expected dtype float32"):
        element_unary.init_kernel(handle, ATTRS, TensorShape(DIMS, np.float32), TensorShape(DIMS, np.float64))
    with pytest.raises(AttrsError, match=r"^element_unary: attrs: expected ElementUnaryAttrs"):
        element_unary.init_kernel(handle, "SILU", TensorShape(DIMS, np.float32), TensorShape(DIMS, np.float32))
