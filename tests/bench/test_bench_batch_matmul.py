"""batch_matmul on YOLOv10x's PSA shapes at a 640x640 input (5 heads, 400 tokens):
the scores q^T k, (1,5,400,32) x (1,5,32,400), and the values v attn^T,
(1,5,64,400) x (1,5,400,400); forward and backward, beside torch.matmul (TF32 off).
Rates use flops = 2 * batch * M * N * K per product (backward: two products).

Half precision (float16, bfloat16) rows, on the GPU only: the same random values rounded to the
dtype, beside torch.matmul in that dtype (cuBLAS with tensor cores and float32 sums on both
sides); their groups end in the dtype's name."""

import numpy as np
import pytest

from kernels import BatchMatmulAttrs, TensorShape, batch_matmul

from .conftest import DTYPES, half_rows_on_gpu_only

SHAPES = [
    pytest.param((1, 5), 400, 32, 400, id="psa_scores_1x5_400x32_32x400"),
    pytest.param((1, 5), 64, 400, 400, id="psa_values_1x5_64x400_400x400"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("batch, m, k, n", SHAPES)
def test_batch_matmul(benchmark, bench, batch, m, k, n, direction, dtype):
    half_rows_on_gpu_only(bench, dtype)
    lhs_dims, rhs_dims, out_dims = batch + (m, k), batch + (k, n), batch + (m, n)
    group = f"batch_matmul {direction} {lhs_dims} x {rhs_dims}{'' if dtype == np.float32 else ' ' + dtype.name}"
    batch_count = int(np.prod(batch))
    products = 1 if direction == "forward" else 2
    flops = products * 2 * batch_count * m * n * k
    sizes = [int(np.prod(d)) for d in (lhs_dims, rhs_dims, out_dims)]
    # forward: read lhs, rhs, write output; backward: read g, lhs, rhs, write lhs_grad, rhs_grad
    bytes_moved = dtype.itemsize * (sum(sizes) if direction == "forward" else sizes[2] + 2 * (sizes[0] + sizes[1]))
    lhs, rhs = bench.array(lhs_dims, dtype, seed=0), bench.array(rhs_dims, dtype, seed=1)
    output_grad = bench.array(out_dims, dtype, seed=2)
    output, lhs_grad, rhs_grad = bench.empty(out_dims, dtype), bench.empty(lhs_dims, dtype), bench.empty(rhs_dims, dtype)
    if bench.impl == "torch":
        torch = bench.torch
        if direction == "forward":
            function = lambda: torch.matmul(lhs, rhs, out=output)  # noqa: E731
        else:
            def function():
                torch.matmul(output_grad, rhs.transpose(-1, -2), out=lhs_grad)
                torch.matmul(lhs.transpose(-1, -2), output_grad, out=rhs_grad)
        bench.run(benchmark, function, bytes_moved, group, flops=flops)
        return
    attrs = BatchMatmulAttrs()
    state = batch_matmul.init_kernel(bench.handle, attrs, TensorShape(lhs_dims, dtype),
                                     TensorShape(rhs_dims, dtype), TensorShape(out_dims, dtype))
    if direction == "forward":
        function = lambda: batch_matmul.forward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, lhs, rhs, output)
    else:
        function = lambda: batch_matmul.backward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad)
    bench.run(benchmark, function, bytes_moved, group, flops=flops)
    batch_matmul.cleanup_kernel(bench.handle, state)
