"""concat's attrs and the layout of a whole cut into pieces along an axis (PieceLayout, made by
piece_layout in init_kernel), which concat and split share: both devices' code reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..runtime import core, gpu
from ..runtime.core import TensorShape

OP = "concat"


@dataclass(frozen=True)
class ConcatAttrs:
    axis: int
    num_inputs: int

    def __post_init__(self) -> None:
        core.set_attr(self, "axis", core.attr_int(OP, "axis", self.axis))
        core.set_attr(self, "num_inputs", core.attr_int(OP, "num_inputs", self.num_inputs, minimum=2))


@dataclass(frozen=True)
class PieceLayout:
    """A whole tensor and its pieces along `axis` (non-negative), each piece `sizes[i]` long there
    and starting at `offsets[i]`.

    Every tensor is viewed as `outer` rows: a piece's row is `piece_bytes[i]` long and
    starts `offset_bytes[i]` into the whole's row of `row_bytes`. `unit` is the widest
    copy unit that divides every row length and offset. Computed once, in init_kernel.
    """

    axis: int
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    outer: int
    piece_bytes: tuple[int, ...]
    offset_bytes: tuple[int, ...]
    row_bytes: int
    unit: int
    # GPU launch plans, made on first use for each (direction, pieces present, address alignment):
    # what the hot path would otherwise recompute every call.
    plans: dict = field(default_factory=dict, compare=False, hash=False, repr=False)


def piece_layout(whole: TensorShape, sizes: Sequence[int], axis: int) -> PieceLayout:
    """The layout of `whole` cut along `axis` (already normalized) into pieces of `sizes`."""
    sizes = tuple(int(s) for s in sizes)
    offsets = tuple(int(sum(sizes[:i])) for i in range(len(sizes)))
    slice_bytes = core.numel(whole.dims[axis + 1:]) * whole.dtype.itemsize  # bytes of one step along the axis
    piece_bytes = tuple(size * slice_bytes for size in sizes)
    row_bytes = sum(sizes) * slice_bytes
    return PieceLayout(axis=axis, sizes=sizes, offsets=offsets, outer=core.numel(whole.dims[:axis]),
                       piece_bytes=piece_bytes, offset_bytes=tuple(offset * slice_bytes for offset in offsets),
                       row_bytes=row_bytes, unit=gpu.widest_unit(row_bytes, *piece_bytes))
