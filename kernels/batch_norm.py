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
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import activation as activations
from . import core, cpu, gpu
from .activation import Activation
from .core import FLOAT_DTYPES, AttrsError, ShapeError, StateError, TensorShape, fail

OP = "batch_norm"


class BatchNormMode(enum.Enum):
    """SPATIAL: one statistic per channel (BatchNorm2d); PER_ACTIVATION: one per (c, h, w) (BatchNorm1d over N)."""

    SPATIAL = "SPATIAL"
    PER_ACTIVATION = "PER_ACTIVATION"


def _attr_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(value):
        raise fail(AttrsError, OP, name, "a finite real number", repr(value))
    return float(value)


@dataclass(frozen=True)
class BatchNormAttrs:
    """affine: gamma and beta are given; eps > 0; 0 <= momentum <= 1, or None for the cumulative average."""

    affine: bool = True
    eps: float = 1e-5
    momentum: float | None = 0.1
    mode: BatchNormMode = BatchNormMode.SPATIAL
    activation: Activation | None = None  # applied after the normalization, forward and backward

    def __post_init__(self) -> None:
        if not isinstance(self.affine, (bool, np.bool_)):
            raise fail(AttrsError, OP, "affine", "a bool", repr(self.affine))
        core.set_attr(self, "affine", bool(self.affine))
        eps = _attr_real("eps", self.eps)
        if eps <= 0:
            raise fail(AttrsError, OP, "eps", "a number > 0", eps)
        core.set_attr(self, "eps", eps)
        if self.momentum is not None:
            momentum = _attr_real("momentum", self.momentum)
            if not 0.0 <= momentum <= 1.0:
                raise fail(AttrsError, OP, "momentum", "a number in [0, 1] or None (cumulative average)", momentum)
            core.set_attr(self, "momentum", momentum)
        core.set_attr(self, "mode", core.attr_enum(OP, "mode", self.mode, BatchNormMode))
        core.set_attr(self, "activation", activations.attr_activation(OP, self.activation))


# --------------------------------------------------------------------------- state and layout


@dataclass(frozen=True)
class Layout:
    """The input seen as (outer, stats, inner): statistic f covers outer x inner elements.

    SPATIAL: (N, C, prod(spatial)); PER_ACTIVATION: (N, C * prod(spatial), 1).
    """

    outer: int
    stats: int
    inner: int
    stat_dims: tuple[int, ...]

    @property
    def count(self) -> int:
        """Elements per statistic."""
        return self.outer * self.inner


def layout_of(attrs: BatchNormAttrs, dims: tuple[int, ...]) -> Layout:
    spatial = core.numel(dims[2:])
    if attrs.mode is BatchNormMode.SPATIAL:
        return Layout(dims[0], dims[1], spatial, (dims[1],))
    return Layout(dims[0], dims[1] * spatial, 1, tuple(dims[1:]))


@dataclass(eq=False)
class BatchNormState(core.KernelState):
    """The running statistics (arrays on the state's device, in the input's dtype, shaped like gamma;
    a caller may read them or overwrite them, in place or by assignment), the number of training
    forwards so far, and what backward needs from the forward before it (in `saved`)."""

    running_mean: Any = None
    running_var: Any = None
    num_batches_tracked: int = 0

    def release(self) -> None:
        super().release()
        self.running_mean = self.running_var = None


def init_kernel(handle: Any, attrs: BatchNormAttrs, input_shape: TensorShape, output_shape: TensorShape) -> BatchNormState:
    """Check the shapes (input (N, C, *spatial), rank >= 2; output the same) and make the running statistics:
    mean 0, variance 1, on the handle's device."""
    state = core.make_state(OP, handle, attrs, BatchNormAttrs, BatchNormState, input_shape=input_shape,
                            output_shape=output_shape)
    core.check_dtype(OP, "input_shape", input_shape, FLOAT_DTYPES)
    core.check_rank(OP, "input_shape", input_shape, min_rank=2)
    core.check_dims(OP, "output_shape", output_shape, input_shape.dims)
    core.check_same_dtype(OP, "output_shape", output_shape, input_shape, "input_shape")
    layout = layout_of(attrs, input_shape.dims)
    state.shapes["stat_shape"] = TensorShape(layout.stat_dims, input_shape.dtype)
    state.saved["layout"] = layout
    if state.device == "cpu":
        state.running_mean = np.zeros(layout.stat_dims, input_shape.dtype)
        state.running_var = np.ones(layout.stat_dims, input_shape.dtype)
    else:
        _gpu_init(state, layout, input_shape.dtype)
    return state


