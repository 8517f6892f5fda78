"""pool_2d refuses bad input before writing anything."""

import re

import numpy as np
import pytest

from kernels import (
    Activation,
    AttrsError,
    DeviceError,
    DTypeError,
    Pool2DAttrs,
    PoolOp,
    ShapeError,
    StateError,
    TensorShape,
    cpu_handle,
    pool_2d,
)

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = Pool2DAttrs(3, 3, 2, 2, 1, 1, PoolOp.MAX)
IN, OUT = (2, 3, 7, 6), (2, 3, 4, 3)


def _state(dev, attrs=ATTRS):
    return pool_2d.init_kernel(dev.handle, attrs, TensorShape(IN, np.float32), TensorShape(OUT, np.float32))


def _forward(input_dims=IN, output_dims=OUT, input_dtype=np.float32, output_dtype=np.float32,
             input_transform=None, attrs=ATTRS, other_device=False):
    def build(dev):
        state = _state(dev)
        input = dev.array(np.arange(np.prod(input_dims), dtype=input_dtype).reshape(input_dims))
        if input_transform:
            input = input_transform(input)
        if other_device:
            input = np.asarray(dev.host(input)) if dev.name == "gpu" else input
        output = poisoned(dev, output_dims, output_dtype)
        return (lambda: pool_2d.forward_kernel(dev.stream, dev.handle, state, attrs, input, output)), [output]
    return build


def _backward_without_forward(attrs):
    def build(dev):
        state = _state(dev, attrs)
        grad, input_grad = poisoned(dev, OUT), poisoned(dev, IN)
        return (lambda: pool_2d.backward_kernel(dev.stream, dev.handle, state, attrs, None, grad, None, input_grad)), \
            [input_grad]
    return build


def _backward(output_grad_dims=OUT, input_grad_dims=IN, input_grad_dtype=np.float32):
    def build(dev):
        state = _state(dev)
        input = dev.array(np.arange(np.prod(IN), dtype=np.float32).reshape(IN))
        output = poisoned(dev, OUT)
        pool_2d.forward_kernel(dev.stream, dev.handle, state, ATTRS, input, output)
        grad = poisoned(dev, output_grad_dims)
        input_grad = poisoned(dev, input_grad_dims, input_grad_dtype)
        return (lambda: pool_2d.backward_kernel(dev.stream, dev.handle, state, ATTRS, output, grad, input, input_grad)), \
            [input_grad]
    return build


def _backward_on_cleaned_state(dev):
    state = _state(dev)
    pool_2d.cleanup_kernel(dev.handle, state)
    grad, input_grad = poisoned(dev, OUT), poisoned(dev, IN)
    return (lambda: pool_2d.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, grad, None, input_grad)), [input_grad]


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(2, 3, 3, 3)), ShapeError, r"output: expected dims \(2, 3, 4, 3\)"),
    Row("rank_3_input", _forward(input_dims=(6, 7, 6)), ShapeError, r"input: expected dims \(2, 3, 7, 6\)"),
    Row("dtype_mismatch", _forward(output_dtype=np.float64), DTypeError, r"output: expected dtype float32"),
    Row("half_output_of_float32_input", _forward(output_dtype=np.float16), DTypeError,
        r"output: expected dtype float32, found float16"),
    Row("non_contiguous", _forward(input_dims=(2, 3, 6, 7), input_transform=lambda x: x.transpose(0, 1, 3, 2)),
        ShapeError, r"input: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(attrs=Pool2DAttrs(3, 3, 2, 2, 1, 1, PoolOp.AVG)), AttrsError,
        r"attrs: expected the attrs"),
    Row("output_grad_wrong_shape", _backward(output_grad_dims=(2, 3, 3, 4)), ShapeError,
        r"output_grad: expected dims \(2, 3, 4, 3\)"),
    Row("input_grad_dtype", _backward(input_grad_dtype=np.float64), DTypeError, r"input_grad: expected dtype float32"),
    Row("max_backward_without_forward", _backward_without_forward(ATTRS), StateError,
        r"state: expected a MAX forward before the backward"),
    Row("activation_backward_without_forward",
        _backward_without_forward(Pool2DAttrs(3, 3, 2, 2, 1, 1, PoolOp.AVG, activation=Activation.SILU)), StateError,
        r"state: expected a forward before the backward \(it saves the pre-SILU values\)"),
    Row("cleaned_up_state", _backward_on_cleaned_state, StateError, r"state: expected a live state"),
    Row("other_device", _forward(other_device=True), DeviceError, r"input: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "pool_2d")


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(padding_h=2), r"pool_2d: padding_h: expected at most half of kernel_h \(1\), found 2"),
    (dict(kernel_w=4, padding_w=3), r"pool_2d: padding_w: expected at most half of kernel_w \(2\), found 3"),
    (dict(padding_w=-1), r"pool_2d: padding_w: expected an integer >= 0"),
    (dict(kernel_h=0, padding_h=0), r"pool_2d: kernel_h: expected an integer >= 1, found 0"),
    (dict(kernel_w=0, padding_w=0), r"pool_2d: kernel_w: expected an integer >= 1"),
    (dict(stride_h=0), r"pool_2d: stride_h: expected an integer >= 1, found 0"),
    (dict(stride_w=-2), r"pool_2d: stride_w: expected an integer >= 1"),
    (dict(kernel_h=2.0), r"pool_2d: kernel_h: expected an integer"),
    (dict(pool_type="MIN"), r"pool_2d: pool_type: expected a PoolOp \(MAX, AVG\)"),
    (dict(count_include_pad=1), r"pool_2d: count_include_pad: expected a bool"),
    (dict(activation="SOFTMAX"), r"pool_2d: activation: expected a Activation"),
])
def test_bad_attrs(kwargs, pattern):
    fields = dict(kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, padding_h=1, padding_w=1, pool_type=PoolOp.MAX)
    fields.update(kwargs)
    with pytest.raises(AttrsError, match=pattern) as raised:
        Pool2DAttrs(**fields)
    assert str(raised.value).startswith("pool_2d: ")  # the message names the op


