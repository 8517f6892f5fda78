"""float16 and bfloat16 in the activations, element_unary, element_binary, softmax,
gradient_reduction and upsample NEAREST: a half tensor is widened to float32 when read,
computed in float32 and rounded once when written. So on each device a half call's
results are the same device's float32 call on the widened inputs, rounded once to the
half dtype, bit for bit (the same float32 operations in the same order), on random
shapes large enough to take the parallel CPU blocks and the GPU's 16-byte packs.
softmax's GPU rows kernels hold 8 halves a lane where they hold 4 floats, so they sum
in another order: within 1 ulp of the half dtype there."""

import numpy as np
import pytest

from conformance.compare import ulp_distance
from kernels import (
    Activation,
    BinaryOpType,
    ElementBinaryAttrs,
    ElementUnaryAttrs,
    GradientReductionAttrs,
    SoftmaxAttrs,
    TensorShape,
    UpsampleAttrs,
    activation,
    element_binary,
    element_unary,
    gradient_reduction,
    softmax,
    upsample,
)
from kernels.runtime.core import BFLOAT16

from .conftest import Dev

HALVES = [pytest.param(np.dtype(np.float16), id="f16"), pytest.param(BFLOAT16, id="bf16")]
F32 = np.dtype(np.float32)


def _random(shape, dtype, seed, scale=2.0):
    """Random values exact in `dtype` (rounded to it), returned as float64."""
    values = np.random.default_rng(seed).standard_normal(shape) * scale
    return values.astype(dtype).astype(np.float64)


