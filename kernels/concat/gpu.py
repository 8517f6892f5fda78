"""The join/cut primitive on the GPU, for concat and split alike: concat.cu's concat_copy, one launch
per 12 pieces; the launch plans are made on first use and kept in the layout. And concat's forward
and backward, which run after the package's checks (gpu_forward_kernel, gpu_backward_kernel, which
run inside their stream). Everything is enqueued on the given stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..runtime import core, gpu, gpu_paths
from .attrs import OP
from .plan import _GRID_SPAN, MAX_PIECES, UNROLL, _blocks, kernel_paths

if TYPE_CHECKING:
    from .attrs import PieceLayout

# One launch per call for up to 12 pieces (concat.cu), the pieces' addresses passed by value in one
# `struct Ints` argument (no pointer table in device memory, so no copy to the device per call): a
# gpu.PackedLaunch, its other parameters packed once per plan. A cudaMemcpy2DAsync per piece was a
# second method until the kernel beat it on every shape, large one-row joins included, on the H100
# and the H200, on the device and on the host (docs/performance.md#concat-one-kernel).

# The GPU paths of the join/cut primitive (concat, and split, which runs it the other way round).
gpu_paths.declare(OP, {
    "kernel.join": "concat_copy<..., ToWhole=true>: pieces -> whole (concat forward, split backward)",
    "kernel.cut": "concat_copy<..., ToWhole=false>: whole -> pieces (split forward, concat backward)",
    **{f"kernel.unit{unit}": f"concat_copy moving {unit}-byte units (the widest that sizes and addresses allow)"
       for unit in (16, 8, 4, 2, 1)},
    "kernel.one_row": "outer == 1: a piece's unit index is a plain offset into the whole (no division)",
    "kernel.rows": "outer > 1: a piece's unit index is split into row and column",
    "kernel.batches": "more than 12 pieces present: one launch per 12",
    "kernel.unrolled": "a piece longer than CONCAT_UNROLL - 1 grid strides: the unrolled main loop runs",
    "kernel.tail": "a piece not a multiple of CONCAT_UNROLL grid strides: the one-unit tail loop runs",
})

_CUDA = gpu.CudaModule("concat.cu", [
    f"concat_copy<{bits}, {index}, {direction}>"
    for bits in gpu.BITS_TYPES for index in gpu.INDEX_TYPES for direction in ("true", "false")
], defines={"CONCAT_UNROLL": UNROLL})


def gpu_join(stream: Any, layout: PieceLayout, pieces: Sequence[Any], whole: Any) -> None:
    """whole = the pieces side by side along the axis, enqueued on the stream."""
    _gpu_move(stream, layout, whole, pieces, True)


def gpu_cut(stream: Any, layout: PieceLayout, whole: Any, pieces: Sequence[Any]) -> None:
    """Each piece that is not None = its slice of whole, enqueued on the stream."""
    _gpu_move(stream, layout, whole, pieces, False)


def _gpu_move(stream, layout: PieceLayout, whole, pieces, to_whole: bool) -> None:
    """The hot path: look the plan up by what can change between calls (which pieces are None,
    the addresses' alignment), then only build the pointer tables and launch."""
    whole_ptr = whole.data.ptr
    bits, present, widths = whole_ptr, 0, layout.piece_bytes
    ptrs = [0] * len(pieces)  # each piece's address read once (0 for a None one)
    for i, piece in enumerate(pieces):
        if piece is not None:
            ptrs[i] = ptr = piece.data.ptr
            present |= 1 << i
            if widths[i]:  # an empty piece's address does not matter
                bits |= ptr
    key = (to_whole, present, bits & 15)
    plan = layout.plans.get(key)
    if plan is None:
        plan = layout.plans[key] = _gpu_move_plan(layout, to_whole, present, bits & 15, gpu.sm_count(stream.device))
    steps, paths = plan
    for path in paths:
        gpu_paths.reach(path)
    for launch, batch in steps:
        launch(stream, whole, [ptrs[i] for i in batch])


def _gpu_move_plan(layout: PieceLayout, to_whole: bool, present: int, misalignment: int, sm_count: int) -> tuple:
    """(steps, paths): the launches of one direction, each with the indices of the pieces it moves, for the
    pieces in the `present` bit mask and addresses whose low 4 bits OR to `misalignment`: everything but the
    addresses, made once; `paths` are the named GPU paths they take (kernels.runtime.gpu_paths)."""
    widths, offsets = layout.piece_bytes, layout.offset_bytes
    active = [i for i in range(len(widths)) if present >> i & 1 and widths[i] and layout.outer]
    # A unit divides every address iff it divides their OR (units are powers of two up to 16).
    unit = gpu.widest_unit(layout.unit, misalignment)
    index = gpu.index_type(layout.outer * layout.row_bytes + _GRID_SPAN)
    scalar = np.int32 if index == "int" else np.int64
    kernel = _CUDA.function(f"concat_copy<{gpu.unit_type(unit)}, {index}, {'true' if to_whole else 'false'}>")
    plan = []
    for start in range(0, len(active), MAX_PIECES):
        batch = tuple(active[start:start + MAX_PIECES])
        units = [widths[i] // unit for i in batch]
        grid = (_blocks(layout.outer * max(units), sm_count), len(batch))
        launch = gpu.PackedLaunch(kernel, grid, gpu.BLOCK, (
            gpu.ARRAY, scalar(layout.row_bytes // unit), scalar(layout.outer), gpu.Addresses(len(batch)),
            gpu.ints_arg(units), gpu.ints_arg([offsets[i] // unit for i in batch])))
        plan.append((launch, batch))
    return plan, kernel_paths(layout, to_whole, unit, active, sm_count) if active else ()


def forward(stream: Any, state: core.KernelState, inputs: Sequence[Any], output: Any) -> None:
    """output = concatenate(inputs, axis), one launch per 12 inputs, enqueued on the stream."""
    gpu_join(stream, state.saved["layout"], inputs, output)


def backward(stream: Any, state: core.KernelState, output_grad: Any, input_grads: Sequence[Any]) -> None:
    """input_grads[i] = output_grad's slice of input i (None ones skipped), enqueued on the stream."""
    gpu_cut(stream, state.saved["layout"], output_grad, input_grads)
