"""softmax on YOLOv10 shapes: the PSA attention softmax over the last dim of
YOLOv10x's 1x5x400x400 scores, and the DFL decode's softmax over dim 1 of
(1, 16, 4, 8400); forward and backward, beside torch.softmax and its backward.

float16 and bfloat16 rows run on the GPU only (conftest.DTYPES), beside PyTorch in the same dtype;
their groups end in the dtype's name."""

import numpy as np
import pytest

from kernels import SoftmaxAttrs, TensorShape, softmax

from .conftest import DTYPES, dtype_suffix, half_rows_on_gpu_only

SHAPES = [
    pytest.param((1, 5, 400, 400), -1, id="psa_1x5x400x400_dim-1"),
    pytest.param((1, 16, 4, 8400), 1, id="dfl_1x16x4x8400_dim1"),
]


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("dims, dim", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax(benchmark, bench, dims, dim, direction, dtype):
    half_rows_on_gpu_only(bench, dtype)
    group = f"softmax {direction} {dims} dim {dim}{dtype_suffix(dtype)}"
    count = int(np.prod(dims))
    # forward reads x and writes y; backward reads y and g and writes input_grad
    bytes_moved = (2 if direction == "forward" else 3) * count * dtype.itemsize
    input, output_grad = bench.array(dims, seed=0, dtype=dtype), bench.array(dims, seed=1, dtype=dtype)
    output, input_grad = bench.empty(dims, dtype), bench.empty(dims, dtype)
    if bench.impl == "torch":
        torch = bench.torch
        torch.softmax(input, dim, out=output)
        if direction == "forward":
            function = lambda: torch.softmax(input, dim, out=output)  # noqa: E731
        else:
            function = lambda: torch.ops.aten._softmax_backward_data.out(  # noqa: E731
                output_grad, output, dim, input.dtype, grad_input=input_grad)
        bench.run(benchmark, function, bytes_moved, group)
        return
    attrs = SoftmaxAttrs(dim)
    shape = TensorShape(dims, dtype)
    state = softmax.init_kernel(bench.handle, attrs, shape, shape)
    softmax.forward_kernel(bench.stream, bench.handle, state, attrs, input, output)
    if direction == "forward":
        function = lambda: softmax.forward_kernel(bench.stream, bench.handle, state, attrs, input, output)  # noqa: E731
    else:
        function = lambda: softmax.backward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, output, output_grad, None, input_grad)
    bench.run(benchmark, function, bytes_moved, group)
    softmax.cleanup_kernel(bench.handle, state)
