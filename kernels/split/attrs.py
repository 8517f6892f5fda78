"""split's attrs: the size of each piece and the axis."""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime import core
from ..runtime.core import AttrsError, fail

OP = "split"


@dataclass(frozen=True)
class SplitAttrs:
    """`splits`: the size of each output along `axis` (at least one; a size may be 0)."""

    splits: tuple[int, ...]
    axis: int

    def __post_init__(self) -> None:
        splits = core.attr_ints(OP, "splits", self.splits, minimum=0)
        if not splits:
            raise fail(AttrsError, OP, "splits", "at least one size", "()")
        core.set_attr(self, "splits", splits)
        core.set_attr(self, "axis", core.attr_int(OP, "axis", self.axis))
