"""concat on YOLOv10x shapes: SPPF's four 1x320x20x20 maps on channels, the
detection head's (1, 144, HW) of three scales on the last axis, and four
1x256x160x160 maps for bandwidth; forward (pieces -> whole) and backward
(whole -> pieces, the same code as split forward). `test_concat` runs the default
GPU method ("auto": chosen per shape class); `test_concat_method` times each GPU
method (one launch, or one cudaMemcpy2DAsync per piece) in the same groups."""

import numpy as np
import pytest

from kernels import ConcatAttrs, TensorShape, concat

SHAPES = [
    pytest.param([(1, 320, 20, 20)] * 4, 1, id="sppf_4x1x320x20x20"),
    pytest.param([(1, 144, 6400), (1, 144, 1600), (1, 144, 400)], -1, id="head_1x144x6400_1600_400_last_axis"),
    pytest.param([(1, 256, 160, 160)] * 4, 1, id="large_4x1x256x160x160"),
]


def _output_dims(input_dims, axis):
    dims = list(input_dims[0])
    dims[axis] = sum(d[axis] for d in input_dims)
    return tuple(dims)


def _run(benchmark, bench, input_dims, axis, direction):
    out_dims = _output_dims(input_dims, axis)
    group = f"concat {direction} {len(input_dims)} inputs -> {out_dims} axis {axis}"
    bytes_moved = 2 * int(np.prod(out_dims)) * 4
    pieces = [bench.array(d, seed=i) if direction == "forward" else bench.empty(d) for i, d in enumerate(input_dims)]
    whole = bench.empty(out_dims) if direction == "forward" else bench.array(out_dims)
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
    state = concat.init_kernel(bench.handle, attrs, [TensorShape(d, np.float32) for d in input_dims],
                               TensorShape(out_dims, np.float32))
    if direction == "forward":
        function = lambda: concat.forward_kernel(bench.stream, bench.handle, state, attrs, pieces, whole)  # noqa: E731
    else:
        function = lambda: concat.backward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, None, whole, None, pieces)
    bench.run(benchmark, function, bytes_moved, group)
    concat.cleanup_kernel(bench.handle, state)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("input_dims, axis", SHAPES)
def test_concat(benchmark, bench, input_dims, axis, direction):
    _run(benchmark, bench, input_dims, axis, direction)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["kernel", "memcpy2d"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("input_dims, axis", SHAPES)
def test_concat_method(benchmark, bench, input_dims, axis, direction, method, monkeypatch):
    if (bench.impl, bench.device) != ("ours", "gpu"):
        pytest.skip("the GPU methods are ours, on the GPU only")
    monkeypatch.setattr(concat, "GPU_METHOD", method)
    _run(benchmark, bench, input_dims, axis, direction)
