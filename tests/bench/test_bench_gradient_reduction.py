"""gradient_reduction on a YOLOv10x shape: three gradients of 1x80x160x160 (a
tensor read three times) summed, and the backward that copies output_grad into
each of the three."""

import numpy as np
import pytest

from kernels import GradientReductionAttrs, TensorShape, gradient_reduction

SHAPES = [
    pytest.param((1, 80, 160, 160), 3, id="3x1x80x160x160"),
]


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("dims, count", SHAPES)
def test_gradient_reduction(benchmark, bench, dims, count, direction):
    group = f"gradient_reduction {direction} {count} x {dims}"
    bytes_moved = (count + 1) * int(np.prod(dims)) * 4
    if direction == "forward":
        inputs, output = [bench.array(dims, seed=i) for i in range(count)], bench.empty(dims)
    else:
        output_grad, input_grads = bench.array(dims), [bench.empty(dims) for _ in range(count)]
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
    state = gradient_reduction.init_kernel(bench.handle, attrs, [TensorShape(dims, np.float32)] * count,
                                           TensorShape(dims, np.float32))
    if direction == "forward":
        function = lambda: gradient_reduction.forward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, inputs, output)
    else:
        function = lambda: gradient_reduction.backward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, None, output_grad, None, input_grads)
    bench.run(benchmark, function, bytes_moved, group)
    gradient_reduction.cleanup_kernel(bench.handle, state)
