"""top_k's GPU launch choice worked out as data, pure and device-free: the kernel, grid, block and
whether a row's candidates live in shared memory or in the state's scratch (gpu_plan)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime import core, gpu
from .attrs import OP

TOP_K_BLOCK = 256  # threads per block: one block per row
# Candidates (key, index) of a row held in shared memory up to this k (12 KiB for double's 8-byte keys);
# a larger k keeps them in the state's global scratch, k per block.
TOP_K_SHARED_CANDIDATES = 1024
DEFINES = {"TOP_K_BLOCK": TOP_K_BLOCK, "TOP_K_SHARED_CANDIDATES": TOP_K_SHARED_CANDIDATES}
# The unsigned key of each element type (top_k.cu's KeyOf): its NumPy dtype, for the scratch.
KEY_DTYPES = {"half_t": np.uint32, "bfloat16_t": np.uint32, "float": np.uint32, "double": np.uint64}


@dataclass(frozen=True)
class GpuPlan:
    """One top_k's launches: `forward`/`backward` the kernels' name expressions, `grid` blocks (each
    strides over rows), `shared`: the candidates in shared memory (else `scratch` elements of the
    state's global scratch), `path` the named GPU path."""

    forward: str
    backward: str
    grid: int
    rows: int
    n: int
    k: int
    shared: bool
    scratch: int
    key_dtype: np.dtype
    path: str


def gpu_plan(dims: tuple[int, ...], k: int, dtype: np.dtype) -> GpuPlan:
    """The plan of a top_k of `dims` (along the last dim) in `dtype`."""
    rows, n = core.numel(dims[:-1]), dims[-1]
    if n >= 2**31:
        raise core.fail(core.ShapeError, OP, "input_shape", "rows shorter than 2^31 elements on the GPU", n)
    t = gpu.cuda_type(dtype)
    shared = k <= TOP_K_SHARED_CANDIDATES
    grid = gpu.capped(rows, gpu.GRID_BLOCKS)
    return GpuPlan(forward=f"top_k_forward<{t}, {'true' if shared else 'false'}>", backward=f"top_k_backward<{t}>",
                   grid=grid, rows=rows, n=n, k=k, shared=shared, scratch=0 if shared else grid * k,
                   key_dtype=np.dtype(KEY_DTYPES[t]), path=f"{OP}.forward." + ("shared" if shared else "scratch"))
