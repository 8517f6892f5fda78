"""The shared activation module: the NumPy erf's measured accuracy, forward and
backward against PyTorch's formulas on both devices, in-place use, attrs and codes."""

import math
import os
import re

import numpy as np
import pytest

from conformance.case import ulp
from conformance.compare import compare, ulp_distance
from kernels import Activation, AttrsError, activation

from .conftest import DEVICE_PARAMS, Dev, require


def test_erf_within_two_ulps_of_math_erf():
    """The bound stated in kernels/activation/: 2 ulps in float64 (1 for |x| >= 1), on a dense grid
    across every branch point, tiny and subnormal magnitudes included."""
    grid = np.concatenate([np.linspace(-7, 7, 140_001)]
                          + [np.linspace(b - 1e-3, b + 1e-3, 20_001) * s for b in (1, 1.5, 2.5, 4, 6) for s in (1, -1)]
                          + [np.geomspace(1e-310, 1e-2, 5000), -np.geomspace(1e-310, 1e-2, 5000)])
    expected = np.array([math.erf(v) for v in grid])
    distance = ulp_distance(activation.cpu.erf(grid), expected)
    assert distance.max() <= 2
    assert distance[np.abs(grid) >= 1].max() <= 1


def test_erf_special_values():
    got = activation.cpu.erf(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 6.0, -30.0]))
    assert np.array_equal(got, [0.0, -0.0, 1.0, -1.0, np.nan, 1.0, -1.0], equal_nan=True)
    assert np.signbit(got[1])


# Moderate inputs (|x| <= 4) with exact zeros; the derivatives' cancellations (1 - s, 1 - t^2)
# stay within a few ulps there, on both devices (CUDA's expf/tanhf/erff are within 2 ulps).
X = np.concatenate([np.arange(-16, 17) * 0.25, [0.0, -0.0, 0.125, -0.125]])
GRAD = ((np.arange(X.size) * 7) % 11 - 5) * 0.5
TOLERANCE = ulp(8)


def _torch_reference(kind):
    import torch
    import torch.nn.functional as F

    functions = {Activation.RELU: torch.relu, Activation.SIGMOID: torch.sigmoid, Activation.TANH: torch.tanh,
                 Activation.GELU: F.gelu, Activation.SILU: F.silu}
    x = torch.tensor(X, dtype=torch.float64, requires_grad=True)
    y = functions[kind](x)
    (x_grad,) = torch.autograd.grad(y, [x], torch.tensor(GRAD, dtype=torch.float64))
    return y.detach().numpy(), x_grad.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", list(Activation))
@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_matches_torch(device, kind, dtype):
    pytest.importorskip("torch")
    require(device)
    dev = Dev(device)
    expected_output, expected_grad = (a.astype(dtype) for a in _torch_reference(kind))
    # Fresh copies: on the CPU dev.array may return its argument itself.
    pre, output_grad = dev.array(np.array(X, dtype)), dev.array(np.array(GRAD, dtype))
    output, pre_grad = dev.array(np.full(X.shape, np.nan, dtype)), dev.array(np.full(X.shape, np.nan, dtype))
    activation.forward(dev.stream, kind, pre, output)
    activation.backward(dev.stream, kind, pre, output_grad, pre_grad)
    dev.stream.synchronize()
    tolerance = TOLERANCE if kind is not Activation.RELU else ulp(1)
    assert compare(dev.host(output), expected_output, tolerance) is None
    assert compare(dev.host(pre_grad), expected_grad, tolerance) is None
    if kind is Activation.RELU:  # exact, with relu'(0) = 0 as torch
        assert np.array_equal(dev.host(output), expected_output)
        assert np.array_equal(dev.host(pre_grad), expected_grad)
    assert np.array_equal(dev.host(output_grad), GRAD.astype(dtype)), "backward modified output_grad"

    # In place: output may be pre, pre_grad may be pre or output_grad; same bits as out of place.
    in_place = dev.array(np.array(X, dtype))
    activation.forward(dev.stream, kind, in_place, in_place)
    grad_in_place = dev.array(np.array(GRAD, dtype))
    activation.backward(dev.stream, kind, pre, grad_in_place, grad_in_place)
    dev.stream.synchronize()
    assert np.array_equal(dev.host(in_place), dev.host(output), equal_nan=True)
    assert np.array_equal(dev.host(grad_in_place), dev.host(pre_grad), equal_nan=True)


def test_attr_activation():
    assert activation.attr_activation("conv_2d", None) is None
    assert activation.attr_activation("conv_2d", Activation.SILU) is Activation.SILU
    assert activation.attr_activation("conv_2d", "GELU") is Activation.GELU
    for bad in ("swish", 3, Activation):
        with pytest.raises(AttrsError, match=r"^conv_2d: activation: expected a Activation"):
            activation.attr_activation("conv_2d", bad)


