"""batch_norm refuses bad input before writing anything (outputs, gradients and the running statistics)."""

import numpy as np
import pytest

from kernels import (
    AttrsError,
    BatchNormAttrs,
    BatchNormMode,
    DeviceError,
    DTypeError,
    ShapeError,
    SoftmaxAttrs,
    StateError,
    TensorShape,
    batch_norm,
    cpu_handle,
    softmax,
)
from kernels.runtime.core import BFLOAT16

from .bad_input import Row, check_row, params, poisoned
from .conftest import Dev, require

ATTRS = BatchNormAttrs(eps=1e-3, momentum=0.03, activation="SILU")
PER_ACTIVATION = BatchNormAttrs(mode=BatchNormMode.PER_ACTIVATION)
NO_AFFINE = BatchNormAttrs(affine=False)
IN = (2, 3, 4, 5)
C = (3,)


def _state(dev, attrs=ATTRS, dims=IN, dtype=np.float32):
    return batch_norm.init_kernel(dev.handle, attrs, TensorShape(dims, dtype), TensorShape(dims, dtype))


def _values(dev, dims, dtype=np.float32):
    return dev.array((np.arange(np.prod(dims)) % 7 - 3).reshape(dims).astype(dtype))


def _forward(input_dims=IN, output_dims=IN, input_dtype=np.float32, output_dtype=np.float32, gamma_dims=C,
             gamma_dtype=np.float32, attrs=ATTRS, call_attrs=None, no_gamma=False, input_transform=None,
             other_device=False, state_dims=IN, training=True, replace_running=None, state_dtype=np.float32):
    def build(dev):
        state = _state(dev, attrs, state_dims, state_dtype)
        input = _values(dev, input_dims, input_dtype)
        if input_transform:
            input = input_transform(input)
        if other_device:
            input = np.asarray(dev.host(input)) if dev.name == "gpu" else input
        gamma = None if no_gamma or gamma_dims is None else _values(dev, gamma_dims, gamma_dtype)
        beta = None if gamma_dims is None else _values(dev, gamma_dims, gamma_dtype)
        if not attrs.affine and gamma_dims == C and not no_gamma:
            gamma, beta = _values(dev, C), None
        if replace_running is not None:
            state.running_mean = None if isinstance(replace_running, str) else dev.array(replace_running)
        output = poisoned(dev, output_dims, output_dtype)
        return (lambda: batch_norm.forward_kernel(dev.stream, dev.handle, state, call_attrs or attrs, input, gamma,
                                                  beta, output, training=training)), \
            [output, state.running_mean, state.running_var]
    return build


def _backward(gamma_grad_dims=C, input_grad_dtype=np.float32, forward=True, cleaned=False, no_gamma=False):
    def build(dev):
        state = _state(dev)
        input, gamma, beta = _values(dev, IN), _values(dev, C), _values(dev, C)
        if forward:
            batch_norm.forward_kernel(dev.stream, dev.handle, state, ATTRS, input, gamma, beta, poisoned(dev, IN))
        if cleaned:
            batch_norm.cleanup_kernel(dev.handle, state)
        output_grad = _values(dev, IN)
        input_grad = poisoned(dev, IN, input_grad_dtype)
        gamma_grad, beta_grad = poisoned(dev, gamma_grad_dims), poisoned(dev, C)
        return (lambda: batch_norm.backward_kernel(dev.stream, dev.handle, state, ATTRS, None, output_grad, input,
                                                   input_grad, None if no_gamma else gamma, beta, gamma_grad,
                                                   beta_grad)), [input_grad, gamma_grad, beta_grad]
    return build


def _state_of_another_op(dev):
    state = softmax.init_kernel(dev.handle, SoftmaxAttrs(1), TensorShape(IN, np.float32), TensorShape(IN, np.float32))
    input, output, gamma = _values(dev, IN), poisoned(dev, IN), _values(dev, C)
    return (lambda: batch_norm.forward_kernel(dev.stream, dev.handle, state, ATTRS, input, gamma, gamma, output)), [output]


