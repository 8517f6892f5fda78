"""reshape's attrs: the output dims, with at most one -1 inferred from the element count."""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime import core
from ..runtime.core import AttrsError, fail

OP = "reshape"


@dataclass(frozen=True)
class ReshapeAttrs:
    """shape: the output dims; sizes >= 0, and at most one -1 (inferred from the input's element count)."""

    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        shape = core.attr_ints(OP, "shape", self.shape, minimum=-1)
        if shape.count(-1) > 1:
            raise fail(AttrsError, OP, "shape", "at most one -1 (inferred size)", shape)
        core.set_attr(self, "shape", shape)