def _same_as_float32_rounded(got, wide, dtype, ulps=0):
    expected = wide.astype(dtype)
    assert got.dtype == expected.dtype
    nan = np.isnan(expected.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    if ulps == 0:  # the same bits (NaN payloads aside)
        differ = np.flatnonzero(got.view(np.uint16)[~nan] != expected.view(np.uint16)[~nan])
        assert differ.size == 0, f"{differ.size} differ, first {got[~nan][differ[:3]]} != {expected[~nan][differ[:3]]}"
    else:
        assert ulp_distance(got[~nan], expected[~nan]).max() <= ulps


def _unary(dev, module, attrs, dtype, x, g):
    """(output, input_grad) of a one-input op on `dev` in `dtype`."""
    shape = TensorShape(x.shape, dtype)
    state = module.init_kernel(dev.handle, attrs, shape, shape)
    xd, gd = dev.array(x, dtype), dev.array(g, dtype)
    out, grad = dev.array(np.zeros(x.shape), dtype), dev.array(np.zeros(x.shape), dtype)
    module.forward_kernel(dev.stream, dev.handle, state, attrs, xd, out)
    module.backward_kernel(dev.stream, dev.handle, state, attrs, out, gd, xd, grad)
    dev.stream.synchronize()
    module.cleanup_kernel(dev.handle, state)
    return dev.host(out), dev.host(grad)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("op_type, scalar", [("SILU", None), ("GELU", None), ("SIGMOID", None), ("TANH", None),
                                             ("RELU", None), ("ELU", 0.5), ("SILU", 1.5), ("EXP", None),
                                             ("RSQRT", None), ("POW", 1.5), ("SCALAR_MULTIPLY", 0.1),
                                             ("SCALAR_TRUE_DIV", 3.0), ("SIN", None)])
def test_element_unary_is_float32_rounded_once(dev, dtype, op_type, scalar):
    attrs = ElementUnaryAttrs(op_type, scalar)
    x = _random((3, 7, 91, 97), dtype, 0)  # 185 kB elements: several CPU blocks, packs and a tail on the GPU
    if op_type in ("RSQRT", "POW"):
        x = (np.abs(x) + 0.25).astype(dtype).astype(np.float64)  # exact in the dtype again
    g = _random(x.shape, dtype, 1)
    half = _unary(dev, element_unary, attrs, dtype, x, g)
    wide = _unary(dev, element_unary, attrs, F32, x, g)
    for got, expected in zip(half, wide):
        _same_as_float32_rounded(got, expected, dtype)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("act", list(Activation))
def test_activation_passes_are_float32_rounded_once_in_place_too(dev, dtype, act):
    x, g = _random((300_001,), dtype, 2), _random((300_001,), dtype, 3)

    def run(data_dtype, in_place):
        pre, dy = dev.array(x, data_dtype), dev.array(g, data_dtype)
        out = pre if in_place else dev.array(np.zeros(x.shape), data_dtype)
        grad = dy if in_place else dev.array(np.zeros(x.shape), data_dtype)
        pre_copy = dev.array(x, data_dtype)
        activation.backward(dev.stream, act, pre_copy, dy, grad)
        activation.forward(dev.stream, act, pre, out)
        dev.stream.synchronize()
        return dev.host(out), dev.host(grad)

    wide = run(F32, False)
    for in_place in (False, True):
        for got, expected in zip(run(dtype, in_place), wide):
            _same_as_float32_rounded(got, expected, dtype)


def _binary(dev, op, dtype, lhs, rhs, g):
    out_dims = element_binary.broadcast_dims(lhs.shape, rhs.shape)
    attrs = ElementBinaryAttrs(op)
    state = element_binary.init_kernel(dev.handle, attrs, TensorShape(lhs.shape, dtype), TensorShape(rhs.shape, dtype),
                                       TensorShape(out_dims, dtype))
    ld, rd, gd = dev.array(lhs, dtype), dev.array(rhs, dtype), dev.array(g, dtype)
    out = dev.array(np.zeros(out_dims), dtype)
    lg, rg = dev.array(np.zeros(lhs.shape), dtype), dev.array(np.zeros(rhs.shape), dtype)
    element_binary.forward_kernel(dev.stream, dev.handle, state, attrs, ld, rd, out)
    element_binary.backward_kernel(dev.stream, dev.handle, state, attrs, out, gd, ld, lg, rd, rg)
    dev.stream.synchronize()
    element_binary.cleanup_kernel(dev.handle, state)
    return dev.host(out), dev.host(lg), dev.host(rg)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("op", list(BinaryOpType))
@pytest.mark.parametrize("lhs_dims, rhs_dims", [((2, 40, 33, 35), (2, 40, 33, 35)), ((2, 40, 33, 35), (1, 40, 1, 1)),
                                                ((3, 700, 5), (5,)), ((1, 2, 24, 25), (1, 2, 1, 1))],
                         ids=["same", "per_channel", "rows_split", "warps_split"])
def test_element_binary_is_float32_rounded_once(dev, dtype, op, lhs_dims, rhs_dims):
    """Reduced gradients too: float32 sums (the GPU's partial sums of split reductions included)."""
    lhs, rhs = _random(lhs_dims, dtype, 4), _random(rhs_dims, dtype, 5)
    if op is BinaryOpType.DIV:
        rhs = np.where(np.abs(rhs) < 0.25, 1.0, rhs)
    g = _random(element_binary.broadcast_dims(lhs_dims, rhs_dims), dtype, 6)
    for got, expected in zip(_binary(dev, op, dtype, lhs, rhs, g), _binary(dev, op, F32, lhs, rhs, g)):
        _same_as_float32_rounded(got, expected, dtype)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("dims, dim", [((6, 1100), -1), ((40, 256), 1), ((9, 70), 1), ((3, 20, 77), 1),
                                       ((2, 40, 33), 1), ((2, 600, 3), 1), ((1, 16, 4, 840), 1)])
def test_softmax_is_float32_rounded_once(dev, dtype, dims, dim):
    x, g = _random(dims, dtype, 7, scale=4.0), _random(dims, dtype, 8)
    attrs = SoftmaxAttrs(dim)
    half = _unary(dev, softmax, attrs, dtype, x, g)
    # The backward reads the stored output: the float32 twin is given the half output, widened.
    y = half[0].astype(np.float64)
    shape = TensorShape(dims, F32)
    state = softmax.init_kernel(dev.handle, attrs, shape, shape)
    wide_out = dev.array(np.zeros(dims), F32)
    wide_grad = dev.array(np.zeros(dims), F32)
    softmax.forward_kernel(dev.stream, dev.handle, state, attrs, dev.array(x, F32), wide_out)
    softmax.backward_kernel(dev.stream, dev.handle, state, attrs, dev.array(y, F32), dev.array(g, F32), None, wide_grad)
    dev.stream.synchronize()
    softmax.cleanup_kernel(dev.handle, state)
    ulps = 0 if dev.name == "cpu" else 1  # the GPU's rows kernels sum halves in another order than floats
    _same_as_float32_rounded(half[0], dev.host(wide_out), dtype, ulps)
    _same_as_float32_rounded(half[1], dev.host(wide_grad), dtype, ulps)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("count", [2, 3, 12, 13, 30])
def test_gradient_reduction_sums_in_float32_and_rounds_once(dev, dtype, count):
    """More than 12 terms: chained GPU launches through the float32 carry, never a rounded partial sum."""
    dims = (5, 41, 37)
    terms = [_random(dims, dtype, 10 + i, scale=100.0) for i in range(count)]
    expected = terms[0].astype(np.float32)
    for term in terms[1:]:
        expected = expected + term.astype(np.float32)  # left to right in float32
    attrs = GradientReductionAttrs()
    state = gradient_reduction.init_kernel(dev.handle, attrs, [TensorShape(dims, dtype)] * count, TensorShape(dims, dtype))
    inputs = [dev.array(t, dtype) for t in terms]
    output = dev.array(np.zeros(dims), dtype)
    for _ in range(2):  # the second call reuses the plans (and the carry)
        gradient_reduction.forward_kernel(dev.stream, dev.handle, state, attrs, inputs, output)
        dev.stream.synchronize()
        _same_as_float32_rounded(dev.host(output), expected, dtype)
    gradient_reduction.cleanup_kernel(dev.handle, state)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("scale", [2, 3])
def test_upsample_nearest_backward_sums_in_float32(dev, dtype, scale):
    dims = (2, 5, 13, 17)
    attrs = UpsampleAttrs(scale)
    out_dims = upsample.output_dims(attrs, dims)
    g = _random(out_dims, dtype, 20, scale=1000.0)
    x = _random(dims, dtype, 21)

    def run(data_dtype):
        state = upsample.init_kernel(dev.handle, attrs, TensorShape(dims, data_dtype), TensorShape(out_dims, data_dtype))
        out, grad = dev.array(np.zeros(out_dims), data_dtype), dev.array(np.zeros(dims), data_dtype)
        upsample.forward_kernel(dev.stream, dev.handle, state, attrs, dev.array(x, data_dtype), out)
        upsample.backward_kernel(dev.stream, dev.handle, state, attrs, None, dev.array(g, data_dtype), None, grad)
        dev.stream.synchronize()
        upsample.cleanup_kernel(dev.handle, state)
        return dev.host(out), dev.host(grad)

    for got, expected in zip(run(dtype), run(F32)):
        _same_as_float32_rounded(got, expected, dtype)


def test_half_scalar_rounds_to_float32_not_to_the_half_dtype():
    """x * 0.1 in float16: the scalar is float32(0.1) (PyTorch's opmath), whose product differs from
    one with float16(0.1) at x = 3 (0.30004882 vs 0.2998)."""
    dev = Dev("cpu")
    x = np.array([3.0])
    out, _ = _unary(dev, element_unary, ElementUnaryAttrs("SCALAR_MULTIPLY", 0.1), np.dtype(np.float16), x, x)
    assert out[0] == np.float16(np.float32(3.0) * np.float32(0.1))
    assert out[0] != np.float16(3.0) * np.float16(0.1)
    dev.handle.close()


@pytest.mark.parametrize("dtype", HALVES)
def test_element_binary_half_backward_skips_none_gradients(dev, dtype):
    """A gradient not wanted (None) is skipped; the other is still the float32 one rounded once."""
    lhs, rhs = _random((4, 30, 5), dtype, 30), _random((1, 30, 1), dtype, 31)
    g = _random((4, 30, 5), dtype, 32)
    _, _, expected = _binary(dev, BinaryOpType.MUL, F32, lhs, rhs, g)
    attrs = ElementBinaryAttrs(BinaryOpType.MUL)
    state = element_binary.init_kernel(dev.handle, attrs, TensorShape(lhs.shape, dtype), TensorShape(rhs.shape, dtype),
                                       TensorShape(g.shape, dtype))
    rhs_grad = dev.array(np.zeros(rhs.shape), dtype)
    element_binary.backward_kernel(dev.stream, dev.handle, state, attrs, None, dev.array(g, dtype), dev.array(lhs, dtype),
                                   None, dev.array(rhs, dtype), rhs_grad)
    dev.stream.synchronize()
    element_binary.cleanup_kernel(dev.handle, state)
    _same_as_float32_rounded(dev.host(rhs_grad), expected, dtype)
