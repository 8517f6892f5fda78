"""Every GPU transpose path (copy, gather, 32x32 and 64x64 tiles, 32- and 64-bit indices in the
plan) against NumPy, bit for bit, on shapes too large for goldens; and which path each shape takes."""

import numpy as np
import pytest

from kernels import TensorShape, TransposeAttrs, transpose

from .conftest import Dev, require


@pytest.mark.parametrize("dims, permutation, kind, tile", [
    ((2, 3, 4), (0, 1, 2), "copy", None),
    ((1, 1, 1), (2, 0, 1), "copy", None),  # only size-1 dims: nothing moves
    ((4, 3, 2), (1, 0, 2), "gather", None),
    ((1, 5, 128, 400), (0, 1, 3, 2), "tiled", 32),
    ((8, 520, 520), (0, 2, 1), "tiled", 64),
    ((8, 64, 160, 160), (0, 2, 3, 1), "tiled", 64),
])
def test_plan_choice(dims, permutation, kind, tile):
    plan = transpose.plan.gpu_plan(dims, permutation, np.dtype(np.float32), sm_count=132)  # an H200
    assert plan[0] == kind
    if tile is not None:
        assert plan[1].endswith(f", {tile}>")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int16, np.complex128])
@pytest.mark.parametrize("dims, permutation", [
    ((8, 520, 520), (0, 2, 1)),        # 64x64 tiles, edges not multiples of 64
    ((3, 70, 5, 130), (3, 1, 2, 0)),   # tiles with batch dims of both kinds
    ((6, 7, 300), (2, 0, 1)),
    ((5, 4, 3, 2, 6), (1, 3, 2, 0, 4)),  # gather
])
def test_gpu_matches_numpy(dims, permutation, dtype):
    require("gpu")
    dev = Dev("gpu")
    rng = np.random.default_rng(7)
    host = (rng.standard_normal(dims) * 100).astype(dtype)
    attrs = TransposeAttrs(permutation)
    out_dims = tuple(dims[p] for p in permutation)
    state = transpose.init_kernel(dev.handle, attrs, TensorShape(dims, dtype), TensorShape(out_dims, dtype))
    input = dev.array(host)
    output = dev.array(np.full(out_dims, 3, dtype))
    transpose.forward_kernel(dev.stream, dev.handle, state, attrs, input, output)
    back = dev.array(np.full(dims, 5, dtype))
    transpose.backward_kernel(dev.stream, dev.handle, state, attrs, output, output, input, back)
    dev.stream.synchronize()
    assert np.array_equal(dev.host(output), host.transpose(permutation))
    assert np.array_equal(dev.host(back), host)
    dev.handle.close()
