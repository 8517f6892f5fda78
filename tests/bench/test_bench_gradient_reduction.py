"""gradient_reduction on a YOLOv10x shape: three gradients of 1x80x160x160 (a
tensor read three times) summed, and the backward that copies output_grad into
each of the three.

float16 and bfloat16 rows run on the GPU only (conftest.DTYPES), beside PyTorch in the same dtype;
their groups end in the dtype's name."""

import numpy as np
import pytest

from kernels import GradientReductionAttrs, TensorShape, gradient_reduction

from .conftest import DTYPES, dtype_suffix, half_rows_on_gpu_only

SHAPES = [
    pytest.param((1, 80, 160, 160), 3, id="3x1x80x160x160"),
]


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("dims, count", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_reduction(benchmark, bench, dims, count, direction, dtype):
    half_rows_on_gpu_only(bench, dtype)
    group = f"gradient_reduction {direction} {count} x {dims}{dtype_suffix(dtype)}"
    bytes_moved = (count + 1) * int(np.prod(dims)) * dtype.itemsize
    if direction == "forward":
        inputs, output = [bench.array(dims, seed=i, dtype=dtype) for i in range(count)], bench.empty(dims, dtype)
    else:
        output_grad, input_grads = bench.array(dims, dtype=dtype), [bench.empty(dims, dtype) for _ in range(count)]
    if bench.impl == "torch":
        torch = bench.torch
        if direction == "forward":
            def function():  # left to right into a preallocated output, as autograd accumulates
                torch.add(inputs[0], inputs[1], out=output)
                for term in inputs[2:]:
                    output.add_(term)
        else:
            def function():
                for input_grad in input_grads:
                    input_grad.copy_(output_grad)
        bench.run(benchmark, function, bytes_moved, group)
        return
    attrs = GradientReductionAttrs()
    state = gradient_reduction.init_kernel(bench.handle, attrs, [TensorShape(dims, dtype)] * count,
                                           TensorShape(dims, dtype))
    if direction == "forward":
        function = lambda: gradient_reduction.forward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, inputs, output)
    else:
        function = lambda: gradient_reduction.backward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, None, output_grad, None, input_grads)
    bench.run(benchmark, function, bytes_moved, group)
    gradient_reduction.cleanup_kernel(bench.handle, state)
