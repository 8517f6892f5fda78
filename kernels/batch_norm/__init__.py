"""batch_norm: input (N, C, *spatial) -> output, normalized per channel (SPATIAL,
statistics over N and every spatial dim, gamma/beta of shape (C,)) or per
activation (PER_ACTIVATION, statistics over N only, gamma/beta of shape
(C, *spatial)), optionally followed by a fused activation.

Training (the default) normalizes with the batch's mean and biased variance and
updates the running statistics held in the state, as PyTorch does::

    running_mean = momentum * mean + (1 - momentum) * running_mean
    running_var  = momentum * unbiased_var + (1 - momentum) * running_var

with momentum None meaning the cumulative average (momentum = 1 / number of
training steps so far). Inference (``training=False``) normalizes with the
running statistics and updates nothing. Backward is the gradient of the forward
before it on the same state: of the batch statistics after a training forward,
of the fixed running statistics (``input_grad = g * gamma * invstd``) after an
inference one.

Precision: every statistic and every element is computed in float64 whatever
the dtype (float32 values are widened, the result rounded once), with the same
operations in the same order on the CPU and the GPU, so the two agree to the
bit wherever the sums are exact and to an ulp or two elsewhere.

Half precision, as PyTorch's mixed precision (cuDNN's batch norm takes float32
scale, bias and statistics with half data): with a float16 or bfloat16 input,
input, output, output_grad and input_grad are in the half dtype, while gamma,
beta, gamma_grad, beta_grad, running_mean and running_var are float32
(core.compute_dtype of the input's dtype; for float32 and float64 inputs they
share its dtype). The saved batch statistics stay float64. Each half value is
widened exactly to float64, the statistics and the normalization are the float64
operations of the other dtypes, and each result is rounded once, from float64,
to its dtype. A fused activation is evaluated in float32 at the pre-activation
rounded to the half dtype, and rounded once (its derivative in float32 too).

A package: this module holds the layout, init, the checks and the entry points; attrs.py
the attrs, BatchNormMode and the state (with SavedForward); cpu.py the NumPy code, plan.py
the layout and the GPU plan (pure Python, no device), gpu.py the launches of batch_norm.cu.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime.core import ALL_FLOAT_DTYPES, ShapeError, StateError, TensorShape, fail
from ..runtime.spec import UNARY_SHAPES, Arg, declare_op, unary_backward
from . import cpu, gpu
from .attrs import OP, BatchNormAttrs, BatchNormMode, BatchNormState, SavedForward
from .plan import Layout


def layout_of(attrs: BatchNormAttrs, dims: tuple[int, ...]) -> Layout:
    """The input of dims `dims` seen as (outer, stats, inner) for the attrs' mode."""
    spatial = core.numel(dims[2:])
    if attrs.mode is BatchNormMode.SPATIAL:
        return Layout(dims[0], dims[1], spatial, (dims[1],))
    return Layout(dims[0], dims[1] * spatial, 1, tuple(dims[1:]))


def init_kernel(handle: Any, attrs: BatchNormAttrs, input_shape: TensorShape, output_shape: TensorShape) -> BatchNormState:
    """Check the shapes (input (N, C, *spatial), rank >= 2; output the same) and make the running statistics:
    mean 0, variance 1, on the handle's device."""
    state = core.make_state(OP, handle, attrs, BatchNormAttrs, BatchNormState, input_shape=input_shape,
                            output_shape=output_shape)
    core.check_dtype(OP, "input_shape", input_shape, ALL_FLOAT_DTYPES)
    core.check_rank(OP, "input_shape", input_shape, min_rank=2)
    core.check_dims(OP, "output_shape", output_shape, input_shape.dims)
    core.check_same_dtype(OP, "output_shape", output_shape, input_shape, "input_shape")
    layout = state.layout = layout_of(attrs, input_shape.dims)
    # gamma, beta, their gradients and the running statistics: float32 for half inputs
    state.stat_shape = TensorShape(layout.stat_dims, core.compute_dtype(input_shape.dtype))
    if state.device == "cpu":
        state.running_mean = np.zeros(layout.stat_dims, state.stat_shape.dtype)
        state.running_var = np.ones(layout.stat_dims, state.stat_shape.dtype)
    else:  # pragma: no cover - GPU: device buffers of a GPU handle
        gpu.init(state, input_shape.dtype)
    return state


def _param_rows(state: BatchNormState, names: tuple[str, ...], arrays: tuple[Any, ...], required: bool) -> list[tuple]:
    """check_call rows for gamma, beta and their grads: shaped like a statistic when affine, absent when not."""
    stat_shape = state.stat_shape
    if not state.attrs.affine:
        for name, array in zip(names, arrays):
            if array is not None:
                raise fail(ShapeError, OP, name, "None (attrs.affine is False)", f"an array {tuple(array.shape)}")
        return []
    return [(name, array, stat_shape, required) for name, array in zip(names, arrays)]


def _check_running(state: BatchNormState, device: Any) -> None:
    """The running statistics, which a caller may have replaced, are still arrays of the right kind
    (not looked at inside core.arrays_checked: a plan's states keep the network's arrays)."""
    if core.arrays_are_checked():
        return
    for name in ("running_mean", "running_var"):
        array = getattr(state, name)
        if array is None:
            raise fail(StateError, OP, f"state.{name}", "an array", None)
        core.check_tensor(OP, f"state.{name}", array, state.stat_shape, device)


