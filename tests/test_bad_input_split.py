"""split refuses bad input before writing anything."""

import numpy as np
import pytest

from kernels import (
    AttrsError,
    ConcatAttrs,
    DeviceError,
    DTypeError,
    ShapeError,
    SplitAttrs,
    StateError,
    TensorShape,
    cpu_handle,
    split,
)

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = SplitAttrs(splits=(1, 3, 2), axis=-1)
IN, OUTS = (2, 3, 6), [(2, 3, 1), (2, 3, 3), (2, 3, 2)]


def _shapes(dims_list, dtype=np.float32):
    return [TensorShape(d, dtype) for d in dims_list]


def _state(dev):
    return split.init_kernel(dev.handle, ATTRS, TensorShape(IN, np.float32), _shapes(OUTS))


def _forward(input_dims=IN, output_dims=OUTS, input_dtype=np.float32, output_dtypes=(np.float32,) * 3,
             transform=None, attrs=ATTRS, other_device=False, as_list=True):
    def build(dev):
        state = _state(dev)
        input = dev.array(np.arange(np.prod(input_dims), dtype=input_dtype).reshape(input_dims))
        if transform:
            input = transform(input)
        if other_device and dev.name == "gpu":
            input = np.asarray(dev.host(input))
        outputs = [poisoned(dev, d, t) for d, t in zip(output_dims, output_dtypes)]
        arg = outputs if as_list else outputs[0]
        return (lambda: split.forward_kernel(dev.stream, dev.handle, state, attrs, input, arg)), outputs
    return build


def _backward(grad_dims=OUTS, input_grad_dims=IN, grads=True, none_grad=None):
    def build(dev):
        state = _state(dev)
        output_grads = [poisoned(dev, d) for d in grad_dims] if grads else poisoned(dev, grad_dims[0])
        if none_grad is not None:
            output_grads[none_grad] = None
        input_grad = poisoned(dev, input_grad_dims)
        return (lambda: split.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, output_grads, None, input_grad)), \
            [input_grad]
    return build


def _backward_on_cleaned_state(dev):
    state = _state(dev)
    split.cleanup_kernel(dev.handle, state)
    grads, input_grad = [poisoned(dev, d) for d in OUTS], poisoned(dev, IN)
    return (lambda: split.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, grads, None, input_grad)), [input_grad]


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=[OUTS[0], (2, 3, 2), OUTS[2]]), ShapeError,
        r"outputs\[1\]: expected dims \(2, 3, 3\)"),
    Row("wrong_input_shape", _forward(input_dims=(2, 3, 7)), ShapeError, r"input: expected dims \(2, 3, 6\)"),
    Row("wrong_input_rank", _forward(input_dims=(6, 6)), ShapeError, r"input: expected dims \(2, 3, 6\)"),
    Row("too_few_outputs", _forward(output_dims=OUTS[:2]), ShapeError, r"outputs: expected a list of 3, found a list of 2"),
    Row("outputs_not_a_list", _forward(as_list=False), ShapeError, r"outputs: expected a list of 3"),
    Row("dtype_mismatch", _forward(output_dtypes=(np.float32, np.int32, np.float32)), DTypeError,
        r"outputs\[1\]: expected dtype float32"),
    Row("input_dtype_mismatch", _forward(input_dtype=np.float64), DTypeError, r"input: expected dtype float32"),
    Row("non_contiguous", _forward(input_dims=(6, 3, 2), transform=lambda x: x.transpose(2, 1, 0)), ShapeError,
        r"input: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(attrs=SplitAttrs(splits=(1, 3, 2), axis=2)), AttrsError,
        r"attrs: expected the attrs"),
    Row("cleaned_up_state", _backward_on_cleaned_state, StateError, r"state: expected a live state"),
    Row("wrong_output_grad_shape", _backward(grad_dims=[OUTS[0], OUTS[1], (2, 3, 3)]), ShapeError,
        r"output_grads\[2\]: expected dims \(2, 3, 2\)"),
    Row("missing_output_grad", _backward(none_grad=0), ShapeError, r"output_grads\[0\]: expected an array"),
    Row("output_grads_not_a_list", _backward(grads=False), ShapeError, r"output_grads: expected a list of 3"),
    Row("wrong_input_grad_shape", _backward(input_grad_dims=(2, 3, 5)), ShapeError, r"input_grad: expected dims \(2, 3, 6\)"),
    Row("other_device", _forward(other_device=True), DeviceError, r"input: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "split")


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(splits=(), axis=0), r"splits: expected at least one size"),
    (dict(splits=(2, -1), axis=0), r"splits\[1\]: expected an integer >= 0, found -1"),
    (dict(splits=(2, 1.5), axis=0), r"splits\[1\]: expected an integer"),
    (dict(splits=3, axis=0), r"splits: expected a sequence of integers"),
    (dict(splits=(1, 2), axis=None), r"axis: expected an integer"),
])
def test_bad_attrs(kwargs, pattern):
    with pytest.raises(AttrsError, match=r"split: " + pattern) as raised:
        SplitAttrs(**kwargs)
    assert str(raised.value).startswith("split: ")  # the message names the op


@pytest.mark.parametrize("attrs, input_shape, output_shapes, error, pattern", [
    (SplitAttrs((1, 3, 3), 2), TensorShape(IN, np.float32), _shapes(OUTS), AttrsError,
     r"splits: expected sizes adding up to the input's dim 2 \(6\), found \(1, 3, 3\) \(sum 7\)"),
    (SplitAttrs((1, 3, 2), 3), TensorShape(IN, np.float32), _shapes(OUTS), AttrsError, r"axis: expected an axis in \[-3, 3\)"),
    (ATTRS, TensorShape(IN, np.float32), _shapes(OUTS[:2]), ShapeError, r"output_shapes: expected a list of 3"),
    (ATTRS, TensorShape(IN, np.float32), TensorShape(OUTS[0], np.float32), ShapeError, r"output_shapes: expected a list"),
    (ATTRS, TensorShape(IN, np.float32), _shapes([OUTS[0], (2, 2, 3), OUTS[2]]), ShapeError,
     r"output_shapes\[1\]: expected dims \(2, 3, 3\)"),
    (ATTRS, TensorShape(IN, np.float32), _shapes(OUTS[:2]) + [TensorShape(OUTS[2], np.float64)], DTypeError,
     r"output_shapes\[2\]: expected dtype float32"),
    (ATTRS, TensorShape(IN, np.str_), _shapes(OUTS, np.str_), DTypeError, r"input_shape: expected one of"),
    (SplitAttrs((1,), 0), TensorShape((), np.float32), _shapes([()]), ShapeError, r"input_shape: expected rank >= 1"),
    (ConcatAttrs(1, 3), TensorShape(IN, np.float32), _shapes(OUTS), AttrsError, r"attrs: expected SplitAttrs"),
])
def test_init_refuses(attrs, input_shape, output_shapes, error, pattern):
    with pytest.raises(error, match=r"split: " + pattern):
        split.init_kernel(cpu_handle(), attrs, input_shape, output_shapes)
