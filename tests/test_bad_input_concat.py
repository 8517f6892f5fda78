"""concat refuses bad input before writing anything."""

import numpy as np
import pytest

from kernels import (
    AttrsError,
    ConcatAttrs,
    DeviceError,
    DTypeError,
    ShapeError,
    StateError,
    TensorShape,
    TransposeAttrs,
    concat,
    cpu_handle,
    transpose,
)

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = ConcatAttrs(axis=1, num_inputs=3)
INS, OUT = [(2, 1, 4), (2, 3, 4), (2, 2, 4)], (2, 6, 4)


def _shapes(dims_list, dtype=np.float32):
    return [TensorShape(d, dtype) for d in dims_list]


def _state(dev):
    return concat.init_kernel(dev.handle, ATTRS, _shapes(INS), TensorShape(OUT, np.float32))


def _inputs(dev, dims_list=INS, dtypes=(np.float32,) * 3):
    return [dev.array(np.arange(np.prod(d), dtype=t).reshape(d)) for d, t in zip(dims_list, dtypes)]


def _forward(input_dims=INS, output_dims=OUT, input_dtypes=(np.float32,) * 3, output_dtype=np.float32,
             transform=None, attrs=ATTRS, other_device=False, as_list=True):
    def build(dev):
        state = _state(dev)
        inputs = _inputs(dev, input_dims, input_dtypes)
        if transform:
            inputs[1] = transform(inputs[1])
        if other_device and dev.name == "gpu":
            inputs[2] = np.asarray(dev.host(inputs[2]))
        output = poisoned(dev, output_dims, output_dtype)
        arg = inputs if as_list else inputs[0]
        return (lambda: concat.forward_kernel(dev.stream, dev.handle, state, attrs, arg, output)), [output]
    return build


def _backward(grad_dims=(INS[0], (2, 3, 5), INS[2]), output_grad=True, grads_as_list=True):
    def build(dev):
        state = _state(dev)
        grad = poisoned(dev, OUT) if output_grad else None
        input_grads = [poisoned(dev, d) for d in grad_dims]
        arg = input_grads if grads_as_list else tuple(input_grads[:2])
        return (lambda: concat.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, grad, None, arg)), input_grads
    return build


def _backward_on_cleaned_state(dev):
    state = _state(dev)
    concat.cleanup_kernel(dev.handle, state)
    grad, input_grads = poisoned(dev, OUT), [poisoned(dev, d) for d in INS]
    return (lambda: concat.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, grad, None, input_grads)), input_grads


