"""softmax on the CPU (NumPy): cache-sized blocks of whole softmax rows, shared out to the threads.

forward and backward run after the package's checks (cpu_forward_kernel, cpu_backward_kernel).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..runtime import core, cpu, cpu_paths
from .attrs import OP, _axis

# Each block is about this many elements: its several passes stay in cache.
CPU_BLOCK_ELEMENTS = 1 << 17
# A block's length where the parts run beside each other: each block makes five NumPy calls, each taking
# the GIL to begin and to end, which the other parts wait for, so fewer and longer ones; 2^18 was the
# fastest on most rows of both machines (docs/performance.md#softmax-blocks). One part alone keeps the
# cache-sized blocks.
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
    nbytes = sum(a.nbytes for a in arrays)
    view_dims, blocks, function = _blocks(state, function, nbytes)
    views = [a.reshape(view_dims) for a in arrays]

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(THREADS_PATH, first, last, len(blocks))
        for block in blocks[first:last]:
            function(*(view[block] for view in views))

    cpu.cpu_parallel(run, len(blocks), nbytes)


def _blocks(state: core.KernelState, function: Any, nbytes: int) -> tuple[tuple[int, ...], list[tuple], Any]:
    """_cpu_blocks' view of the arrays (their dims), its blocks (indices into the view) and the function
    to call on them, for a pass over `nbytes` bytes of the state's form."""
    dims = state.shapes["input_shape"].dims
    axis = _axis(state)
    outer, size, inner = core.numel(dims[:axis]), dims[axis], core.numel(dims[axis + 1:])
    ways = cpu.parallel_parts(nbytes)
    length = cpu.block_length(nbytes, outer * size * inner, CPU_BLOCK_ELEMENTS, PARALLEL_BLOCK_ELEMENTS)

    def even(count: int, most: int) -> int:
        """Parts of about `most` items each, their number a multiple of the parts that run (balanced)."""
        parts = -(-count // max(most, 1))
        return min(count, -(-parts // ways) * ways)

    if inner == 1:
        view_dims: tuple[int, ...] = (outer, size)
        rows = -(-outer // even(outer, length // size))
        blocks = [(slice(start, start + rows),) for start in range(0, outer, rows)]
        cpu_paths.reach_if(ROWS_BLOCKS_PATH, len(blocks) > 1 and size <= length)
        cpu_paths.reach_if(ROWS_LONG_PATH, size > length)
    else:
        view_dims = (outer, size, inner)
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
    return view_dims, blocks, function


def forward_plan(state: core.KernelState, attrs: Any, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, input, output) on checked arrays, the blocks worked out once (for `threads`, the
    handle's count); a form of one block (the whole tensor) gets the block function's call alone."""
    shape = state.shapes["input_shape"]
    function = _in_compute_dtype(_cpu_forward_block, shape.dtype)
    if shape.numel == 0:
        return lambda state, input, output: None
    view_dims, blocks, function = cpu.with_threads(_blocks, threads)(state, function, 2 * shape.numel * shape.dtype.itemsize)
    if len(blocks) > 1:
        return cpu.with_threads(lambda state, input, output: forward(state, input, output), threads)
    if view_dims == shape.dims:
        return lambda state, input, output: function(input, output)
    return lambda state, input, output: function(input.reshape(view_dims), output.reshape(view_dims))


def _cpu_forward_block(x: np.ndarray, y: np.ndarray, accumulate: Any = None) -> None:
    """Softmax along axis 1 of a block; `accumulate`: the dtype of the sum (None: the block's)."""
    # The ufuncs' reduce (axis 1, dtype, out None, keepdims), which np.max and np.sum call after Python of
    # a microsecond each: a tiny tensor's time.
    np.subtract(x, np.maximum.reduce(x, 1, None, None, True), y)
    np.exp(y, y)
    np.divide(y, np.add.reduce(y, 1, accumulate, None, True), y)


def _cpu_backward_block(y: np.ndarray, g: np.ndarray, dx: np.ndarray, accumulate: Any = None) -> None:
    """Softmax's gradient along axis 1 of a block; `accumulate`: the dtype of the dot (None: the block's)."""
    # einsum forms the dot along dim without a temporary of the block's size
    dot = np.expand_dims(np.einsum("ab...,ab...->a...", g, y, dtype=accumulate), 1)
    np.subtract(g, dot, out=dx)
    np.multiply(y, dx, out=dx)


def _in_compute_dtype(function: Any, dtype: np.dtype) -> Any:
    """A block function itself, or for a half dtype run in float32 on widened blocks and rounded once."""
    return cpu.widened(function) if dtype in core.HALF_DTYPES else function


def forward(state: core.KernelState, input: core.Array, output: core.Array) -> None:
    """output = exp(input - max) / sum(exp(input - max)) along dim."""
    if input.size == 0:
        return
    _cpu_blocks(state, _in_compute_dtype(_cpu_forward_block, input.dtype), input, output)


def backward(state: core.KernelState, output: core.Array, output_grad: core.Array,
             input_grad: core.Array | None) -> None:
    """input_grad = output * (output_grad - sum(output_grad * output)) along dim."""
    if input_grad is None or input_grad.size == 0:
        return
    _cpu_blocks(state, _in_compute_dtype(_cpu_backward_block, input_grad.dtype), output, output_grad, input_grad)
