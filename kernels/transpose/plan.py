"""transpose's GPU plans worked out as data, pure and device-free: the permutation with size-1 dims
dropped and adjacent dims merged (_collapse), the launch that runs it (gpu_plan: a copy, a gather or
a tiled transpose through shared memory) and its named path (plan_path). gpu.py runs the plans;
tests/test_transpose_paths.py and tests/test_gpu_paths.py check them on the CPU.
"""

from __future__ import annotations

import numpy as np

from ..runtime import core, gpu
from .attrs import OP

THREADS_X, THREADS_Y = 32, 8  # a tiled block's threads (transpose.cu's THREADS_X, THREADS_Y)


def _collapse(dims: tuple[int, ...], permutation: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Drop size-1 dims and merge input dims that stay adjacent and in order in the output."""
    keep = [d for d in range(len(dims)) if dims[d] != 1]
    if not keep:
        return [1], [0]
    renumber = {old: new for new, old in enumerate(keep)}
    sizes = [dims[d] for d in keep]
    perm = [renumber[p] for p in permutation if p in renumber]
    groups = [[perm[0]]]
    for p in perm[1:]:
        if p == groups[-1][-1] + 1:
            groups[-1].append(p)
        else:
            groups.append([p])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])
    position = {g: i for i, g in enumerate(order)}
    in_dims = [int(np.prod([sizes[d] for d in groups[g]])) for g in order]
    return in_dims, [position[g] for g in range(len(groups))]


def gpu_plan(dims: tuple[int, ...], permutation: tuple[int, ...], dtype: np.dtype, sm_count: int) -> tuple:
    """How to run a permutation on the GPU: ('copy',), ('gather', ...) or ('tiled', ...). `sm_count`,
    the device's SMs, only steers the tile size (fewer, larger tiles only when they fill the device)."""
    in_dims, perm = _collapse(dims, permutation)
    rank, count = len(in_dims), int(np.prod(dims, dtype=np.int64))
    if perm == list(range(rank)):
        return ("copy",)
    index = gpu.index_type(count)
    in_strides = core.c_strides(in_dims)
    out_dims = [in_dims[p] for p in perm]
    out_strides = core.c_strides(out_dims)
    type_args = f"<{gpu.bits_type(dtype)}, {index}>"
    scalar = np.int32 if index == "int" else np.int64
    if perm[-1] == rank - 1:
        args = (scalar(count), np.int32(rank), gpu.ints_arg(out_dims), gpu.ints_arg([in_strides[p] for p in perm]))
        return ("gather", f"transpose_gather{type_args}", gpu.grid_for(count), gpu.BLOCK, args)
    a = perm[-1]
    b = perm.index(rank - 1)
    batch = [d for d in range(rank) if d not in (b, rank - 1)]
    size_x, size_a = in_dims[rank - 1], in_dims[a]
    batch_count = int(np.prod([out_dims[d] for d in batch], dtype=np.int64))
    args = (scalar(size_x), scalar(size_a), scalar(in_strides[a]), scalar(out_strides[b]), scalar(batch_count),
            np.int32(len(batch)), gpu.ints_arg([out_dims[d] for d in batch]),
            gpu.ints_arg([in_strides[perm[d]] for d in batch]), gpu.ints_arg([out_strides[d] for d in batch]))
    tile = 64
    if np.dtype(dtype).itemsize > 8 or -(-size_x // 64) * -(-size_a // 64) * batch_count < 4 * sm_count:
        tile = 32  # 16-byte elements (shared memory), or too few 64x64 tiles to fill the GPU (PSA: 70)
    tiles = -(-size_x // tile) * -(-size_a // tile)
    name = f"transpose_tiled<{gpu.bits_type(dtype)}, {index}, {tile}>"
    return ("tiled", name, (tiles, gpu.capped(batch_count, 65535)), (THREADS_X, THREADS_Y), args)


def plan_path(plan: tuple) -> str:
    """The named GPU path (kernels.runtime.gpu_paths) of a plan from gpu_plan."""
    if plan[0] != "tiled":
        return f"{OP}.{plan[0]}"
    return f"{OP}.tiled{plan[1].rsplit(', ', 1)[1][:-1]}"