def _param_rows(state: BatchNormState, names: tuple[str, ...], arrays: tuple[Any, ...], required: bool) -> list[tuple]:
    """check_call rows for gamma, beta and their grads: shaped like a statistic when affine, absent when not."""
    stat_shape = state.shapes["stat_shape"]
    if not state.attrs.affine:
        for name, array in zip(names, arrays):
            if array is not None:
                raise fail(ShapeError, OP, name, "None (attrs.affine is False)", f"an array {tuple(array.shape)}")
        return []
    return [(name, array, stat_shape, required) for name, array in zip(names, arrays)]


def _check_running(state: BatchNormState, device: Any) -> None:
    """The running statistics, which a caller may have replaced, are still arrays of the right kind."""
    for name in ("running_mean", "running_var"):
        array = getattr(state, name)
        if array is None:
            raise fail(StateError, OP, f"state.{name}", "an array", None)
        core.check_tensor(OP, f"state.{name}", array, state.shapes["stat_shape"], device)


def _check_state(state: Any) -> None:
    if not isinstance(state, BatchNormState):
        raise fail(StateError, OP, "state", f"a state from {OP}.init_kernel", type(state).__name__)


def _check_forward(stream, handle, state, attrs, input, gamma, beta, output, training) -> Any:
    _check_state(state)
    rows = [("input", input, state.shapes["input_shape"], True), ("output", output, state.shapes["output_shape"], True)]
    rows += _param_rows(state, ("gamma", "beta"), (gamma, beta), True)
    device = core.check_call(OP, stream, handle, state, attrs, rows)
    _check_running(state, device)
    layout = state.saved["layout"]
    if training and layout.count == 1 and layout.stats:
        raise fail(ShapeError, OP, "input", "more than 1 value per statistic when training",
                   f"dims {tuple(input.shape)}")
    return device


def _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, gamma, beta,
                    gamma_grad, beta_grad) -> dict[str, Any]:
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
    saved = state.saved.get("forward")
    if saved is None:
        raise fail(StateError, OP, "state", "a forward on this state before backward", "none")
    return saved


def _momentum(state: BatchNormState, attrs: BatchNormAttrs) -> float:
    """The weight of this step's statistics; counts the step (momentum None: 1 / steps so far, as torch)."""
    state.num_batches_tracked += 1
    return 1.0 / state.num_batches_tracked if attrs.momentum is None else attrs.momentum


# --------------------------------------------------------------------------- CPU


def _cpu_view(array: np.ndarray, layout: Layout) -> np.ndarray:
    return array.reshape(layout.outer, layout.stats, layout.inner)


def _cpu_params(array: np.ndarray | None, layout: Layout) -> np.ndarray | None:
    return None if array is None else array.reshape(1, layout.stats, 1).astype(np.float64)


