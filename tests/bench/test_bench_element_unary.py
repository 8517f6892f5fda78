"""element_unary on a YOLOv10 shape: SiLU over 1x80x320x320 (the stem's output at a 640
input in the larger variants), forward and backward, in float32 and (GPU only) float16
and bfloat16. The PyTorch
twin writes into preallocated tensors too (aten silu.out / silu_backward.grad_input)."""

import numpy as np
import pytest

from kernels import ElementUnaryAttrs, TensorShape, UnaryOpType, element_unary

from .conftest import DTYPES, half_rows_on_gpu_only

DIMS = (1, 80, 320, 320)
ATTRS = ElementUnaryAttrs(UnaryOpType.SILU)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu(benchmark, bench, direction, dtype):
    half_rows_on_gpu_only(bench, dtype)
    count = int(np.prod(DIMS))
    group = f"element_unary SILU {DIMS} {dtype.name} {direction}"
    bytes_moved = (2 if direction == "forward" else 3) * count * dtype.itemsize  # read input (and output_grad), write one
    input, output_grad = bench.array(DIMS, seed=0, dtype=dtype), bench.array(DIMS, seed=1, dtype=dtype)
    output = bench.empty(DIMS, dtype)
    if bench.impl == "torch":
        silu = bench.torch.ops.aten.silu.out
        silu_backward = bench.torch.ops.aten.silu_backward.grad_input
        if direction == "forward":
            bench.run(benchmark, lambda: silu(input, out=output), bytes_moved, group)
        else:
            bench.run(benchmark, lambda: silu_backward(output_grad, input, grad_input=output), bytes_moved, group)
        return
    shape = TensorShape(DIMS, dtype)
    state = element_unary.init_kernel(bench.handle, ATTRS, shape, shape)
    if direction == "forward":
        function = lambda: element_unary.forward_kernel(bench.stream, bench.handle, state, ATTRS, input, output)  # noqa: E731
    else:
        function = lambda: element_unary.backward_kernel(bench.stream, bench.handle, state, ATTRS,  # noqa: E731
                                                         None, output_grad, input, output)
    bench.run(benchmark, function, bytes_moved, group)
    element_unary.cleanup_kernel(bench.handle, state)
