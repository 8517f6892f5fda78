"""batch_norm on the GPU: the launches of batch_norm.cu, worked out once per state. The
arguments are checked, and the call runs inside its stream (core.gpu_kernel), before
anything here runs.

Custom kernels rather than cuDNN: cuDNN's batch norm leaves the precision and
order of its reductions to the library (no promise of the same bits as the
CPU), fuses no SiLU or GELU (its Ex variant knows ReLU), and older releases
refused eps < 1e-5 (CUDNN_BN_MIN_EPSILON; 0 since cuDNN 8). These kernels
reduce in float64 in a fixed order with no atomics (deterministic: the same
bits on every run), follow torch's conventions exactly (unbiased running
variance, cumulative momentum) and do the same float64 operations as cpu.py,
so that the CPU and the GPU agree to the bit wherever the sums are exact.
float16 and bfloat16 data run the same kernels (half_t, bfloat16_t), their
parameters and running statistics float32 (see the package's docstring).

SPATIAL training: a partial-sum kernel over (part, channel) blocks, then the
same kernel again for the sum of squared deviations (each block recomputes
the mean from the partials in the same order: two-pass, as the CPU), then the
elementwise apply, each of whose blocks recomputes its channel's mean and
invstd from the partials in that same order (block x 0 writes them for
backward and updates the running statistics): 3 launches; 1 where a channel
is one part (N 1, H*W <= plan.CHUNK: one block reduces and applies it, with the
same operations, bn_spatial_forward_one_part). SPATIAL inference: the apply
alone, computing invstd from the running variance. PER_ACTIVATION (and
SPATIAL without spatial dims): one thread per statistic reduces over N, then
the same apply (inference: the apply alone). Backward mirrors it.

Host time is most of a call on small layers: what a call launches (kernels,
grids, the fixed arguments) is worked out once per state (GpuCalls), so that
a call is its checks and its launches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import activation as activations
from ..runtime import gpu, gpu_paths
from .attrs import SavedForward
from .plan import APPLY_UNROLL, BLOCK, PACK_BYTES, GpuPlan, gpu_plan, grid2, inference_launch

if TYPE_CHECKING:
    from .attrs import BatchNormAttrs, BatchNormState

_NULL = np.uint64(0)  # a null pointer argument (absent gamma, beta or gradient)
# bn_spatial_partials' `what` and bn_forward_apply's `stats_from` (BN_PARTIALS_*, BN_STATS_* of batch_norm.cu)
_PARTIALS_SUMS, _PARTIALS_SQUARES = np.int32(0), np.int32(1)
_STATS_SAVED, _STATS_RUNNING, _STATS_PARTIALS = np.int32(0), np.int32(1), np.int32(2)
_COEF_SAVED, _COEF_PARTIALS = np.int32(0), np.int32(1)  # bn_backward_apply's `coef_from` (BN_COEF_*)
_FALSE, _TRUE = np.int32(0), np.int32(1)
_FORWARD_TRAINING, _FORWARD_INFERENCE = SavedForward(True), SavedForward(False)  # state.forward, made once

# What Python and batch_norm.cu share, defined here and in plan.py, reaching the source as -D options.
DEFINES = {
    "BN_BLOCK": BLOCK, "BN_APPLY_UNROLL": APPLY_UNROLL,
    "BN_PARTIALS_SUMS": _PARTIALS_SUMS, "BN_PARTIALS_SQUARES": _PARTIALS_SQUARES,
    "BN_STATS_SAVED": _STATS_SAVED, "BN_STATS_RUNNING": _STATS_RUNNING, "BN_STATS_PARTIALS": _STATS_PARTIALS,
    "BN_COEF_SAVED": _COEF_SAVED, "BN_COEF_PARTIALS": _COEF_PARTIALS,
}

gpu_paths.declare("batch_norm", {
    "forward.by_feature": "training, PER_ACTIVATION (or no spatial dims): bn_feature_stats, a thread per statistic",
    "forward.one_part": "training, SPATIAL, a channel one part: bn_spatial_forward_one_part, statistics and apply at once",
    "forward.partials": "training, SPATIAL, a channel of several parts: bn_spatial_partials twice (sums, squares)",
    "forward.apply_training": "bn_forward_apply with the batch statistics (saved, or from the partials)",
    "forward.apply_inference": "inference: bn_forward_apply with the running statistics",
    "forward.inference_packs": "inference, SPATIAL, no activation or SiLU, rows of whole 16-byte packs, tensors "
                               "aligned: bn_inference_apply, a pack a thread, the activation compiled in",
    "backward.by_feature": "bn_feature_grad: a thread per statistic reduces the gradient sums over N",
    "backward.partials": "SPATIAL: bn_spatial_grad_partials, the gradient sums per (part, channel)",
    "backward.finalize": "SPATIAL, input_grad not wanted: bn_spatial_grad_finalize writes gamma_grad, beta_grad",
    "backward.apply_from_partials": "SPATIAL with sums: bn_backward_apply finalizes the partials itself",
    "backward.apply_from_saved": "bn_backward_apply with coefficients saved (by_feature, or no sums needed)",
    "empty": "a zero-size input: nothing computed, gamma_grad and beta_grad zeros",
})

# The activation codes bn_inference_apply is compiled for (YOLOv10's: none and SiLU); others take bn_forward_apply.
INFERENCE_ACTIVATIONS = (int(activations.code(None)), int(activations.code(activations.Activation.SILU)))


def _inference_name(dtype: Any, index: str, code: int) -> str:
    return f"bn_inference_apply<{gpu.cuda_type(dtype)}, {index}, {PACK_BYTES // np.dtype(dtype).itemsize}, {code}>"


_CUDA = gpu.CudaModule("batch_norm.cu", [
    f"{kernel}<{t}, {i}>"
    for kernel in ("bn_spatial_partials", "bn_feature_stats", "bn_forward_apply", "bn_spatial_forward_one_part",
                   "bn_spatial_grad_partials", "bn_feature_grad", "bn_backward_apply")
    for t in gpu.FLOAT_TYPES + gpu.HALF_TYPES for i in gpu.INDEX_TYPES
] + [
    _inference_name(dtype, i, code) for dtype in (np.float32, np.float64, np.float16, gpu.BFLOAT16)
    for i in gpu.INDEX_TYPES for code in INFERENCE_ACTIVATIONS
] + [
    f"{kernel}<{t}>" for kernel in ("bn_spatial_grad_finalize",)  # t: the parameters' type (float for half data)
    for t in gpu.FLOAT_TYPES
], defines=DEFINES)


def init(state: BatchNormState, dtype: np.dtype) -> None:
    """The state's plan and device memory: the running statistics (filled with 0 and 1 on the legacy
    stream and waited for), the saved statistics and the workspace."""
    cupy = gpu.cupy
    layout = state.layout
    plan = state.plan = gpu_plan(layout)
    device = state.device
    stats = max(layout.stats, 1)
    # The state's memory: gpu.device_empty (outside CuPy's pool; freed only once the device is done).
    state.running_mean = gpu.device_empty(layout.stat_dims, state.stat_shape.dtype, device)
    state.running_var = gpu.device_empty(layout.stat_dims, state.stat_shape.dtype, device)
    state.saved_mean = gpu.device_empty((stats,), np.float64, device)
    state.saved_invstd = gpu.device_empty((stats,), np.float64, device)
    state.coef = gpu.device_empty((2 * stats,), np.float64, device)  # backward: grad_mean, k per statistic
    state.partials = gpu.device_empty((2 * stats * max(plan.parts, 1) if not plan.by_feature else 1,), np.float64,
                                      device)
    with cupy.cuda.Device(device), cupy.cuda.Stream.null:
        # init has no stream: the fills go on the legacy stream and init waits for them, so the
        # statistics hold 0 and 1 for any stream that reads them next (a caller's copy, a kernel
        # call), whatever CuPy's current stream is or however busy it is. The event stays for the
        # calls' cheap check (seen complete at once).
        state.running_mean.fill(0)
        state.running_var.fill(1)
        ready = cupy.cuda.Event(disable_timing=True)
        ready.record()
        ready.synchronize()
    state.ready = ready


def _apply_grid(plan: GpuPlan, per_thread: int = 1) -> tuple[int, int]:
    return grid2(-(-plan.cols // (BLOCK * per_thread)), plan.rows)


class GpuCalls:
    """Everything about a state's launches that does not change from call to call: the kernels
    (compiled on first use), grids, views of the workspace and the fixed arguments, in order.
    Made by the first non-empty GPU call on a state (_calls), kept in state.calls."""

    def __init__(self, state: BatchNormState, attrs: BatchNormAttrs, dtype: np.dtype) -> None:
        layout, plan = state.layout, state.plan
        t, i, scalar = gpu.cuda_type(dtype), plan.index, plan.scalar
        with gpu.cupy.cuda.Device(state.device):
            def function(name: str) -> Any:
                return _CUDA.function(name, state.device)

            # The pre-activation a fused activation's backward reads (none for a state without backward:
            # the kernels then write the output alone).
            self.pre = (gpu.device_empty(state.shapes["input_shape"].dims, dtype, state.device)
                        if attrs.activation is not None and attrs.backward else _NULL)
            mean, invstd, partials = state.saved_mean, state.saved_invstd, state.partials
            self.fixed_momentum = None if attrs.momentum is None else np.float64(attrs.momentum)
            self.stat_grid = gpu.grid_for(layout.stats)
            count, eps = np.float64(layout.count), np.float64(attrs.eps)
            # forward: bn_forward_apply(input, stats_from, partials, parts, count, eps, momentum,
            #   running_mean, running_var, saved_mean, saved_invstd, gamma, beta, pre, output, rows, cols, stats,
            #   stat_by_row, activation)
            self.apply = function(f"bn_forward_apply<{t}, {i}>")
            self.apply_grid = _apply_grid(plan, APPLY_UNROLL)
            # inference in packs (calls whose tensors are aligned): bn_inference_apply(input, eps, running_mean,
            #   running_var, saved_mean, saved_invstd, gamma, beta, pre, output, rows, cols, stats)
            code = int(activations.code(attrs.activation))
            launch = inference_launch(plan, np.dtype(dtype).itemsize) if code in INFERENCE_ACTIVATIONS else None
            self.inference = None
            if launch is not None:
                _, self.inference_block, self.inference_grid = launch
                self.inference = function(_inference_name(dtype, i, code))
                self.inference_head = (eps,)
                self.inference_end = (scalar(plan.rows), scalar(plan.cols), scalar(layout.stats))
            self.apply_tail = (self.pre,)  # + output + apply_end
            self.apply_end = (scalar(plan.rows), scalar(plan.cols), scalar(layout.stats),
                              np.int32(0 if plan.by_feature else 1), activations.code(attrs.activation))
            self.apply_inference = (_STATS_RUNNING, _NULL, scalar(1), count, eps, np.float64(0.0))
            self.saved_stats = (mean, invstd)
            # backward: output_grad + upstream + input come first in every backward kernel
            self.by_feature = plan.by_feature
            self.one_part = None  # SPATIAL with one part a channel: bn_spatial_forward_one_part
            self.upstream = (self.pre, activations.code(attrs.activation))
            self.coef = (state.coef,)
            self.backward_apply = function(f"bn_backward_apply<{t}, {i}>")
            # bn_backward_apply(..., coef_from, partials, parts, count, mean, invstd, coef, gamma, gamma_grad,
            #   beta_grad, input_grad, rows, cols, stats, stat_by_row, training)
            self.backward_apply_stats = (partials, scalar(plan.parts), count, mean, invstd, state.coef)
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
                self.partials_grid = grid2(plan.parts, layout.stats)
                partials_tail = (scalar(layout.stats), scalar(layout.inner), scalar(plan.chunk),
                                 scalar(plan.parts_per_row), scalar(plan.parts), count)
                if plan.parts == 1:
                    # bn_spatial_forward_one_part(input, count, eps, momentum, running_mean, running_var,
                    #   saved_mean, saved_invstd, gamma, beta, pre, output, channels, inner, activation)
                    self.one_part = function(f"bn_spatial_forward_one_part<{t}, {i}>")
                    self.one_part_grid = grid2(1, layout.stats)
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
                self.grad_finalize = function(f"bn_spatial_grad_finalize<{gpu.cuda_type(state.stat_shape.dtype)}>")
                self.grad_finalize_args = (partials, np.int64(plan.parts), np.int64(layout.stats), invstd, count)


def _calls(state: BatchNormState, attrs: BatchNormAttrs, dtype: np.dtype) -> GpuCalls:
    calls = state.calls
    if calls is None:
        calls = state.calls = GpuCalls(state, attrs, dtype)
        if attrs.activation is not None and attrs.backward:
            state.pre = calls.pre
    return calls


def _wait_ready(stream: gpu.GpuStream, state: BatchNormState) -> None:
    """Order the stream after init's fills, until they are seen complete (a query, no synchronization)."""
    ready = state.ready
    if ready is not None:
        if ready.done:
            state.ready = None
        else:
            stream.cupy_stream.wait_event(ready)


