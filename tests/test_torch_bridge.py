"""kernels.torch: every functional op as a torch.autograd.Function. Each op's forward is checked against
torch's own op and its backward by torch.autograd.gradcheck (float64: the kernels' analytic gradient
against torch's finite differences of the kernels' forward); then what the bridge itself promises:
no copies, torch's no-grad path, in-place modification refused, retain_graph, needs, and that
`import kernels` leaves torch unimported."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch.autograd import gradcheck

import kernels
import kernels.torch as KT

from .conftest import DEVICE_PARAMS, require


@pytest.fixture(params=DEVICE_PARAMS)
def device(request):
    require(request.param)
    return "cpu" if request.param == "cpu" else "cuda"


def _randn(device, *dims, positive=False, seed=0):
    generator = torch.Generator().manual_seed(seed + sum(dims))
    value = torch.randn(*dims, dtype=torch.float64, generator=generator)
    if positive:
        value = value.abs() + 0.5
    return value.to(device).requires_grad_()


def _batch_norm(training):
    def ours(x, w, b):
        return KT.batch_norm(x, torch.zeros(3, dtype=x.dtype, device=x.device),
                             torch.ones(3, dtype=x.dtype, device=x.device), w, b, training, 0.1, 1e-5)

    def theirs(x, w, b):
        return TF.batch_norm(x, torch.zeros(3, dtype=x.dtype, device=x.device),
                             torch.ones(3, dtype=x.dtype, device=x.device), w, b, training, 0.1, 1e-5)

    return ours, theirs


# (id, ours, torch's, inputs: (dims, positive) per tensor). Inputs are distinct random values (no ties for
# max pooling or maximum, no kink of relu within gradcheck's step of 1e-6 in practice; seeded).
CASES = [
    ("conv2d", lambda x, w, b: KT.conv2d(x, w, b, stride=1, padding=1),
     lambda x, w, b: TF.conv2d(x, w, b, stride=1, padding=1), [((2, 3, 5, 6),), ((4, 3, 3, 3),), ((4,),)]),
    ("conv2d_grouped_strided", lambda x, w: KT.conv2d(x, w, stride=2, padding=1, groups=2),
     lambda x, w: TF.conv2d(x, w, stride=2, padding=1, groups=2), [((1, 4, 6, 6),), ((4, 2, 3, 3),)]),
    ("conv2d_silu", lambda x, w, b: KT.conv2d(x, w, b, activation="SILU"),
     lambda x, w, b: TF.silu(TF.conv2d(x, w, b)), [((1, 2, 4, 4),), ((3, 2, 1, 1),), ((3,),)]),
    ("batch_norm_training", *_batch_norm(True), [((4, 3, 2, 3),), ((3,),), ((3,),)]),
    ("batch_norm_eval", *_batch_norm(False), [((2, 3, 2, 3),), ((3,),), ((3,),)]),
    ("max_pool2d", lambda x: KT.max_pool2d(x, 3, 2, 1), lambda x: TF.max_pool2d(x, 3, 2, 1), [((2, 3, 7, 6),)]),
    ("avg_pool2d", lambda x: KT.avg_pool2d(x, 3, 2, 1), lambda x: TF.avg_pool2d(x, 3, 2, 1), [((2, 3, 7, 6),)]),
    ("interpolate_nearest", lambda x: KT.interpolate(x, scale_factor=2),
     lambda x: TF.interpolate(x, scale_factor=2), [((1, 2, 3, 4),)]),
    ("interpolate_bilinear", lambda x: KT.upsample(x, scale_factor=2, mode="bilinear"),
     lambda x: TF.interpolate(x, scale_factor=2, mode="bilinear"), [((1, 2, 3, 4),)]),
    ("softmax", lambda x: KT.softmax(x, 1), lambda x: TF.softmax(x, 1), [((3, 5, 2),)]),
    ("topk", lambda x: KT.topk(x, 2), lambda x: torch.topk(x, 2), [((3, 5),)]),
    ("topk_k_n_dim_2", lambda x: KT.topk(x, 4, 2), lambda x: torch.topk(x, 4, 2), [((2, 3, 4),)]),
    ("cat", lambda a, b: KT.cat([a, b], 1), lambda a, b: torch.cat([a, b], 1), [((2, 3, 2),), ((2, 1, 2),)]),
    ("split", lambda x: KT.split(x, [1, 3], 1), lambda x: torch.split(x, [1, 3], 1), [((2, 4, 3),)]),
    ("split_one_piece_used", lambda x: KT.split(x, 2, 1)[1], lambda x: torch.split(x, 2, 1)[1], [((2, 4, 3),)]),
    ("reshape", lambda x: KT.reshape(x, (3, -1)), lambda x: x.reshape(3, -1), [((2, 3, 4),)]),
    ("permute", lambda x: KT.permute(x, (2, 0, 1)), lambda x: x.permute(2, 0, 1), [((2, 3, 4),)]),
    ("transpose", lambda x: KT.transpose(x, 0, -1), lambda x: x.transpose(0, -1), [((2, 3, 4),)]),
    ("matmul", KT.matmul, torch.matmul, [((2, 3, 4),), ((2, 4, 5),)]),
    ("add_broadcast", KT.add, torch.add, [((2, 3, 4),), ((3, 1),)]),
    ("sub", KT.sub, torch.sub, [((2, 3),), ((2, 3),)]),
    ("mul_broadcast", KT.mul, torch.mul, [((2, 1, 4),), ((3, 1),)]),
    ("div", KT.div, torch.div, [((2, 3),), ((2, 3), True)]),
    ("maximum", KT.maximum, torch.maximum, [((2, 3),), ((2, 3),)]),
    ("minimum", KT.minimum, torch.minimum, [((2, 3),), ((1, 3),)]),
    ("add_number", lambda x: KT.add(x, 1.5), lambda x: x + 1.5, [((2, 3),)]),
    ("sub_number", lambda x: KT.sub(x, 1.5), lambda x: x - 1.5, [((2, 3),)]),
    ("mul_number", lambda x: KT.mul(x, -2.0), lambda x: x * -2.0, [((2, 3),)]),
    ("div_number", lambda x: KT.div(x, 4.0), lambda x: x / 4.0, [((2, 3),)]),
    ("relu", KT.relu, TF.relu, [((3, 4),)]),
    ("sigmoid", KT.sigmoid, torch.sigmoid, [((3, 4),)]),
    ("tanh", KT.tanh, torch.tanh, [((3, 4),)]),
    ("elu", lambda x: KT.elu(x, 0.5), lambda x: TF.elu(x, 0.5), [((3, 4),)]),
    ("gelu", KT.gelu, TF.gelu, [((3, 4),)]),
    ("silu", KT.silu, TF.silu, [((3, 4),)]),
    ("exp", KT.exp, torch.exp, [((3, 4),)]),
    ("rsqrt", KT.rsqrt, torch.rsqrt, [((3, 4), True)]),
    ("sin", KT.sin, torch.sin, [((3, 4),)]),
    ("cos", KT.cos, torch.cos, [((3, 4),)]),
    ("pow", lambda x: KT.pow(x, 3.0), lambda x: torch.pow(x, 3.0), [((3, 4),)]),
    ("gradient_reduction", lambda a, b, c: KT.gradient_reduction([a, b, c]), lambda a, b, c: a + b + c,
     [((2, 3),), ((2, 3),), ((2, 3),)]),
]


def _inputs(device, specs):
    return [_randn(device, *spec[0], positive=len(spec) > 1, seed=i) for i, spec in enumerate(specs)]


@pytest.mark.parametrize("ours, theirs, specs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_forward_matches_torch_and_gradcheck_passes(device, ours, theirs, specs):
    inputs = _inputs(device, specs)
    got, expected = ours(*inputs), theirs(*inputs)
    got, expected = (got, expected) if isinstance(got, tuple) else ((got,), (expected,))
    for g, e in zip(got, expected):
        assert isinstance(g, torch.Tensor) and g.device == e.device and g.dtype == e.dtype
        if not e.is_floating_point():  # topk's indices: equal, and not differentiable (as torch's)
            assert torch.equal(g, e) and not g.requires_grad
            continue
        assert g.grad_fn is not None
        # float64: the kernels and torch sum in other orders (conv, matmul, softmax, batch statistics);
        # measured at most 2.1e-16 (about one ulp) relative to the largest value on the CPU; bound 1e-13.
        torch.testing.assert_close(g, e, rtol=0, atol=1e-13 * max(1.0, float(e.detach().abs().max())))
    # The analytic (kernel) gradient against finite differences of the kernel forward, torch's defaults
    # (eps 1e-6, atol 1e-5, rtol 1e-3).
    assert gradcheck(ours, tuple(inputs))


def test_gradients_equal_torchs():
    """One backward through a small network of bridged ops equals torch's own on the same values."""
    x, w, gamma, beta = _inputs("cpu", [((2, 3, 8, 8),), ((4, 3, 3, 3),), ((4,),), ((4,),)])

    def network(conv, bn, silu, pool, up, cat):
        y = silu(bn(conv(x, w, None, 1, 1), torch.zeros(4, dtype=x.dtype), torch.ones(4, dtype=x.dtype), gamma, beta,
                    True, 0.1, 1e-3))
        return cat([up(pool(y, 2), scale_factor=2), y], 1)

    ours = network(KT.conv2d, KT.batch_norm, KT.silu, KT.max_pool2d, KT.interpolate, KT.cat)
    theirs = network(TF.conv2d, TF.batch_norm, TF.silu, TF.max_pool2d, TF.interpolate, torch.cat)
    weights = torch.randn(ours.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad((ours * weights).sum(), (x, w, gamma, beta))
    expected = torch.autograd.grad((theirs * weights).sum(), (x, w, gamma, beta))
    for g, e in zip(got, expected):
        # Measured at most 6.6e-16 relative to the largest gradient (w's: the conv's and batch norm's sums in
        # other orders); bound 1e-12.
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12 * float(e.abs().max()))


