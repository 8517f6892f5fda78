"""transpose: output dim d is input dim permutation[d] (torch.permute), any rank, any dtype.

Backward writes input_grad as output_grad permuted by the inverse permutation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime import core, cpu, gpu, gpu_paths
from ..runtime.core import MOVABLE_DTYPES, AttrsError, TensorShape, fail
from ..runtime.spec import UNARY_FORWARD, UNARY_SHAPES, declare_op, unary_backward

OP = "transpose"


@dataclass(frozen=True)
class TransposeAttrs:
    permutation: tuple[int, ...]

    def __post_init__(self) -> None:
        permutation = core.attr_ints(OP, "permutation", self.permutation)
        if sorted(permutation) != list(range(len(permutation))):
            raise fail(AttrsError, OP, "permutation", f"a permutation of 0..{len(permutation) - 1}", permutation)
        core.set_attr(self, "permutation", permutation)

    @property
    def inverse(self) -> tuple[int, ...]:
        return tuple(int(i) for i in np.argsort(self.permutation))


def output_dims(attrs: TransposeAttrs, dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(dims[p] for p in attrs.permutation)


def init_kernel(handle: Any, attrs: TransposeAttrs, input_shape: TensorShape, output_shape: TensorShape) -> core.KernelState:
    """Check the shapes against the permutation and record them."""
    state = core.make_state(OP, handle, attrs, TransposeAttrs, input_shape=input_shape, output_shape=output_shape)
    core.check_dtype(OP, "input_shape", input_shape, MOVABLE_DTYPES)
    if input_shape.rank != len(attrs.permutation):
        raise fail(core.ShapeError, OP, "input_shape", f"rank {len(attrs.permutation)} (the permutation's length)",
                   input_shape.rank)
    core.check_dims(OP, "output_shape", output_shape, output_dims(attrs, input_shape.dims))
    core.check_same_dtype(OP, "output_shape", output_shape, input_shape, "input_shape")
    return state


def _check_forward(stream, handle, state, attrs, input, output) -> None:
    core.check_unary_forward(OP, stream, handle, state, attrs, input, output)


def _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad) -> None:
    core.check_unary_backward(OP, stream, handle, state, attrs, output, output_grad, input, input_grad)


# --------------------------------------------------------------------------- CPU


@cpu.cpu_kernel
def cpu_forward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: TransposeAttrs,
                       input: core.Array, output: core.Array) -> None:
    """output = input.transpose(permutation)."""
    _check_forward(stream, handle, state, attrs, input, output)
    cpu.cpu_copy(output, input.transpose(attrs.permutation))


@cpu.cpu_kernel
def cpu_backward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: TransposeAttrs,
                        output: core.Array | None, output_grad: core.Array, input: core.Array | None,
                        input_grad: core.Array | None) -> None:
    """input_grad = output_grad.transpose(inverse permutation)."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is not None:
        cpu.cpu_copy(input_grad, output_grad.transpose(attrs.inverse))


# --------------------------------------------------------------------------- GPU


