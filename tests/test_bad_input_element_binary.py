"""element_binary refuses bad input before writing anything, and skips None gradients."""

import numpy as np
import pytest

import kernels
from kernels import (
    AttrsError,
    BinaryOpType,
    DeviceError,
    DTypeError,
    ElementBinaryAttrs,
    ShapeError,
    StateError,
    TensorShape,
    element_binary,
)
from kernels.runtime.core import BFLOAT16

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = ElementBinaryAttrs(BinaryOpType.MUL)
LHS, RHS, OUT = (2, 1, 4), (1, 3, 1), (2, 3, 4)


def _state(dev, attrs=ATTRS):
    return element_binary.init_kernel(dev.handle, attrs, TensorShape(LHS, np.float32), TensorShape(RHS, np.float32),
                                      TensorShape(OUT, np.float32))


def _forward(lhs_dims=LHS, rhs_dims=RHS, output_dims=OUT, rhs_dtype=np.float32, output_dtype=np.float32,
             lhs_transform=None, other_device=False, attrs=ATTRS):
    def build(dev):
        state = _state(dev)
        lhs = dev.array(np.ones(lhs_dims, dtype=np.float32))
        rhs = dev.array(np.full(rhs_dims, 2, dtype=rhs_dtype))
        if lhs_transform:
            lhs = lhs_transform(lhs)
        if other_device:
            rhs = np.asarray(dev.host(rhs)) if dev.name == "gpu" else rhs
        output = poisoned(dev, output_dims, output_dtype)
        return (lambda: element_binary.forward_kernel(dev.stream, dev.handle, state, attrs, lhs, rhs, output)), [output]
    return build


def _backward(lhs_present=True, rhs_present=True, grad_dims=OUT, rhs_grad_dims=RHS, rhs_grad_dtype=np.float32,
              grad_transform=None):
    def build(dev):
        state = _state(dev)
        lhs = dev.array(np.ones(LHS, dtype=np.float32)) if lhs_present else None
        rhs = dev.array(np.ones(RHS, dtype=np.float32)) if rhs_present else None
        grad = dev.array(np.ones(grad_dims, dtype=np.float32))
        if grad_transform:
            grad = grad_transform(grad)
        lhs_grad, rhs_grad = poisoned(dev, LHS), poisoned(dev, rhs_grad_dims, rhs_grad_dtype)
        return (lambda: element_binary.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, grad,
                                                       lhs, lhs_grad, rhs, rhs_grad)), [lhs_grad, rhs_grad]
    return build


