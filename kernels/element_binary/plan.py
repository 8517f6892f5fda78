"""element_binary's GPU plans: pure Python, no device. The dims are collapsed, the
kernels chosen and every reduction split from the shapes and the device's SM count,
so tests build and emulate plans without a GPU (tests/test_element_binary_plan.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..runtime import core, gpu

# Reductions are split into chunks summed in a second pass, so that a gradient with
# few elements and many broadcast positions still fills the device. The split decides the
# order of the sums, so it depends on the shapes alone, never on the device: every run on
# every GPU gives the same bits. REDUCTION_THREADS is therefore a constant, not the device's
# size: 2**18 fills an H200 (132 SMs x 2048 resident threads, rounded to a power of two);
# a smaller GPU runs the same split in more waves.
REDUCTION_THREADS = 1 << 18
MIN_PER_THREAD = 32       # reduced positions one thread sums at least, per chunk ('rows')
MIN_PER_WARP = 32 * 16    # reduced positions one warp sums at least, per chunk ('warps')
MAX_CHUNKS = 1024
WARP_SUM_CHUNKS = 8       # more chunks than this: the second pass takes a warp per gradient element
# A broadcasting forward whose innermost collapsed dim has this many elements or more runs along rows
# (binary_rows): a row's offsets are found once, and its elements are read in vectors. Below it, rows
# would leave most of a block idle, and the kernel that finds every element's offsets (binary_broadcast)
# runs instead. 1024: one 256-thread block's vectors of float32.
ROWS_MIN_INNER = 1024


def collapse(out_dims: tuple[int, ...], lhs_dims: tuple[int, ...], rhs_dims: tuple[int, ...]
             ) -> tuple[list[int], list[int], list[int]]:
    """The output's dims without size-1 dims, adjacent dims merged where lhs, rhs and output all
    allow it, and the lhs and rhs strides of each (0 where that side is broadcast)."""
    rank = len(out_dims)
    padded = []
    for dims in (lhs_dims, rhs_dims):
        full = [1] * (rank - len(dims)) + list(dims)
        padded.append([0 if size == 1 else stride for size, stride in zip(full, core.c_strides(full))])
    sizes: list[int] = []
    lhs_strides: list[int] = []
    rhs_strides: list[int] = []
    for d in range(rank):
        size, ls, rs = out_dims[d], padded[0][d], padded[1][d]
        if size == 1:
            continue
        if sizes and lhs_strides[-1] == ls * size and rhs_strides[-1] == rs * size:
            sizes[-1] *= size  # the output is contiguous, so its strides always merge
            lhs_strides[-1], rhs_strides[-1] = ls, rs
        else:
            sizes.append(size)
            lhs_strides.append(ls)
            rhs_strides.append(rs)
    if not sizes:  # one element: both sides have it
        return [1], [1], [1]
    return sizes, lhs_strides, rhs_strides


def divider(size: int) -> int:
    """Constants of 32-bit division by `size` (PyTorch's IntDivider): magic | shift << 32.

    n / size == (umulhi(n, magic) + n) >> shift for 0 <= n < 2**31 and 1 <= size < 2**31.
    """
    if size < 1:  # a zero-size dim: nothing is ever divided by it
        return 1
    shift = 0
    while (1 << shift) < size:
        shift += 1
    magic = ((1 << 32) * ((1 << shift) - size)) // size + 1
    return magic | (shift << 32)


@dataclass(frozen=True)
class Space:
    """An index space over some of the collapsed output dims, outermost first, with the
    output, lhs and rhs strides of each dim."""

    sizes: tuple[int, ...]
    out_strides: tuple[int, ...]
    lhs_strides: tuple[int, ...]
    rhs_strides: tuple[int, ...]

    @property
    def count(self) -> int:
        return int(np.prod(self.sizes, dtype=np.int64))

    @functools.cached_property
    def args(self) -> tuple:
        """(rank, sizes, dividers, out, lhs, rhs strides) as kernel arguments, innermost dim first, packed once."""
        return (np.int32(len(self.sizes)), gpu.ints_arg(self.sizes[::-1]),
                gpu.ints_arg([divider(s) for s in self.sizes[::-1]]), gpu.ints_arg(self.out_strides[::-1]),
                gpu.ints_arg(self.lhs_strides[::-1]), gpu.ints_arg(self.rhs_strides[::-1]))


@dataclass(frozen=True)
class GradPlan:
    """How one side's gradient is computed: `kind` 'rows' (a thread per gradient element,
    looping over its broadcast positions) or 'warps' (a warp per gradient element, when the
    innermost dim is reduced); `chunks` > 1 splits the positions, and a second pass sums the
    chunks' partial sums (a thread per element, or a warp for more than WARP_SUM_CHUNKS)."""

    kind: str
    kept: Space
    reduced: Space
    chunks: int
    chunk: int


