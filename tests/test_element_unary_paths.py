"""element_unary's GPU paths against its CPU twin on sizes the conformance cases do
not reach: 16-byte packs plus a remainder, an unaligned (offset) view that takes
the one-element path, and backward with input None for constant derivatives."""

import numpy as np
import pytest

from conformance.case import ulp
from conformance.compare import compare
from kernels import ElementUnaryAttrs, TensorShape, UnaryOpType, element_unary

from .conftest import Dev, require

SCALARS = {"ELU": 0.5, "SILU": 1.5, "POW": 3.0, "SCALAR_MULTIPLY": -0.75, "SCALAR_ADD": 1.25,
           "SCALAR_SUB": 0.5, "SCALAR_TRUE_DIV": 3.0}
COUNT = 4099  # packs of 4 (float) or 2 (double) and a remainder


def _values(dtype, positive):
    values = ((np.arange(COUNT) * 37 % 129) - 64) / 16.0
    return (np.abs(values) + 0.0625 if positive else values).astype(dtype)


def _run(dev, attrs, input, output_grad):
    shape = TensorShape(input.shape, input.dtype)
    state = element_unary.init_kernel(dev.handle, attrs, shape, shape)
    output = dev.array(np.full(input.shape, np.nan, input.dtype))
    input_grad = dev.array(np.full(input.shape, np.nan, input.dtype))
    element_unary.forward_kernel(dev.stream, dev.handle, state, attrs, input, output)
    element_unary.backward_kernel(dev.stream, dev.handle, state, attrs, None, output_grad, input, input_grad)
    dev.stream.synchronize()
    return dev.host(output), dev.host(input_grad)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset_view"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op_type", [t.name for t in UnaryOpType])
def test_gpu_matches_cpu(op_type, dtype, offset):
    require("gpu")
    attrs = ElementUnaryAttrs(UnaryOpType[op_type], SCALARS.get(op_type))
    positive = op_type in ("RSQRT", "POW")
    host_input = _values(dtype, positive)
    host_grad = _values(dtype, False)[::-1].copy()
    cpu, gpu = Dev("cpu"), Dev("gpu")
    expected = _run(cpu, attrs, host_input, host_grad)
    # A contiguous view one element into a larger buffer is not 16-byte aligned.
    base_input = gpu.array(np.concatenate([[1.0], host_input]).astype(dtype))
    base_grad = gpu.array(np.concatenate([[1.0], host_grad]).astype(dtype))
    got = _run(gpu, attrs, base_input[offset:offset + COUNT] if offset else gpu.array(host_input),
               base_grad[offset:offset + COUNT] if offset else gpu.array(host_grad))
    for name, g, e in zip(("output", "input_grad"), got, expected):
        assert compare(g, e, ulp(8)) is None, f"{name}: {compare(g, e, ulp(8))}"


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("op_type", ["IDENTITY", "SCALAR_MULTIPLY", "SCALAR_ADD", "SCALAR_SUB", "SCALAR_TRUE_DIV"])
def test_constant_derivative_needs_no_input(device, op_type):
    require(device)
    dev = Dev(device)
    attrs = ElementUnaryAttrs(UnaryOpType[op_type], SCALARS.get(op_type))
    shape = TensorShape((3, 5), np.float32)
    state = element_unary.init_kernel(dev.handle, attrs, shape, shape)
    output_grad = dev.array(np.arange(15, dtype=np.float32).reshape(3, 5) - 7)
    input_grad = dev.array(np.full((3, 5), np.nan, np.float32))
    element_unary.backward_kernel(dev.stream, dev.handle, state, attrs, None, output_grad, None, input_grad)
    dev.stream.synchronize()
    expected = {"SCALAR_MULTIPLY": lambda g: g * np.float32(-0.75), "SCALAR_TRUE_DIV": lambda g: g / np.float32(3)}
    host_grad = dev.host(output_grad)
    assert np.array_equal(dev.host(input_grad), expected.get(op_type, lambda g: g)(host_grad))