def test_codes_reach_every_cuda_module_as_options():
    """The activation codes are defined in Python only and reach every CUDA module as -D options
    (with KERNELS_MAX_RANK), so Python and CUDA cannot disagree; the header defines none itself."""
    from kernels.runtime import gpu

    expected = {f"-DKERNELS_ACTIVATION_{a.name}={int(activation.code(a))}" for a in Activation}
    expected |= {"-DKERNELS_ACTIVATION_NONE=-1", f"-DKERNELS_MAX_RANK={gpu.MAX_RANK}"}
    assert activation.code(None) == -1
    for module in gpu.MODULES:
        assert expected <= set(module.options), module.path
    with open(os.path.join(gpu._HERE, "activation.cuh")) as source:  # the shared headers: kernels/runtime
        assert not re.findall(r"#define KERNELS_ACTIVATION_\w+", source.read())


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset_view"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", list(Activation))
def test_gpu_packs_and_remainder_match_cpu(kind, dtype, offset):
    """4099 elements: 16-byte packs and a remainder, or (offset view) the one-element path; in place too."""
    require("gpu")
    cpu, gpu = Dev("cpu"), Dev("gpu")
    count = 4099
    host = ((np.arange(count + 1) * 37 % 129 - 64) / 16.0).astype(dtype)
    host_grad = host[::-1].copy()
    expected_output, expected_grad = np.empty(count, dtype), np.empty(count, dtype)
    activation.cpu_forward(kind, host[offset:offset + count], expected_output)
    activation.cpu_backward(kind, host[offset:offset + count], host_grad[offset:offset + count], expected_grad)
    pre = gpu.array(host)[offset:offset + count]
    output_grad = gpu.array(host_grad)[offset:offset + count]
    output, pre_grad = gpu.array(np.full(count, np.nan, dtype)), gpu.array(np.full(count, np.nan, dtype))
    activation.gpu_forward(gpu.stream, kind, pre, output)
    activation.gpu_backward(gpu.stream, kind, pre, output_grad, pre_grad)
    activation.gpu_backward(gpu.stream, kind, pre, output_grad, output_grad)  # in place, after the one above
    gpu.stream.synchronize()
    assert compare(gpu.host(output), expected_output, ulp(8)) is None
    assert compare(gpu.host(pre_grad), expected_grad, ulp(8)) is None
    assert np.array_equal(gpu.host(output_grad), gpu.host(pre_grad), equal_nan=True)
    cpu.handle.close()
    gpu.handle.close()


def test_erf_of_magnitudes_at_least_one_only():
    """No |x| < 1 at all: only the continued-fraction bands run (1 ulp, the bound stated above)."""
    grid = np.concatenate([np.linspace(1, 7, 601), -np.linspace(1, 7, 601)])
    assert ulp_distance(activation.cpu.erf(grid), np.array([math.erf(v) for v in grid])).max() <= 1


@pytest.mark.parametrize("kind", list(Activation))
def test_cpu_derivative_matches_torch(kind):
    """f'(pre) on its own (relu: the mask pre > 0, relu'(0) = 0 as torch)."""
    pytest.importorskip("torch")
    expected_grad = _torch_reference(kind)[1]
    derivative = activation.cpu.cpu_derivative(kind, X.copy())
    if kind is Activation.RELU:
        assert derivative.dtype == np.bool_
        assert np.array_equal(GRAD * derivative, expected_grad)
    else:
        assert compare(GRAD * derivative, expected_grad, TOLERANCE) is None


def test_cpu_silu_backward_on_a_large_non_contiguous_array_matches_torch(monkeypatch):
    """Not contiguous and past BLOCK_ELEMENTS: blockwise runs once on the whole arrays, and past
    PARALLEL_BLOCK_ELEMENTS (made smaller here) the per-thread scratch is too small, so the block
    gets buffers of its own."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(activation.cpu, "PARALLEL_BLOCK_ELEMENTS", activation.cpu.BLOCK_ELEMENTS)
    rng = np.random.default_rng(7)
    pre = rng.standard_normal((800, 400)).T  # 320000 elements, a transposed view
    output_grad = rng.standard_normal((800, 400)).T
    assert pre.size > activation.cpu.BLOCK_ELEMENTS and not pre.flags.c_contiguous
    pre_grad = np.full_like(pre, np.nan)
    activation.cpu_backward(Activation.SILU, pre, output_grad, pre_grad)
    x = torch.tensor(pre, requires_grad=True)
    (expected,) = torch.autograd.grad(torch.nn.functional.silu(x), [x], torch.tensor(output_grad))
    assert compare(pre_grad, expected.numpy(), TOLERANCE) is None


@pytest.mark.parametrize("call", [
    lambda bad, x: activation.cpu_forward(bad, x, x.copy()),
    lambda bad, x: activation.cpu_backward(bad, x, x, x.copy()),
    lambda bad, x: activation.cpu.cpu_derivative(bad, x),
    lambda bad, x: activation.cpu._forward_block(bad, x, x.copy()),
], ids=["cpu_forward", "cpu_backward", "cpu_derivative", "forward_block"])
def test_cpu_functions_refuse_what_is_not_an_activation(call):
    with pytest.raises(AttrsError, match=r"^activation: activation: expected an Activation, found 'SILU'"):
        call("SILU", np.array(X))
