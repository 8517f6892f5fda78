"""BILINEAR backward with NaN and infinite output gradients, beyond the goldens.

PyTorch's backward scatters each output coordinate's gradient to both of its taps, times each
tap's weight, also where that weight is 0: 0 * inf is NaN. Ours gathers, and adds the same
zero-weight terms (kernels/upsample/cpu.py: bilinear_clamped, bilinear_zero_taps). Here every output
coordinate of small planes in turn holds +inf or NaN, and which input pixels come out NaN, +inf or
finite must be PyTorch's; on the GPU, the bits must be the CPU's.
"""

import numpy as np
import pytest

from kernels import TensorShape, UpsampleAttrs, UpsampleMode, upsample

from .conftest import Dev, require

BILINEAR = UpsampleMode.BILINEAR
PLANES = [(1, 1), (2, 1), (1, 3), (2, 3), (3, 2), (4, 4)]


def _backward(dev, scale, output_grad, dims):
    attrs = UpsampleAttrs(scale, BILINEAR)
    out_dims = upsample.output_dims(attrs, dims)
    state = upsample.init_kernel(dev.handle, attrs, TensorShape(dims, output_grad.dtype),
                                 TensorShape(out_dims, output_grad.dtype))
    grad = dev.array(output_grad)
    input_grad = dev.array(np.zeros(dims, output_grad.dtype))
    upsample.backward_kernel(dev.stream, dev.handle, state, attrs, None, grad, None, input_grad)
    dev.stream.synchronize()
    upsample.cleanup_kernel(dev.handle, state)
    return dev.host(input_grad)


def _kinds(array):
    """Each element as 'N' (NaN), '+' or '-' (infinite) or '.' (finite)."""
    return np.where(np.isnan(array), "N", np.where(np.isinf(array), np.where(array > 0, "+", "-"), "."))


def _one_hot_grads(scale, h, w, value):
    """(H*s*W*s, 1, 1, H*s, W*s): small dyadic gradients, with `value` at each output coordinate in turn."""
    out_h, out_w = h * scale, w * scale
    base = ((np.arange(out_h * out_w) * 7 % 13) - 6) * 0.25
    grads = np.tile(base, (out_h * out_w, 1))
    grads[np.arange(out_h * out_w), np.arange(out_h * out_w)] = value
    return grads.reshape(out_h * out_w, 1, 1, out_h, out_w)


@pytest.mark.parametrize("value", [np.inf, np.nan], ids=["inf", "nan"])
@pytest.mark.parametrize("h, w", PLANES)
@pytest.mark.parametrize("scale", [2, 3, 4])
def test_cpu_carries_what_pytorch_carries(scale, h, w, value):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    cpu = Dev("cpu")
    for output_grad in _one_hot_grads(scale, h, w, value):
        x = torch.zeros((1, 1, h, w), dtype=torch.float64, requires_grad=True)
        y = F.interpolate(x, scale_factor=scale, mode="bilinear", align_corners=False)
        (expected,) = torch.autograd.grad(y, [x], torch.from_numpy(output_grad))
        got = _backward(cpu, scale, output_grad, (1, 1, h, w))
        np.testing.assert_array_equal(_kinds(got), _kinds(expected.numpy()), err_msg=f"{output_grad}")
        finite = np.isfinite(expected.numpy())
        np.testing.assert_allclose(got[finite], expected.numpy()[finite], rtol=1e-14, atol=1e-14)


def test_zero_terms_are_where_the_kernels_say():
    """s = 3 on 3 pixels: coordinates 1, 4, 7 lie on pixel centres 0, 1, 2 (second weight 0); the
    last one's taps are both pixel 2. Coordinates clamped before pixel 0's centre: 0 (s // 2 = 1 of them)."""
    zero_taps = upsample.cpu.bilinear_zero_taps(3, 3)
    taps = list(upsample.cpu.bilinear_taps(3))
    marked = [(taps[j], p) for j, p in zip(*np.nonzero(zero_taps))]
    assert marked == [(1, 2)]  # coordinate 2 * 3 + 1 = 7
    assert list(upsample.cpu.bilinear_clamped(3, 3)) == [0]
    assert list(upsample.cpu.bilinear_clamped(3, 4)) == [0, 1]
    assert list(upsample.cpu.bilinear_clamped(1, 4)) == []  # no pixel 1
    single = upsample.cpu.bilinear_zero_taps(1, 3)  # one pixel: coordinates 0 and 1 (clamped, on its centre)
    assert [taps[j] for j, p in zip(*np.nonzero(single))] == [0, 1]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [2, 3, 4])
def test_gpu_matches_cpu_bit_for_bit(scale, dtype):
    require("gpu")
    cpu, gpu = Dev("cpu"), Dev("gpu")
    for h, w in PLANES:
        for value in (np.inf, -np.inf, np.nan):
            for output_grad in _one_hot_grads(scale, h, w, value).astype(dtype):
                expected = _backward(cpu, scale, output_grad, (1, 1, h, w))
                got = _backward(gpu, scale, output_grad, (1, 1, h, w))
                assert np.array_equal(_kinds(got), _kinds(expected)), (scale, h, w, value)
                assert np.array_equal(np.nan_to_num(got).view(np.uint8), np.nan_to_num(expected).view(np.uint8))
