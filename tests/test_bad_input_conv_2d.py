"""conv_2d refuses bad input before writing anything."""

import re

import numpy as np
import pytest

from kernels import (
    Activation,
    AttrsError,
    Conv2DAttrs,
    DeviceError,
    DTypeError,
    ShapeError,
    StateError,
    TensorShape,
    conv_2d,
    cpu_handle,
)
from kernels.runtime.core import BFLOAT16

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

# groups 2, C = 4, O = 6: filters (6, 2, 3, 2); stride (2, 1), padding (1, 0).
ATTRS = Conv2DAttrs(6, 3, 2, stride_h=2, stride_w=1, padding_h=1, padding_w=0, groups=2)
BIAS_ATTRS = Conv2DAttrs(6, 3, 2, stride_h=2, stride_w=1, padding_h=1, padding_w=0, groups=2, use_bias=True)
IN, OUT, FILTER, BIAS = (2, 4, 7, 5), (2, 6, 4, 4), (6, 2, 3, 2), (6,)


def _state(dev, attrs=ATTRS, dtype=np.float32):
    return conv_2d.init_kernel(dev.handle, attrs, TensorShape(IN, dtype), TensorShape(OUT, dtype))


def _values(dev, dims, dtype=np.float32):
    return dev.array((np.arange(np.prod(dims)) % 5).astype(dtype).reshape(dims))


def _forward(attrs=ATTRS, state_attrs=None, input_dims=IN, filter_dims=FILTER, output_dims=OUT, bias_dims=None,
             filter_dtype=np.float32, output_dtype=np.float32, input_transform=None, other_device=None):
    def build(dev):
        state = _state(dev, state_attrs or attrs)
        input = _values(dev, input_dims)
        if input_transform:
            input = input_transform(input)
        filter = _values(dev, filter_dims, filter_dtype)
        bias = None if bias_dims is None else _values(dev, bias_dims)
        if other_device == "filter" and dev.name == "gpu":
            filter = dev.host(filter)
        output = poisoned(dev, output_dims, output_dtype)
        return (lambda: conv_2d.forward_kernel(dev.stream, dev.handle, state, attrs, input, filter, bias, output)), \
            [output]
    return build


def _backward(attrs=ATTRS, input_grad_dims=IN, filter_grad_dims=FILTER, bias_grad=False, with_input=True,
              with_filter=True, forward_first=True):
    def build(dev):
        state = _state(dev, attrs)
        input, filter = _values(dev, IN), _values(dev, FILTER)
        bias = _values(dev, BIAS) if attrs.use_bias else None
        output = poisoned(dev, OUT)
        if forward_first:
            conv_2d.forward_kernel(dev.stream, dev.handle, state, attrs, input, filter, bias, output)
        grad = _values(dev, OUT)
        input_grad = poisoned(dev, input_grad_dims)
        filter_grad = poisoned(dev, filter_grad_dims)
        bias_grad_array = poisoned(dev, BIAS) if bias_grad else None
        return (lambda: conv_2d.backward_kernel(dev.stream, dev.handle, state, attrs, output, grad,
                                                input if with_input else None, input_grad,
                                                filter if with_filter else None, filter_grad, bias_grad_array)), \
            [input_grad, filter_grad, bias_grad_array]
    return build


def _backward_on_cleaned_state(dev):
    state = _state(dev)
    conv_2d.cleanup_kernel(dev.handle, state)
    grad, input_grad = _values(dev, OUT), poisoned(dev, IN)
    filter = _values(dev, FILTER)
    return (lambda: conv_2d.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, grad, None, input_grad,
                                            filter, None, None)), [input_grad]


