"""reshape on YOLOv10 shapes: a large NCHW -> (N, C, HW) flatten (a 1x640x160x160
activation) and the PSA head split of YOLOv10x (1x640x20x20 -> 1x5x128x400);
a reshape is a copy on the stream."""

import numpy as np
import pytest

from kernels import ReshapeAttrs, TensorShape, reshape

SHAPES = [
    pytest.param((1, 640, 160, 160), (1, 640, 25600), id="flatten_1x640x160x160"),
    pytest.param((1, 640, 20, 20), (1, 5, 128, 400), id="psa_1x640x20x20_to_1x5x128x400"),
]


@pytest.mark.parametrize("dims, out_dims", SHAPES)
def test_reshape(benchmark, bench, dims, out_dims):
    group = f"reshape {dims} -> {out_dims}"
    bytes_moved = 2 * int(np.prod(dims)) * 4
    input = bench.array(dims)
    output = bench.empty(out_dims)
    if bench.impl == "torch":
        bench.run(benchmark, lambda: output.copy_(input.view(out_dims)), bytes_moved, group)
        return
    attrs = ReshapeAttrs(out_dims)
    state = reshape.init_kernel(bench.handle, attrs, TensorShape(dims, np.float32), TensorShape(out_dims, np.float32))
    bench.run(benchmark, lambda: reshape.forward_kernel(bench.stream, bench.handle, state, attrs, input, output),
              bytes_moved, group)
    reshape.cleanup_kernel(bench.handle, state)
