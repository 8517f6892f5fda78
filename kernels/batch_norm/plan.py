"""batch_norm's layout and GPU plan: pure Python, no device. The block size and unroll
factor of batch_norm.cu are defined here, once; gpu.py passes them to the source as
-D options (BN_BLOCK, BN_APPLY_UNROLL)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime import gpu

BLOCK = 256  # BN_BLOCK: threads of every batch_norm.cu block (its block sums assume it)
APPLY_UNROLL = 4  # BN_APPLY_UNROLL: columns a thread of the forward and backward apply covers per step
PACK_BYTES = 16  # bn_inference_apply's packs (common.cuh's Pack): 16 bytes a thread access
MAX_PACK = PACK_BYTES // 2  # the most elements a pack holds (float16, bfloat16)
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
    # 32-bit indices only where no apply's grid-stride step can carry a column past 2^31: a row of at most
    # 65535 blocks moves APPLY_UNROLL elements a thread a step in bn_forward_apply, one pack of at most
    # MAX_PACK in bn_inference_apply.
    index = gpu.index_type(total + 65535 * BLOCK * max(APPLY_UNROLL, MAX_PACK), layout.count)
    scalar = np.int32 if index == "int" else np.int64
    by_feature = layout.inner == 1
    chunk = min(max(layout.inner, 1), CHUNK)
    parts_per_row = -(-layout.inner // chunk) if layout.inner else 1
    if by_feature:
        return GpuPlan(True, 1, 1, 1, layout.outer, layout.stats, index, scalar)
    return GpuPlan(False, chunk, parts_per_row, layout.outer * parts_per_row, layout.outer * layout.stats,
                   layout.inner, index, scalar)


def pack_width(plan: GpuPlan, itemsize: int) -> int:
    """Elements of bn_inference_apply's packs for a dtype of `itemsize` bytes: PACK_BYTES' worth where
    every row of the apply (cols elements) is a whole number of packs, else 1 (no packs: the rows
    cannot take them). A call takes the packs only where its tensors are PACK_BYTES-aligned too
    (gpu.forward)."""
    width = PACK_BYTES // itemsize
    return width if plan.cols % width == 0 else 1


def inference_launch(plan: GpuPlan, itemsize: int) -> tuple[int, int, tuple[int, int]] | None:
    """(pack, threads, grid) of bn_inference_apply, or None where it does not apply (by feature, or rows
    that are not whole packs): a pack a thread, a block's threads a multiple of 32 up to BLOCK (fewer
    for short rows: a 20x20 plane of float16 is 50 packs, a block of 64), as many blocks along a row as
    its packs need and one row of blocks per row (both capped at the grid's 65535; the kernel strides)."""
    pack = pack_width(plan, itemsize)
    if plan.by_feature or pack == 1:
        return None
    packs = plan.cols // pack
    threads = min(BLOCK, -(-packs // 32) * 32)
    return pack, threads, grid2(-(-packs // threads), plan.rows)


def grid2(blocks_x: int, rows: int) -> tuple[int, int]:
    """A two-dimensional grid: blocks along a row, rows; each within 65535 (the kernels stride past it)."""
    return gpu.capped(blocks_x, 65535), gpu.capped(rows, 65535)