def _check_state(state: Any) -> None:
    if not isinstance(state, BatchNormState):
        raise fail(StateError, OP, "state", f"a state from {OP}.init_kernel", type(state).__name__)


def _check_forward(stream: Any, handle: Any, state: Any, attrs: Any, input: Any, gamma: Any, beta: Any, output: Any,
                   training: bool) -> Any:
    _check_state(state)
    rows = [("input", input, state.shapes["input_shape"], True), ("output", output, state.shapes["output_shape"], True)]
    rows += _param_rows(state, ("gamma", "beta"), (gamma, beta), True)
    device = core.check_call(OP, stream, handle, state, attrs, rows)
    _check_running(state, device)
    layout = state.layout
    if training and layout.count == 1 and layout.stats:
        raise fail(ShapeError, OP, "input", "more than 1 value per statistic when training",
                   f"dims {tuple(input.shape)}")
    return device


def _check_backward(stream: Any, handle: Any, state: Any, attrs: Any, output: Any, output_grad: Any, input: Any,
                    input_grad: Any, gamma: Any, beta: Any, gamma_grad: Any, beta_grad: Any) -> SavedForward:
    _check_state(state)
    rows = [
        ("output", output, state.shapes["output_shape"], False),
        ("output_grad", output_grad, state.shapes["output_shape"], True),
        ("input", input, state.shapes["input_shape"], True),
        ("input_grad", input_grad, state.shapes["input_shape"], False),
    ]
    rows += _param_rows(state, ("gamma",), (gamma,), True)
    rows += _param_rows(state, ("beta", "gamma_grad", "beta_grad"), (beta, gamma_grad, beta_grad), False)
    core.check_call(OP, stream, handle, state, attrs, rows)
    if not state.attrs.backward:
        raise fail(StateError, OP, "state", "a state made for a backward (attrs.backward True)",
                   "a state made with attrs.backward False (inference only: its forward keeps nothing for one)")
    saved = state.forward
    if saved is None:
        raise fail(StateError, OP, "state", "a forward on this state before backward", "none")
    return saved


# --------------------------------------------------------------------------- entry points


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: Any, handle: Any, state: BatchNormState, attrs: BatchNormAttrs, input: Any,
                       gamma: Any, beta: Any, output: Any, *, training: bool = True) -> None:
    """output = activation((input - mean) * invstd * gamma + beta), with batch statistics (training, which
    updates the running ones) or the running statistics (inference)."""
    _check_forward(stream, handle, state, attrs, input, gamma, beta, output, training)
    cpu.forward(state, attrs, input, gamma, beta, output, training)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: Any, handle: Any, state: BatchNormState, attrs: BatchNormAttrs, output: Any,
                        output_grad: Any, input: Any, input_grad: Any, gamma: Any, beta: Any, gamma_grad: Any,
                        beta_grad: Any) -> None:
    """Gradients of the forward before (training: through the batch statistics; inference: through the
    fixed running ones); gamma_grad = sum(g * xhat), beta_grad = sum(g), g the pre-activation gradient."""
    saved = _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, gamma, beta,
                            gamma_grad, beta_grad)
    cpu.backward(state, attrs, saved, output_grad, input, input_grad, gamma, gamma_grad, beta_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: Any, handle: Any, state: BatchNormState, attrs: BatchNormAttrs, input: Any,
                       gamma: Any, beta: Any, output: Any, *, training: bool = True) -> None:
    """output = activation((input - mean) * invstd * gamma + beta), enqueued on the stream (see cpu_forward_kernel)."""
    _check_forward(stream, handle, state, attrs, input, gamma, beta, output, training)
    gpu.forward(stream, state, attrs, input, gamma, beta, output, training)


@core.gpu_kernel
def gpu_backward_kernel(stream: Any, handle: Any, state: BatchNormState, attrs: BatchNormAttrs, output: Any,
                        output_grad: Any, input: Any, input_grad: Any, gamma: Any, beta: Any, gamma_grad: Any,
                        beta_grad: Any) -> None:
    """Gradients of the forward before, enqueued on the stream (see cpu_backward_kernel)."""
    saved = _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, gamma, beta,
                            gamma_grad, beta_grad)
    gpu.backward(stream, state, attrs, saved, output_grad, input, input_grad, gamma, gamma_grad, beta_grad)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=BatchNormAttrs,
    shapes=UNARY_SHAPES,
    # gamma and beta: arrays where attrs.affine, None where not (so not `required`: None may be passed).
    forward=(Arg("input", "input"), Arg("gamma", "weight", required=False), Arg("beta", "weight", required=False),
             Arg("output", "output")),
    backward=(*unary_backward(output=False, input=True), Arg("gamma", "weight", required=False),
              Arg("beta", "weight", required=False),
              Arg("gamma_grad", "grad", required=False, of="gamma"), Arg("beta_grad", "grad", required=False, of="beta")),
    dtypes=ALL_FLOAT_DTYPES,
    forward_options={"training": True},
    exports=(BatchNormMode,),
    forward_doc='Write output (training: batch statistics, running ones updated; inference: running statistics).',
    backward_doc='Write input_grad, gamma_grad and beta_grad (each skipped when None) for the forward before.',
    cleanup_doc='Release the state: running statistics, saved statistics, workspace.',
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