def test_no_copies(device):
    """The kernels read the caller's tensors and the results are the kernels' own arrays (DLPack views)."""
    x, w = _inputs(device, [((1, 3, 5, 5),), ((2, 3, 3, 3),)])
    y = KT.conv2d(x, w)
    saved = y.grad_fn.recorded.saved

    def address(array):
        return array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr

    assert address(saved["input"]) == x.data_ptr() and address(saved["weight"]) == w.data_ptr()
    assert address(saved["output"]) == y.data_ptr()
    (gx,) = torch.autograd.grad(KT.relu(x).sum(), x)
    assert gx.device == x.device


def test_without_grad_nothing_is_recorded():
    x = torch.randn(2, 3, dtype=torch.float64)
    assert KT.sigmoid(x).grad_fn is None  # no input requires grad: the functional op, no Context
    with torch.no_grad():
        assert KT.sigmoid(x.requires_grad_()).grad_fn is None
    assert KT.add(torch.randn(2, 3), torch.randn(2, 3)).grad_fn is None


def test_needs_only_what_autograd_asks():
    x, w = _inputs("cpu", [((1, 3, 5, 5),), ((2, 3, 3, 3),)])
    x.requires_grad_(False)
    (gw,) = torch.autograd.grad(KT.conv2d(x, w).sum(), w)
    torch.testing.assert_close(gw, torch.autograd.grad(TF.conv2d(x, w).sum(), w)[0], rtol=0, atol=1e-12)
    # A cat where one input needs no gradient (cat_backward's needs flags).
    a, b = _inputs("cpu", [((2, 3),), ((2, 3),)])
    b.requires_grad_(False)
    (ga,) = torch.autograd.grad((KT.cat([a, b], 0) * 2).sum(), a)
    torch.testing.assert_close(ga, torch.full_like(a, 2.0))


