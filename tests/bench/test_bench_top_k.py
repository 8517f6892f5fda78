"""top_k on YOLOv10's shapes: 300 of the 8400 anchors' best scores and 300 of the 300 x 80 class scores
(640x640 input), at batch 1 and 16, and two of a large k, forward, beside torch.sort(descending=True,
stable=True)[..., :k] (the same order: torch.topk promises none among ties; its row is there too, for the time).

float16 and bfloat16 rows run on the GPU only (conftest.DTYPES), beside PyTorch in the same dtype;
their groups end in the dtype's name."""

import numpy as np
import pytest

from kernels import TensorShape, TopKAttrs, top_k

from .conftest import DTYPES, dtype_suffix, half_rows_on_gpu_only

SHAPES = [
    pytest.param((1, 8400), 300, id="anchors_1x8400_k300"),
    pytest.param((16, 8400), 300, id="anchors_16x8400_k300"),
    pytest.param((1, 24000), 300, id="classes_1x24000_k300"),
    pytest.param((16, 24000), 300, id="classes_16x24000_k300"),
    # A large k (the candidates in the scratch, ranked by the radix sort): the whole anchor row sorted, and
    # 1500 of each of 16 rows of 2000.
    pytest.param((1, 8400), 8400, id="sorted_1x8400_k8400"),
    pytest.param((16, 2000), 1500, id="rows_16x2000_k1500"),
]


@pytest.mark.parametrize("twin", ["sort", "topk"])
@pytest.mark.parametrize("dims, k", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k(benchmark, bench, dims, k, dtype, twin):
    half_rows_on_gpu_only(bench, dtype)
    if twin == "topk" and bench.impl != "torch":
        pytest.skip("the torch.topk row is PyTorch's only (ours is the sort row)")
    group = f"top_k forward {dims} k {k}{dtype_suffix(dtype)}"
    out_dims = (dims[0], k)
    # reads the input, writes the values and the int64 indices
    bytes_moved = int(np.prod(dims)) * dtype.itemsize + dims[0] * k * (dtype.itemsize + 8)
    input = bench.array(dims, seed=0, dtype=dtype)
    if bench.impl == "torch":
        torch = bench.torch
        if twin == "sort":
            function = lambda: torch.sort(input, dim=-1, descending=True, stable=True)[0][..., :k]  # noqa: E731
        else:
            function = lambda: torch.topk(input, k, dim=-1)  # noqa: E731
        bench.run(benchmark, function, bytes_moved, group)
        return
    values, indices = bench.empty(out_dims, dtype), bench.empty(out_dims, np.int64)
    attrs = TopKAttrs(k)
    state = top_k.init_kernel(bench.handle, attrs, TensorShape(dims, dtype), TensorShape(out_dims, dtype),
                              TensorShape(out_dims, np.int64))
    function = lambda: top_k.forward_kernel(bench.stream, bench.handle, state, attrs, input, values, indices)  # noqa: E731
    bench.run(benchmark, function, bytes_moved, group)
    top_k.cleanup_kernel(bench.handle, state)
