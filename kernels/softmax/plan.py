"""softmax's GPU launch choice worked out as data, pure and device-free: the kernel, grid and block of
a shape (gpu_plan) and the named GPU path of its kernel (plan_path)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import core, gpu
from .attrs import OP

_WIDTHS_AND_PER_LANE = [(w, 1) for w in (1, 2, 4, 8, 16, 32)] + [(32, p) for p in (2, 4, 8, 16, 32)]
MAX_ROW_IN_REGISTERS = 32 * 32
_CACHED_COLUMN_SIZES = (4, 8, 16, 32)  # a softmax dim up to 32 with inner > 1 is kept in registers
ROWS_BLOCK = 128  # threads per block of the *_rows kernels (4 warps)
COLUMN_BLOCK = 256  # threads per block of the *_block and *_columns kernels


def plan_path(kind: str) -> str:
    """The named GPU path (kernels.runtime.gpu_paths) of a plan's kernel suffix (gpu_plan's first entry)."""
    family, _, template = kind.partition("<")
    if family == "rows":
        _, width, per_lane = (part.strip() for part in template[:-1].split(","))
        return f"{OP}.rows." + ("registers" if per_lane != "1" else "warp" if width == "32" else "shared_warp")
    return f"{OP}.{family}"


def gpu_plan(dims: tuple[int, ...], axis: int, dtype: np.dtype) -> tuple[str, Any, Any, tuple]:
    """(kernel suffix with template arguments, grid, block, size arguments) for one softmax.

    The tensor is (outer, size, inner) around the softmax dim. Rows (inner == 1) up to
    1024 long live in registers of WIDTH lanes each (the next power of two of the row,
    capped at a warp, so a warp holds several short rows); longer rows get a block
    each. With inner > 1, threads own columns (in registers when the dim is <= 32);
    when there are too few columns to fill the device and the dim is long, a block
    owns each column instead.
    """
    outer = core.numel(dims[:axis])
    size = dims[axis]
    inner = core.numel(dims[axis + 1:])
    t = gpu.cuda_type(dtype)
    columns = outer * inner
    if inner == 1 and size <= MAX_ROW_IN_REGISTERS:
        padded = 1 << max(size - 1, 0).bit_length()
        width = min(padded, 32)
        per_lane = max(padded // 32, 1)
        rows_per_block = ROWS_BLOCK // width
        grid = gpu.grid_for(outer, rows_per_block)
        return f"rows<{t}, {width}, {per_lane}>", grid, ROWS_BLOCK, (np.int64(outer), np.int32(size))
    if inner > 1 and size <= _CACHED_COLUMN_SIZES[-1]:
        cached = next(c for c in _CACHED_COLUMN_SIZES if c >= size)
        return (f"columns_cached<{t}, {cached}>", gpu.grid_for(columns, COLUMN_BLOCK), COLUMN_BLOCK,
                (np.int64(columns), np.int32(size), np.int64(inner)))
    if inner == 1 or (columns < 8192 and size >= 512):
        return f"block<{t}>", gpu.capped(columns, gpu.GRID_BLOCKS), COLUMN_BLOCK, (np.int64(columns), np.int64(size),
                                                                                 np.int64(inner))
    return f"columns<{t}>", gpu.grid_for(columns, COLUMN_BLOCK), COLUMN_BLOCK, (np.int64(columns), np.int64(size),
                                                                                 np.int64(inner))
