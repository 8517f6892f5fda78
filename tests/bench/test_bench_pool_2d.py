"""pool_2d on YOLOv10 shapes: the SPPF pool (MAX 5x5, stride 1, pad 2) on YOLOv10n's
1x128x20x20 and YOLOv10x's 1x640x20x20, and 8x256x80x80 for bandwidth; forward
and backward, beside F.max_pool2d and its autograd backward.

Bytes are what any implementation must move (read the input, write the output;
backward: read output_grad, write input_grad), so the GB/s of ours and PyTorch's
compare directly; ours also moves one byte of argmax per output, PyTorch eight.

Half precision (float16, bfloat16) rows, on the GPU only, beside F.max_pool2d in the same dtype;
their groups end in the dtype's name.
"""

import numpy as np
import pytest

from kernels import Pool2DAttrs, PoolOp, TensorShape, pool_2d

from .conftest import DTYPES, dtype_suffix, half_rows_on_gpu_only

SPPF = Pool2DAttrs(5, 5, 1, 1, 2, 2, PoolOp.MAX)
SHAPES = [
    pytest.param((1, 128, 20, 20), id="sppf_v10n_1x128x20x20"),
    pytest.param((1, 640, 20, 20), id="sppf_v10x_1x640x20x20"),
    pytest.param((8, 256, 80, 80), id="sppf_8x256x80x80"),
]


def _torch_pool(bench, input):
    return bench.torch.nn.functional.max_pool2d(input, (SPPF.kernel_h, SPPF.kernel_w), (SPPF.stride_h, SPPF.stride_w),
                                                (SPPF.padding_h, SPPF.padding_w))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", SHAPES)
def test_pool_2d_forward(benchmark, bench, dims, dtype):
    half_rows_on_gpu_only(bench, dtype)
    out_dims = pool_2d.output_dims(SPPF, dims)
    group = f"pool_2d forward MAX 5x5 s1 p2 {dims}{dtype_suffix(dtype)}"
    bytes_moved = (int(np.prod(dims)) + int(np.prod(out_dims))) * dtype.itemsize
    input = bench.array(dims, dtype)
    if bench.impl == "torch":
        bench.run(benchmark, lambda: _torch_pool(bench, input), bytes_moved, group)
        return
    output = bench.empty(out_dims, dtype)
    state = pool_2d.init_kernel(bench.handle, SPPF, TensorShape(dims, dtype), TensorShape(out_dims, dtype))
    bench.run(benchmark, lambda: pool_2d.forward_kernel(bench.stream, bench.handle, state, SPPF, input, output),
              bytes_moved, group)
    pool_2d.cleanup_kernel(bench.handle, state)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", SHAPES)
def test_pool_2d_backward(benchmark, bench, dims, dtype):
    half_rows_on_gpu_only(bench, dtype)
    out_dims = pool_2d.output_dims(SPPF, dims)
    group = f"pool_2d backward MAX 5x5 s1 p2 {dims}{dtype_suffix(dtype)}"
    bytes_moved = (int(np.prod(dims)) + int(np.prod(out_dims))) * dtype.itemsize
    input = bench.array(dims, dtype)
    output_grad = bench.array(out_dims, dtype, seed=1)
    if bench.impl == "torch":
        input.requires_grad_()
        output = _torch_pool(bench, input)
        torch = bench.torch
        bench.run(benchmark, lambda: torch.autograd.grad(output, [input], output_grad, retain_graph=True),
                  bytes_moved, group)
        return
    output, input_grad = bench.empty(out_dims, dtype), bench.empty(dims, dtype)
    state = pool_2d.init_kernel(bench.handle, SPPF, TensorShape(dims, dtype), TensorShape(out_dims, dtype))
    pool_2d.forward_kernel(bench.stream, bench.handle, state, SPPF, input, output)  # saves the argmax
    bench.run(benchmark, lambda: pool_2d.backward_kernel(bench.stream, bench.handle, state, SPPF, output, output_grad,
                                                         input, input_grad), bytes_moved, group)
    pool_2d.cleanup_kernel(bench.handle, state)
