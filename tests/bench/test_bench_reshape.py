"""reshape on YOLOv10 shapes: a large NCHW -> (N, C, HW) flatten (a 1x640x160x160
activation) and the PSA head split of YOLOv10x (1x640x20x20 -> 1x5x128x400);
a reshape is a copy on the stream.

float16 and bfloat16 rows run on the GPU only (conftest.DTYPES), beside PyTorch in the same dtype;
their groups end in the dtype's name."""

import numpy as np
import pytest

from kernels import ReshapeAttrs, TensorShape, reshape

from .conftest import DTYPES, dtype_suffix, half_rows_on_gpu_only

SHAPES = [
    pytest.param((1, 640, 160, 160), (1, 640, 25600), id="flatten_1x640x160x160"),
    pytest.param((1, 640, 20, 20), (1, 5, 128, 400), id="psa_1x640x20x20_to_1x5x128x400"),
]


@pytest.mark.parametrize("dims, out_dims", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape(benchmark, bench, dims, out_dims, dtype):
    half_rows_on_gpu_only(bench, dtype)
    group = f"reshape {dims} -> {out_dims}{dtype_suffix(dtype)}"
    bytes_moved = 2 * int(np.prod(dims)) * dtype.itemsize
    input = bench.array(dims, dtype=dtype)
    output = bench.empty(out_dims, dtype)
    if bench.impl == "torch":
        bench.run(benchmark, lambda: output.copy_(input.view(out_dims)), bytes_moved, group)
        return
    attrs = ReshapeAttrs(out_dims)
    state = reshape.init_kernel(bench.handle, attrs, TensorShape(dims, dtype), TensorShape(out_dims, dtype))
    bench.run(benchmark, lambda: reshape.forward_kernel(bench.stream, bench.handle, state, attrs, input, output),
              bytes_moved, group)
    reshape.cleanup_kernel(bench.handle, state)
