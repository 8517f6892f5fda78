"""softmax along `dim` (any dim of any rank, negative dims count from the end), float16, bfloat16,
float32 and float64. Half-precision tensors are computed in float32 on both devices: each value
widened when read, the max, the exponentials, the sums and the quotients in float32, each result
rounded once to the dtype when written.

Forward is numerically stable: y = exp(x - max) / sum(exp(x - max)) along dim.
Backward is computed from the output alone: input_grad = y * (g - sum(g * y)) along
dim, so `input` may be None.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime import core, cpu, cpu_paths, gpu, gpu_paths
from ..runtime.core import ALL_FLOAT_DTYPES, TensorShape
from ..runtime.spec import UNARY_FORWARD, UNARY_SHAPES, declare_op, unary_backward

OP = "softmax"


@dataclass(frozen=True)
class SoftmaxAttrs:
    dim: int

    def __post_init__(self) -> None:
        core.set_attr(self, "dim", core.attr_int(OP, "dim", self.dim))


def init_kernel(handle: Any, attrs: SoftmaxAttrs, input_shape: TensorShape, output_shape: TensorShape) -> core.KernelState:
    """Check dim against the rank and the shapes against each other; record them."""
    state = core.make_state(OP, handle, attrs, SoftmaxAttrs, input_shape=input_shape, output_shape=output_shape)
    core.check_dtype(OP, "input_shape", input_shape, ALL_FLOAT_DTYPES)
    core.normalize_axis(OP, "dim", attrs.dim, input_shape.rank)
    core.check_dims(OP, "output_shape", output_shape, input_shape.dims)
    core.check_same_dtype(OP, "output_shape", output_shape, input_shape, "input_shape")
    return state


def _axis(state: core.KernelState) -> int:
    return core.normalize_axis(OP, "dim", state.attrs.dim, state.shapes["input_shape"].rank)


def _check_forward(stream, handle, state, attrs, input, output) -> None:
    core.check_unary_forward(OP, stream, handle, state, attrs, input, output)


def _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad) -> None:
    # Backward reads y, not x: input is accepted, or None.
    core.check_unary_backward(OP, stream, handle, state, attrs, output, output_grad, input, input_grad,
                              output_required=True)


# --------------------------------------------------------------------------- CPU


# Each block is about this many elements: its several passes stay in cache.
CPU_BLOCK_ELEMENTS = 1 << 17
# A block's length where the parts run beside each other: each block makes five NumPy calls, each taking
# the GIL to begin and to end, which the other parts wait for, so fewer and longer ones. Blocks of 2^17 /
# 2^18 / 2^19 / 2^20 elements (2026-12-02), backward along dim 1 of (1, 16, 4, 8400), backward along the
# last dim of (1, 5, 400, 400), forward along dim 1, forward along the last dim, us:
# - the 16-core host, 16 threads (2 parts each): 569 / 495 / 595 / 815, 863 / 564 / 644 / 548,
#   810 / 656 / 823 / 920, 1577 / 1277 / 1399 / 1310;
# - the 2-core VM, 2 threads: 817 / 528 / 448 / 651, 974 / 622 / 591 / 633, 713 / 521 / 584 / 844,
#   1108 / 814 / 949 / 1007 (2^18 and 2^19 from other runs than 2^17 and 2^20).
# One part alone keeps the cache-sized blocks.
PARALLEL_BLOCK_ELEMENTS = 1 << 18

# The size-gated paths of _cpu_blocks (kernels.runtime.cpu_paths).
ROWS_BLOCKS_PATH, ROWS_LONG_PATH, PLANES_BLOCKS_PATH, COLUMNS_PATH, WHOLE_INNER_PATH, THREADS_PATH = \
    cpu_paths.declare(OP, {
        "rows.blocks": "dim last: the rows past a block's length cut into blocks of several whole rows",
        "rows.long": "dim last, a row longer than a block: a block a row",
        "planes.blocks": "an inner dim: whole (dim, inner) planes past a block's length cut into blocks of them",
        "inner_columns": "an inner dim, a plane longer than a block: parts of inner at least 4 columns wide",
        "whole_inner": "an inner dim so long that 4 columns of it pass a block: a block a whole plane",
        "threads": "the blocks shared out to the threads",
    })


def _cpu_blocks(state: core.KernelState, function: Any, *arrays: np.ndarray) -> None:
    """Call function(*views) on cache-sized blocks of whole softmax rows, shared out to the cores
    (cpu.cpu_parallel). The tensor is seen as (outer, size) when dim is the last one, else as
    (outer, size, inner); dim is axis 1 of every block, and each block reduces over it exactly
    as a call on the whole tensor does (a row's arithmetic does not depend on its neighbours)."""
    dims = state.shapes["input_shape"].dims
    axis = _axis(state)
    outer, size, inner = core.numel(dims[:axis]), dims[axis], core.numel(dims[axis + 1:])
    nbytes = sum(a.nbytes for a in arrays)
    ways = cpu.parallel_parts(nbytes)
    length = cpu.block_length(nbytes, outer * size * inner, CPU_BLOCK_ELEMENTS, PARALLEL_BLOCK_ELEMENTS)

    def even(count: int, most: int) -> int:
        """Parts of about `most` items each, their number a multiple of the parts that run (balanced)."""
        parts = -(-count // max(most, 1))
        return min(count, -(-parts // ways) * ways)

    if inner == 1:
        views = [a.reshape(outer, size) for a in arrays]
        rows = -(-outer // even(outer, length // size))
        blocks = [(slice(start, start + rows),) for start in range(0, outer, rows)]
        cpu_paths.reach_if(ROWS_BLOCKS_PATH, len(blocks) > 1 and size <= length)
        cpu_paths.reach_if(ROWS_LONG_PATH, size > length)
    else:
        views = [a.reshape(outer, size, inner) for a in arrays]
        if size * inner <= length:
            rows = -(-outer // even(outer, length // (size * inner)))
            blocks = [(slice(start, start + rows),) for start in range(0, outer, rows)]
            cpu_paths.reach_if(PLANES_BLOCKS_PATH, len(blocks) > 1)
        else:
            # Parts of inner at least 2 wide (else width 1 would make the reduction NumPy's inner loop,
            # which sums in another order): the whole of inner when dim is too long for that.
            width = length // size
            parts = max(1, min(even(inner, width), inner // 4)) if width >= 4 else 1
            bounds = [inner * i // parts for i in range(parts + 1)]
            blocks = [(slice(row, row + 1), slice(None), slice(bounds[i], bounds[i + 1]))
                      for row in range(outer) for i in range(parts)]
            cpu_paths.reach(COLUMNS_PATH if parts > 1 else WHOLE_INNER_PATH)
            if parts == 1:
                # Columns fewer than 4 wide: NumPy adds a long strided dim one row after another,
                # and in float32 that sum drifts by hundreds of ulps over tens of thousands of
                # terms; float64 sums keep it to the last bit or two.
                function = functools.partial(function, accumulate=np.float64)

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(THREADS_PATH, first, last, len(blocks))
        for block in blocks[first:last]:
            function(*(view[block] for view in views))

    cpu.cpu_parallel(run, len(blocks), nbytes)


def _cpu_forward_block(x: np.ndarray, y: np.ndarray, accumulate: Any = None) -> None:
    """Softmax along axis 1 of a block; `accumulate`: the dtype of the sum (None: the block's)."""
    np.subtract(x, np.max(x, axis=1, keepdims=True), out=y)
    np.exp(y, out=y)
    np.divide(y, np.sum(y, axis=1, keepdims=True, dtype=accumulate), out=y)


def _cpu_backward_block(y: np.ndarray, g: np.ndarray, dx: np.ndarray, accumulate: Any = None) -> None:
    """Softmax's gradient along axis 1 of a block; `accumulate`: the dtype of the dot (None: the block's)."""
    # einsum forms the dot along dim without a temporary of the block's size
    dot = np.expand_dims(np.einsum("ab...,ab...->a...", g, y, dtype=accumulate), 1)
    np.subtract(g, dot, out=dx)
    np.multiply(y, dx, out=dx)


def _in_compute_dtype(function: Any, dtype: np.dtype) -> Any:
    """A block function itself, or for a half dtype run in float32 on widened blocks and rounded once."""
    return cpu.widened(function) if dtype in core.HALF_DTYPES else function


@cpu.cpu_kernel
def cpu_forward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: SoftmaxAttrs,
                       input: core.Array, output: core.Array) -> None:
    """output = exp(input - max) / sum(exp(input - max)) along dim."""
    _check_forward(stream, handle, state, attrs, input, output)
    if input.size == 0:
        return
    _cpu_blocks(state, _in_compute_dtype(_cpu_forward_block, input.dtype), input, output)


@cpu.cpu_kernel
def cpu_backward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: SoftmaxAttrs,
                        output: core.Array | None, output_grad: core.Array, input: core.Array | None,
                        input_grad: core.Array | None) -> None:
    """input_grad = output * (output_grad - sum(output_grad * output)) along dim."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is None or input_grad.size == 0:
        return
    _cpu_blocks(state, _in_compute_dtype(_cpu_backward_block, input_grad.dtype), output, output_grad, input_grad)


# --------------------------------------------------------------------------- GPU

_WIDTHS_AND_PER_LANE = [(w, 1) for w in (1, 2, 4, 8, 16, 32)] + [(32, p) for p in (2, 4, 8, 16, 32)]
MAX_ROW_IN_REGISTERS = 32 * 32
_CACHED_COLUMN_SIZES = (4, 8, 16, 32)  # a softmax dim up to 32 with inner > 1 is kept in registers
ROWS_BLOCK = 128  # threads per block of the *_rows kernels (4 warps)
COLUMN_BLOCK = 256  # threads per block of the *_block and *_columns kernels

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


def plan_path(kind: str) -> str:
    """The named GPU path (kernels.runtime.gpu_paths) of a plan's kernel suffix (gpu_plan's first entry)."""
    family, _, template = kind.partition("<")
    if family == "rows":
        _, width, per_lane = (part.strip() for part in template[:-1].split(","))
        return f"{OP}.rows." + ("registers" if per_lane != "1" else "warp" if width == "32" else "shared_warp")
    return f"{OP}.{family}"


def gpu_plan(dims: tuple[int, ...], axis: int, dtype: np.dtype) -> tuple[str, Any, Any, tuple]:
    """(kernel suffix with template arguments, grid, block, size arguments) for one softmax.

    The tensor is (outer, size, inner) around the softmax dim. Rows (inner == 1) up to
    1024 long live in registers of WIDTH lanes each (the next power of two of the row,
    capped at a warp, so a warp holds several short rows); longer rows get a block
    each. With inner > 1, threads own columns (in registers when the dim is <= 32);
    when there are too few columns to fill the device and the dim is long, a block
    owns each column instead.
    """
    outer = core.numel(dims[:axis])
    size = dims[axis]
    inner = core.numel(dims[axis + 1:])
    t = gpu.cuda_type(dtype)
    columns = outer * inner
    if inner == 1 and size <= MAX_ROW_IN_REGISTERS:
        padded = 1 << max(size - 1, 0).bit_length()
        width = min(padded, 32)
        per_lane = max(padded // 32, 1)
        rows_per_block = ROWS_BLOCK // width
        grid = gpu.grid_for(outer, rows_per_block)
        return f"rows<{t}, {width}, {per_lane}>", grid, ROWS_BLOCK, (np.int64(outer), np.int32(size))
    if inner > 1 and size <= _CACHED_COLUMN_SIZES[-1]:
        cached = next(c for c in _CACHED_COLUMN_SIZES if c >= size)
        return (f"columns_cached<{t}, {cached}>", gpu.grid_for(columns, COLUMN_BLOCK), COLUMN_BLOCK,
                (np.int64(columns), np.int32(size), np.int64(inner)))
    if inner == 1 or (columns < 8192 and size >= 512):
        return f"block<{t}>", gpu.capped(columns, gpu.GRID_BLOCKS), COLUMN_BLOCK, (np.int64(columns), np.int64(size), np.int64(inner))
    return f"columns<{t}>", gpu.grid_for(columns, COLUMN_BLOCK), COLUMN_BLOCK, (np.int64(columns), np.int64(size),
                                                                                 np.int64(inner))


def _gpu_plan(state: core.KernelState) -> tuple:
    if "plan" not in state.saved:
        shape = state.shapes["input_shape"]
        state.saved["plan"] = gpu_plan(shape.dims, _axis(state), shape.dtype)
    return state.saved["plan"]


def _gpu_launch(state: core.KernelState, direction: str) -> tuple:
    """(kernel, grid, block, size arguments, paths) of one direction, made on first use and kept in the state."""
    key = "gpu_" + direction
    launch = state.saved.get(key)
    if launch is None:
        kind, grid, block, sizes = _gpu_plan(state)
        launch = state.saved[key] = (_CUDA.function(f"softmax_{direction}_{kind}"), grid, block, sizes,
                                     (f"{OP}.{direction}", plan_path(kind)))
    return launch


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: SoftmaxAttrs,
                       input: core.Array, output: core.Array) -> None:
    """output = softmax(input) along dim, enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, output)
    if input.size == 0:
        return
    kernel, grid, block, sizes, paths = _gpu_launch(state, "forward")
    gpu_paths.reach(paths[0])
    gpu_paths.reach(paths[1])
    gpu.launch(stream, kernel, grid, block, (input, output) + sizes)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: SoftmaxAttrs,
                        output: core.Array | None, output_grad: core.Array, input: core.Array | None,
                        input_grad: core.Array | None) -> None:
    """input_grad = output * (output_grad - sum(output_grad * output)) along dim, enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is None or input_grad.size == 0:
        return
    kernel, grid, block, sizes, paths = _gpu_launch(state, "backward")
    gpu_paths.reach(paths[0])
    gpu_paths.reach(paths[1])
    gpu.launch(stream, kernel, grid, block, (output, output_grad, input_grad) + sizes)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=SoftmaxAttrs,
    shapes=UNARY_SHAPES,
    forward=UNARY_FORWARD,
    backward=unary_backward(output=True, input=False),
    dtypes=ALL_FLOAT_DTYPES,
    forward_doc="Write output = softmax(input) along dim, on the stream's device.",
    backward_doc="Write input_grad from output and output_grad (input is not needed), on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
