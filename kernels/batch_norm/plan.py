"""batch_norm's layout and GPU plan: pure Python, no device. The block size and unroll
factor of batch_norm.cu are defined here, once; gpu.py passes them to the source as
-D options (BN_BLOCK, BN_APPLY_UNROLL)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import gpu

BLOCK = 256  # BN_BLOCK: threads of every batch_norm.cu block (its block sums assume it)
APPLY_UNROLL = 4  # BN_APPLY_UNROLL: columns a thread of the forward and backward apply covers per step
CHUNK = 2048  # elements of one row that a partial-sum block reduces (8 per thread)


@dataclass(frozen=True)
class Layout:
    """The input seen as (outer, stats, inner): statistic f covers outer x inner elements.

    SPATIAL: (N, C, prod(spatial)); PER_ACTIVATION: (N, C * prod(spatial), 1).
    """

    outer: int
    stats: int
    inner: int
    stat_dims: tuple[int, ...]

    @property
    def count(self) -> int:
        """Elements per statistic."""
        return self.outer * self.inner


@dataclass(frozen=True)
class GpuPlan:
    by_feature: bool  # one thread per statistic, reducing over N (PER_ACTIVATION, or no spatial dims)
    chunk: int
    parts_per_row: int
    parts: int  # partial sums per channel: outer * parts_per_row
    rows: int  # apply kernels: rows x cols, statistic = row % stats (SPATIAL) or col (by feature)
    cols: int
    index: str
    scalar: Any


def gpu_plan(layout: Layout) -> GpuPlan:
    """The kernels' split of a layout: partial sums per channel, the apply's rows and columns, the index type."""
    total = layout.outer * layout.stats * layout.inner
    # 32-bit indices only where the apply's grid-stride step cannot carry a column past 2^31.
    index = gpu.index_type(total + 65535 * BLOCK * APPLY_UNROLL, layout.count)
    scalar = np.int32 if index == "int" else np.int64
    by_feature = layout.inner == 1
    chunk = min(max(layout.inner, 1), CHUNK)
    parts_per_row = -(-layout.inner // chunk) if layout.inner else 1
    if by_feature:
        return GpuPlan(True, 1, 1, 1, layout.outer, layout.stats, index, scalar)
    return GpuPlan(False, chunk, parts_per_row, layout.outer * parts_per_row, layout.outer * layout.stats,
                   layout.inner, index, scalar)