def _collapse(dims: tuple[int, ...], permutation: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Drop size-1 dims and merge input dims that stay adjacent and in order in the output."""
    keep = [d for d in range(len(dims)) if dims[d] != 1]
    if not keep:
        return [1], [0]
    renumber = {old: new for new, old in enumerate(keep)}
    sizes = [dims[d] for d in keep]
    perm = [renumber[p] for p in permutation if p in renumber]
    groups = [[perm[0]]]
    for p in perm[1:]:
        if p == groups[-1][-1] + 1:
            groups[-1].append(p)
        else:
            groups.append([p])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])
    position = {g: i for i, g in enumerate(order)}
    in_dims = [int(np.prod([sizes[d] for d in groups[g]])) for g in order]
    return in_dims, [position[g] for g in range(len(groups))]


def gpu_plan(dims: tuple[int, ...], permutation: tuple[int, ...], dtype: np.dtype, sm_count: int) -> tuple:
    """How to run a permutation on the GPU: ('copy',), ('gather', ...) or ('tiled', ...). `sm_count`,
    the device's SMs, only steers the tile size (fewer, larger tiles only when they fill the device)."""
    in_dims, perm = _collapse(dims, permutation)
    rank, count = len(in_dims), int(np.prod(dims, dtype=np.int64))
    if perm == list(range(rank)):
        return ("copy",)
    index = gpu.index_type(count)
    in_strides = core.c_strides(in_dims)
    out_dims = [in_dims[p] for p in perm]
    out_strides = core.c_strides(out_dims)
    type_args = f"<{gpu.bits_type(dtype)}, {index}>"
    scalar = np.int32 if index == "int" else np.int64
    if perm[-1] == rank - 1:
        args = (scalar(count), np.int32(rank), gpu.ints_arg(out_dims), gpu.ints_arg([in_strides[p] for p in perm]))
        return ("gather", f"transpose_gather{type_args}", gpu.grid_for(count), gpu.BLOCK, args)
    a = perm[-1]
    b = perm.index(rank - 1)
    batch = [d for d in range(rank) if d not in (b, rank - 1)]
    size_x, size_a = in_dims[rank - 1], in_dims[a]
    batch_count = int(np.prod([out_dims[d] for d in batch], dtype=np.int64))
    args = (scalar(size_x), scalar(size_a), scalar(in_strides[a]), scalar(out_strides[b]), scalar(batch_count),
            np.int32(len(batch)), gpu.ints_arg([out_dims[d] for d in batch]),
            gpu.ints_arg([in_strides[perm[d]] for d in batch]), gpu.ints_arg([out_strides[d] for d in batch]))
    tile = 64
    if np.dtype(dtype).itemsize > 8 or -(-size_x // 64) * -(-size_a // 64) * batch_count < 4 * sm_count:
        tile = 32  # 16-byte elements (shared memory), or too few 64x64 tiles to fill the GPU (PSA: 70)
    tiles = -(-size_x // tile) * -(-size_a // tile)
    name = f"transpose_tiled<{gpu.bits_type(dtype)}, {index}, {tile}>"
    return ("tiled", name, (tiles, gpu.capped(batch_count, 65535)), (THREADS_X, THREADS_Y), args)


gpu_paths.declare(OP, {
    "copy": "the permutation is the identity once size-1 dims are dropped and dims merged: one device copy",
    "gather": "the innermost dim stays innermost: transpose_gather, a thread per output element",
    "tiled64": "the innermost dims differ: transpose_tiled<..., 64> through shared memory, 16 elements a thread",
    "tiled32": "transpose_tiled<..., 32>: 16-byte elements, or too few 64x64 tiles to fill the device",
})


def plan_path(plan: tuple) -> str:
    """The named GPU path (kernels.runtime.gpu_paths) of a plan from gpu_plan."""
    if plan[0] != "tiled":
        return f"{OP}.{plan[0]}"
    return f"{OP}.tiled{plan[1].rsplit(', ', 1)[1][:-1]}"


THREADS_X, THREADS_Y = 32, 8  # a tiled block's threads (transpose.cu's THREADS_X, THREADS_Y)
_CUDA = gpu.CudaModule("transpose.cu", [
    f"transpose_gather<{bits}, {index}>" for bits in gpu.BITS_TYPES for index in gpu.INDEX_TYPES
] + [
    f"transpose_tiled<{bits}, {index}, {tile}>" for bits in gpu.BITS_TYPES for index in gpu.INDEX_TYPES
    for tile in ((32,) if bits == "ulonglong2" else (32, 64))
], defines={"THREADS_X": THREADS_X, "THREADS_Y": THREADS_Y})


def gpu_run_plan(stream, plan: tuple, source, destination) -> None:  # pragma: no cover - GPU: a launch or device copy
    """Enqueue a plan from gpu_plan on the stream."""
    gpu_paths.reach(plan_path(plan))
    if plan[0] == "copy":
        gpu.copy_async(stream, destination, source)
        return
    _, name, grid, block, args = plan
    gpu.launch(stream, _CUDA.function(name), grid, block, (source, destination) + args)


def _gpu_plans(state: core.KernelState) -> tuple:  # pragma: no cover - GPU: the device's SM count
    if "plans" not in state.saved:
        shape = state.shapes["input_shape"]
        output = state.shapes["output_shape"]
        sm_count = gpu.sm_count(state.device)
        state.saved["plans"] = (gpu_plan(shape.dims, state.attrs.permutation, shape.dtype, sm_count),
                                gpu_plan(output.dims, state.attrs.inverse, shape.dtype, sm_count))
    return state.saved["plans"]


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: TransposeAttrs,
                       input: core.Array, output: core.Array) -> None:
    """output = input permuted, enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, output)
    if input.size:
        gpu_run_plan(stream, _gpu_plans(state)[0], input, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: TransposeAttrs,
                        output: core.Array | None, output_grad: core.Array, input: core.Array | None,
                        input_grad: core.Array | None) -> None:
    """input_grad = output_grad permuted by the inverse permutation, enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is not None and input_grad.size:
        gpu_run_plan(stream, _gpu_plans(state)[1], output_grad, input_grad)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=TransposeAttrs,
    shapes=UNARY_SHAPES,
    forward=UNARY_FORWARD,
    backward=unary_backward(output=False, input=False),
    dtypes=MOVABLE_DTYPES,
    forward_doc="Write output = input permuted, on the stream's device.",
    backward_doc="Write input_grad from output_grad (inverse permutation), on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
