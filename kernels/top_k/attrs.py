"""top_k's attrs and state, and the order key that the CPU and GPU code share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime import core

OP = "top_k"

# The dtype of the indices top_k writes (torch.topk's and torch.sort's, NumPy's argsort's on 64-bit hosts).
INDEX_DTYPE = np.dtype(np.int64)


@dataclass(frozen=True)
class TopKAttrs:
    """k: how many of the largest values of each row (along the last dim) to keep, 1 <= k <= the row's length."""

    k: int

    def __post_init__(self) -> None:
        core.set_attr(self, "k", core.attr_int(OP, "k", self.k, minimum=1))


@dataclass(eq=False)
class TopKState(core.KernelState):
    """A top_k state: the shapes, and on the GPU the launch plan and the candidates' scratch (made on the
    first call, where a row's k candidates do not fit in shared memory)."""

    plan: Any = None
    scratch_keys: Any = None
    scratch_index: Any = None

    def release(self) -> None:
        self.plan = self.scratch_keys = self.scratch_index = None
        super().release()


def rows_and_length(state: core.KernelState) -> tuple[int, int]:
    """(rows, n): the input seen as rows of its last dim, the dims before it flattened."""
    dims = state.shapes["input_shape"].dims
    return core.numel(dims[:-1]), dims[-1]