def forward(stream: gpu.GpuStream, state: BatchNormState, attrs: BatchNormAttrs, input: Any, gamma: Any, beta: Any,
            output: Any, training: bool) -> None:
    """output = activation((input - mean) * invstd * gamma + beta), enqueued on the stream (see cpu.forward)."""
    if input.size == 0:
        gpu_paths.reach("batch_norm.empty")
        state.forward = SavedForward(training, empty=True)
        return
    calls = _calls(state, attrs, input.dtype)
    _wait_ready(stream, state)
    params = (gamma, beta) if attrs.affine else (_NULL, _NULL)
    running = (state.running_mean, state.running_var)
    if training:
        momentum = calls.fixed_momentum
        if momentum is None:
            momentum = np.float64(state.training_step())
        else:
            state.num_batches_tracked += 1
        state.forward = _FORWARD_TRAINING
        if calls.by_feature:
            gpu_paths.reach("batch_norm.forward.by_feature")
            gpu.launch(stream, calls.feature_stats, calls.stat_grid, BLOCK,
                       (input,) + calls.feature_head + (momentum,) + running + calls.saved_stats)
        elif calls.one_part is not None:  # statistics and apply in one launch
            gpu_paths.reach("batch_norm.forward.one_part")
            gpu.launch(stream, calls.one_part, calls.one_part_grid, BLOCK,
                       (input,) + calls.one_part_head + (momentum,) + running + calls.saved_stats + params
                       + calls.apply_tail + (output,) + calls.one_part_end)
            return
        else:
            gpu_paths.reach("batch_norm.forward.partials")
            for args in calls.partials_args:
                gpu.launch(stream, calls.partials, calls.partials_grid, BLOCK, (input,) + args)
        head = calls.apply_training + (momentum,)
        gpu_paths.reach("batch_norm.forward.apply_training")
    else:
        state.forward = _FORWARD_INFERENCE
        if calls.inference is not None and (input.data.ptr | output.data.ptr) % PACK_BYTES == 0:  # pre: ours, aligned
            gpu_paths.reach("batch_norm.forward.inference_packs")
            gpu.launch(stream, calls.inference, calls.inference_grid, calls.inference_block,
                       (input,) + calls.inference_head + running + calls.saved_stats + params
                       + calls.apply_tail + (output,) + calls.inference_end)
            return
        head = calls.apply_inference
        gpu_paths.reach("batch_norm.forward.apply_inference")
    gpu.launch(stream, calls.apply, calls.apply_grid, BLOCK,
               (input,) + head + running + calls.saved_stats + params + calls.apply_tail + (output,) + calls.apply_end)


