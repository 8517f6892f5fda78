"""pool_2d's GPU launch choices worked out as data, pure and device-free: the tiled MAX forward's
tile (max_forward_tile) and the named GPU paths of a launch (plan_paths)."""

from __future__ import annotations

from ..runtime import gpu
from .attrs import OP, Pool2DAttrs, PoolOp, tap_dtype

TILE_OUTPUTS = 512  # outputs a block of the tiled MAX forward aims at (two a thread)
TILE_SHARED_LIMIT = gpu.SHARED_MEMORY_LIMIT  # a larger tile falls back to the direct kernel


def max_forward_tile(attrs: Pool2DAttrs, out_h: int, out_w: int, itemsize: int) -> tuple[int, int, int, int, int] | None:
    """(tile_h, tile_w, tiles_h, tiles_w, shared bytes) of the tiled MAX forward, or None where the
    tile's shared memory would exceed TILE_SHARED_LIMIT. Tiles split the plane evenly, at most 32 wide."""
    tiles_w = -(-out_w // 32)
    tile_w = -(-out_w // tiles_w)
    tiles_h = -(-out_h // max(1, TILE_OUTPUTS // tile_w))
    tile_h = -(-out_h // tiles_h)
    in_h = (tile_h - 1) * attrs.stride_h + attrs.kernel_h
    in_w = (tile_w - 1) * attrs.stride_w + attrs.kernel_w
    tap_size = tap_dtype(attrs).itemsize
    values = in_h * in_w * itemsize + in_h * tile_w * itemsize
    shared = -(-values // tap_size) * tap_size + in_h * tile_w * tap_size  # the taps aligned to their size
    if shared > TILE_SHARED_LIMIT:
        return None
    return tile_h, tile_w, tiles_h, tiles_w, shared


def plan_paths(attrs: Pool2DAttrs, direction: str, tiled: bool) -> tuple[str, ...]:
    """The named GPU paths (kernels.runtime.gpu_paths) of one pool launch."""
    if attrs.pool_type is not PoolOp.MAX:
        return (f"{OP}.avg.{direction}",)
    kernel = "forward_tiled" if tiled else "forward_direct" if direction == "forward" else "backward"
    return f"{OP}.max.{kernel}", f"{OP}.max.taps_{'u8' if tap_dtype(attrs).itemsize == 1 else 'i32'}"