def test_attrs_accept_names():
    attrs = Pool2DAttrs(5, 5, 1, 1, 2, 2, "MAX", activation="SILU")
    assert attrs.pool_type is PoolOp.MAX and attrs.activation is Activation.SILU


def test_init_refuses_bad_shapes():
    handle = cpu_handle()
    with pytest.raises(ShapeError, match=r"pool_2d: input_shape: expected rank 4, found rank 3"):
        pool_2d.init_kernel(handle, ATTRS, TensorShape((3, 7, 6), np.float32), TensorShape((3, 4, 3), np.float32))
    with pytest.raises(ShapeError, match=r"pool_2d: output_shape: expected dims \(2, 3, 4, 3\), found \(2, 3, 4, 4\)"):
        pool_2d.init_kernel(handle, ATTRS, TensorShape(IN, np.float32), TensorShape((2, 3, 4, 4), np.float32))
    with pytest.raises(ShapeError, match=r"pool_2d: output_shape: expected rank 4"):
        pool_2d.init_kernel(handle, ATTRS, TensorShape(IN, np.float32), TensorShape((6, 4, 3), np.float32))
    with pytest.raises(ShapeError, match=r"pool_2d: input_shape: expected H >= 5 \(a window inside the padded input\)"):
        pool_2d.init_kernel(handle, Pool2DAttrs(5, 5, 1, 1, 0, 0, PoolOp.MAX), TensorShape((1, 1, 4, 9), np.float32),
                            TensorShape((1, 1, 0, 5), np.float32))
    with pytest.raises(ShapeError, match=r"pool_2d: input_shape: expected W >= 1 \(a window"):
        pool_2d.init_kernel(handle, ATTRS, TensorShape((1, 1, 4, 0), np.float32), TensorShape((1, 1, 2, 0), np.float32))
    with pytest.raises(DTypeError, match=r"pool_2d: input_shape: expected one of float16, bfloat16, float32, float64, "
                                         r"found int32"):
        pool_2d.init_kernel(handle, ATTRS, TensorShape(IN, np.int32), TensorShape(OUT, np.int32))
    with pytest.raises(DTypeError, match=r"pool_2d: output_shape: expected dtype float32"):
        pool_2d.init_kernel(handle, ATTRS, TensorShape(IN, np.float32), TensorShape(OUT, np.float64))



def test_output_dims_refuse_a_window_outside_the_padded_input():
    """The window check at its boundary, with padding, along H alone and along W alone (a 5-wide window with
    padding 1 needs 3 rows or columns), and any rank but 4, each with its whole message."""
    for attrs, short, fits, axis in ((Pool2DAttrs(5, 1, 1, 1, 1, 0, PoolOp.MAX), (1, 1, 2, 9), (1, 1, 3, 9), "H"),
                                     (Pool2DAttrs(1, 5, 1, 1, 0, 1, PoolOp.MAX), (1, 1, 9, 2), (1, 1, 9, 3), "W")):
        with pytest.raises(ShapeError, match=rf"^pool_2d: input_shape: expected {axis} >= 3 \(a window inside the padded "
                                             rf"input\), found {re.escape(str(short))}$"):
            pool_2d.output_dims(attrs, short)
        assert pool_2d.output_dims(attrs, fits) == ((1, 1, 1, 9) if axis == "H" else (1, 1, 9, 1))
    with pytest.raises(ShapeError, match=r"^pool_2d: input_shape: expected rank 4 \(N, C, H, W\), found rank 3 \(4, 7, 5\)$"):
        pool_2d.output_dims(ATTRS, (4, 7, 5))
