"""transpose on the GPU: the plans of plan.gpu_plan, one per direction, made on its first call and kept
in the state with their packed launch: a device copy where the permutation collapses to the identity,
transpose_gather where the innermost dim stays innermost, transpose_tiled (transpose.cu) through shared
memory otherwise.

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


def _gpu_launch(state: core.KernelState, direction: str) -> tuple:
    """(plan, its gpu.PackedLaunch, None for a copy) of one direction, made on first use and kept in the state."""
    key = "gpu_" + direction
    launch = state.saved.get(key)
    if launch is None:
        forward = direction == "forward"
        dims = state.shapes["input_shape" if forward else "output_shape"].dims
        plan = gpu_plan(dims, state.attrs.permutation if forward else state.attrs.inverse,
                        state.shapes["input_shape"].dtype, gpu.sm_count(state.device))
        packed = None if plan[0] == "copy" else gpu.packed(_CUDA.function(plan[1]), plan[2], plan[3], 2, plan[4])
        launch = state.saved[key] = (plan, packed)
    return launch


def _run(stream, state: core.KernelState, direction: str, source, destination) -> None:
    """Enqueue one direction's plan on the stream: a device copy, or its launch."""
    plan, launch = _gpu_launch(state, direction)
    gpu_paths.reach(plan_path(plan))
    if launch is None:
        gpu.copy_async(stream, destination, source)
    else:
        launch(stream, source, destination)


def forward(stream: Any, state: core.KernelState, input: Any, output: Any) -> None:
    """output = input permuted, enqueued on the stream."""
    if input.size:
        _run(stream, state, "forward", input, output)


def backward(stream: Any, state: core.KernelState, output_grad: Any, input_grad: Any) -> None:
    """input_grad = output_grad permuted by the inverse permutation (None: skipped), enqueued on the stream."""
    if input_grad is not None and input_grad.size:
        _run(stream, state, "backward", output_grad, input_grad)