@dataclass(frozen=True)
class GpuPlan:
    same: bool                      # no broadcasting after collapsing: plain elementwise kernels
    count: int                      # output elements
    index: str                      # 'int' or 'long long'
    space: Space                    # the whole output (forward)
    grads: tuple[GradPlan, GradPlan]
    rows: bool = False              # a broadcasting forward along rows of the innermost dim (binary_rows)
    outer: Space | None = None      # the rows: every collapsed dim but the innermost
    inner: int = 0                  # the innermost collapsed dim's size: a row's elements
    sides_inner: tuple[bool, bool] = (False, False)  # whether lhs, rhs have the innermost dim (stride 1, else 0)


def grad_plan(space: Space, side: int, threads: int) -> GradPlan:
    """Split the output dims into those this side has (kept) and those it was broadcast along (reduced),
    and the reduced positions into chunks enough for about `threads` threads (REDUCTION_THREADS)."""
    strides = space.lhs_strides if side == 0 else space.rhs_strides
    parts: dict[bool, list[int]] = {True: [], False: []}
    for d, stride in enumerate(strides):
        parts[stride != 0].append(d)

    def sub(dims: list[int]) -> Space:
        return Space(tuple(space.sizes[d] for d in dims), tuple(space.out_strides[d] for d in dims),
                     tuple(space.lhs_strides[d] for d in dims), tuple(space.rhs_strides[d] for d in dims))

    kept, reduced = sub(parts[True]), sub(parts[False])
    kept_count, reduced_count = kept.count, reduced.count
    innermost_reduced = strides[-1] == 0 and space.sizes[-1] >= 32
    kind = "warps" if innermost_reduced else "rows"
    if kind == "warps":
        chunks = min(-(-(threads // 32) // max(kept_count, 1)), -(-reduced_count // MIN_PER_WARP), MAX_CHUNKS)
        chunks = max(chunks, 1)
        chunk = -(-reduced_count // chunks)
        chunk = -(-chunk // 32) * 32
    else:
        chunks = min(-(-threads // max(kept_count, 1)), -(-reduced_count // MIN_PER_THREAD), MAX_CHUNKS)
        chunks = max(chunks, 1)
        chunk = -(-reduced_count // chunks)
    chunk = max(chunk, 1)  # zero-size outputs never launch; keep the plan well formed
    chunks = max(1, -(-reduced_count // chunk))
    return GradPlan(kind, kept, reduced, chunks, chunk)


def gpu_plan(lhs_dims: tuple[int, ...], rhs_dims: tuple[int, ...], out_dims: tuple[int, ...]) -> GpuPlan:
    """Collapse the dims, choose the kernels and the reduction split; depends on the shapes only."""
    sizes, lhs_strides, rhs_strides = collapse(out_dims, lhs_dims, rhs_dims)
    space = Space(tuple(sizes), tuple(core.c_strides(sizes)), tuple(lhs_strides), tuple(rhs_strides))
    count = core.numel(out_dims)
    same = space.lhs_strides == space.out_strides and space.rhs_strides == space.out_strides
    threads = REDUCTION_THREADS
    # The partial sums index chunks * kept elements: bounded by the output count plus the target threads.
    index = gpu.index_type(count + threads)
    grads = (grad_plan(space, 0, threads), grad_plan(space, 1, threads))
    inner = space.sizes[-1]
    if same or inner < ROWS_MIN_INNER:
        return GpuPlan(same, count, index, space, grads)
    # The innermost dim's stride is 1 on a side that has it, 0 on one broadcast along it (collapse).
    outer = Space(space.sizes[:-1], space.out_strides[:-1], space.lhs_strides[:-1], space.rhs_strides[:-1])
    return GpuPlan(same, count, index, space, grads, rows=True, outer=outer, inner=inner,
                   sides_inner=(space.lhs_strides[-1] == 1, space.rhs_strides[-1] == 1))
