"""element_binary on YOLOv10 shapes: C2f's residual add of two 1x80x160x160 tensors,
and a per-channel broadcast multiply 1x80x160x160 * 1x80x1x1; forward and backward,
beside torch.add/torch.mul(out=...) and, for backward, the same gradient formulas
and reductions written in torch.

Bytes are what a call must move at least: forward reads lhs and rhs and writes the
output; backward reads output_grad and the operand values its formulas need, and
writes both gradients (each broadcast operand's gradient is a reduction).

float16 and bfloat16 rows run on the GPU only (conftest.DTYPES), beside PyTorch in the same dtype;
their groups end in the dtype's name."""

import numpy as np
import pytest

from kernels import BinaryOpType, ElementBinaryAttrs, TensorShape, element_binary

from .conftest import DTYPES, dtype_suffix, half_rows_on_gpu_only

SHAPES = [
    pytest.param(BinaryOpType.ADD, (1, 80, 160, 160), (1, 80, 160, 160), id="residual_add_1x80x160x160"),
    pytest.param(BinaryOpType.MUL, (1, 80, 160, 160), (1, 80, 1, 1), id="channel_mul_1x80x160x160_1x80x1x1"),
]


def _bytes(op, direction, lhs_dims, rhs_dims, out_dims, dtype):
    lhs, rhs, out = (int(np.prod(d)) for d in (lhs_dims, rhs_dims, out_dims))
    if direction == "forward":
        return (lhs + rhs + out) * dtype.itemsize
    values = 0 if op is BinaryOpType.ADD else lhs + rhs
    return (out + values + lhs + rhs) * dtype.itemsize


def _torch_backward(torch, op, lhs, rhs, output_grad, lhs_grad, rhs_grad):
    """The twin of backward: each gradient by its formula, summed over broadcast dims (torch's sum_to_size)."""
    for operand, other, grad in ((lhs, rhs, lhs_grad), (rhs, lhs, rhs_grad)):
        dims = tuple(d for d in range(output_grad.dim()) if operand.shape[d] == 1 and output_grad.shape[d] != 1)
        if op is BinaryOpType.ADD:
            if dims:
                torch.sum(output_grad, dims, keepdim=True, out=grad)
            else:
                grad.copy_(output_grad)
        elif dims:
            torch.sum(torch.mul(output_grad, other), dims, keepdim=True, out=grad)
        else:
            torch.mul(output_grad, other, out=grad)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("op, lhs_dims, rhs_dims", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_element_binary(benchmark, bench, op, lhs_dims, rhs_dims, direction, dtype):
    half_rows_on_gpu_only(bench, dtype)
    out_dims = element_binary.broadcast_dims(lhs_dims, rhs_dims)
    group = f"element_binary {direction} {op.name} {lhs_dims} {rhs_dims}{dtype_suffix(dtype)}"
    bytes_moved = _bytes(op, direction, lhs_dims, rhs_dims, out_dims, dtype)
    lhs, rhs = bench.array(lhs_dims, seed=0, dtype=dtype), bench.array(rhs_dims, seed=1, dtype=dtype)
    output_grad = bench.array(out_dims, seed=2, dtype=dtype)
    output, lhs_grad, rhs_grad = bench.empty(out_dims, dtype), bench.empty(lhs_dims, dtype), bench.empty(rhs_dims, dtype)
    if bench.impl == "torch":
        torch = bench.torch
        forward = {BinaryOpType.ADD: torch.add, BinaryOpType.MUL: torch.mul}[op]
        if direction == "forward":
            function = lambda: forward(lhs, rhs, out=output)  # noqa: E731
        else:
            function = lambda: _torch_backward(torch, op, lhs, rhs, output_grad, lhs_grad, rhs_grad)  # noqa: E731
        bench.run(benchmark, function, bytes_moved, group)
        return
    attrs = ElementBinaryAttrs(op)
    state = element_binary.init_kernel(bench.handle, attrs, TensorShape(lhs_dims, dtype),
                                       TensorShape(rhs_dims, dtype), TensorShape(out_dims, dtype))
    if direction == "forward":
        function = lambda: element_binary.forward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, lhs, rhs, output)
    else:
        function = lambda: element_binary.backward_kernel(  # noqa: E731
            bench.stream, bench.handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad)
    bench.run(benchmark, function, bytes_moved, group)
    element_binary.cleanup_kernel(bench.handle, state)
