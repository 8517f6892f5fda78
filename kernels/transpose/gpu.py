"""transpose on the GPU: the plans of plan.gpu_plan, one per direction, made on the first call and kept
in the state: a device copy where the permutation collapses to the identity, transpose_gather where
the innermost dim stays innermost, transpose_tiled (transpose.cu) through shared memory otherwise.

forward and backward run after the package's checks (gpu_forward_kernel, gpu_backward_kernel,
which run inside their stream). Everything is enqueued on the given stream.
"""

from __future__ import annotations

from typing import Any

from ..runtime import core, gpu, gpu_paths
from .attrs import OP
from .plan import THREADS_X, THREADS_Y, gpu_plan, plan_path

gpu_paths.declare(OP, {
    "copy": "the permutation is the identity once size-1 dims are dropped and dims merged: one device copy",
    "gather": "the innermost dim stays innermost: transpose_gather, a thread per output element",
    "tiled64": "the innermost dims differ: transpose_tiled<..., 64> through shared memory, 16 elements a thread",
    "tiled32": "transpose_tiled<..., 32>: 16-byte elements, or too few 64x64 tiles to fill the device",
})

_CUDA = gpu.CudaModule("transpose.cu", [
    f"transpose_gather<{bits}, {index}>" for bits in gpu.BITS_TYPES for index in gpu.INDEX_TYPES
] + [
    f"transpose_tiled<{bits}, {index}, {tile}>" for bits in gpu.BITS_TYPES for index in gpu.INDEX_TYPES
    for tile in ((32,) if bits == "ulonglong2" else (32, 64))
], defines={"THREADS_X": THREADS_X, "THREADS_Y": THREADS_Y})


def _run(stream, launches: list, plan: tuple, source, destination) -> None:
    """Enqueue a plan from gpu_plan on the stream: a device copy, or its launch, a gpu.PackedLaunch made on
    the first call and kept in launches[0]."""
    if plan[0] == "copy":
        gpu_paths.reach(plan_path(plan))
        gpu.copy_async(stream, destination, source)
        return
    if launches[0] is None:
        _, name, grid, block, args = plan
        launches[0] = gpu.packed(_CUDA.function(name), grid, block, 2, args)
    gpu_paths.reach(plan_path(plan))
    launches[0](stream, source, destination)


def _gpu_plans(state: core.KernelState) -> tuple:
    """((plan, [launch]) forward, (plan, [launch]) backward), made on the first call and kept in the state."""
    if "plans" not in state.saved:
        shape = state.shapes["input_shape"]
        output = state.shapes["output_shape"]
        sm_count = gpu.sm_count(state.device)
        state.saved["plans"] = ((gpu_plan(shape.dims, state.attrs.permutation, shape.dtype, sm_count), [None]),
                                (gpu_plan(output.dims, state.attrs.inverse, shape.dtype, sm_count), [None]))
    return state.saved["plans"]


def forward(stream: Any, state: core.KernelState, input: Any, output: Any) -> None:
    """output = input permuted, enqueued on the stream."""
    if input.size:
        plan, launches = _gpu_plans(state)[0]
        _run(stream, launches, plan, input, output)


def backward(stream: Any, state: core.KernelState, output_grad: Any, input_grad: Any) -> None:
    """input_grad = output_grad permuted by the inverse permutation (None: skipped), enqueued on the stream."""
    if input_grad is not None and input_grad.size:
        plan, launches = _gpu_plans(state)[1]
        _run(stream, launches, plan, output_grad, input_grad)
