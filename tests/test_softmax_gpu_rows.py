"""softmax's rows-in-registers GPU kernels (inner == 1, rows <= 1024 long): the
16-byte-pack path (size a multiple of the pack, every array 16-byte aligned) and the
scalar path with the same slots (odd sizes, offset views) against the CPU in float64
on random data, and the two paths against each other bit for bit."""

import numpy as np
import pytest

from conformance.case import ulp
from conformance.compare import compare
from kernels import SoftmaxAttrs, TensorShape, softmax

from .conftest import Dev, require

ROWS = 37  # not a multiple of the 4 rows of a 128-thread block
# 1024/1000/512/100/64: packs (per lane 32, 32, 16, 4, 2 floats); 1023/1021/65/37: the scalar path with
# a ragged last chunk; 33/5: the per-lane-2 and several-rows-a-warp kernels (always scalar).
SIZES = [1024, 1023, 1021, 1000, 512, 100, 65, 64, 37, 33, 5]
ATTRS = SoftmaxAttrs(-1)


def _random(size, dtype, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((ROWS, size)) * 3).astype(dtype)


def _cpu_float64(direction, *arrays):
    """The CPU kernel in float64 on the (exactly widened) values: the reference."""
    cpu = Dev("cpu")
    dims = arrays[0].shape
    state = softmax.init_kernel(cpu.handle, ATTRS, TensorShape(dims, np.float64), TensorShape(dims, np.float64))
    result = np.full(dims, np.nan)
    wide = [np.asarray(a, np.float64) for a in arrays]
    if direction == "forward":
        softmax.forward_kernel(cpu.stream, cpu.handle, state, ATTRS, wide[0], result)
    else:
        softmax.backward_kernel(cpu.stream, cpu.handle, state, ATTRS, wide[0], wide[1], None, result)
    cpu.handle.close()
    return result


def _on_gpu(gpu, host, offset):
    """A device copy of `host`, starting `offset` elements into its allocation (offset 1: not 16-byte aligned)."""
    import cupy

    with gpu.stream:
        buffer = cupy.full(host.size + 1, np.nan, host.dtype)
        view = buffer[offset:offset + host.size].reshape(host.shape)
        view[...] = cupy.asarray(host)
    return view


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", SIZES)
def test_gpu_rows_forward_packs_and_offset_views_match_cpu(size, dtype):
    require("gpu")
    gpu = Dev("gpu")
    x = _random(size, dtype, size)
    expected = _cpu_float64("forward", x).astype(dtype)
    state = softmax.init_kernel(gpu.handle, ATTRS, TensorShape(x.shape, dtype), TensorShape(x.shape, dtype))
    results = []
    for input_offset, output_offset in [(0, 0), (1, 0), (0, 1), (1, 1)]:
        output = _on_gpu(gpu, np.full(x.shape, np.nan, dtype), output_offset)
        softmax.forward_kernel(gpu.stream, gpu.handle, state, ATTRS, _on_gpu(gpu, x, input_offset), output)
        results.append(gpu.host(output))
    gpu.stream.synchronize()
    for got in results:
        assert compare(got, expected, ulp(8)) is None
        assert np.array_equal(got, results[0])  # same slots, same summation order on both paths
    gpu.handle.close()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", SIZES)
def test_gpu_rows_backward_packs_and_offset_views_match_cpu(size, dtype):
    require("gpu")
    gpu = Dev("gpu")
    x = _random(size, dtype, size)
    y = (np.exp(x - x.max(axis=1, keepdims=True))).astype(dtype)
    y /= y.sum(axis=1, keepdims=True)
    g = _random(size, dtype, size + 1)
    expected = _cpu_float64("backward", y, g)
    state = softmax.init_kernel(gpu.handle, ATTRS, TensorShape(x.shape, dtype), TensorShape(x.shape, dtype))
    results = []
    for y_offset, g_offset, dx_offset in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1)]:
        input_grad = _on_gpu(gpu, np.full(x.shape, np.nan, dtype), dx_offset)
        softmax.backward_kernel(gpu.stream, gpu.handle, state, ATTRS, _on_gpu(gpu, y, y_offset),
                                _on_gpu(gpu, g, g_offset), None, input_grad)
        results.append(gpu.host(input_grad))
    gpu.stream.synchronize()
    bound = _backward_bound(y, g)
    for got in results:
        assert np.all(np.abs(got.astype(np.float64) - expected) <= bound)
        assert np.array_equal(got, results[0])
    gpu.handle.close()


def _backward_bound(y, g):
    """How far y * (g - dot) may be from the float64 value: g - dot cancels on random data, so
    ulps of the result mean nothing; the dot's rounding is at most (32 per-lane terms + 5 butterfly
    steps, with room) 64 eps of sum |g * y|, times y, plus a few roundings of the result itself."""
    eps = np.finfo(y.dtype).eps
    y64, g64 = y.astype(np.float64), g.astype(np.float64)
    dot = np.sum(g64 * y64, axis=1, keepdims=True)
    magnitude = np.sum(np.abs(g64 * y64), axis=1, keepdims=True)
    return y64 * eps * (4 * np.abs(g64 - dot) + 64 * magnitude) + np.finfo(y.dtype).tiny


def test_rows_plan_for_the_bench_shape():
    """(65536, 1024) float32 along the last dim takes the 32-lane, 32-per-lane rows kernel."""
    kind, grid, block, sizes = softmax.plan.gpu_plan((65536, 1024), 1, np.dtype(np.float32))
    assert kind == "rows<float, 32, 32>" and block == softmax.plan.ROWS_BLOCK
    assert grid * (block // 32) >= 65536 and [int(s) for s in sizes] == [65536, 1024]


@pytest.mark.parametrize("dims, axis, kind", [
    ((2, 5, 7), 1, "columns_cached<double, 8>"),  # a short dim with inner > 1: in registers, the next cached size
    ((64, 3000, 300), 1, "columns<double>"),  # many columns (19200 >= 8192): a thread per column
    ((2, 3000, 2), 1, "block<double>"),  # few columns of a long dim: a block per column
])
def test_column_plans(dims, axis, kind):
    name, grid, block, sizes = softmax.plan.gpu_plan(dims, axis, np.dtype(np.float64))
    columns = dims[0] * dims[2]
    assert name == kind and block == softmax.plan.COLUMN_BLOCK
    assert [int(s) for s in sizes][:2] == [columns, dims[1]] and int(sizes[2]) == dims[2]
    assert grid * block >= columns if kind.startswith("columns") else grid == columns
