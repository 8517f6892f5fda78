"""transpose on YOLOv10 shapes: the PSA transpose of the last two dims (YOLOv10x,
1x5x128x400) and a large NCHW -> NHWC permute.

float16 and bfloat16 rows run on the GPU only (conftest.DTYPES), beside PyTorch in the same dtype;
their groups end in the dtype's name."""

import numpy as np
import pytest

from kernels import TensorShape, TransposeAttrs, transpose

from .conftest import DTYPES, dtype_suffix, half_rows_on_gpu_only

SHAPES = [
    pytest.param((1, 5, 128, 400), (0, 1, 3, 2), id="psa_1x5x128x400_0132"),
    pytest.param((8, 64, 160, 160), (0, 2, 3, 1), id="nchw_to_nhwc_8x64x160x160"),
]


@pytest.mark.parametrize("dims, permutation", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose(benchmark, bench, dims, permutation, dtype):
    half_rows_on_gpu_only(bench, dtype)
    out_dims = tuple(dims[p] for p in permutation)
    group = f"transpose {dims} {permutation}{dtype_suffix(dtype)}"
    bytes_moved = 2 * int(np.prod(dims)) * dtype.itemsize
    input = bench.array(dims, dtype=dtype)
    if bench.impl == "torch":
        output = bench.empty(out_dims, dtype)
        bench.run(benchmark, lambda: output.copy_(input.permute(permutation)), bytes_moved, group)
        return
    attrs = TransposeAttrs(permutation)
    output = bench.empty(out_dims, dtype)
    state = transpose.init_kernel(bench.handle, attrs, TensorShape(dims, dtype), TensorShape(out_dims, dtype))
    bench.run(benchmark, lambda: transpose.forward_kernel(bench.stream, bench.handle, state, attrs, input, output),
              bytes_moved, group)
    transpose.cleanup_kernel(bench.handle, state)