def cpu_forward_kernel(stream, handle, state, attrs, input, gamma, beta, output, *, training: bool = True) -> None:
    """output = activation((input - mean) * invstd * gamma + beta), with batch statistics (training, which
    updates the running ones) or the running statistics (inference)."""
    _check_forward(stream, handle, state, attrs, input, gamma, beta, output, training)
    layout = state.saved["layout"]
    if input.size == 0:
        state.saved["forward"] = {"training": training, "empty": True}
        return
    x = _cpu_view(input, layout).astype(np.float64, copy=False) if training else _cpu_view(input, layout)
    if training:
        mean = x.sum(axis=(0, 2)) / layout.count
        centered = x - mean[:, None]
        var_sum = np.square(centered).sum(axis=(0, 2))
        invstd = 1.0 / np.sqrt(var_sum / layout.count + attrs.eps)
        momentum = _momentum(state, attrs)
        running_mean = state.running_mean.reshape(-1)
        running_var = state.running_var.reshape(-1)
        running_mean[...] = momentum * mean + (1.0 - momentum) * running_mean.astype(np.float64)
        running_var[...] = momentum * (var_sum / (layout.count - 1)) + (1.0 - momentum) * running_var.astype(np.float64)
    else:
        mean = state.running_mean.reshape(-1).astype(np.float64)
        invstd = 1.0 / np.sqrt(state.running_var.reshape(-1).astype(np.float64) + attrs.eps)
        centered = None  # inference: each block centres its own part of x
    state.saved["forward"] = {"training": training, "mean": mean, "invstd": invstd}
    pre = None
    if attrs.activation is not None:
        pre = state.saved.get("pre")
        if pre is None:
            pre = state.saved["pre"] = np.empty(input.shape, input.dtype)
        pre = _cpu_view(pre, layout)
    gamma64 = None if not attrs.affine else gamma.reshape(-1).astype(np.float64)
    beta64 = None if not attrs.affine else beta.reshape(-1).astype(np.float64)
    out = _cpu_view(output, layout)

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

    _cpu_blocks(layout, apply)


# Elements of one block of the CPU elementwise passes: several float64 passes stay in cache, and
# the calls are long enough for two threads not to wait on each other for the GIL (2^14: twice the time).
CPU_BLOCK_ELEMENTS = 1 << 16


def _cpu_blocks(layout: Layout, function: Any) -> None:
    """Call function((outer slice, stats slice, inner slice)) over cache-sized blocks of the (outer,
    stats, inner) view, shared out to the cores (cpu.cpu_parallel): elementwise work only."""
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

    cpu.cpu_parallel(run, len(blocks))


def cpu_backward_kernel(stream, handle, state, attrs, output, output_grad, input, input_grad, gamma, beta,
                        gamma_grad, beta_grad) -> None:
    """Gradients of the forward before (training: through the batch statistics; inference: through the
    fixed running ones); gamma_grad = sum(g * xhat), beta_grad = sum(g), g the pre-activation gradient."""
    saved = _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, gamma, beta,
                            gamma_grad, beta_grad)
    layout = state.saved["layout"]
    if saved.get("empty"):
        for grad in (gamma_grad, beta_grad):  # sums over no elements
            if grad is not None:
                grad[...] = 0
        return
    if attrs.activation is not None:
        # f' in float64 at the kept pre-activation, not rounded to the dtype: as the GPU does.
        pre_grad = state.saved["pre"].astype(np.float64)
        activations.cpu_backward(attrs.activation, pre_grad, output_grad.astype(np.float64), pre_grad)
        output_grad = pre_grad
    mean, invstd, training = saved["mean"], saved["invstd"], saved["training"]
    g = _cpu_view(output_grad, layout).astype(np.float64, copy=False)
    centered = _cpu_view(input, layout) - mean[:, None]
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
        result *= _cpu_params(gamma, layout)
    _cpu_view(input_grad, layout)[...] = result


# --------------------------------------------------------------------------- GPU
#
# Custom kernels rather than cuDNN: cuDNN's batch norm leaves the precision and
# order of its reductions to the library (no promise of the same bits as the
# CPU), fuses no SiLU or GELU (its Ex variant knows ReLU), and older releases
# refused eps < 1e-5 (CUDNN_BN_MIN_EPSILON; 0 since cuDNN 8). These kernels reduce in float64 in a fixed order with no
# atomics (deterministic: the same bits on every run), follow torch's
# conventions exactly (unbiased running variance, cumulative momentum) and do
# the same float64 operations as the CPU code above, so that the CPU and the GPU
# agree to the bit wherever the sums are exact.
#
# SPATIAL training: a partial-sum kernel over (part, channel) blocks, then the
# same kernel again for the sum of squared deviations (each block recomputes
# the mean from the partials in the same order: two-pass, as the CPU), then the
# elementwise apply, each of whose blocks recomputes its channel's mean and
# invstd from the partials in that same order (block x 0 writes them for
# backward and updates the running statistics): 3 launches; 1 where a channel
# is one part (N 1, H*W <= _CHUNK: one block reduces and applies it, with the
# same operations, bn_spatial_forward_one_part). SPATIAL inference: the apply
# alone, computing invstd from the running variance. PER_ACTIVATION (and
# SPATIAL without spatial dims): one thread per statistic reduces over N, then
# the same apply (inference: the apply alone). Backward mirrors it.
#
# Host time is most of a call on small layers: what a call launches (kernels,
# grids, the fixed arguments) is worked out once per state (_GpuCalls), so that
# a call is its checks and its launches.

