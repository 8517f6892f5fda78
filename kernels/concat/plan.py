"""The join/cut kernel's launch geometry, pure and device-free: the pieces a launch takes, the units a
thread moves, the grid (_blocks) and the named GPU paths its launches take (kernel_paths). gpu.py
makes the launches from them; tests/test_gpu_paths.py checks them on the CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..runtime import gpu
from .attrs import OP

if TYPE_CHECKING:
    from .attrs import PieceLayout

MAX_PIECES = gpu.MAX_RANK  # pieces per launch: as many as one `struct Ints` holds
UNROLL = 4  # units a thread moves per round (concat.cu's CONCAT_UNROLL)
# Resident blocks of 256 threads an SM holds: below that many blocks on the device a grid moves
# one unit a thread, above it UNROLL units a thread, loads in flight before stores.
BLOCKS_PER_SM = 8
# An index runs up to UNROLL grid strides past the count; 32-bit arithmetic must hold that too.
_GRID_SPAN = UNROLL * 65536 * gpu.BLOCK


def _blocks(units: int, sm_count: int) -> int:
    return min(gpu.grid_for(units), max(gpu.grid_for(units, per_thread=UNROLL), BLOCKS_PER_SM * sm_count))


def kernel_paths(layout: PieceLayout, to_whole: bool, unit: int, active: Sequence[int], sm_count: int) -> tuple[str, ...]:
    """The named GPU paths (kernels.runtime.gpu_paths) that the kernel method's launches take for the
    `active` pieces moved in `unit`-byte units: direction, unit, row form, batching, and which of
    copy_piece's loops run (CONCAT_UNROLL units a thread while (UNROLL - 1) grid strides remain, one
    at a time after). Pure: no device."""
    paths = [OP + (".kernel.join" if to_whole else ".kernel.cut"), f"{OP}.kernel.unit{unit}",
             OP + (".kernel.one_row" if layout.outer == 1 else ".kernel.rows")]
    if len(active) > MAX_PIECES:
        paths.append(OP + ".kernel.batches")
    unrolled = tail = False
    for start in range(0, len(active), MAX_PIECES):  # each launch's grid is sized by its longest piece
        counts = [layout.outer * (layout.piece_bytes[i] // unit) for i in active[start:start + MAX_PIECES]]
        stride = _blocks(max(counts), sm_count) * gpu.BLOCK
        unrolled = unrolled or any(count > (UNROLL - 1) * stride for count in counts)
        tail = tail or any(count % (UNROLL * stride) for count in counts)
    return tuple(paths + [OP + ".kernel.unrolled"] * unrolled + [OP + ".kernel.tail"] * tail)
