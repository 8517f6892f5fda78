"""batch_matmul refuses bad input before writing anything."""

import numpy as np
import pytest

import kernels
from kernels import BatchMatmulAttrs, DeviceError, DTypeError, ShapeError, StateError, TensorShape, batch_matmul
from kernels.runtime.core import BFLOAT16

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = BatchMatmulAttrs()
LHS, RHS, OUT = (2, 3, 4), (2, 4, 5), (2, 3, 5)


def _state(dev, dtype=np.float32):
    return batch_matmul.init_kernel(dev.handle, ATTRS, TensorShape(LHS, dtype), TensorShape(RHS, dtype),
                                    TensorShape(OUT, dtype))


def _forward(lhs_dims=LHS, rhs_dims=RHS, output_dims=OUT, rhs_dtype=np.float32, rhs_transform=None,
             other_device=False):
    def build(dev):
        state = _state(dev)
        lhs = dev.array(np.ones(lhs_dims, dtype=np.float32))
        rhs = dev.array(np.ones(rhs_dims, dtype=rhs_dtype))
        if rhs_transform:
            rhs = rhs_transform(rhs)
        if other_device:
            rhs = np.asarray(dev.host(rhs)) if dev.name == "gpu" else rhs
        output = poisoned(dev, output_dims)
        return (lambda: batch_matmul.forward_kernel(dev.stream, dev.handle, state, ATTRS, lhs, rhs, output)), [output]
    return build


def _backward(rhs_present=True, lhs_present=True, grad_dims=OUT):
    def build(dev):
        state = _state(dev)
        lhs = dev.array(np.ones(LHS, dtype=np.float32)) if lhs_present else None
        rhs = dev.array(np.ones(RHS, dtype=np.float32)) if rhs_present else None
        grad = dev.array(np.ones(grad_dims, dtype=np.float32))
        lhs_grad, rhs_grad = poisoned(dev, LHS), poisoned(dev, RHS)
        return (lambda: batch_matmul.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, grad,
                                                     lhs, lhs_grad, rhs, rhs_grad)), [lhs_grad, rhs_grad]
    return build


def _forward_on_cleaned_state(dev):
    state = _state(dev)
    batch_matmul.cleanup_kernel(dev.handle, state)
    lhs, rhs, output = poisoned(dev, LHS), poisoned(dev, RHS), poisoned(dev, OUT)
    return (lambda: batch_matmul.forward_kernel(dev.stream, dev.handle, state, ATTRS, lhs, rhs, output)), [output]


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(2, 5, 3)), ShapeError, r"output: expected dims \(2, 3, 5\)"),
    Row("inner_dims_differ", _forward(rhs_dims=(2, 3, 5)), ShapeError, r"rhs: expected dims \(2, 4, 5\)"),
    Row("leading_dims_differ", _forward(rhs_dims=(1, 4, 5)), ShapeError, r"rhs: expected dims \(2, 4, 5\)"),
    Row("dtype_mismatch", _forward(rhs_dtype=np.float64), DTypeError, r"rhs: expected dtype float32"),
    Row("non_contiguous", _forward(rhs_dims=(2, 5, 4), rhs_transform=lambda x: x.transpose(0, 2, 1)),
        ShapeError, r"rhs: expected a C-contiguous"),
    Row("backward_lhs_grad_without_rhs", _backward(rhs_present=False), ShapeError, r"rhs: expected an array"),
    Row("backward_rhs_grad_without_lhs", _backward(lhs_present=False), ShapeError, r"lhs: expected an array"),
    Row("backward_wrong_grad_shape", _backward(grad_dims=(2, 3, 4)), ShapeError, r"output_grad: expected dims"),
    Row("cleaned_up_state", _forward_on_cleaned_state, StateError, r"state: expected a live state"),
    Row("other_device", _forward(other_device=True), DeviceError, r"rhs: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "batch_matmul")


def _init(lhs, rhs, out, lhs_dtype=np.float32, rhs_dtype=np.float32, out_dtype=np.float32):
    return batch_matmul.init_kernel(kernels.cpu_handle(), ATTRS, TensorShape(lhs, lhs_dtype),
                                    TensorShape(rhs, rhs_dtype), TensorShape(out, out_dtype))


@pytest.mark.parametrize("lhs, rhs, out, error, pattern", [
    ((2, 3, 4), (2, 3, 5), (2, 3, 5), ShapeError, r"rhs_shape: expected dim -2 equal to lhs_shape's inner dim K = 4"),
    ((2, 3, 4), (3, 4, 5), (2, 3, 5), ShapeError, r"rhs_shape: expected leading dims \(2,\)"),
    ((2, 2, 3, 4), (2, 3, 4, 5), (2, 2, 3, 5), ShapeError, r"rhs_shape: expected leading dims \(2, 2\)"),
    ((2, 3, 4), (1, 2, 4, 5), (2, 3, 5), ShapeError, r"rhs_shape: expected leading dims \(2,\)"),
    ((3, 4), (4, 5), (3, 5), ShapeError, r"lhs_shape: expected rank >= 3"),
    ((2, 3, 4), (4, 5), (2, 3, 5), ShapeError, r"rhs_shape: expected rank >= 3"),
    ((2, 3, 4), (2, 4, 5), (2, 5, 3), ShapeError, r"output_shape: expected dims \(2, 3, 5\)"),
])
def test_init_refuses_shapes(lhs, rhs, out, error, pattern):
    with pytest.raises(error, match="batch_matmul: " + pattern):
        _init(lhs, rhs, out)


def test_init_refuses_dtypes():
    with pytest.raises(DTypeError, match=r"batch_matmul: rhs_shape: expected dtype float32 \(as lhs_shape\)"):
        _init(LHS, RHS, OUT, rhs_dtype=np.float64)
    with pytest.raises(DTypeError, match=r"batch_matmul: output_shape: expected dtype float64"):
        _init(LHS, RHS, OUT, lhs_dtype=np.float64, rhs_dtype=np.float64)
    with pytest.raises(DTypeError, match=r"batch_matmul: lhs_shape: expected one of float16, bfloat16, float32, "
                                         r"float64, found int32"):
        _init(LHS, RHS, OUT, lhs_dtype=np.int32, rhs_dtype=np.int32, out_dtype=np.int32)
    with pytest.raises(DTypeError, match=r"batch_matmul: rhs_shape: expected dtype float16 \(as lhs_shape\), "
                                         r"found bfloat16"):
        _init(LHS, RHS, OUT, lhs_dtype=np.float16, rhs_dtype=BFLOAT16, out_dtype=np.float16)
    with pytest.raises(DTypeError, match=r"batch_matmul: output_shape: expected dtype bfloat16 \(as lhs_shape\), "
                                         r"found float32"):
        _init(LHS, RHS, OUT, lhs_dtype=BFLOAT16, rhs_dtype=BFLOAT16)


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16])
def test_init_takes_half_dtypes(dtype):
    state = _init(LHS, RHS, OUT, lhs_dtype=dtype, rhs_dtype=dtype, out_dtype=dtype)
    assert state.shapes["output_shape"].dtype == np.dtype(dtype)
    assert state.saved["tf32"] is False  # a CPU handle never asks for TF32


def test_attrs_take_no_fields():
    with pytest.raises(TypeError):
        BatchMatmulAttrs(1)
