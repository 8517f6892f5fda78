"""gradient_reduction refuses bad input before writing anything."""

import numpy as np
import pytest

from kernels import (
    AttrsError,
    ConcatAttrs,
    DeviceError,
    DTypeError,
    GradientReductionAttrs,
    ShapeError,
    StateError,
    TensorShape,
    cpu_handle,
    gradient_reduction,
)
from kernels.runtime.core import BFLOAT16

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = GradientReductionAttrs()
DIMS, COUNT = (2, 3, 4), 3


def _shapes(count=COUNT, dims=DIMS, dtype=np.float32):
    return [TensorShape(dims, dtype) for _ in range(count)]


def _state(dev):
    return gradient_reduction.init_kernel(dev.handle, ATTRS, _shapes(), TensorShape(DIMS, np.float32))


def _forward(input_dims=(DIMS,) * COUNT, output_dims=DIMS, input_dtypes=(np.float32,) * COUNT, output_dtype=np.float32,
             transform=None, attrs=ATTRS, other_device=False, as_list=True):
    def build(dev):
        state = _state(dev)
        inputs = [dev.array(np.arange(np.prod(d), dtype=t).reshape(d)) for d, t in zip(input_dims, input_dtypes)]
        if transform:
            inputs[0] = transform(inputs[0])
        if other_device and dev.name == "gpu":
            inputs[1] = np.asarray(dev.host(inputs[1]))
        output = poisoned(dev, output_dims, output_dtype)
        arg = inputs if as_list else inputs[0]
        return (lambda: gradient_reduction.forward_kernel(dev.stream, dev.handle, state, attrs, arg, output)), [output]
    return build


def _backward(grad_dims=(DIMS, DIMS, (2, 3, 5)), output_grad_dims=DIMS, count=COUNT):
    def build(dev):
        state = _state(dev)
        output_grad = poisoned(dev, output_grad_dims)
        input_grads = [poisoned(dev, d) for d in grad_dims[:count]]
        return (lambda: gradient_reduction.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, output_grad, None,
                                                           input_grads)), input_grads
    return build


def _backward_on_cleaned_state(dev):
    state = _state(dev)
    gradient_reduction.cleanup_kernel(dev.handle, state)
    grad, input_grads = poisoned(dev, DIMS), [poisoned(dev, DIMS) for _ in range(COUNT)]
    return (lambda: gradient_reduction.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, grad, None,
                                                       input_grads)), input_grads


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(2, 4, 3)), ShapeError, r"output: expected dims \(2, 3, 4\)"),
    Row("wrong_input_shape", _forward(input_dims=(DIMS, (2, 3, 5), DIMS)), ShapeError, r"inputs\[1\]: expected dims \(2, 3, 4\)"),
    Row("wrong_input_rank", _forward(input_dims=(DIMS, DIMS, (6, 4))), ShapeError, r"inputs\[2\]: expected dims \(2, 3, 4\)"),
    Row("too_few_inputs", _forward(input_dims=(DIMS, DIMS)), ShapeError, r"inputs: expected a list of 3, found a list of 2"),
    Row("inputs_not_a_list", _forward(as_list=False), ShapeError, r"inputs: expected a list of 3"),
    Row("dtype_mismatch", _forward(input_dtypes=(np.float32, np.float64, np.float32)), DTypeError,
        r"inputs\[1\]: expected dtype float32"),
    Row("output_dtype_mismatch", _forward(output_dtype=np.int32), DTypeError, r"output: expected dtype float32"),
    Row("non_contiguous", _forward(input_dims=((2, 4, 3), DIMS, DIMS), transform=lambda x: x.transpose(0, 2, 1)),
        ShapeError, r"inputs\[0\]: expected a C-contiguous"),
    Row("attrs_of_another_op", _forward(attrs=ConcatAttrs(0, 3)), AttrsError, r"attrs: expected the attrs"),
    Row("cleaned_up_state", _backward_on_cleaned_state, StateError, r"state: expected a live state"),
    Row("wrong_input_grad_shape", _backward(), ShapeError, r"input_grads\[2\]: expected dims \(2, 3, 4\)"),
    Row("wrong_output_grad_shape", _backward(grad_dims=(DIMS,) * 3, output_grad_dims=(2, 3, 3)), ShapeError,
        r"output_grad: expected dims \(2, 3, 4\)"),
    Row("too_few_input_grads", _backward(grad_dims=(DIMS,) * 3, count=2), ShapeError,
        r"input_grads: expected a list of 3, found a list of 2"),
    Row("other_device", _forward(other_device=True), DeviceError, r"inputs\[1\]: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "gradient_reduction")


def test_attrs_take_no_fields():
    assert GradientReductionAttrs() == GradientReductionAttrs()
    with pytest.raises(TypeError):
        GradientReductionAttrs(3)


@pytest.mark.parametrize("attrs, input_shapes, output_shape, error, pattern", [
    (ATTRS, [], TensorShape(DIMS, np.float32), ShapeError, r"input_shapes: expected a non-empty list"),
    (ATTRS, TensorShape(DIMS, np.float32), TensorShape(DIMS, np.float32), ShapeError, r"input_shapes: expected a list"),
    (ATTRS, _shapes(2) + [TensorShape((2, 3, 5), np.float32)], TensorShape(DIMS, np.float32), ShapeError,
     r"input_shapes\[2\]: expected dims \(2, 3, 4\)"),
    (ATTRS, _shapes(2) + [TensorShape(DIMS, np.float64)], TensorShape(DIMS, np.float32), DTypeError,
     r"input_shapes\[2\]: expected dtype float32"),
    (ATTRS, _shapes(), TensorShape((2, 3), np.float32), ShapeError, r"output_shape: expected dims \(2, 3, 4\)"),
    (ATTRS, _shapes(), TensorShape(DIMS, np.int32), DTypeError, r"output_shape: expected dtype float32"),
    (ATTRS, _shapes(dtype=np.bool_), TensorShape(DIMS, np.bool_), DTypeError,
     r"input_shapes\[0\]: expected one of float16, bfloat16, float32"),
    (ATTRS, _shapes(dtype=np.complex64), TensorShape(DIMS, np.complex64), DTypeError, r"input_shapes\[0\]: expected one of"),
    (ATTRS, _shapes(2, dtype=np.float16) + [TensorShape(DIMS, BFLOAT16)], TensorShape(DIMS, np.float16), DTypeError,
     r"input_shapes\[2\]: expected dtype float16"),
    (ConcatAttrs(0, 3), _shapes(), TensorShape(DIMS, np.float32), AttrsError, r"attrs: expected GradientReductionAttrs"),
])
def test_init_refuses(attrs, input_shapes, output_shape, error, pattern):
    with pytest.raises(error, match=r"gradient_reduction: " + pattern):
        gradient_reduction.init_kernel(cpu_handle(), attrs, input_shapes, output_shape)
