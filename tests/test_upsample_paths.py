"""upsample beyond the goldens: random values against PyTorch on the CPU, and the
GPU against the CPU bit for bit on every code path (the s = 2 vector paths,
their unaligned fallback, 16-byte elements, integer wrap-around, bilinear)."""

import numpy as np
import pytest

from kernels import TensorShape, UpsampleAttrs, UpsampleMode, upsample
from kernels.runtime.core import BFLOAT16, is_floating

from .conftest import Dev, require

NEAREST, BILINEAR = UpsampleMode.NEAREST, UpsampleMode.BILINEAR


def _random(dims, dtype, seed):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if is_floating(dtype):
        return rng.standard_normal(dims).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(dims) + 1j * rng.standard_normal(dims)).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, dims).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, dims, dtype=dtype, endpoint=True)


def _run(dev, attrs, x, output_grad, offset=0):
    """Forward and (where given output_grad) backward on `dev`; `offset` elements shift the written buffers."""
    dims, out_dims = x.shape, upsample.output_dims(attrs, x.shape)
    state = upsample.init_kernel(dev.handle, attrs, TensorShape(dims, x.dtype), TensorShape(out_dims, x.dtype))

    def buffer(shape):
        count = int(np.prod(shape))
        flat = dev.array(np.zeros(count + offset, dtype=x.dtype))  # made on dev.stream
        return flat[offset:].reshape(shape)

    output = buffer(out_dims)
    upsample.forward_kernel(dev.stream, dev.handle, state, attrs, dev.array(x), output)
    input_grad = None
    if output_grad is not None:
        grad = buffer(out_dims)
        dev.assign(grad, output_grad)
        input_grad = buffer(dims)
        upsample.backward_kernel(dev.stream, dev.handle, state, attrs, output, grad, None, input_grad)
    dev.stream.synchronize()
    upsample.cleanup_kernel(dev.handle, state)
    return dev.host(output), None if input_grad is None else dev.host(input_grad)


@pytest.mark.parametrize("mode", [NEAREST, BILINEAR])
@pytest.mark.parametrize("scale", [2, 3, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_against_torch_on_random_values(mode, scale, dtype):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    attrs = UpsampleAttrs(scale, mode)
    x = _random((2, 3, 5, 7), dtype, 1)
    output_grad = _random(upsample.output_dims(attrs, x.shape), dtype, 2)
    output, input_grad = _run(Dev("cpu"), attrs, x, output_grad)
    tx = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    extra = {"align_corners": False} if mode is BILINEAR else {}
    ty = F.interpolate(tx, scale_factor=scale, mode=mode.value, **extra)
    (tg,) = torch.autograd.grad(ty, [tx], torch.from_numpy(output_grad.astype(np.float64)))
    # PyTorch's bilinear weight src - floor(src) loses about log2(src) bits to
    # cancellation, src up to max(H, W): allow that much beside a few roundings.
    atol = 8 * max(x.shape[2:]) * np.finfo(dtype).eps
    np.testing.assert_allclose(output, ty.detach().numpy(), rtol=0, atol=atol)
    np.testing.assert_allclose(input_grad, tg.numpy(), rtol=0, atol=scale * scale * atol)


CASES = [
    pytest.param(NEAREST, 2, np.float32, 0, id="nearest_x2_f32_vector"),
    pytest.param(NEAREST, 2, np.float32, 1, id="nearest_x2_f32_unaligned"),
    pytest.param(NEAREST, 2, np.float64, 0, id="nearest_x2_f64_vector"),
    pytest.param(NEAREST, 2, np.float64, 1, id="nearest_x2_f64_unaligned"),
    pytest.param(NEAREST, 3, np.float32, 0, id="nearest_x3_f32"),
    pytest.param(NEAREST, 2, np.int8, 0, id="nearest_x2_int8_wraps"),
    pytest.param(NEAREST, 3, np.uint8, 1, id="nearest_x3_uint8_wraps"),
    pytest.param(NEAREST, 2, np.uint16, 0, id="nearest_x2_uint16"),
    pytest.param(NEAREST, 2, np.int64, 1, id="nearest_x2_int64_unaligned"),
    pytest.param(NEAREST, 4, np.uint64, 0, id="nearest_x4_uint64"),
    pytest.param(BILINEAR, 2, np.float32, 0, id="bilinear_x2_f32"),
    pytest.param(BILINEAR, 3, np.float32, 0, id="bilinear_x3_f32"),
    pytest.param(BILINEAR, 3, np.float64, 1, id="bilinear_x3_f64"),
    pytest.param(BILINEAR, 4, np.float64, 0, id="bilinear_x4_f64"),
    # Half: sums and bilinear arithmetic in float32, rounded once, on both devices.
    pytest.param(NEAREST, 2, np.float16, 0, id="nearest_x2_f16_vector"),
    pytest.param(NEAREST, 2, BFLOAT16, 1, id="nearest_x2_bf16_unaligned"),
    pytest.param(NEAREST, 2, BFLOAT16, 0, id="nearest_x2_bf16_vector"),
    pytest.param(NEAREST, 3, np.float16, 1, id="nearest_x3_f16"),
    pytest.param(BILINEAR, 2, np.float16, 0, id="bilinear_x2_f16"),
    pytest.param(BILINEAR, 3, BFLOAT16, 1, id="bilinear_x3_bf16"),
    pytest.param(BILINEAR, 3, np.float16, 0, id="bilinear_x3_f16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("mode, scale, dtype, offset", CASES)
def test_gpu_matches_cpu_bit_for_bit(mode, scale, dtype, offset):
    require("gpu")
    attrs = UpsampleAttrs(scale, mode)
    x = _random((2, 3, 5, 7), dtype, 3)
    output_grad = _random(upsample.output_dims(attrs, x.shape), dtype, 4)
    cpu = _run(Dev("cpu"), attrs, x, output_grad)
    gpu = _run(Dev("gpu"), attrs, x, output_grad, offset)
    for got, expected in zip(gpu, cpu):
        assert np.array_equal(got.view(np.uint8), expected.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, offset", [(np.complex128, 0), (np.complex64, 1), (np.float16, 0), (np.bool_, 1)])
def test_gpu_nearest_forward_of_forward_only_dtypes(dtype, offset):
    require("gpu")
    attrs = UpsampleAttrs(2)
    x = _random((2, 3, 5, 7), dtype, 5)
    cpu, _ = _run(Dev("cpu"), attrs, x, None)
    gpu, _ = _run(Dev("gpu"), attrs, x, None, offset)
    assert np.array_equal(gpu.view(np.uint8), cpu.view(np.uint8))


@pytest.mark.parametrize("dims", [(1, 2, 1, 4), (2, 1, 3, 1)])
def test_cpu_bilinear_backward_of_a_single_row_or_column(dims):
    """H or W of 1: some taps have no source at all (an empty range), the rest must still add up as torch's."""
    torch = pytest.importorskip("torch")
    attrs = UpsampleAttrs(3, BILINEAR)
    x = _random(dims, np.float64, 3)
    output_grad = _random(upsample.output_dims(attrs, dims), np.float64, 4)
    output, input_grad = _run(Dev("cpu"), attrs, x, output_grad)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.interpolate(tx, scale_factor=3, mode="bilinear", align_corners=False)
    ty.backward(torch.tensor(output_grad))
    np.testing.assert_allclose(output, ty.detach().numpy(), rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(input_grad, tx.grad.numpy(), rtol=1e-13, atol=1e-13)
