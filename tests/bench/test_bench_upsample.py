"""upsample on YOLOv10x shapes: the neck's nearest x2 of 1x640x20x20 and
1x640x40x40, forward and backward (the backward sums each 2x2 block); the backward
in float16 and bfloat16 too (GPU only, sums in float32 beside PyTorch's in the dtype;
groups end in the dtype's name)."""

import numpy as np
import pytest

from kernels import TensorShape, UpsampleAttrs, upsample
from kernels.core import BFLOAT16

from .test_bench_batch_norm import array, half_rows_on_gpu_only

SHAPES = [
    pytest.param((1, 640, 20, 20), id="1x640x20x20"),
    pytest.param((1, 640, 40, 40), id="1x640x40x40"),
]
SCALE = 2


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("dims", SHAPES)
def test_upsample_nearest(benchmark, bench, dims, direction):
    n, c, h, w = dims
    out_dims = (n, c, h * SCALE, w * SCALE)
    group = f"upsample nearest x{SCALE} {direction} {dims}"
    bytes_moved = (1 + SCALE * SCALE) * int(np.prod(dims)) * 4
    if direction == "forward":
        source, destination = bench.array(dims), bench.empty(out_dims)
    else:
        source, destination = bench.array(out_dims), bench.empty(dims)
    if bench.impl == "torch":
        torch = bench.torch
        if direction == "forward":
            function = lambda: destination.copy_(  # noqa: E731
                torch.nn.functional.interpolate(source, scale_factor=SCALE, mode="nearest"))
        else:  # what autograd calls for interpolate's backward, written into a preallocated gradient
            backward = torch.ops.aten.upsample_nearest2d_backward.grad_input
            function = lambda: backward(source, [h * SCALE, w * SCALE], list(dims),  # noqa: E731
                                        float(SCALE), float(SCALE), grad_input=destination)
        bench.run(benchmark, function, bytes_moved, group)
        return
    attrs = UpsampleAttrs(SCALE)
    state = upsample.init_kernel(bench.handle, attrs, TensorShape(dims, np.float32), TensorShape(out_dims, np.float32))
    if direction == "forward":
        function = lambda: upsample.forward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, source, destination)
    else:
        function = lambda: upsample.backward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, None, source, None, destination)
    bench.run(benchmark, function, bytes_moved, group)
    upsample.cleanup_kernel(bench.handle, state)


@pytest.mark.parametrize("dtype", [pytest.param(np.dtype(np.float16), id="f16"), pytest.param(BFLOAT16, id="bf16")])
@pytest.mark.parametrize("dims", SHAPES)
def test_upsample_nearest_backward_half(benchmark, bench, dims, dtype):
    half_rows_on_gpu_only(bench, dtype)
    n, c, h, w = dims
    out_dims = (n, c, h * SCALE, w * SCALE)
    group = f"upsample nearest x{SCALE} backward {dims} {dtype.name}"
    bytes_moved = (1 + SCALE * SCALE) * int(np.prod(dims)) * dtype.itemsize
    source, destination = array(bench, out_dims, dtype), bench.empty(dims, dtype)
    if bench.impl == "torch":
        backward = bench.torch.ops.aten.upsample_nearest2d_backward.grad_input
        bench.run(benchmark, lambda: backward(source, [h * SCALE, w * SCALE], list(dims), float(SCALE), float(SCALE),
                                              grad_input=destination), bytes_moved, group)
        return
    attrs = UpsampleAttrs(SCALE)
    state = upsample.init_kernel(bench.handle, attrs, TensorShape(dims, dtype), TensorShape(out_dims, dtype))
    bench.run(benchmark, lambda: upsample.backward_kernel(bench.stream, bench.handle, state, attrs, None, source, None,
                                                          destination), bytes_moved, group)
    upsample.cleanup_kernel(bench.handle, state)
