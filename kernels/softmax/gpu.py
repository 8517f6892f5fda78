"""softmax on the GPU: the launches of softmax.cu, planned once per state (plan.gpu_plan) and kept
in it. The arguments are checked, and the call runs inside its stream (core.gpu_kernel), before
anything here runs."""

from __future__ import annotations

from ..runtime import core, gpu, gpu_paths
from .attrs import OP, _axis
from .plan import _CACHED_COLUMN_SIZES, _WIDTHS_AND_PER_LANE, gpu_plan, plan_path

_TYPES = gpu.HALF_TYPES + gpu.FLOAT_TYPES
_CUDA = gpu.CudaModule("softmax.cu", [
    f"softmax_{direction}_rows<{t}, {width}, {per_lane}>"
    for direction in ("forward", "backward") for t in _TYPES for width, per_lane in _WIDTHS_AND_PER_LANE
] + [
    f"softmax_{direction}_{kind}<{t}>"
    for direction in ("forward", "backward") for kind in ("block", "columns") for t in _TYPES
] + [
    f"softmax_{direction}_columns_cached<{t}, {size}>"
    for direction in ("forward", "backward") for t in _TYPES for size in _CACHED_COLUMN_SIZES
])


gpu_paths.declare(OP, {
    "rows.shared_warp": "*_rows<T, WIDTH < 32, 1>: rows of at most 16 in registers, several rows a warp",
    "rows.warp": "*_rows<T, 32, 1>: rows of 17 to 32, one a warp, an element a lane",
    "rows.registers": "*_rows<T, 32, PER_LANE > 1>: rows of 33 to 1024, one a warp, PER_LANE elements a lane",
    "columns_cached": "*_columns_cached<T, SIZE>: inner > 1, a dim of at most 32 kept in a thread's registers",
    "block": "*_block<T>: a block per row or column (rows over 1024, or few columns along a dim of 512 or more)",
    "columns": "*_columns<T>: inner > 1, a thread per column along a dim over 32",
    **{f"{direction}": f"softmax_{direction}_*: the {direction} kernels" for direction in ("forward", "backward")},
})


def _gpu_plan(state: core.KernelState) -> tuple:
    if "plan" not in state.saved:
        shape = state.shapes["input_shape"]
        state.saved["plan"] = gpu_plan(shape.dims, _axis(state), shape.dtype)
    return state.saved["plan"]


def _gpu_launch(state: core.KernelState, direction: str) -> tuple:
    """(gpu.PackedLaunch, paths) of one direction, made on first use and kept in the state."""
    key = "gpu_" + direction
    launch = state.saved.get(key)
    if launch is None:
        kind, grid, block, sizes = _gpu_plan(state)
        launch = state.saved[key] = (gpu.packed(_CUDA.function(f"softmax_{direction}_{kind}"), grid, block,
                                                2 if direction == "forward" else 3, sizes),
                                     (f"{OP}.{direction}", plan_path(kind)))
    return launch


def forward(stream: gpu.GpuStream, state: core.KernelState, input: core.Array, output: core.Array) -> None:
    """output = softmax(input) along dim, enqueued on the stream."""
    if input.size == 0:
        return
    launch, paths = _gpu_launch(state, "forward")
    gpu_paths.reach(paths[0])
    gpu_paths.reach(paths[1])
    launch(stream, input, output)


def backward(stream: gpu.GpuStream, state: core.KernelState, output: core.Array, output_grad: core.Array,
             input_grad: core.Array | None) -> None:
    """input_grad = output * (output_grad - sum(output_grad * output)) along dim, enqueued on the stream."""
    if input_grad is None or input_grad.size == 0:
        return
    launch, paths = _gpu_launch(state, "backward")
    gpu_paths.reach(paths[0])
    gpu_paths.reach(paths[1])
    launch(stream, output, output_grad, input_grad)