SILU = Conv2DAttrs(6, 3, 2, stride_h=2, stride_w=1, padding_h=1, padding_w=0, groups=2, activation=Activation.SILU)

ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(2, 6, 3, 4)), ShapeError, r"output: expected dims \(2, 6, 4, 4\)"),
    Row("rank_3_input", _forward(input_dims=(8, 7, 5)), ShapeError, r"input: expected dims \(2, 4, 7, 5\)"),
    Row("filter_wrong_channel_count", _forward(filter_dims=(6, 4, 3, 2)), ShapeError,
        r"filter: expected dims \(6, 2, 3, 2\)"),
    Row("filter_wrong_kernel", _forward(filter_dims=(6, 2, 2, 3)), ShapeError, r"filter: expected dims \(6, 2, 3, 2\)"),
    Row("bias_given_without_use_bias", _forward(bias_dims=BIAS), ShapeError, r"bias: expected None \(use_bias is False\)"),
    Row("bias_missing_with_use_bias", _forward(attrs=BIAS_ATTRS), ShapeError, r"bias: expected an array"),
    Row("bias_wrong_length", _forward(attrs=BIAS_ATTRS, bias_dims=(4,)), ShapeError, r"bias: expected dims \(6,\)"),
    Row("filter_dtype_mismatch", _forward(filter_dtype=np.float64), DTypeError, r"filter: expected dtype float32"),
    Row("output_dtype_mismatch", _forward(output_dtype=np.float64), DTypeError, r"output: expected dtype float32"),
    Row("non_contiguous_input", _forward(input_dims=(2, 4, 5, 7), input_transform=lambda x: x.transpose(0, 1, 3, 2)),
        ShapeError, r"input: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(attrs=BIAS_ATTRS, state_attrs=ATTRS, bias_dims=BIAS), AttrsError,
        r"attrs: expected the attrs"),
    Row("input_grad_wrong_shape", _backward(input_grad_dims=(2, 4, 7, 4)), ShapeError,
        r"input_grad: expected dims \(2, 4, 7, 5\)"),
    Row("filter_grad_wrong_shape", _backward(filter_grad_dims=(6, 4, 3, 2)), ShapeError,
        r"filter_grad: expected dims \(6, 2, 3, 2\)"),
    Row("bias_grad_without_use_bias", _backward(bias_grad=True), ShapeError,
        r"bias_grad: expected None \(use_bias is False\)"),
    Row("input_grad_needs_filter", _backward(with_filter=False), ShapeError, r"filter: expected an array"),
    Row("filter_grad_needs_input", _backward(with_input=False), ShapeError, r"input: expected an array"),
    Row("activation_backward_without_forward", _backward(attrs=SILU, forward_first=False), StateError,
        r"state: expected a forward before the backward"),
    Row("cleaned_up_state", _backward_on_cleaned_state, StateError, r"state: expected a live state"),
    Row("other_device", _forward(other_device="filter"), DeviceError, r"filter: expected a CuPy array",
        devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    try:
        check_row(row, dev, "conv_2d")
    finally:
        dev.handle.close()


@pytest.mark.parametrize("fields, pattern", [
    (dict(kernel_h=0), r"kernel_h: expected an integer >= 1"),
    (dict(kernel_w=-1), r"kernel_w: expected an integer >= 1"),
    (dict(stride_h=0), r"stride_h: expected an integer >= 1"),
    (dict(dilation_w=0), r"dilation_w: expected an integer >= 1"),
    (dict(padding_h=-1), r"padding_h: expected an integer >= 0"),
    (dict(groups=0), r"groups: expected an integer >= 1"),
    (dict(groups=4), r"groups: expected a divisor of out_channels \(6\)"),
    (dict(out_channels=0), r"out_channels: expected an integer >= 1"),
    (dict(kernel_h=1.5), r"kernel_h: expected an integer"),
    (dict(use_bias=1), r"use_bias: expected a bool"),
    (dict(backward="no"), r"backward: expected a bool"),
    (dict(activation="SWISH"), r"activation: expected a Activation"),
])
def test_bad_attrs(fields, pattern):
    values = dict(out_channels=6, kernel_h=3, kernel_w=3)
    values.update(fields)
    with pytest.raises(AttrsError, match=r"conv_2d: " + pattern) as raised:
        Conv2DAttrs(**values)
    assert str(raised.value).startswith("conv_2d: ")  # the message names the op


def test_init_refuses_shapes():
    handle = cpu_handle()
    f32 = np.float32
    with pytest.raises(ShapeError, match=r"conv_2d: input_shape: expected channels divisible by groups \(2\)"):
        conv_2d.init_kernel(handle, ATTRS, TensorShape((2, 5, 7, 5), f32), TensorShape(OUT, f32))
    with pytest.raises(ShapeError, match=r"conv_2d: input_shape: expected rank 4"):
        conv_2d.init_kernel(handle, ATTRS, TensorShape((4, 7, 5), f32), TensorShape(OUT, f32))
    with pytest.raises(ShapeError, match=r"conv_2d: output_shape: expected dims \(2, 6, 4, 4\)"):
        conv_2d.init_kernel(handle, ATTRS, TensorShape(IN, f32), TensorShape((2, 6, 7, 4), f32))
    with pytest.raises(ShapeError, match=r"conv_2d: input_shape: expected H \+ 2 \* padding >= the dilated kernel \(5\)"):
        dilated = Conv2DAttrs(1, 3, 1, dilation_h=2)
        conv_2d.init_kernel(handle, dilated, TensorShape((1, 1, 4, 3), f32), TensorShape((1, 1, 0, 3), f32))
    with pytest.raises(DTypeError, match=r"conv_2d: output_shape: expected dtype float32"):
        conv_2d.init_kernel(handle, ATTRS, TensorShape(IN, f32), TensorShape(OUT, np.float64))
    with pytest.raises(DTypeError, match=r"conv_2d: input_shape: expected one of float16, bfloat16, float32, float64, "
                                         r"found int32"):
        conv_2d.init_kernel(handle, ATTRS, TensorShape(IN, np.int32), TensorShape(OUT, np.int32))
    with pytest.raises(DTypeError, match=r"conv_2d: output_shape: expected dtype float16 \(as input_shape\), "
                                         r"found bfloat16"):
        conv_2d.init_kernel(handle, ATTRS, TensorShape(IN, np.float16), TensorShape(OUT, BFLOAT16))
    for half in (np.float16, BFLOAT16):  # the half dtypes are taken, the bias and filter in the same dtype
        state = conv_2d.init_kernel(handle, ATTRS, TensorShape(IN, half), TensorShape(OUT, half))
        assert state.shapes["filter_shape"].dtype == state.shapes["bias_shape"].dtype == np.dtype(half)
        assert state.tf32 is False
    with pytest.raises(ShapeError, match=r"conv_2d: input_shape: expected rank 4 \(N, C, H, W\), found rank 3"):
        conv_2d.output_dims(ATTRS, (4, 7, 5))


def test_output_dims_refuse_an_input_too_small_by_one_along_one_axis():
    """The extent check at its boundary, with padding, along H alone and along W alone: a padded size one short
    of the dilated kernel is refused, naming the axis; one more row or column is taken (a 1-long output axis)."""
    along_h = Conv2DAttrs(1, 3, 1, padding_h=1, dilation_h=2)  # extent 5 along H: H + 2 >= 5
    along_w = Conv2DAttrs(1, 1, 3, padding_w=1, dilation_w=2)
    for attrs, short, fits, axis in ((along_h, (1, 1, 2, 9), (1, 1, 3, 9), "H"), (along_w, (1, 1, 9, 2), (1, 1, 9, 3), "W")):
        with pytest.raises(ShapeError, match=rf"^conv_2d: input_shape: expected {axis} \+ 2 \* padding >= the dilated "
                                             rf"kernel \(5\), so that the output is not empty, found {re.escape(str(short))}$"):
            conv_2d.output_dims(attrs, short)
        assert conv_2d.output_dims(attrs, fits) == ((1, 1, 1, 9) if axis == "H" else (1, 1, 9, 1))