_BLOCK = 256
_APPLY_UNROLL = 4  # BN_APPLY_UNROLL: columns a thread of the forward apply covers per step
_NULL = np.uint64(0)  # a null pointer argument (absent gamma, beta or gradient)
_CHUNK = 2048  # elements of one row that a partial-sum block reduces (8 per thread)
# bn_spatial_partials' `what` and bn_forward_apply's `stats_from` (batch_norm.cu)
_PARTIALS_SUMS, _PARTIALS_SQUARES = np.int32(0), np.int32(1)
_STATS_SAVED, _STATS_RUNNING, _STATS_PARTIALS = np.int32(0), np.int32(1), np.int32(2)
_COEF_SAVED, _COEF_PARTIALS = np.int32(0), np.int32(1)  # bn_backward_apply's `coef_from`
_FALSE, _TRUE = np.int32(0), np.int32(1)
_FORWARD_TRAINING, _FORWARD_INFERENCE = {"training": True}, {"training": False}  # state.saved["forward"], read only

_CUDA = gpu.CudaModule("batch_norm.cu", [
    f"{kernel}<{t}, {i}>"
    for kernel in ("bn_spatial_partials", "bn_feature_stats", "bn_forward_apply", "bn_spatial_forward_one_part",
                   "bn_spatial_grad_partials", "bn_feature_grad", "bn_backward_apply")
    for t in gpu.FLOAT_TYPES for i in gpu.INDEX_TYPES
] + [
    f"{kernel}<{t}>" for kernel in ("bn_spatial_grad_finalize",)
    for t in gpu.FLOAT_TYPES
])


@dataclass(frozen=True)
class _GpuPlan:
    by_feature: bool  # one thread per statistic, reducing over N (PER_ACTIVATION, or no spatial dims)
    chunk: int
    parts_per_row: int
    parts: int  # partial sums per channel: outer * parts_per_row
    rows: int  # apply kernels: rows x cols, statistic = row % stats (SPATIAL) or col (by feature)
    cols: int
    index: str
    scalar: Any


