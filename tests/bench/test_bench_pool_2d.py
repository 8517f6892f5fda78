"""pool_2d on YOLOv10 shapes: the SPPF pool (MAX 5x5, stride 1, pad 2) on YOLOv10n's
1x128x20x20 and YOLOv10x's 1x640x20x20, and 8x256x80x80 for bandwidth; forward
and backward, beside F.max_pool2d and its autograd backward.

Bytes are what any implementation must move (read the input, write the output;
backward: read output_grad, write input_grad), so the GB/s of ours and PyTorch's
compare directly; ours also moves one byte of argmax per output, PyTorch eight.
"""

import numpy as np
import pytest

from kernels import Pool2DAttrs, PoolOp, TensorShape, pool_2d

SPPF = Pool2DAttrs(5, 5, 1, 1, 2, 2, PoolOp.MAX)
SHAPES = [
    pytest.param((1, 128, 20, 20), id="sppf_v10n_1x128x20x20"),
    pytest.param((1, 640, 20, 20), id="sppf_v10x_1x640x20x20"),
    pytest.param((8, 256, 80, 80), id="sppf_8x256x80x80"),
]


def _torch_pool(bench, input):
    return bench.torch.nn.functional.max_pool2d(input, (SPPF.kernel_h, SPPF.kernel_w), (SPPF.stride_h, SPPF.stride_w),
                                                (SPPF.padding_h, SPPF.padding_w))


@pytest.mark.parametrize("dims", SHAPES)
def test_pool_2d_forward(benchmark, bench, dims):
    out_dims = pool_2d.output_dims(SPPF, dims)
    group = f"pool_2d forward MAX 5x5 s1 p2 {dims}"
    bytes_moved = (int(np.prod(dims)) + int(np.prod(out_dims))) * 4
    input = bench.array(dims)
    if bench.impl == "torch":
        bench.run(benchmark, lambda: _torch_pool(bench, input), bytes_moved, group)
        return
    output = bench.empty(out_dims)
    state = pool_2d.init_kernel(bench.handle, SPPF, TensorShape(dims, np.float32), TensorShape(out_dims, np.float32))
    bench.run(benchmark, lambda: pool_2d.forward_kernel(bench.stream, bench.handle, state, SPPF, input, output),
              bytes_moved, group)
    pool_2d.cleanup_kernel(bench.handle, state)


@pytest.mark.parametrize("dims", SHAPES)
def test_pool_2d_backward(benchmark, bench, dims):
    out_dims = pool_2d.output_dims(SPPF, dims)
    group = f"pool_2d backward MAX 5x5 s1 p2 {dims}"
    bytes_moved = (int(np.prod(dims)) + int(np.prod(out_dims))) * 4
    input = bench.array(dims)
    output_grad = bench.array(out_dims, seed=1)
    if bench.impl == "torch":
        input.requires_grad_()
        output = _torch_pool(bench, input)
        torch = bench.torch
        bench.run(benchmark, lambda: torch.autograd.grad(output, [input], output_grad, retain_graph=True),
                  bytes_moved, group)
        return
    output, input_grad = bench.empty(out_dims), bench.empty(dims)
    state = pool_2d.init_kernel(bench.handle, SPPF, TensorShape(dims, np.float32), TensorShape(out_dims, np.float32))
    pool_2d.forward_kernel(bench.stream, bench.handle, state, SPPF, input, output)  # saves the argmax
    bench.run(benchmark, lambda: pool_2d.backward_kernel(bench.stream, bench.handle, state, SPPF, output, output_grad,
                                                         input, input_grad), bytes_moved, group)
    pool_2d.cleanup_kernel(bench.handle, state)
