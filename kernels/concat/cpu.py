"""The join/cut primitive on the CPU (NumPy), for concat and split alike: one np.copyto a piece, shared
out to the threads past cpu.PARALLEL_MIN_BYTES (_cpu_move); and concat's forward and backward, which
run after the package's checks (cpu_forward_kernel, cpu_backward_kernel).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..runtime import cpu as cpu_runtime
from ..runtime import cpu_paths
from .attrs import OP

if TYPE_CHECKING:
    from ..runtime import core
    from .attrs import PieceLayout


def _slices(layout: PieceLayout) -> list[tuple]:
    """Each piece's index in the whole, made once per layout."""
    slices = layout.plans.get("cpu_slices")
    if slices is None:
        lead = (slice(None),) * layout.axis
        slices = layout.plans["cpu_slices"] = [lead + (slice(offset, offset + size),)
                                               for offset, size in zip(layout.offsets, layout.sizes)]
    return slices


# The size-gated paths of _cpu_move, for concat and split alike (kernels.runtime.cpu_paths).
ROWS_PATH, PIECES_PATH, PIECES_THREADS_PATH = cpu_paths.declare(OP, {
    "rows": "a whole past PARALLEL_MIN_BYTES with dims before the axis: parts of its rows, every piece's in each",
    "pieces": "a whole past PARALLEL_MIN_BYTES without such dims (one image's channels): each piece cut along the axis",
    "pieces.threads": "the pieces' cuts shared out to the threads",
})


def _cpu_move(layout: PieceLayout, whole: Any, pieces: Sequence[Any], to_whole: bool) -> None:
    """Copy each piece that is not None to (to_whole) or from its slice of whole along the axis. Shared out
    to the threads past cpu.PARALLEL_MIN_BYTES: where the dims before the axis hold at least as many rows
    as the parts (cpu.parallel_parts), each part copies its rows of every piece (cpu.cpu_parts); else
    (the channel joins of one image) each piece is cut along the axis itself into that many parts,
    each a contiguous block."""
    if whole.nbytes < cpu_runtime.PARALLEL_MIN_BYTES:  # small (most calls): one copy a piece, nothing more
        for piece, where in zip(pieces, _slices(layout)):
            if piece is not None:
                np.copyto(*((whole[where], piece) if to_whole else (piece, whole[where])))
        return
    lead = (slice(None),) * layout.axis
    moves = [(piece, offset) for piece, offset in zip(pieces, layout.offsets) if piece is not None]

    def copy(part: slice, piece: Any, offset: int) -> None:
        target = lead + (slice(offset + part.start, offset + part.stop),)
        if to_whole:
            np.copyto(whole[target], piece[lead + (part,)])
        else:
            np.copyto(piece[lead + (part,)], whole[target])

    ways = cpu_runtime.parallel_parts(2 * whole.nbytes)
    outer_dims = whole.shape[:layout.axis]
    if any(size >= ways for size in outer_dims) or ways < 2:
        cpu_paths.reach(ROWS_PATH)

        def rows(part: Any, *piece_parts: Any) -> None:
            for (_, offset), piece in zip(moves, piece_parts):
                where = lead + (slice(offset, offset + piece.shape[layout.axis]),)
                if to_whole:
                    np.copyto(part[where], piece)
                else:
                    np.copyto(piece, part[where])

        cpu_runtime.cpu_parts(rows, whole, *(piece for piece, _ in moves), skip_axis=layout.axis)
        return
    tasks = [(slice(size * i // ways, size * (i + 1) // ways), piece, offset)
             for piece, offset in moves for size in (piece.shape[layout.axis],) for i in range(min(ways, size))]
    cpu_paths.reach(PIECES_PATH)

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(PIECES_THREADS_PATH, first, last, len(tasks))
        for task in tasks[first:last]:
            copy(*task)

    cpu_runtime.cpu_parallel(run, len(tasks), 2 * whole.nbytes)


def move_plan(layout: PieceLayout, whole: core.TensorShape, threads: int, to_whole: bool) -> Any:
    """_cpu_move(layout, whole, pieces, to_whole) for the calls of a functional plan (kernels/functional.py)
    on a whole of that shape, with `threads` as the handle's count: move(whole, pieces)."""
    if whole.numel * whole.dtype.itemsize < cpu_runtime.PARALLEL_MIN_BYTES:  # _cpu_move's small path, no threads
        return lambda whole, pieces: _cpu_move(layout, whole, pieces, to_whole)
    return cpu_runtime.with_threads(lambda whole, pieces: _cpu_move(layout, whole, pieces, to_whole), threads)


def forward_plan(state: core.KernelState, attrs: Any, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, inputs, output) on checked arrays."""
    move = move_plan(state.saved["layout"], state.shapes["output_shape"], threads, True)
    return lambda state, inputs, output: move(output, inputs)


def cpu_join(layout: PieceLayout, pieces: Sequence[Any], whole: Any) -> None:
    """whole = the pieces side by side along the axis (NumPy), shared out to the threads (_cpu_move)."""
    _cpu_move(layout, whole, pieces, True)


def cpu_cut(layout: PieceLayout, whole: Any, pieces: Sequence[Any]) -> None:
    """Each piece that is not None = its slice of whole along the axis (NumPy), shared out to the threads."""
    _cpu_move(layout, whole, pieces, False)


def forward(state: core.KernelState, inputs: Sequence[Any], output: Any) -> None:
    """output = concatenate(inputs, axis)."""
    cpu_join(state.saved["layout"], inputs, output)


def backward(state: core.KernelState, output_grad: Any, input_grads: Sequence[Any]) -> None:
    """input_grads[i] = output_grad's slice of input i along the axis (None ones skipped)."""
    cpu_cut(state.saved["layout"], output_grad, input_grads)