def test_in_place_modification_and_a_second_backward_are_torchs_errors():
    x = _randn("cpu", 2, 3)
    y = KT.sigmoid(x)
    z = y.sum()
    with torch.no_grad():
        y.add_(1)  # sigmoid's backward reads its output
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    y = KT.exp(x).sum()
    y.backward(retain_graph=True)
    first = x.grad.clone()
    y.backward()  # retained: the Context is kept with the graph
    torch.testing.assert_close(x.grad, 2 * first)
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad|differentiable"):
        (g,) = torch.autograd.grad(KT.sin(x).sum(), x, create_graph=True)
        g.sum().backward()


def test_batch_norm_updates_the_running_statistics_in_place():
    x, w, b = _inputs("cpu", [((4, 3, 2, 3),), ((3,),), ((3,),)])
    ours = (torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    theirs = (torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    KT.batch_norm(x, *ours, w, b, True, 0.25, 1e-5).sum().backward()
    TF.batch_norm(x, *theirs, w, b, True, 0.25, 1e-5)
    for o, t in zip(ours, theirs):
        torch.testing.assert_close(o, t, rtol=0, atol=1e-15)


def test_batch_norm_without_a_weight_gives_the_bias_sum_dy(device):
    """batch_norm with a bias and no weight: the bias gradient is sum(dy) over all but the channels, on every
    device (values that need no reference: torch 2.11's CUDA batch_norm returns 0 here, or raises in backward,
    see tests/test_torch_bridge_properties.py), the input gradient is as with a weight of ones."""
    x = torch.tensor([1.5, 0.5, -0.25, 2.0], dtype=torch.float64, device=device).reshape(2, 2, 1, 1)
    b = torch.tensor([1.5, -1.0], dtype=torch.float64, device=device, requires_grad=True)
    dy = torch.tensor([3.0, 1.0, -2.0, 0.5], dtype=torch.float64, device=device).reshape(2, 2, 1, 1)
    stats = torch.zeros(2, dtype=torch.float64, device=device), torch.ones(2, dtype=torch.float64, device=device)
    x_none, x_ones = x.clone().requires_grad_(), x.clone().requires_grad_()
    KT.batch_norm(x_none, *stats, None, b, True, 0.1, 1e-3).backward(dy)
    assert b.grad.tolist() == [1.0, 1.5]  # channel 0: 3 - 2; channel 1: 1 + 0.5
    ones = torch.ones(2, dtype=torch.float64, device=device)
    KT.batch_norm(x_ones, *stats, ones, None, True, 0.1, 1e-3).backward(dy)
    assert torch.equal(x_none.grad, x_ones.grad)


def test_errors_are_the_functional_layers():
    with pytest.raises(kernels.ShapeError, match=r"^conv2d: weight: expected dims"):
        KT.conv2d(_randn("cpu", 1, 3, 5, 5), _randn("cpu", 2, 4, 3, 3))
    with pytest.raises(kernels.ShapeError, match=r"^cat: tensors: expected a non-empty list"):
        KT.cat([])
    with pytest.raises(kernels.AttrsError, match=r"^topk: dim: expected the last dim \(-1 or 2\)"):
        KT.topk(_randn("cpu", 2, 3, 4), 2, 1)
    with pytest.raises(kernels.AttrsError, match=r"^topk: k: expected at most the last dim of input \(4\), found 5"):
        KT.topk(_randn("cpu", 2, 3, 4), 5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=["f64", "f16", "bf16"])
def test_topk_ties_nan_and_the_gradient(device, dtype):
    """torch.sort(descending=True, stable=True)'s order through the bridge (ties lower index first, NaN
    largest, each value's own bits, -0.0 kept), as torch.return_types.topk; the gradient is the values'
    scattered to the indices, zeros elsewhere; the indices are int64 and not differentiable."""
    nan, inf = float("nan"), float("inf")
    rows = torch.tensor([[1.0, nan, 2.0, nan, -inf, inf, 2.0], [-0.0, 0.0, -1.0, 0.0, -0.0, -2.0, -inf],
                         [0.5, 0.5, 0.5, 0.5, -0.5, inf, -inf]], dtype=dtype, device=device)
    x = rows.clone().requires_grad_()
    result = KT.topk(x, 3)
    assert isinstance(result, torch.return_types.topk)
    values, indices = result
    expected = torch.sort(rows.double(), dim=-1, descending=True, stable=True).indices[:, :3]
    assert torch.equal(indices, expected) and indices.dtype == torch.int64 and not indices.requires_grad
    bits = {2: torch.int16, 8: torch.int64}[rows.element_size()]  # gathered as integers: torch's bfloat16 gather
    assert torch.equal(values.view(bits), rows.view(bits).gather(-1, expected))  # changes NaN's bits on the CPU
    grad = torch.tensor([[1.0, -2.0, 0.5], [4.0, 0.25, -1.0], [3.0, 2.0, 1.0]], dtype=dtype, device=device)
    values.backward(grad)
    assert torch.equal(x.grad, torch.zeros_like(rows).scatter(-1, expected, grad))
    with torch.no_grad():
        plain = KT.topk(x, 3)
    assert isinstance(plain, torch.return_types.topk) and plain.values.grad_fn is None
    assert torch.equal(plain.indices, indices)


def test_bfloat16_through_the_bridge():
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0)).bfloat16().requires_grad_()
    y = KT.silu(x)
    assert y.dtype == torch.bfloat16
    y.sum().backward()
    assert x.grad.dtype == torch.bfloat16
    # Against torch's silu and its gradient on the same bfloat16 values, computed in float32: the kernel
    # computes in float32 and rounds once, so each is within half a bfloat16 unit (2^-9 relative, measured 0).
    x32 = x.detach().float().requires_grad_()
    TF.silu(x32).sum().backward()
    torch.testing.assert_close(y.float(), TF.silu(x32), rtol=2.0 ** -8, atol=0)
    torch.testing.assert_close(x.grad.float(), x32.grad, rtol=2.0 ** -8, atol=0)


def test_import_kernels_leaves_torch_unimported():
    code = "import sys, kernels, kernels.functional, kernels.models; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