def backward(stream: gpu.GpuStream, state: BatchNormState, attrs: BatchNormAttrs, saved: SavedForward,
             output_grad: Any, input: Any, input_grad: Any, gamma: Any, gamma_grad: Any, beta_grad: Any) -> None:
    """Gradients of the forward before, enqueued on the stream (see cpu.backward)."""
    if saved.empty:
        gpu_paths.reach("batch_norm.empty")
        for grad in (gamma_grad, beta_grad):
            if grad is not None:
                grad.fill(0)  # on the stream: GPU kernel calls run inside it
        return
    calls = _calls(state, attrs, input.dtype)
    _wait_ready(stream, state)
    # The activation's gradient is taken inside the kernels, from the pre-activation the forward kept.
    upstream = (output_grad,) + calls.upstream + (input,)
    training = saved.training
    flag = _TRUE if training else _FALSE
    grads = (_NULL if gamma_grad is None else gamma_grad, _NULL if beta_grad is None else beta_grad)
    need_sums = gamma_grad is not None or beta_grad is not None or (training and input_grad is not None)
    coef_from = _COEF_SAVED
    if need_sums:
        if calls.by_feature:
            gpu_paths.reach("batch_norm.backward.by_feature")
            gpu.launch(stream, calls.feature_grad, calls.stat_grid, BLOCK,
                       upstream + calls.feature_grad_args + (flag,) + grads + calls.coef)
        else:
            gpu_paths.reach("batch_norm.backward.partials")
            gpu.launch(stream, calls.grad_partials, calls.partials_grid, BLOCK, upstream + calls.grad_partials_args)
            if input_grad is None:
                gpu_paths.reach("batch_norm.backward.finalize")
                gpu.launch(stream, calls.grad_finalize, calls.stat_grid, BLOCK,
                           calls.grad_finalize_args + (flag,) + grads + calls.coef)
                return
            coef_from = _COEF_PARTIALS  # the apply finalizes: gamma_grad and beta_grad too
    if input_grad is not None:
        gpu_paths.reach("batch_norm.backward.apply_from_partials" if coef_from is _COEF_PARTIALS
                        else "batch_norm.backward.apply_from_saved")
        gpu.launch(stream, calls.backward_apply, calls.apply_grid, BLOCK,
                   upstream + (coef_from,) + calls.backward_apply_stats + (gamma if attrs.affine else _NULL,) + grads
                   + (input_grad,) + calls.backward_apply_end + (flag,))