def _gpu_plan(layout: Layout) -> _GpuPlan:
    total = layout.outer * layout.stats * layout.inner
    # 32-bit indices only where the apply's grid-stride step cannot carry a column past 2^31.
    index = gpu.index_type(total + 65535 * _BLOCK * _APPLY_UNROLL, layout.count)
    scalar = np.int32 if index == "int" else np.int64
    by_feature = layout.inner == 1
    chunk = min(max(layout.inner, 1), _CHUNK)
    parts_per_row = -(-layout.inner // chunk) if layout.inner else 1
    if by_feature:
        return _GpuPlan(True, 1, 1, 1, layout.outer, layout.stats, index, scalar)
    return _GpuPlan(False, chunk, parts_per_row, layout.outer * parts_per_row, layout.outer * layout.stats,
                    layout.inner, index, scalar)


def _gpu_init(state: BatchNormState, layout: Layout, dtype: np.dtype) -> None:
    cupy = gpu.cupy
    plan = _gpu_plan(layout)
    device = state.device
    stats = max(layout.stats, 1)
    # The state's memory: gpu.device_empty (outside CuPy's pool; freed only once the device is done).
    state.running_mean = gpu.device_empty(layout.stat_dims, dtype, device)
    state.running_var = gpu.device_empty(layout.stat_dims, dtype, device)
    state.saved.update(
        plan=plan,
        mean=gpu.device_empty((stats,), np.float64, device), invstd=gpu.device_empty((stats,), np.float64, device),
        coef=gpu.device_empty((2 * stats,), np.float64, device),  # backward: grad_mean, k per statistic
        partials=gpu.device_empty((2 * stats * max(plan.parts, 1) if not plan.by_feature else 1,), np.float64, device),
    )
    with cupy.cuda.Device(device):
        # init has no stream: the fills go on CuPy's current stream, and calls on this state wait
        # for them through an event (until it is seen complete) rather than synchronizing the device.
        state.running_mean.fill(0)
        state.running_var.fill(1)
        ready = cupy.cuda.Event(disable_timing=True)
        ready.record()
    state.saved["ready"] = ready


def _grid2(cols_blocks: int, rows: int) -> tuple[int, int]:
    return (max(1, min(cols_blocks, 65535)), max(1, min(rows, 65535)))


def _gpu_apply_grid(plan: _GpuPlan, per_thread: int = 1) -> tuple[int, int]:
    return _grid2(-(-plan.cols // (_BLOCK * per_thread)), plan.rows)


class _GpuCalls:
    """Everything about a state's launches that does not change from call to call: the kernels
    (compiled on first use), grids, views of the workspace and the fixed arguments, in order.
    Made by the first non-empty GPU call on a state (_gpu_calls), kept in state.saved["calls"]."""

    def __init__(self, state: BatchNormState, attrs: BatchNormAttrs, dtype: np.dtype) -> None:
        layout, plan, saved = state.saved["layout"], state.saved["plan"], state.saved
        t, i, scalar = gpu.cuda_type(dtype), plan.index, plan.scalar
        with gpu.cupy.cuda.Device(state.device):
            def function(name: str) -> Any:
                return _CUDA.function(name, state.device)

            self.pre = (gpu.device_empty(state.shapes["input_shape"].dims, dtype, state.device)
                        if attrs.activation is not None else _NULL)
            mean, invstd, partials = saved["mean"], saved["invstd"], saved["partials"]
            self.fixed_momentum = None if attrs.momentum is None else np.float64(attrs.momentum)
            self.stat_grid = gpu.grid_for(layout.stats)
            count, eps = np.float64(layout.count), np.float64(attrs.eps)
            # forward: bn_forward_apply(input, stats_from, partials, parts, count, eps, momentum,
            #   running_mean, running_var, saved_mean, saved_invstd, gamma, beta, pre, output, rows, cols, stats,
            #   stat_by_row, activation)
            self.apply = function(f"bn_forward_apply<{t}, {i}>")
            self.apply_grid = _gpu_apply_grid(plan, _APPLY_UNROLL)
            self.apply_tail = (self.pre,)  # + output + apply_end
            self.apply_end = (scalar(plan.rows), scalar(plan.cols), scalar(layout.stats),
                              np.int32(0 if plan.by_feature else 1), activations.code(attrs.activation))
            self.apply_inference = (_STATS_RUNNING, _NULL, scalar(1), count, eps, np.float64(0.0))
            self.saved_stats = (mean, invstd)
            # backward: output_grad + upstream + input come first in every backward kernel
            self.by_feature = plan.by_feature
            self.one_part = None  # SPATIAL with one part a channel: bn_spatial_forward_one_part
            self.upstream = (self.pre, activations.code(attrs.activation))
            self.coef = (saved["coef"],)
            self.backward_apply = function(f"bn_backward_apply<{t}, {i}>")
            # bn_backward_apply(..., coef_from, partials, parts, count, mean, invstd, coef, gamma, gamma_grad,
            #   beta_grad, input_grad, rows, cols, stats, stat_by_row, training)
            self.backward_apply_stats = (partials, scalar(plan.parts), count, mean, invstd, saved["coef"])
            self.backward_apply_end = self.apply_end[:4]
            if plan.by_feature:
                # bn_feature_grad(..., mean, invstd, rows, features, count, training, gamma_grad, beta_grad, coef)
                self.feature_grad = function(f"bn_feature_grad<{t}, {i}>")
                self.feature_grad_args = (mean, invstd, scalar(layout.outer), scalar(layout.stats), count)
                # bn_feature_stats(input, rows, features, eps, momentum, running_mean, running_var, mean, invstd)
                self.feature_stats = function(f"bn_feature_stats<{t}, {i}>")
                self.feature_head = (scalar(layout.outer), scalar(layout.stats), eps)
                self.apply_training = (_STATS_SAVED, _NULL, scalar(1), count, eps)
            else:
                size = layout.stats * plan.parts
                sums, squares = partials[:size], partials[size:2 * size]
                self.partials = function(f"bn_spatial_partials<{t}, {i}>")
                self.partials_grid = _grid2(plan.parts, layout.stats)
                partials_tail = (scalar(layout.stats), scalar(layout.inner), scalar(plan.chunk),
                                 scalar(plan.parts_per_row), scalar(plan.parts), count)
                if plan.parts == 1:
                    # bn_spatial_forward_one_part(input, count, eps, momentum, running_mean, running_var,
                    #   saved_mean, saved_invstd, gamma, beta, pre, output, channels, inner, activation)
                    self.one_part = function(f"bn_spatial_forward_one_part<{t}, {i}>")
                    self.one_part_grid = _grid2(1, layout.stats)
                    self.one_part_head = (count, eps)
                    self.one_part_end = (scalar(layout.stats), scalar(layout.inner), activations.code(attrs.activation))
                self.partials_args = [(sums, squares, _PARTIALS_SUMS) + partials_tail,
                                      (sums, squares, _PARTIALS_SQUARES) + partials_tail]
                self.apply_training = (_STATS_PARTIALS, partials, scalar(plan.parts), count, eps)
                # bn_spatial_grad_partials(..., mean, partials, channels, inner, chunk, parts_per_row, parts)
                self.grad_partials = function(f"bn_spatial_grad_partials<{t}, {i}>")
                self.grad_partials_args = (mean, partials) + partials_tail[:-1]
                # bn_spatial_grad_finalize(partials, parts, channels, invstd, count, training, gamma_grad,
                #   beta_grad, coef)
                self.grad_finalize = function(f"bn_spatial_grad_finalize<{t}>")
                self.grad_finalize_args = (partials, np.int64(plan.parts), np.int64(layout.stats), invstd, count)


def _gpu_calls(state: BatchNormState, attrs: BatchNormAttrs, dtype: np.dtype) -> _GpuCalls:
    calls = state.saved.get("calls")
    if calls is None:
        calls = state.saved["calls"] = _GpuCalls(state, attrs, dtype)
        if attrs.activation is not None:
            state.saved["pre"] = calls.pre
    return calls


def _wait_ready(stream, state) -> None:
    """Order the stream after init's fills, until they are seen complete (a query, no synchronization)."""
    ready = state.saved["ready"]
    if ready is not None:
        if ready.done:
            state.saved["ready"] = None
        else:
            stream.cupy_stream.wait_event(ready)


@core.gpu_kernel
def gpu_forward_kernel(stream, handle, state, attrs, input, gamma, beta, output, *, training: bool = True) -> None:
    """output = activation((input - mean) * invstd * gamma + beta), enqueued on the stream (see cpu_forward_kernel)."""
    _check_forward(stream, handle, state, attrs, input, gamma, beta, output, training)
    if input.size == 0:
        state.saved["forward"] = {"training": training, "empty": True}
        return
    calls = _gpu_calls(state, attrs, input.dtype)
    _wait_ready(stream, state)
    params = (gamma, beta) if attrs.affine else (_NULL, _NULL)
    running = (state.running_mean, state.running_var)
    if training:
        momentum = calls.fixed_momentum
        if momentum is None:
            momentum = np.float64(_momentum(state, attrs))
        else:
            state.num_batches_tracked += 1
        state.saved["forward"] = _FORWARD_TRAINING
        if calls.by_feature:
            gpu.launch(stream, calls.feature_stats, calls.stat_grid, _BLOCK,
                       (input,) + calls.feature_head + (momentum,) + running + calls.saved_stats)
        elif calls.one_part is not None:  # statistics and apply in one launch
            gpu.launch(stream, calls.one_part, calls.one_part_grid, _BLOCK,
                       (input,) + calls.one_part_head + (momentum,) + running + calls.saved_stats + params
                       + calls.apply_tail + (output,) + calls.one_part_end)
            return
        else:
            for args in calls.partials_args:
                gpu.launch(stream, calls.partials, calls.partials_grid, _BLOCK, (input,) + args)
        head = calls.apply_training + (momentum,)
    else:
        head = calls.apply_inference
        state.saved["forward"] = _FORWARD_INFERENCE
    gpu.launch(stream, calls.apply, calls.apply_grid, _BLOCK,
               (input,) + head + running + calls.saved_stats + params + calls.apply_tail + (output,) + calls.apply_end)


@core.gpu_kernel
def gpu_backward_kernel(stream, handle, state, attrs, output, output_grad, input, input_grad, gamma, beta,
                        gamma_grad, beta_grad) -> None:
    """Gradients of the forward before, enqueued on the stream (see cpu_backward_kernel)."""
    saved = _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, gamma, beta,
                            gamma_grad, beta_grad)
    if saved.get("empty"):
        for grad in (gamma_grad, beta_grad):
            if grad is not None:
                grad.fill(0)  # on the stream: GPU kernel calls run inside it
        return
    calls = _gpu_calls(state, attrs, input.dtype)
    _wait_ready(stream, state)
    # The activation's gradient is taken inside the kernels, from the pre-activation the forward kept.
    upstream = (output_grad,) + calls.upstream + (input,)
    training = saved["training"]
    flag = _TRUE if training else _FALSE
    grads = (_NULL if gamma_grad is None else gamma_grad, _NULL if beta_grad is None else beta_grad)
    need_sums = gamma_grad is not None or beta_grad is not None or (training and input_grad is not None)
    coef_from = _COEF_SAVED
    if need_sums:
        if calls.by_feature:
            gpu.launch(stream, calls.feature_grad, calls.stat_grid, _BLOCK,
                       upstream + calls.feature_grad_args + (flag,) + grads + calls.coef)
        else:
            gpu.launch(stream, calls.grad_partials, calls.partials_grid, _BLOCK, upstream + calls.grad_partials_args)
            if input_grad is None:
                gpu.launch(stream, calls.grad_finalize, calls.stat_grid, _BLOCK,
                           calls.grad_finalize_args + (flag,) + grads + calls.coef)
                return
            coef_from = _COEF_PARTIALS  # the apply finalizes: gamma_grad and beta_grad too
    if input_grad is not None:
        gpu.launch(stream, calls.backward_apply, calls.apply_grid, _BLOCK,
                   upstream + (coef_from,) + calls.backward_apply_stats + (gamma if attrs.affine else _NULL,) + grads
                   + (input_grad,) + calls.backward_apply_end + (flag,))


# --------------------------------------------------------------------------- dispatch


def forward_kernel(stream, handle, state, attrs, input, gamma, beta, output, *, training: bool = True) -> None:
    """Write output (training: batch statistics, running ones updated; inference: running statistics)."""
    core.dispatch(OP, cpu_forward_kernel, gpu_forward_kernel, stream, handle, state, attrs, input, gamma, beta, output,
                  training=training)


def backward_kernel(stream, handle, state, attrs, output, output_grad, input, input_grad, gamma, beta,
                    gamma_grad, beta_grad) -> None:
    """Write input_grad, gamma_grad and beta_grad (each skipped when None) for the forward before."""
    core.dispatch(OP, cpu_backward_kernel, gpu_backward_kernel, stream, handle, state, attrs, output, output_grad,
                  input, input_grad, gamma, beta, gamma_grad, beta_grad)


def cleanup_kernel(handle, state) -> None:
    """Release the state: running statistics, saved statistics, workspace."""
    core.cleanup_state(OP, handle, state)


cpu_init_kernel = gpu_init_kernel = init_kernel
cpu_cleanup_kernel = gpu_cleanup_kernel = cleanup_kernel
