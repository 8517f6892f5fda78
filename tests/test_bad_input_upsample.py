"""upsample refuses bad input before writing anything."""

import numpy as np
import pytest

import kernels
from kernels import (
    AttrsError,
    DeviceError,
    DTypeError,
    ShapeError,
    StateError,
    TensorShape,
    UpsampleAttrs,
    UpsampleMode,
    upsample,
)
from kernels.runtime.core import BFLOAT16

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = UpsampleAttrs(2)
IN, OUT = (2, 3, 4, 5), (2, 3, 8, 10)


def _forward(input_dims=IN, output_dims=OUT, input_dtype=np.float32, output_dtype=np.float32,
             input_transform=None, attrs=ATTRS, other_device=False):
    def build(dev):
        state = upsample.init_kernel(dev.handle, ATTRS, TensorShape(IN, np.float32), TensorShape(OUT, np.float32))
        input = dev.array(np.arange(np.prod(input_dims), dtype=input_dtype).reshape(input_dims))
        if input_transform:
            input = input_transform(input)
        if other_device:
            input = np.asarray(dev.host(input)) if dev.name == "gpu" else input
        output = poisoned(dev, output_dims, output_dtype)
        return (lambda: upsample.forward_kernel(dev.stream, dev.handle, state, attrs, input, output)), [output]
    return build


def _backward(output_grad_dims=OUT, input_grad_dims=IN, dtype=np.float32, input_grad_dtype=None, cleaned=False):
    def build(dev):
        state = upsample.init_kernel(dev.handle, ATTRS, TensorShape(IN, dtype), TensorShape(OUT, dtype))
        if cleaned:
            upsample.cleanup_kernel(dev.handle, state)
        output_grad = dev.array((np.arange(np.prod(output_grad_dims)) % 2).astype(dtype).reshape(output_grad_dims))
        input_grad = poisoned(dev, input_grad_dims, input_grad_dtype or dtype)
        return (lambda: upsample.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, output_grad, None,
                                                 input_grad)), [input_grad]
    return build


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(2, 3, 10, 8)), ShapeError, r"output: expected dims \(2, 3, 8, 10\)"),
    Row("wrong_input_rank", _forward(input_dims=(6, 4, 5)), ShapeError, r"input: expected dims \(2, 3, 4, 5\)"),
    Row("dtype_mismatch", _forward(output_dtype=np.float64), DTypeError, r"output: expected dtype float32"),
    Row("non_contiguous", _forward(input_dims=(2, 3, 5, 4), input_transform=lambda x: x.transpose(0, 1, 3, 2)),
        ShapeError, r"input: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(attrs=UpsampleAttrs(3)), AttrsError, r"attrs: expected the attrs"),
    Row("backward_wrong_output_grad", _backward(output_grad_dims=(2, 3, 8, 5)), ShapeError,
        r"output_grad: expected dims \(2, 3, 8, 10\)"),
    Row("backward_wrong_input_grad_dtype", _backward(input_grad_dtype=np.int32), DTypeError,
        r"input_grad: expected dtype float32"),
    Row("backward_bool", _backward(dtype=np.bool_), DTypeError,
        r"output_grad: expected one of float16, bfloat16, float32, float64, int8"),
    Row("backward_complex64", _backward(dtype=np.complex64), DTypeError, r"output_grad: expected one of .*found complex64"),
    Row("backward_half_input_grad_of_bfloat16", _backward(dtype=BFLOAT16, input_grad_dtype=np.float16), DTypeError,
        r"input_grad: expected dtype bfloat16, found float16"),
    Row("cleaned_up_state", _backward(cleaned=True), StateError, r"state: expected a live state"),
    Row("other_device", _forward(other_device=True), DeviceError, r"input: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    check_row(row, dev, "upsample")


@pytest.mark.parametrize("scale_factor, mode, pattern", [
    (1, "NEAREST", r"scale_factor: expected an integer >= 2, found 1"),
    (0, "NEAREST", r"scale_factor: expected an integer >= 2"),
    (2.0, "NEAREST", r"scale_factor: expected an integer, found 2.0"),
    (True, "NEAREST", r"scale_factor: expected an integer"),
    (2, "BICUBIC", r"mode: expected a UpsampleMode \(NEAREST, BILINEAR\)"),
    (2, None, r"mode: expected a UpsampleMode"),
])
def test_bad_attrs(scale_factor, mode, pattern):
    with pytest.raises(AttrsError, match=pattern) as raised:
        UpsampleAttrs(scale_factor, mode)
    assert str(raised.value).startswith("upsample: ")  # the message names the op


def test_mode_by_name():
    assert UpsampleAttrs(3, "BILINEAR").mode is UpsampleMode.BILINEAR
    assert UpsampleAttrs(2).mode is UpsampleMode.NEAREST


@pytest.mark.parametrize("attrs, input_shape, output_shape, error, pattern", [
    (ATTRS, TensorShape((3, 4, 5), np.float32), TensorShape((3, 8, 10), np.float32), ShapeError,
     r"upsample: input_shape: expected rank 4"),
    (ATTRS, TensorShape(IN, np.float32), TensorShape((2, 3, 8, 5), np.float32), ShapeError,
     r"upsample: output_shape: expected dims \(2, 3, 8, 10\)"),
    (UpsampleAttrs(3), TensorShape(IN, np.float32), TensorShape(OUT, np.float32), ShapeError,
     r"upsample: output_shape: expected dims \(2, 3, 12, 15\)"),
    (ATTRS, TensorShape(IN, np.float32), TensorShape(OUT, np.int32), DTypeError,
     r"upsample: output_shape: expected dtype float32"),
    (UpsampleAttrs(2, UpsampleMode.BILINEAR), TensorShape(IN, np.int32), TensorShape(OUT, np.int32), DTypeError,
     r"upsample: input_shape: expected one of float16, bfloat16, float32, float64, found int32"),
])
def test_init_refuses(attrs, input_shape, output_shape, error, pattern):
    with pytest.raises(error, match=pattern):
        upsample.init_kernel(kernels.cpu_handle(), attrs, input_shape, output_shape)


def test_output_dims_refuse_any_rank_but_4():
    """upsample.output_dims (the functional layer's output formula) on its own: its whole message."""
    with pytest.raises(ShapeError, match=r"^upsample: input_shape: expected rank 4 \(N, C, H, W\), found rank 3 \(3, 4, 5\)$"):
        upsample.output_dims(ATTRS, (3, 4, 5))
    assert upsample.output_dims(UpsampleAttrs(3), IN) == (2, 3, 12, 15)
