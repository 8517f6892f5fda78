"""upsample on the GPU: the launches of upsample.cu (scale 2's pair-aligned NEAREST through the x2
kernels), planned once per state and alignment and kept in it. The arguments are checked, and the call
runs inside its stream (core.gpu_kernel), before anything here runs."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import core, gpu, gpu_paths
from .attrs import NEAREST_BACKWARD_DTYPES, OP, UpsampleAttrs, UpsampleMode
from .plan import plan_path

_VEC2_BITS = tuple(t for t in gpu.BITS_TYPES if t != "ulonglong2")  # 16-byte elements have no pair type
_ARITHMETIC = tuple(gpu.cuda_type(d) for d in NEAREST_BACKWARD_DTYPES)

_CUDA = gpu.CudaModule("upsample.cu", [
    *(f"upsample_nearest_forward<{t}, {i}>" for t in gpu.BITS_TYPES for i in gpu.INDEX_TYPES),
    *(f"upsample_nearest_forward_x2<{t}, {i}>" for t in _VEC2_BITS for i in gpu.INDEX_TYPES),
    *(f"upsample_nearest_backward{x2}<{t}, {i}>" for x2 in ("", "_x2") for t in _ARITHMETIC for i in gpu.INDEX_TYPES),
    *(f"upsample_bilinear_{d}<{t}, {i}>" for d in ("forward", "backward") for t in gpu.FLOAT_TYPES + gpu.HALF_TYPES
      for i in gpu.INDEX_TYPES),
], options=("--fmad=false",))  # no contraction: bilinear rounds exactly as the NumPy twin does


gpu_paths.declare(OP, {
    "nearest.forward": "upsample_nearest_forward: a thread per input element, writing its scale x scale block",
    "nearest.forward_x2": "upsample_nearest_forward_x2: scale 2 and the output pair-aligned, two elements a store",
    "nearest.backward": "upsample_nearest_backward: a thread per input element, summing its block",
    "nearest.backward_x2": "upsample_nearest_backward_x2: scale 2 and output_grad pair-aligned, two elements a load",
    "bilinear.forward": "upsample_bilinear_forward: a thread per output element",
    "bilinear.backward": "upsample_bilinear_backward: a thread per input element, gathering its weighted sources",
})


def _aligned_pair(array: Any) -> bool:
    """Whether `array` may be read or written two elements at a time (the s = 2 vector paths)."""
    return array.dtype.itemsize <= 8 and array.data.ptr % (2 * array.dtype.itemsize) == 0


def _gpu_plan(kind: str, type_name: str, count: int, total: int, args: tuple, scale: int,
              vector: bool) -> gpu.PackedLaunch:
    """The launch of one upsample kernel: its two arrays, then its scalars."""
    index = gpu.index_type(total)
    scalar = np.int32 if index == "int" else np.int64
    suffix = "_x2" if vector else ""
    name = f"upsample_{kind}{suffix}<{type_name}, {index}>"
    scale_args = () if vector else (np.int32(scale),)
    return gpu.packed(_CUDA.function(name), gpu.grid_for(count), gpu.BLOCK, 2,
                      (scalar(count),) + tuple(scalar(a) for a in args) + scale_args)


def _forward_plan(attrs, input, output, vector: bool) -> gpu.PackedLaunch:
    _, _, h, w = input.shape
    if attrs.mode is UpsampleMode.NEAREST:
        return _gpu_plan("nearest_forward", gpu.bits_type(input.dtype), input.size, output.size, (w,),
                         attrs.scale_factor, vector)
    return _gpu_plan("bilinear_forward", gpu.cuda_type(input.dtype), output.size, output.size, (h, w),
                     attrs.scale_factor, False)


def _backward_plan(attrs, output_grad, input_grad, vector: bool) -> gpu.PackedLaunch:
    _, _, h, w = input_grad.shape
    type_name = gpu.cuda_type(input_grad.dtype)
    if attrs.mode is UpsampleMode.NEAREST:
        return _gpu_plan("nearest_backward", type_name, input_grad.size, output_grad.size, (w,),
                         attrs.scale_factor, vector)
    return _gpu_plan("bilinear_backward", type_name, input_grad.size, output_grad.size, (h, w),
                     attrs.scale_factor, False)


def _pairs(attrs: UpsampleAttrs, array: Any) -> bool:
    """Whether the nearest x2 kernels' vector path applies: scale 2 and `array` pair-aligned."""
    return attrs.mode is UpsampleMode.NEAREST and attrs.scale_factor == 2 and _aligned_pair(array)


def forward(stream: gpu.GpuStream, state: core.KernelState, attrs: UpsampleAttrs, input: core.Array,
            output: core.Array) -> None:
    """output = input upsampled, enqueued on the stream."""
    if output.size == 0:
        return
    vector = _pairs(attrs, output)
    key = ("gpu_forward", vector)
    plan = state.saved.get(key)
    if plan is None:
        plan = state.saved[key] = (_forward_plan(attrs, input, output, vector), plan_path(attrs, "forward", vector))
    launch, path = plan
    gpu_paths.reach(path)
    launch(stream, input, output)


def backward(stream: gpu.GpuStream, state: core.KernelState, attrs: UpsampleAttrs, output_grad: core.Array,
             input_grad: core.Array | None) -> None:
    """input_grad = the gathered sum of output_grad over each input element's sources, enqueued on the stream."""
    if input_grad is None or input_grad.size == 0:
        return
    vector = _pairs(attrs, output_grad)
    key = ("gpu_backward", vector)
    plan = state.saved.get(key)
    if plan is None:
        plan = state.saved[key] = (_backward_plan(attrs, output_grad, input_grad, vector),
                                   plan_path(attrs, "backward", vector))
    launch, path = plan
    gpu_paths.reach(path)
    launch(stream, output_grad, input_grad)
