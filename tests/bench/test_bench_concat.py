"""concat on YOLOv10x shapes: SPPF's four 1x320x20x20 maps on channels, the
detection head's (1, 144, HW) of three scales on the last axis, and four
1x256x160x160 maps for bandwidth; forward (pieces -> whole) and backward
(whole -> pieces, the same code as split forward).

float16 and bfloat16 rows run on the GPU only (conftest.DTYPES), beside PyTorch in the same dtype;
their groups end in the dtype's name."""

import numpy as np
import pytest

from kernels import ConcatAttrs, TensorShape, concat

from .conftest import DTYPES, dtype_suffix, half_rows_on_gpu_only

FLOAT32 = np.dtype(np.float32)
SHAPES = [
    pytest.param([(1, 320, 20, 20)] * 4, 1, id="sppf_4x1x320x20x20"),
    pytest.param([(1, 144, 6400), (1, 144, 1600), (1, 144, 400)], -1, id="head_1x144x6400_1600_400_last_axis"),
    pytest.param([(1, 256, 160, 160)] * 4, 1, id="large_4x1x256x160x160"),
]


def _output_dims(input_dims, axis):
    dims = list(input_dims[0])
    dims[axis] = sum(d[axis] for d in input_dims)
    return tuple(dims)


def _run(benchmark, bench, input_dims, axis, direction, dtype=FLOAT32):
    out_dims = _output_dims(input_dims, axis)
    group = f"concat {direction} {len(input_dims)} inputs -> {out_dims} axis {axis}{dtype_suffix(dtype)}"
    bytes_moved = 2 * int(np.prod(out_dims)) * dtype.itemsize
    pieces = [bench.array(d, seed=i, dtype=dtype) if direction == "forward" else bench.empty(d, dtype)
              for i, d in enumerate(input_dims)]
    whole = bench.empty(out_dims, dtype) if direction == "forward" else bench.array(out_dims, dtype=dtype)
    if bench.impl == "torch":
        torch = bench.torch
        if direction == "forward":
            function = lambda: torch.cat(pieces, dim=axis, out=whole)  # noqa: E731
        else:
            sizes = [d[axis] for d in input_dims]

            def function():
                for piece, part in zip(pieces, torch.split(whole, sizes, dim=axis)):
                    piece.copy_(part)
        bench.run(benchmark, function, bytes_moved, group)
        return
    attrs = ConcatAttrs(axis=axis, num_inputs=len(input_dims))
    state = concat.init_kernel(bench.handle, attrs, [TensorShape(d, dtype) for d in input_dims],
                               TensorShape(out_dims, dtype))
    if direction == "forward":
        function = lambda: concat.forward_kernel(bench.stream, bench.handle, state, attrs, pieces, whole)  # noqa: E731
    else:
        function = lambda: concat.backward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, None, whole, None, pieces)
    bench.run(benchmark, function, bytes_moved, group)
    concat.cleanup_kernel(bench.handle, state)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("input_dims, axis", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_concat(benchmark, bench, input_dims, axis, direction, dtype):
    half_rows_on_gpu_only(bench, dtype)
    _run(benchmark, bench, input_dims, axis, direction, dtype)