ROWS = [
    Row("wrong_output_shape", _forward(output_dims=(2, 3, 5, 4)), ShapeError, r"output: expected dims \(2, 3, 4, 5\)"),
    Row("wrong_input_rank", _forward(input_dims=(6, 4, 5)), ShapeError, r"input: expected dims \(2, 3, 4, 5\)"),
    Row("input_dtype_mismatch", _forward(input_dtype=np.float64), DTypeError, r"input: expected dtype float32"),
    Row("output_dtype_mismatch", _forward(output_dtype=np.float64), DTypeError, r"output: expected dtype float32"),
    Row("missing_gamma_affine", _forward(no_gamma=True), ShapeError, r"gamma: expected an array"),
    Row("gamma_wrong_shape", _forward(gamma_dims=(4,)), ShapeError, r"gamma: expected dims \(3,\)"),
    Row("gamma_per_channel_in_per_activation", _forward(attrs=PER_ACTIVATION), ShapeError,
        r"gamma: expected dims \(3, 4, 5\)"),
    Row("gamma_dtype_mismatch", _forward(gamma_dtype=np.float64), DTypeError, r"gamma: expected dtype float32"),
    Row("gamma_without_affine", _forward(attrs=NO_AFFINE), ShapeError, r"gamma: expected None \(attrs.affine is False\)"),
    Row("non_contiguous", _forward(input_dims=(5, 4, 3, 2), input_transform=lambda x: x.transpose(3, 2, 1, 0)),
        ShapeError, r"input: expected a C-contiguous"),
    Row("attrs_differ_from_state", _forward(call_attrs=BatchNormAttrs(eps=1e-3, momentum=0.1, activation="SILU")),
        AttrsError, r"attrs: expected the attrs"),
    Row("one_value_per_channel_training", _forward(input_dims=(1, 3, 1, 1), output_dims=(1, 3, 1, 1),
                                                   state_dims=(1, 3, 1, 1)),
        ShapeError, r"input: expected more than 1 value per statistic when training"),
    Row("running_mean_replaced_wrong_shape", _forward(replace_running=np.zeros(4, np.float32)), ShapeError,
        r"state.running_mean: expected dims \(3,\)"),
    Row("running_mean_replaced_wrong_dtype", _forward(replace_running=np.zeros(3, np.float64)), DTypeError,
        r"state.running_mean: expected dtype float32"),
    Row("running_mean_replaced_by_none", _forward(replace_running="None"), StateError,
        r"state.running_mean: expected an array, found None"),
    Row("state_of_another_op", _state_of_another_op, StateError, r"state: expected a state from batch_norm.init_kernel"),
    Row("backward_without_forward", _backward(forward=False), StateError, r"state: expected a forward"),
    Row("cleaned_up_state", _backward(cleaned=True), StateError, r"state: expected a live state"),
    Row("gamma_grad_wrong_shape", _backward(gamma_grad_dims=(4,)), ShapeError, r"gamma_grad: expected dims \(3,\)"),
    Row("input_grad_dtype_mismatch", _backward(input_grad_dtype=np.float64), DTypeError,
        r"input_grad: expected dtype float32"),
    Row("backward_missing_gamma", _backward(no_gamma=True), ShapeError, r"gamma: expected an array"),
    # Half data: gamma, beta and the running statistics are float32 (mixed precision), never half.
    Row("half_gamma_with_half_input", _forward(input_dtype=np.float16, output_dtype=np.float16,
                                               gamma_dtype=np.float16, state_dtype=np.float16),
        DTypeError, r"gamma: expected dtype float32, found float16"),
    Row("bfloat16_gamma_with_bfloat16_input", _forward(input_dtype=BFLOAT16, output_dtype=BFLOAT16,
                                                       gamma_dtype=BFLOAT16, state_dtype=BFLOAT16),
        DTypeError, r"gamma: expected dtype float32, found bfloat16"),
    Row("half_running_mean_with_half_input", _forward(input_dtype=np.float16, output_dtype=np.float16,
                                                      state_dtype=np.float16,
                                                      replace_running=np.zeros(3, np.float16)),
        DTypeError, r"state.running_mean: expected dtype float32, found float16"),
    Row("float32_input_to_a_half_state", _forward(output_dtype=np.float16, state_dtype=np.float16), DTypeError,
        r"input: expected dtype float16, found float32"),
    Row("bfloat16_output_to_a_float16_state", _forward(input_dtype=np.float16, output_dtype=BFLOAT16,
                                                       state_dtype=np.float16),
        DTypeError, r"output: expected dtype float16, found bfloat16"),
    Row("other_device", _forward(other_device=True), DeviceError, r"input: expected a CuPy array", devices=("gpu",)),
]


@pytest.mark.parametrize("row, device", params(ROWS))
def test_bad_call(row, device):
    require(device)
    dev = Dev(device)
    try:
        check_row(row, dev, "batch_norm")
    finally:
        dev.handle.close()


@pytest.mark.parametrize("kwargs, pattern", [
    ({"eps": 0.0}, r"eps: expected a number > 0"),
    ({"eps": -1e-5}, r"eps: expected a number > 0"),
    ({"eps": float("nan")}, r"eps: expected a finite real number"),
    ({"eps": "1e-5"}, r"eps: expected a finite real number"),
    ({"momentum": -0.1}, r"momentum: expected a number in \[0, 1\]"),
    ({"momentum": 1.5}, r"momentum: expected a number in \[0, 1\]"),
    ({"momentum": True}, r"momentum: expected a finite real number"),
    ({"mode": "CHANNEL"}, r"mode: expected a BatchNormMode"),
    ({"activation": "SWISH"}, r"activation: expected a Activation"),
    ({"affine": 1}, r"affine: expected a bool"),
    ({"backward": 0}, r"backward: expected a bool"),
])
def test_bad_attrs(kwargs, pattern):
    with pytest.raises(AttrsError, match=r"^batch_norm: " + pattern):
        BatchNormAttrs(**kwargs)


def test_init_refuses_rank_dtype_and_dims():
    handle = cpu_handle()
    with pytest.raises(ShapeError, match=r"batch_norm: input_shape: expected rank >= 2"):
        batch_norm.init_kernel(handle, ATTRS, TensorShape((5,), np.float32), TensorShape((5,), np.float32))
    with pytest.raises(DTypeError, match=r"batch_norm: input_shape: expected one of float16, bfloat16, float32, float64"):
        batch_norm.init_kernel(handle, ATTRS, TensorShape(IN, np.int32), TensorShape(IN, np.int32))
    with pytest.raises(DTypeError, match=r"batch_norm: output_shape: expected dtype bfloat16 \(as input_shape\), found float16"):
        batch_norm.init_kernel(handle, ATTRS, TensorShape(IN, BFLOAT16), TensorShape(IN, np.float16))
    with pytest.raises(ShapeError, match=r"batch_norm: output_shape: expected dims \(2, 3, 4, 5\)"):
        batch_norm.init_kernel(handle, ATTRS, TensorShape(IN, np.float32), TensorShape((2, 3, 5, 4), np.float32))
    with pytest.raises(DTypeError, match=r"batch_norm: output_shape: expected dtype float32"):
        batch_norm.init_kernel(handle, ATTRS, TensorShape(IN, np.float32), TensorShape(IN, np.float64))
