"""element_unary on the GPU: the launches of element_unary.cu (a device copy where the result is
the input or output_grad itself), planned once per state and kept in it. The arguments are checked,
and the call runs inside its stream (core.gpu_kernel), before anything here runs."""

from __future__ import annotations

import numpy as np

from ..runtime import core, gpu, gpu_paths
from .attrs import OP, ElementUnaryAttrs, UnaryOpType
from .plan import _COPY_BACKWARD, plan_paths

_CUDA = gpu.CudaModule("element_unary.cu", [
    f"element_unary_{direction}<{cuda_type}, {op_type.value}>"
    for direction in ("forward", "backward") for cuda_type in gpu.HALF_TYPES + gpu.FLOAT_TYPES for op_type in UnaryOpType
], defines={f"OP_{op_type.name}": op_type.value for op_type in UnaryOpType})

_PACK_BYTES = 16  # each thread moves 16-byte packs where every pointer allows it

gpu_paths.declare(OP, {
    "copy": "IDENTITY forward, and the backward of IDENTITY, SCALAR_ADD and SCALAR_SUB: one device copy",
    **{f"{direction}.{op_type.name.lower()}": f"element_unary_{direction}<T, {op_type.name}>"
       for direction in ("forward", "backward") for op_type in UnaryOpType
       if not (op_type is UnaryOpType.IDENTITY or (direction == "backward" and op_type.name in ("SCALAR_ADD", "SCALAR_SUB")))},
    **{f"{direction}.packs": f"{direction}, every pointer 16-byte aligned: 16-byte packs, then the elements after them"
       for direction in ("forward", "backward")},
    **{f"{direction}.scalars": f"{direction}, some pointer not 16-byte aligned: one element at a time"
       for direction in ("forward", "backward")},
})


def _gpu_plan(state, direction: str, attrs: ElementUnaryAttrs, dtype: np.dtype, count: int, aligned: bool) -> tuple:
    """(the PackedLaunch, paths) of one direction and alignment, made on first use and kept in the state."""
    key = ("gpu", direction, aligned)
    plan = state.saved.get(key)
    if plan is None:
        kernel = _CUDA.function(f"element_unary_{direction}<{gpu.cuda_type(dtype)}, {attrs.op_type.value}>")
        scalar = core.compute_dtype(dtype).type(0.0 if attrs.scalar is None else attrs.scalar)  # float32 for halves
        per_thread = _PACK_BYTES // dtype.itemsize if aligned else 1
        arrays = 2 if direction == "forward" else 3
        plan = state.saved[key] = (gpu.packed(kernel, gpu.grid_for(count, per_thread=per_thread), gpu.BLOCK, arrays,
                                              (np.int64(count), scalar, np.int32(aligned))),
                                   plan_paths(direction, attrs.op_type, aligned))
    return plan


def forward(stream: gpu.GpuStream, state: core.KernelState, attrs: ElementUnaryAttrs, input: core.Array,
            output: core.Array) -> None:
    """output = f(input), enqueued on the stream."""
    count = input.size
    if not count:
        return
    if attrs.op_type is UnaryOpType.IDENTITY:
        gpu_paths.reach("element_unary.copy")
        gpu.copy_async(stream, output, input)
        return
    launch, paths = _gpu_plan(state, "forward", attrs, output.dtype, count,
                              (input.data.ptr | output.data.ptr) % _PACK_BYTES == 0)
    gpu_paths.reach(paths[0])
    gpu_paths.reach(paths[1])
    launch(stream, input, output)


def backward(stream: gpu.GpuStream, state: core.KernelState, attrs: ElementUnaryAttrs, output_grad: core.Array,
             input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = output_grad * f'(input), enqueued on the stream."""
    if input_grad is None:
        return
    count = input_grad.size
    if not count:
        return
    if attrs.op_type in _COPY_BACKWARD:
        gpu_paths.reach("element_unary.copy")
        gpu.copy_async(stream, input_grad, output_grad)
        return
    # Constant derivatives never read input; output_grad stands in for it when it is None.
    source = output_grad if input is None else input
    launch, paths = _gpu_plan(state, "backward", attrs, input_grad.dtype, count,
                              (source.data.ptr | output_grad.data.ptr | input_grad.data.ptr) % _PACK_BYTES == 0)
    gpu_paths.reach(paths[0])
    gpu_paths.reach(paths[1])
    launch(stream, source, output_grad, input_grad)
