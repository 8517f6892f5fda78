"""batch_norm on the CPU: float64 statistics and elements in NumPy, the elementwise passes
in cache-sized blocks shared out to the cores. The arguments are checked
(kernels.batch_norm's entry points) before anything here runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from .. import activation as activations
from .. import cpu as cpu_runtime
from . import SavedForward
from .plan import Layout

if TYPE_CHECKING:
    from . import BatchNormAttrs, BatchNormState

# Elements of one block of the CPU elementwise passes: several float64 passes stay in cache, and
# the calls are long enough for two threads not to wait on each other for the GIL (2^14: twice the time).
CPU_BLOCK_ELEMENTS = 1 << 16


def _view(array: np.ndarray, layout: Layout) -> np.ndarray:
    return array.reshape(layout.outer, layout.stats, layout.inner)


def _params(array: np.ndarray | None, layout: Layout) -> np.ndarray | None:
    return None if array is None else array.reshape(1, layout.stats, 1).astype(np.float64)


def forward(state: BatchNormState, attrs: BatchNormAttrs, input: np.ndarray, gamma: np.ndarray | None,
            beta: np.ndarray | None, output: np.ndarray, training: bool) -> None:
    """output = activation((input - mean) * invstd * gamma + beta), with batch statistics (training, which
    updates the running ones) or the running statistics (inference)."""
    layout = state.layout
    if input.size == 0:
        state.forward = SavedForward(training, empty=True)
        return
    x = _view(input, layout).astype(np.float64, copy=False) if training else _view(input, layout)
    if training:
        mean = x.sum(axis=(0, 2)) / layout.count
        centered = x - mean[:, None]
        var_sum = np.square(centered).sum(axis=(0, 2))
        invstd = 1.0 / np.sqrt(var_sum / layout.count + attrs.eps)
        momentum = state.training_step()
        running_mean = state.running_mean.reshape(-1)
        running_var = state.running_var.reshape(-1)
        running_mean[...] = momentum * mean + (1.0 - momentum) * running_mean.astype(np.float64)
        running_var[...] = momentum * (var_sum / (layout.count - 1)) + (1.0 - momentum) * running_var.astype(np.float64)
    else:
        mean = state.running_mean.reshape(-1).astype(np.float64)
        invstd = 1.0 / np.sqrt(state.running_var.reshape(-1).astype(np.float64) + attrs.eps)
        centered = None  # inference: each block centres its own part of x
    state.forward = SavedForward(training, mean=mean, invstd=invstd)
    pre = None
    if attrs.activation is not None:
        if state.pre is None:
            state.pre = np.empty(input.shape, input.dtype)
        pre = _view(state.pre, layout)
    gamma64 = None if not attrs.affine else gamma.reshape(-1).astype(np.float64)
    beta64 = None if not attrs.affine else beta.reshape(-1).astype(np.float64)
    out = _view(output, layout)

    def apply(block: tuple) -> None:
        # The same float64 operations, element by element, as over the whole tensor at once.
        stats = block[1]
        if centered is None:
            normalized = np.subtract(x[block], mean[stats, None])
        else:
            normalized = centered[block]
        normalized *= invstd[stats, None]
        if gamma64 is not None:
            normalized *= gamma64[stats, None]
            normalized += beta64[stats, None]
        if pre is None:
            out[block] = normalized
            return
        pre[block] = normalized
        # f in float64 at the kept (rounded) pre-activation, rounded once: as the GPU does.
        wide = pre[block].astype(np.float64)
        activations.cpu_forward(attrs.activation, wide, wide)
        out[block] = wide

    _blocks(layout, apply)


def _blocks(layout: Layout, function: Callable[[tuple], None]) -> None:
    """Call function((outer slice, stats slice, inner slice)) over cache-sized blocks of the (outer,
    stats, inner) view, shared out to the cores (cpu_runtime.cpu_parallel): elementwise work only."""
    if layout.inner >= CPU_BLOCK_ELEMENTS:
        stats_step, inner_step = 1, CPU_BLOCK_ELEMENTS
    else:
        stats_step, inner_step = max(1, CPU_BLOCK_ELEMENTS // max(layout.inner, 1)), layout.inner
    blocks = [(slice(o, o + 1), slice(s, s + stats_step), slice(i, i + inner_step))
              for o in range(layout.outer) for s in range(0, layout.stats, stats_step)
              for i in range(0, max(layout.inner, 1), max(inner_step, 1))]

    def run(first: int, last: int) -> None:
        for block in blocks[first:last]:
            function(block)

    cpu_runtime.cpu_parallel(run, len(blocks))


def backward(state: BatchNormState, attrs: BatchNormAttrs, saved: SavedForward, output_grad: np.ndarray,
             input: np.ndarray, input_grad: np.ndarray | None, gamma: np.ndarray | None,
             gamma_grad: np.ndarray | None, beta_grad: np.ndarray | None) -> None:
    """Gradients of the forward before (training: through the batch statistics; inference: through the
    fixed running ones); gamma_grad = sum(g * xhat), beta_grad = sum(g), g the pre-activation gradient."""
    layout = state.layout
    if saved.empty:
        for grad in (gamma_grad, beta_grad):  # sums over no elements
            if grad is not None:
                grad[...] = 0
        return
    if attrs.activation is not None:
        # f' in float64 at the kept pre-activation, not rounded to the dtype: as the GPU does.
        pre_grad = state.pre.astype(np.float64)
        activations.cpu_backward(attrs.activation, pre_grad, output_grad.astype(np.float64), pre_grad)
        output_grad = pre_grad
    mean, invstd, training = saved.mean, saved.invstd, saved.training
    g = _view(output_grad, layout).astype(np.float64, copy=False)
    centered = _view(input, layout) - mean[:, None]
    need_sums = gamma_grad is not None or beta_grad is not None or (training and input_grad is not None)
    if need_sums:
        sum_g = g.sum(axis=(0, 2))
        dot = (g * centered).sum(axis=(0, 2))
        if gamma_grad is not None:
            gamma_grad.reshape(-1)[...] = dot * invstd
        if beta_grad is not None:
            beta_grad.reshape(-1)[...] = sum_g
    if input_grad is None:
        return
    if training:
        grad_mean = sum_g / layout.count
        k = dot * invstd * invstd / layout.count
        centered *= k[:, None]
        result = g - grad_mean[:, None]
        result -= centered
        result *= invstd[:, None]
    else:
        result = g * invstd[:, None]
    if attrs.affine:
        result *= _params(gamma, layout)
    _view(input_grad, layout)[...] = result
