"""top_k's GPU launch choice worked out as data, pure and device-free: the kernel, grid, block,
whether a row's candidates live in shared memory or in the state's scratch, and whether its keys are
read once into shared memory or from global memory on each pass (gpu_plan)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime import core, gpu
from .attrs import OP

# Threads per block, one block a row: the narrowest of 256, 512 and TOP_K_BLOCK (the widest: the kernels'
# launch bounds, the backward's tiles) at which a thread has at most TOP_K_KEYS_PER_THREAD of the row's
# keys. On the H200 (docs/performance.md#top_k-and-the-detections) a long row runs fastest at 1024, its
# passes' latency hidden by more warps (YOLOv10's 8400 and 24000 keys: 1.9-2.3x faster than at 256), while
# many short rows run fastest at 256, more of their blocks on an SM at once (4096 rows of 300: 3.2x
# faster than at 1024).
TOP_K_BLOCK = 1024
TOP_K_KEYS_PER_THREAD = 4
# Candidates (key, index) of a row held in shared memory up to this k (12 KiB for double's 8-byte keys);
# a larger k keeps them in the state's global scratch, 2k per block (the candidates and the other buffer of
# the radix sort that ranks them there).
TOP_K_SHARED_CANDIDATES = 1024
DEFINES = {"TOP_K_BLOCK": TOP_K_BLOCK, "TOP_K_SHARED_CANDIDATES": TOP_K_SHARED_CANDIDATES}
# A row's keys held in the launch's dynamic shared memory up to this many bytes (and within the device's
# opt-in limit, less TOP_K_STATIC_BYTES): YOLOv10's longest row, the 300 x 80 class scores, is 24000 keys
# (93.75 KiB); a longer row is read from global memory on each of the radix select's passes.
TOP_K_CACHE_BYTES = 96 * 1024
# The scratch path's radix sort runs in the launch's dynamic shared memory where its two buffers (2k keys
# and 2k int indices) fit in the device's opt-in limit less TOP_K_STATIC_BYTES (k up to 13504 for 4-byte
# keys and 9002 for double's on an H200); they share it with the row's cached keys, which the sort follows.
# Else the sort runs in the scratch, its passes' loads from global memory (k = n = 8400 in float32 took
# 126 us with the sort there, 89 with it in shared memory: docs/performance.md#top_k-and-the-detections).
# The backward of a k past TOP_K_SHARED_CANDIDATES sorts each row's (index, j) pairs in the launch's dynamic
# shared memory (top_k_backward_sorted, O(n + k) a row) where they fit (2k keys and 2k ints: 16 bytes a pair,
# k up to 13504 on an H200); else, and for a smaller k, it gathers (top_k_backward, O(n k) a row, a block a
# chunk of a row). A gather of k = n = 8400 took 2484 us, against 22 for PyTorch's zeros and scatter.
# The kernels' own shared memory at most, which each use of dynamic shared memory above leaves them: the
# forward's histogram (1 KiB), warp counts and 1024 candidates of a key and an int (12 KiB for double's
# keys), or, in its scratch instantiation and in top_k_backward_sorted, the sort's digit counts (2 KiB);
# tests/test_top_k_paths.py checks it on a GPU.
TOP_K_STATIC_BYTES = 16 * 1024
# The unsigned key of each element type (top_k.cu's KeyOf): its NumPy dtype, for the scratch.
KEY_DTYPES = {"half_t": np.uint32, "bfloat16_t": np.uint32, "float": np.uint32, "double": np.uint64}


def _within(nbytes: int, limit: int) -> int:
    """`nbytes` of a launch's dynamic shared memory where they fit in `limit`, else 0 (that use goes without)."""
    return nbytes if nbytes <= limit else 0


@dataclass(frozen=True)
class GpuPlan:
    """One top_k's launches: `forward`/`backward` the kernels' name expressions, `grid` blocks of the forward
    (each strides over rows) and `backward_grid` of the backward (each strides over chunks of `block` elements
    of a row), of `block` threads (both kernels), `shared`: the candidates in shared memory
    (else `scratch` elements of the state's global scratch), `cache_bytes`: the forward's dynamic shared
    memory for a row's keys (0: the keys read from global memory), `sort_bytes`: that for the scratch path's sort
    (0: the sort in the scratch), `shared_mem` the launch's dynamic shared memory (the larger of the two), `paths`
    the named GPU paths of the forward; `backward_shared_mem` the backward's dynamic shared memory (0: the
    gather; else top_k_backward_sorted, a block a row, `backward_grid` blocks), `backward_path` its path."""

    forward: str
    backward: str
    grid: int
    backward_grid: int
    backward_shared_mem: int
    block: int
    rows: int
    n: int
    k: int
    shared: bool
    scratch: int
    key_dtype: np.dtype
    cache_bytes: int
    sort_bytes: int
    paths: tuple[str, ...]

    @property
    def shared_mem(self) -> int:
        return max(self.cache_bytes, self.sort_bytes)

    @property
    def backward_path(self) -> str:
        return f"{OP}.backward." + ("sorted" if self.backward_shared_mem else "gather")


def gpu_plan(dims: tuple[int, ...], k: int, dtype: np.dtype, shared_optin: int) -> GpuPlan:
    """The plan of a top_k of `dims` (along the last dim) in `dtype`, on a device whose blocks may use
    `shared_optin` bytes of shared memory (gpu.shared_memory_optin)."""
    rows, n = core.numel(dims[:-1]), dims[-1]
    if n >= 2**31:
        raise core.fail(core.ShapeError, OP, "input_shape", "rows shorter than 2^31 elements on the GPU", n)
    t = gpu.cuda_type(dtype)
    shared = k <= TOP_K_SHARED_CANDIDATES
    grid = gpu.capped(rows, gpu.GRID_BLOCKS)
    block = 256
    while block < TOP_K_BLOCK and block * TOP_K_KEYS_PER_THREAD < n:
        block *= 2
    key_dtype = np.dtype(KEY_DTYPES[t])
    reserve = shared_optin - TOP_K_STATIC_BYTES  # the dynamic shared memory a launch may ask for
    cache_bytes = _within(n * key_dtype.itemsize, min(TOP_K_CACHE_BYTES, reserve))
    sort_bytes = 0 if shared else _within(2 * k * (key_dtype.itemsize + 4), reserve)  # 2k keys, 2k int indices
    paths = (f"{OP}.forward." + ("shared" if shared else "scratch"),
             f"{OP}.forward." + ("keys_cached" if cache_bytes else "keys_global"))
    if not shared:
        paths += (f"{OP}.forward.sort_" + ("shared" if sort_bytes else "global"),)
    backward_shared_mem = 0 if shared else _within(2 * k * (4 + 4), reserve)  # 2k 4-byte keys, 2k int positions
    backward = f"top_k_backward_sorted<{t}>" if backward_shared_mem else f"top_k_backward<{t}>"
    backward_grid = grid if backward_shared_mem else gpu.capped(rows * -(-n // block), gpu.GRID_BLOCKS)
    return GpuPlan(forward=f"top_k_forward<{t}, {'true' if shared else 'false'}>", backward=backward,
                   grid=grid, backward_grid=backward_grid, backward_shared_mem=backward_shared_mem, block=block,
                   rows=rows, n=n, k=k, shared=shared,
                   scratch=0 if shared else grid * 2 * k, key_dtype=key_dtype, cache_bytes=cache_bytes,
                   sort_bytes=sort_bytes, paths=paths)
