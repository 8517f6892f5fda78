"""split on YOLOv10x shapes: C2f's split of 1x160x160x160 into two halves on
channels, and PSA's {32, 32, 64} split of (1, 5, 128, 400) on axis 2; forward
(whole -> pieces) and backward (pieces -> whole, the same code as concat forward).

float16 and bfloat16 rows run on the GPU only (conftest.DTYPES), beside PyTorch in the same dtype;
their groups end in the dtype's name."""

import numpy as np
import pytest

from kernels import SplitAttrs, TensorShape, split

from .conftest import DTYPES, dtype_suffix, half_rows_on_gpu_only

SHAPES = [
    pytest.param((1, 160, 160, 160), (80, 80), 1, id="c2f_1x160x160x160_halves"),
    pytest.param((1, 5, 128, 400), (32, 32, 64), 2, id="psa_1x5x128x400_32_32_64"),
]


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("dims, splits, axis", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_split(benchmark, bench, dims, splits, axis, direction, dtype):
    half_rows_on_gpu_only(bench, dtype)
    out_dims = [dims[:axis] + (size,) + dims[axis + 1:] for size in splits]
    group = f"split {direction} {dims} -> {splits} axis {axis}{dtype_suffix(dtype)}"
    bytes_moved = 2 * int(np.prod(dims)) * dtype.itemsize
    whole = bench.array(dims, dtype=dtype) if direction == "forward" else bench.empty(dims, dtype)
    pieces = [bench.empty(d, dtype) if direction == "forward" else bench.array(d, seed=i, dtype=dtype)
              for i, d in enumerate(out_dims)]
    if bench.impl == "torch":
        torch = bench.torch
        if direction == "forward":
            def function():  # torch.split gives views: copy them into preallocated outputs, as we do
                for piece, part in zip(pieces, torch.split(whole, list(splits), dim=axis)):
                    piece.copy_(part)
        else:
            function = lambda: torch.cat(pieces, dim=axis, out=whole)  # noqa: E731
        bench.run(benchmark, function, bytes_moved, group)
        return
    attrs = SplitAttrs(splits=splits, axis=axis)
    state = split.init_kernel(bench.handle, attrs, TensorShape(dims, dtype), [TensorShape(d, dtype) for d in out_dims])
    if direction == "forward":
        function = lambda: split.forward_kernel(bench.stream, bench.handle, state, attrs, whole, pieces)  # noqa: E731
    else:
        function = lambda: split.backward_kernel(bench.stream, bench.handle, state, attrs, None, pieces, None, whole)  # noqa: E731
    bench.run(benchmark, function, bytes_moved, group)
    split.cleanup_kernel(bench.handle, state)