def _state_of_another_op(dev):
    state = transpose.init_kernel(dev.handle, TransposeAttrs((0, 1)), TensorShape((2, 3), np.float32),
                                  TensorShape((2, 3), np.float32))
    output = poisoned(dev, OUT)
    inputs = _inputs(dev)
    return (lambda: concat.forward_kernel(dev.stream, dev.handle, state, ATTRS, inputs, output)), [output]


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(2, 5, 4)), ShapeError, r"output: expected dims \(2, 6, 4\)"),
    Row("wrong_input_shape", _forward(input_dims=[INS[0], (2, 3, 5), INS[2]]), ShapeError,
        r"inputs\[1\]: expected dims \(2, 3, 4\)"),
    Row("wrong_input_rank", _forward(input_dims=[INS[0], (2, 12), INS[2]]), ShapeError, r"inputs\[1\]: expected dims"),
    Row("too_few_inputs", _forward(input_dims=INS[:2]), ShapeError, r"inputs: expected a list of 3, found a list of 2"),
    Row("inputs_not_a_list", _forward(as_list=False), ShapeError, r"inputs: expected a list of 3"),
    Row("dtype_mismatch", _forward(input_dtypes=(np.float32, np.float32, np.float64)), DTypeError,
        r"inputs\[2\]: expected dtype float32"),
    Row("output_dtype_mismatch", _forward(output_dtype=np.int32), DTypeError, r"output: expected dtype float32"),
    Row("non_contiguous", _forward(input_dims=[INS[0], (2, 4, 3), INS[2]], transform=lambda x: x.transpose(0, 2, 1)),
        ShapeError, r"inputs\[1\]: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(attrs=ConcatAttrs(axis=-2, num_inputs=3)), AttrsError,
        r"attrs: expected the attrs"),
    Row("state_of_another_op", _state_of_another_op, StateError, r"state: expected a state from concat.init_kernel"),
    Row("cleaned_up_state", _backward_on_cleaned_state, StateError, r"state: expected a live state"),
    Row("wrong_input_grad_shape", _backward(), ShapeError, r"input_grads\[1\]: expected dims \(2, 3, 4\)"),
    Row("missing_output_grad", _backward(grad_dims=INS, output_grad=False), ShapeError, r"output_grad: expected an array"),
    Row("too_few_input_grads", _backward(grad_dims=INS, grads_as_list=False), ShapeError,
        r"input_grads: expected a list of 3, found a list of 2"),
    Row("other_device", _forward(other_device=True), DeviceError, r"inputs\[2\]: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "concat")


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(axis=1, num_inputs=1), r"num_inputs: expected an integer >= 2, found 1"),
    (dict(axis=1.0, num_inputs=2), r"axis: expected an integer"),
    (dict(axis=True, num_inputs=2), r"axis: expected an integer"),
    (dict(axis=0, num_inputs="3"), r"num_inputs: expected an integer"),
])
def test_bad_attrs(kwargs, pattern):
    with pytest.raises(AttrsError, match=r"concat: " + pattern) as raised:
        ConcatAttrs(**kwargs)
    assert str(raised.value).startswith("concat: ")  # the message names the op


@pytest.mark.parametrize("attrs, input_shapes, output_shape, error, pattern", [
    (ConcatAttrs(3, 3), _shapes(INS), TensorShape(OUT, np.float32), AttrsError, r"axis: expected an axis in \[-3, 3\), found 3"),
    (ConcatAttrs(-4, 3), _shapes(INS), TensorShape(OUT, np.float32), AttrsError, r"axis: expected an axis in \[-3, 3\)"),
    (ATTRS, _shapes(INS[:2]), TensorShape(OUT, np.float32), ShapeError, r"input_shapes: expected a list of 3"),
    (ATTRS, TensorShape(INS[0], np.float32), TensorShape(OUT, np.float32), ShapeError, r"input_shapes: expected a list"),
    (ATTRS, _shapes([INS[0], (3, 3, 4), INS[2]]), TensorShape(OUT, np.float32), ShapeError,
     r"input_shapes\[1\]: expected dims \(2, 'any', 4\)"),
    (ATTRS, _shapes([INS[0], (2, 3), INS[2]]), TensorShape(OUT, np.float32), ShapeError, r"input_shapes\[1\]: expected dims"),
    (ATTRS, _shapes(INS), TensorShape((2, 7, 4), np.float32), ShapeError, r"output_shape: expected dims \(2, 6, 4\)"),
    (ATTRS, _shapes(INS[:2]) + [TensorShape(INS[2], np.int32)], TensorShape(OUT, np.float32), DTypeError,
     r"input_shapes\[2\]: expected dtype float32"),
    (ATTRS, _shapes(INS), TensorShape(OUT, np.float64), DTypeError, r"output_shape: expected dtype float32"),
    (ATTRS, _shapes(INS, "datetime64[s]"), TensorShape(OUT, "datetime64[s]"), DTypeError, r"input_shapes\[0\]: expected one of"),
    (ConcatAttrs(0, 3), _shapes([(), (), ()]), TensorShape((), np.float32), ShapeError, r"input_shapes\[0\]: expected rank >= 1"),
    (TransposeAttrs((0, 1)), _shapes(INS), TensorShape(OUT, np.float32), AttrsError, r"attrs: expected ConcatAttrs"),
])
def test_init_refuses(attrs, input_shapes, output_shape, error, pattern):
    with pytest.raises(error, match=r"concat: " + pattern):
        concat.init_kernel(cpu_handle(), attrs, input_shapes, output_shape)