def _forward_on_cleaned_state(dev):
    state = _state(dev)
    element_binary.cleanup_kernel(dev.handle, state)
    lhs, rhs, output = poisoned(dev, LHS), poisoned(dev, RHS), poisoned(dev, OUT)
    return (lambda: element_binary.forward_kernel(dev.stream, dev.handle, state, ATTRS, lhs, rhs, output)), [output]


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(2, 3, 1)), ShapeError, r"output: expected dims \(2, 3, 4\)"),
    Row("rhs_not_the_state_shape", _forward(rhs_dims=(1, 1, 4)), ShapeError, r"rhs: expected dims \(1, 3, 1\)"),
    Row("wrong_rank", _forward(lhs_dims=(2, 4)), ShapeError, r"lhs: expected dims \(2, 1, 4\)"),
    Row("dtype_mismatch_lhs_rhs", _forward(rhs_dtype=np.float64), DTypeError, r"rhs: expected dtype float32"),
    Row("output_dtype_mismatch", _forward(output_dtype=np.float64), DTypeError, r"output: expected dtype float32"),
    Row("non_contiguous", _forward(lhs_dims=(4, 1, 2), lhs_transform=lambda x: x.transpose(2, 1, 0)),
        ShapeError, r"lhs: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(attrs=ElementBinaryAttrs(BinaryOpType.ADD)), AttrsError,
        r"attrs: expected the attrs"),
    Row("backward_mul_without_lhs", _backward(lhs_present=False), ShapeError, r"lhs: expected an array"),
    Row("backward_mul_without_rhs", _backward(rhs_present=False), ShapeError, r"rhs: expected an array"),
    Row("backward_wrong_grad_shape", _backward(grad_dims=(2, 3, 1)), ShapeError, r"output_grad: expected dims"),
    Row("backward_non_contiguous_grad", _backward(grad_dims=(4, 3, 2), grad_transform=lambda x: x.transpose(2, 1, 0)),
        ShapeError, r"output_grad: expected a C-contiguous"),
    Row("backward_rhs_grad_unreduced", _backward(rhs_grad_dims=OUT), ShapeError, r"rhs_grad: expected dims \(1, 3, 1\)"),
    Row("backward_rhs_grad_dtype", _backward(rhs_grad_dtype=np.float64), DTypeError, r"rhs_grad: expected dtype float32"),
    Row("cleaned_up_state", _forward_on_cleaned_state, StateError, r"state: expected a live state"),
    Row("other_device", _forward(other_device=True), DeviceError, r"rhs: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "element_binary")


@pytest.mark.parametrize("op_type, pattern", [
    ("POW", r"element_binary: op_type: expected a BinaryOpType \(ADD, SUB, MUL, DIV, MAX, MIN\)"),
    (2, r"op_type: expected a BinaryOpType"),
    (None, r"op_type: expected a BinaryOpType"),
    (kernels.UnaryOpType.RELU, r"op_type: expected a BinaryOpType"),
])
def test_bad_attrs(op_type, pattern):
    with pytest.raises(AttrsError, match=pattern) as raised:
        ElementBinaryAttrs(op_type)
    assert str(raised.value).startswith("element_binary: ")  # the message names the op


def test_attrs_accept_member_names():
    assert ElementBinaryAttrs("MAX") == ElementBinaryAttrs(BinaryOpType.MAX)


def _init(lhs, rhs, out, lhs_dtype=np.float32, rhs_dtype=np.float32, out_dtype=np.float32):
    return element_binary.init_kernel(kernels.cpu_handle(), ATTRS, TensorShape(lhs, lhs_dtype),
                                      TensorShape(rhs, rhs_dtype), TensorShape(out, out_dtype))


@pytest.mark.parametrize("shapes, error, pattern", [
    (((2, 3), (4, 3), (2, 3)), ShapeError, r"element_binary: rhs_shape: expected dims that broadcast with lhs_shape \(2, 3\)"),
    (((2, 3, 4), (3,), (2, 3, 4)), ShapeError, r"rhs_shape: expected dims that broadcast"),
    (((2, 1), (1, 3), (2, 1)), ShapeError, r"output_shape: expected dims \(2, 3\)"),
    (((2, 1), (1, 3), (1, 2, 3)), ShapeError, r"output_shape: expected dims \(2, 3\)"),
    (((4,), (2, 3, 4), (3, 4)), ShapeError, r"output_shape: expected dims \(2, 3, 4\)"),
])
def test_init_refuses_shapes(shapes, error, pattern):
    with pytest.raises(error, match=pattern):
        _init(*shapes)


@pytest.mark.parametrize("dtypes, pattern", [
    ((np.float32, np.float64, np.float32), r"element_binary: rhs_shape: expected dtype float32 \(as lhs_shape\)"),
    ((np.float64, np.float64, np.float32), r"output_shape: expected dtype float64"),
    ((np.int32, np.int32, np.int32), r"lhs_shape: expected one of float16, bfloat16, float32, float64, found int32"),
    ((np.float16, BFLOAT16, np.float16), r"rhs_shape: expected dtype float16 \(as lhs_shape\)"),
    ((BFLOAT16, BFLOAT16, np.float32), r"output_shape: expected dtype bfloat16"),
])
def test_init_refuses_dtypes(dtypes, pattern):
    with pytest.raises(DTypeError, match=pattern):
        _init(LHS, RHS, OUT, *dtypes)


def test_backward_skips_none_gradients_and_add_needs_no_values(dev):
    """ADD and SUB read neither lhs nor rhs; a None gradient is neither written nor required."""
    attrs = ElementBinaryAttrs(BinaryOpType.SUB)
    state = _state(dev, attrs)
    grad = dev.array(np.arange(24, dtype=np.float32).reshape(OUT) * 0.25)
    rhs_grad = poisoned(dev, RHS)
    element_binary.backward_kernel(dev.stream, dev.handle, state, attrs, None, grad, None, None, None, rhs_grad)
    dev.stream.synchronize()
    expected = -np.sum(dev.host(grad), axis=(0, 2), keepdims=True)
    assert np.array_equal(dev.host(rhs_grad), expected)
    element_binary.backward_kernel(dev.stream, dev.handle, state, attrs, None, grad, None, None, None, None)
    element_binary.cleanup_kernel(dev.handle, state)


def test_init_writes_nothing_and_accepts_zero_size(dev):
    state = element_binary.init_kernel(dev.handle, ATTRS, TensorShape((2, 0, 3), np.float64),
                                       TensorShape((2, 1, 3), np.float64), TensorShape((2, 0, 3), np.float64))
    lhs, output = dev.array(np.ones((2, 0, 3))), dev.array(np.ones((2, 0, 3)))
    rhs = dev.array(np.ones((2, 1, 3)))
    element_binary.forward_kernel(dev.stream, dev.handle, state, ATTRS, lhs, rhs, output)
    rhs_grad = poisoned(dev, (2, 1, 3), np.float64)
    element_binary.backward_kernel(dev.stream, dev.handle, state, ATTRS, output, output, lhs, None, rhs, rhs_grad)
    dev.stream.synchronize()
    assert np.array_equal(dev.host(rhs_grad), np.zeros((2, 1, 3)))  # an empty sum
