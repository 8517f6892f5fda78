"""transpose's attrs: the permutation (output dim d is input dim permutation[d]) and its inverse."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime import core
from ..runtime.core import AttrsError, fail

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
