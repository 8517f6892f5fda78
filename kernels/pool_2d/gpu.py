"""pool_2d on the GPU: the launches of pool_2d.cu (a plan per state and direction, made on the
first call and kept), enqueued on the stream."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import activation
from ..runtime import core, gpu, gpu_paths
from . import plan as _plan
from .attrs import OP, Pool2DAttrs, PoolOp, _saved, tap_dtype
from .plan import plan_paths

_CUDA = gpu.CudaModule("pool_2d.cu", [
    f"max_pool_{kind}<{value}, {tap}, {index}>"
    for kind in ("forward", "forward_tiled", "backward") for value in gpu.FLOAT_TYPES + gpu.HALF_TYPES
    for tap in ("unsigned char", "int") for index in gpu.INDEX_TYPES
] + [
    f"avg_pool_{direction}<{value}, {index}>"
    for direction in ("forward", "backward") for value in gpu.FLOAT_TYPES + gpu.HALF_TYPES
    for index in gpu.INDEX_TYPES
])

gpu_paths.declare(OP, {
    "max.forward_tiled": "max_pool_forward_tiled: a block per output tile, its input window staged in shared memory",
    "max.forward_direct": "max_pool_forward: a thread per output (the tile would exceed 48 KB of shared memory)",
    "max.backward": "max_pool_backward: a thread per input element, gathering from the saved argmax taps",
    "max.taps_u8": "argmax taps as unsigned char (a window of at most 255 taps)",
    "max.taps_i32": "argmax taps as int (a window of more than 255 taps)",
    "avg.forward": "avg_pool_forward: a thread per output",
    "avg.backward": "avg_pool_backward: a thread per input element, gathering its windows' shares",
})


def _gpu_plan(attrs: Pool2DAttrs, direction: str, dtype: Any, input_dims: tuple[int, ...],
              output_dims: tuple[int, ...]) -> tuple:
    """(gpu.PackedLaunch, paths) of one pool kernel, made once per state and direction. Forward: a block
    per tile of outputs (MAX, where the tile fits shared memory) or a thread per output; backward: a thread
    per input element."""
    n, c, height, width = input_dims
    out_h, out_w = output_dims[2:]
    count = core.numel(output_dims if direction == "forward" else input_dims)
    index = gpu.index_type(core.numel(input_dims), core.numel(output_dims))
    scalar = np.int32 if index == "int" else np.int64
    geometry = tuple(np.int32(v) for v in (height, width, out_h, out_w, attrs.kernel_h, attrs.kernel_w,
                                           attrs.stride_h, attrs.stride_w, attrs.padding_h, attrs.padding_w))
    value = gpu.cuda_type(dtype)
    if attrs.pool_type is PoolOp.MAX:
        types = f"<{value}, {gpu.cuda_type(tap_dtype(attrs))}, {index}>"
        tile = _plan.max_forward_tile(attrs, out_h, out_w, np.dtype(dtype).itemsize) if direction == "forward" else None
        if tile is not None:
            tile_h, tile_w, tiles_h, tiles_w, shared = tile
            scalars = (scalar(n * c),) + geometry + (np.int32(tile_h), np.int32(tile_w), np.int32(tiles_w))
            return (gpu.packed(_CUDA.function(f"max_pool_forward_tiled{types}"),
                               (tiles_h * tiles_w, gpu.capped(n * c, 65535)), gpu.BLOCK, 3, scalars, shared),
                    plan_paths(attrs, direction, True))
        name = f"max_pool_{direction}{types}"
        scalars = (scalar(count),) + geometry
    else:
        name = f"avg_pool_{direction}<{value}, {index}>"
        scalars = (scalar(count),) + geometry + (np.int32(attrs.count_include_pad),)
    arrays = 3 if attrs.pool_type is PoolOp.MAX else 2  # MAX: the argmax taps too
    return gpu.packed(_CUDA.function(name), gpu.grid_for(count), gpu.BLOCK, arrays, scalars), \
        plan_paths(attrs, direction, False)


def _gpu_forward_setup(stream, state, attrs, output) -> tuple:
    """The forward's buffers (argmax taps, pre-activation; made on the stream's device, once)
    and launch plan, kept in the state: (launch, paths, taps, pre), or None for an empty output."""
    taps = _saved(state, "taps", gpu.cupy, output.shape, tap_dtype(attrs)) if attrs.pool_type is PoolOp.MAX else None
    pre = None if attrs.activation is None else _saved(state, "pre", gpu.cupy, output.shape, output.dtype)
    if not output.size:
        return None
    shapes = state.shapes
    return _gpu_plan(attrs, "forward", output.dtype, shapes["input_shape"].dims, shapes["output_shape"].dims) + (taps, pre)


def forward(stream: gpu.GpuStream, state: core.KernelState, attrs: Pool2DAttrs, input: Any, output: Any) -> None:
    """output = activation(pool(input)), enqueued on the stream; MAX saves the argmax taps."""
    saved = state.saved
    if "gpu_forward" not in saved:
        saved["gpu_forward"] = _gpu_forward_setup(stream, state, attrs, output)
    plan = saved["gpu_forward"]
    if plan is None:
        return
    launch, paths, taps, pre = plan
    for path in paths:
        gpu_paths.reach(path)
    pooled = output if pre is None else pre
    if taps is None:
        launch(stream, input, pooled)
    else:
        launch(stream, input, pooled, taps)
    if pre is not None:
        activation.gpu_forward(stream, attrs.activation, pre, output)


def _gpu_backward_setup(stream, state, attrs, output_grad) -> tuple:
    """The backward's buffer (the pre-activation gradient, made once) and launch plan, kept in the
    state: (launch, paths, pre_grad)."""
    pre_grad = None
    if attrs.activation is not None:
        pre_grad = _saved(state, "pre_grad", gpu.cupy, output_grad.shape, output_grad.dtype)
    shapes = state.shapes
    return _gpu_plan(attrs, "backward", output_grad.dtype, shapes["input_shape"].dims,
                     shapes["output_shape"].dims) + (pre_grad,)


def backward(stream: gpu.GpuStream, state: core.KernelState, attrs: Pool2DAttrs, output_grad: Any,
             input_grad: Any) -> None:
    """input_grad = the gather of output_grad to the windows' elements, enqueued on the stream."""
    saved = state.saved
    if "gpu_backward" not in saved:
        saved["gpu_backward"] = _gpu_backward_setup(stream, state, attrs, output_grad)
    launch, paths, pre_grad = saved["gpu_backward"]
    for path in paths:
        gpu_paths.reach(path)
    grad = output_grad
    if pre_grad is not None:
        activation.gpu_backward(stream, attrs.activation, saved["pre"], output_grad, pre_grad)
        grad = pre_grad
    if attrs.pool_type is PoolOp.MAX:
        launch(stream, grad, saved["taps"], input_grad)
    else:
        launch(stream, grad, input_grad)
