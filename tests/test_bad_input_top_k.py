"""top_k refuses bad input before writing anything."""

import numpy as np
import pytest

import kernels
from kernels import AttrsError, DeviceError, DTypeError, ShapeError, StateError, TensorShape, TopKAttrs, top_k

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = TopKAttrs(3)
DIMS = (2, 7)
OUT = (2, 3)


def _state(dev):
    return top_k.init_kernel(dev.handle, ATTRS, TensorShape(DIMS, np.float32), TensorShape(OUT, np.float32),
                             TensorShape(OUT, np.int64))


def _forward(input_dims=DIMS, values_dims=OUT, indices_dims=OUT, values_dtype=np.float32, indices_dtype=np.int64,
             input_transform=None, attrs=ATTRS, other_device=False):
    def build(dev):
        state = _state(dev)
        input = dev.array(np.arange(np.prod(input_dims), dtype=np.float32).reshape(input_dims))
        if input_transform:
            input = input_transform(input)
        if other_device:
            input = np.asarray(dev.host(input)) if dev.name == "gpu" else input
        values, indices = poisoned(dev, values_dims, values_dtype), poisoned(dev, indices_dims, indices_dtype)
        return (lambda: top_k.forward_kernel(dev.stream, dev.handle, state, attrs, input, values, indices)), \
            [values, indices]
    return build


def _backward(indices_present=True, grad_dims=OUT, input_grad_dtype=np.float32):
    def build(dev):
        state = _state(dev)
        indices = dev.array(np.array([[0, 1, 2], [6, 5, 4]], dtype=np.int64)) if indices_present else None
        grad = dev.array(np.ones(grad_dims, dtype=np.float32))
        input_grad = poisoned(dev, DIMS, input_grad_dtype)
        return (lambda: top_k.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, grad, indices, None,
                                              input_grad)), [input_grad]
    return build


def _forward_on_cleaned_state(dev):
    state = _state(dev)
    top_k.cleanup_kernel(dev.handle, state)
    input, values, indices = dev.array(np.zeros(DIMS, np.float32)), poisoned(dev, OUT), poisoned(dev, OUT, np.int64)
    return (lambda: top_k.forward_kernel(dev.stream, dev.handle, state, ATTRS, input, values, indices)), \
        [values, indices]


ROWS = [
    Row("wrong_values_shape", _forward(values_dims=(2, 4)), ShapeError, r"values: expected dims \(2, 3\)"),
    Row("wrong_indices_shape", _forward(indices_dims=(3, 2)), ShapeError, r"indices: expected dims \(2, 3\)"),
    Row("wrong_input_rank", _forward(input_dims=(14,)), ShapeError, r"input: expected dims \(2, 7\)"),
    Row("values_dtype_mismatch", _forward(values_dtype=np.float64), DTypeError, r"values: expected dtype float32"),
    Row("indices_int32", _forward(indices_dtype=np.int32), DTypeError, r"indices: expected dtype int64"),
    Row("non_contiguous", _forward(input_dims=(7, 2), input_transform=lambda x: x.T), ShapeError,
        r"input: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(attrs=TopKAttrs(2)), AttrsError, r"attrs: expected the attrs"),
    Row("backward_without_indices", _backward(indices_present=False), ShapeError, r"indices: expected an array"),
    Row("backward_wrong_grad_shape", _backward(grad_dims=(2, 4)), ShapeError, r"values_grad: expected dims"),
    Row("backward_grad_dtype_mismatch", _backward(input_grad_dtype=np.float64), DTypeError,
        r"input_grad: expected dtype float32"),
    Row("cleaned_up_state", _forward_on_cleaned_state, StateError, r"state: expected a live state"),
    Row("other_device", _forward(other_device=True), DeviceError, r"input: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "top_k")


@pytest.mark.parametrize("k, pattern", [
    (0, r"top_k: k: expected an integer >= 1, found 0"),
    (-2, r"top_k: k: expected an integer >= 1"),
    (1.0, r"top_k: k: expected an integer"),
    (True, r"top_k: k: expected an integer"),
    (None, r"top_k: k: expected an integer"),
])
def test_bad_attrs(k, pattern):
    with pytest.raises(AttrsError, match=pattern) as raised:
        TopKAttrs(k)
    assert str(raised.value).startswith("top_k: ")  # the message names the op


def test_init_refuses_k_past_the_row():
    with pytest.raises(AttrsError, match=r"top_k: k: expected at most the last dim of input_shape \(7\), found 8"):
        top_k.init_kernel(kernels.cpu_handle(), TopKAttrs(8), TensorShape(DIMS, np.float32),
                          TensorShape((2, 8), np.float32), TensorShape((2, 8), np.int64))


def test_init_refuses_shapes_and_dtypes():
    handle = kernels.cpu_handle()
    f32, i64 = np.float32, np.int64
    with pytest.raises(ShapeError, match=r"top_k: values_shape: expected dims \(2, 3\)"):
        top_k.init_kernel(handle, ATTRS, TensorShape(DIMS, f32), TensorShape((3, 2), f32), TensorShape(OUT, i64))
    with pytest.raises(ShapeError, match=r"top_k: indices_shape: expected dims \(2, 3\)"):
        top_k.init_kernel(handle, ATTRS, TensorShape(DIMS, f32), TensorShape(OUT, f32), TensorShape((2, 7), i64))
    with pytest.raises(DTypeError, match=r"top_k: values_shape: expected dtype float32"):
        top_k.init_kernel(handle, ATTRS, TensorShape(DIMS, f32), TensorShape(OUT, np.float16), TensorShape(OUT, i64))
    with pytest.raises(DTypeError, match=r"top_k: indices_shape: expected one of int64"):
        top_k.init_kernel(handle, ATTRS, TensorShape(DIMS, f32), TensorShape(OUT, f32), TensorShape(OUT, np.int32))
    with pytest.raises(DTypeError, match=r"top_k: input_shape: expected one of float16, bfloat16, float32, float64"):
        top_k.init_kernel(handle, ATTRS, TensorShape(DIMS, np.int32), TensorShape(OUT, np.int32),
                          TensorShape(OUT, i64))
    with pytest.raises(ShapeError, match=r"top_k: input_shape: expected rank >= 1"):
        top_k.init_kernel(handle, ATTRS, TensorShape((), f32), TensorShape((3,), f32), TensorShape((3,), i64))
