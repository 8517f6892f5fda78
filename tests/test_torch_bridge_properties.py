"""kernels.torch under drawn autograd situations (hypothesis): which inputs require grad, and what gradient
torch hands the backward.

tests/test_torch_bridge.py checks each op by gradcheck with every input requiring grad, and `needs` on two
examples. Here hypothesis draws, for the ops of several tensors (conv2d with or without bias, batch_norm
with any of weight and bias, matmul, the binary ops with broadcasting, cat, gradient_reduction, split):
which of the tensors require grad (at least one), whether a tensor is passed twice, and the loss, so that
the output gradient the bridge receives is contiguous, expanded (stride 0: `y.sum()`) or transposed. Our
ops and torch's compute the same loss; the gradients torch.autograd.grad returns for the tensors that
require grad must agree (dyadic values: exact where the math is a sum of products; batch norm within a
bound of its terms' magnitudes, as in tests/test_functional_properties.py), and the others get none.
On CUDA (marked `gpu`) the tensors are CUDA tensors and the bridge runs on torch's current stream.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.case import EXACT

from .conftest import require
from .test_functional_properties import EPS, _check, _close, _profile, _values  # the same profiles (ci, device)

torch = pytest.importorskip("torch")
TF = torch.nn.functional
KT = pytest.importorskip("kernels.torch")

@pytest.fixture(scope="module", params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request):
    require(request.param)
    return "cpu" if request.param == "cpu" else "cuda"


def _tensors(draw, device, dims_list, scales=None):
    """Dyadic float64 tensors of the dims, on the device; which require grad is drawn (at least one)."""
    arrays = [_values(draw, dims, scale=0.25 if scales is None else scales[i]) for i, dims in enumerate(dims_list)]
    wants = [draw(st.booleans()) for _ in arrays]
    wants[draw(st.integers(0, len(arrays) - 1))] = True
    return [torch.tensor(a, device=device).requires_grad_(want) for a, want in zip(arrays, wants)]


def _loss(draw, output):
    """A scalar loss of one output, drawn so that its gradient reaches the bridge contiguous (y * g), expanded
    (y.sum(): every element's gradient one value, stride 0) or transposed (a permuted y times g)."""
    form = draw(st.sampled_from(["weighted", "sum", "transposed"]))
    if form == "sum" or output.dim() == 0:
        return lambda y: y.sum()
    if form == "transposed" and output.dim() >= 2:
        g = torch.tensor(_values(draw, tuple(output.transpose(0, -1).shape), scale=0.5), device=output.device)
        return lambda y: (y.transpose(0, -1) * g).sum()
    g = torch.tensor(_values(draw, tuple(output.shape), scale=0.5), device=output.device)
    return lambda y: (y * g).sum()


def _compare(draw, ours, theirs, tensors, bound=None):
    """Our op and torch's over the same tensors and a drawn loss: the forward, then the gradients of the tensors
    that require grad (exact, or within bound(output_or_grad_index) where given)."""
    got, expected = ours(*tensors), theirs(*tensors)
    loss = _loss(draw, expected)
    wanted = [t for t in tensors if t.requires_grad]
    assert got.grad_fn is not None, "an input requires grad: the output must too"
    ours_grads = torch.autograd.grad(loss(got), wanted)
    theirs_grads = torch.autograd.grad(loss(expected), wanted)
    checks = [("output", got, expected)] + [(f"gradient {i}", a, b) for i, (a, b) in
                                            enumerate(zip(ours_grads, theirs_grads))]
    for i, (what, a, b) in enumerate(checks):
        a, b = a.detach().cpu().numpy(), b.detach().cpu().numpy()
        if bound is None:
            _check(a, b, EXACT, what)
        else:
            _close(a, b, bound(i, b), what)


@_profile
@given(data=st.data())
def test_conv2d_needs(device, data):
    draw = data.draw
    n, c, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(3, 6)), draw(st.integers(3, 6))
    o, with_bias = draw(st.integers(1, 3)), draw(st.booleans())
    dims = [(n, c, h, w), (o, c, 3, 3)] + ([(o,)] if with_bias else [])
    tensors = _tensors(draw, device, dims, scales=[0.25, 0.5, 0.25])
    stride = draw(st.integers(1, 2))
    _compare(draw, lambda *t: KT.conv2d(*t, stride=stride, padding=1),
             lambda *t: TF.conv2d(*t, stride=stride, padding=1), tensors)


@_profile
@given(data=st.data())
def test_batch_norm_needs(device, data):
    draw = data.draw
    dims = (draw(st.integers(2, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    channels = dims[1]
    affine = draw(st.sampled_from(["weight and bias", "weight", "bias"]))
    shapes = [dims] + [(channels,)] * (2 if affine == "weight and bias" else 1)
    tensors = _tensors(draw, device, shapes, scales=[0.25, 0.5, 0.25])
    weight = tensors[1] if affine != "bias" else None
    bias = tensors[-1] if affine != "weight" else None

    def call(module, weight):
        def op(*_):
            stats = torch.zeros(channels, dtype=torch.float64, device=device), torch.ones(channels, dtype=torch.float64,
                                                                                         device=device)
            return module.batch_norm(tensors[0], *stats, weight, bias, True, 0.1, 1e-3)
        return op

    # torch's reference is given a weight of ones (not requiring grad) where ours is given none: the same function.
    # torch 2.11's CUDA batch_norm without a weight gets the bias gradient wrong, cuDNN or native, float32 or 64,
    # whether or not the input requires grad (H200, 2026-12-05): x = [1.5, 0.5] (2, 1, 1, 1), bias 1.5, loss
    # sum(y * [3, 1]) gives 0.0 where the CPU and the math give sum(dy) = 4.0, and y.sum() raises "tensor does
    # not have a device" in backward. With a weight of ones CUDA gives 4.0 and 2.0.
    ones = torch.ones(channels, dtype=torch.float64, device=device)

    count = math.prod(dims) // channels

    def bound(_, reference):
        # The statistics and every gradient are sums of `count` rounded terms, and 1 / sqrt(var + eps) carries the
        # variance's relative error, up to about `count` times its terms' (values on a 1/4 grid: a nonzero var
        # is at least 1 / (16 count)).
        # On the CPU (3 runs of 500 random draws) the largest error was 0.12 of (count + 8) eps (1 + max|ref|)
        # (1 + 4 count); 8 of them leaves 65x for the GPU's other summation order.
        return 8 * (count + 8) * EPS * (1 + np.abs(reference).max()) * (1 + 4 * count)

    _compare(draw, call(KT, weight), call(TF, ones if weight is None else weight), tensors, bound)


@_profile
@given(data=st.data())
def test_matmul_and_binary_needs(device, data):
    draw = data.draw
    name = draw(st.sampled_from(["matmul", "add", "sub", "mul", "maximum", "minimum", "same tensor twice"]))
    if name == "matmul":
        lead, m, k, n = (draw(st.integers(1, 3)),), draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(
            st.integers(1, 4))
        tensors = _tensors(draw, device, [(*lead, m, k), (*lead, k, n)], scales=[0.25, 0.5])
        _compare(draw, KT.matmul, torch.matmul, tensors)
        return
    out = tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(1, 3))))
    if name == "same tensor twice":  # autograd adds the two gradients the bridge returns for one tensor
        (x,) = _tensors(draw, device, [out])
        _compare(draw, lambda t: KT.mul(t, t), lambda t: torch.mul(t, t), [x])
        return
    rhs = tuple(d if draw(st.booleans()) else 1 for d in out[len(out) - draw(st.integers(0, len(out))):])
    tensors = _tensors(draw, device, [out, rhs])
    _compare(draw, getattr(KT, name), getattr(torch, name), tensors)


@_profile
@given(data=st.data())
def test_cat_split_and_gradient_reduction_needs(device, data):
    draw = data.draw
    rank = draw(st.integers(1, 3))
    dims = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    axis = draw(st.integers(-rank, rank - 1))
    count = draw(st.integers(2, 4))
    name = draw(st.sampled_from(["cat", "gradient_reduction", "split"]))
    if name == "cat":
        sizes = [draw(st.integers(1, 3)) for _ in range(count)]
        shapes = [tuple(s if d == axis % rank else n for d, n in enumerate(dims)) for s in sizes]
        _compare(draw, lambda *t: KT.cat(list(t), axis), lambda *t: torch.cat(t, axis), _tensors(draw, device, shapes))
    elif name == "gradient_reduction":
        _compare(draw, lambda *t: KT.gradient_reduction(list(t)), lambda *t: sum(t[1:], t[0]),
                 _tensors(draw, device, [dims] * count))
    else:  # a split whose parts the loss uses in part: torch hands the bridge None for an unused part
        (x,) = _tensors(draw, device, [dims])
        size = draw(st.integers(1, dims[axis]))
        used = draw(st.lists(st.booleans(), min_size=-(-dims[axis] // size), max_size=-(-dims[axis] // size)))
        used[0] = True

        def pick(parts):
            return torch.cat([p.reshape(-1) for p, u in zip(parts, used) if u])

        _compare(draw, lambda t: pick(KT.split(t, size, axis)), lambda t: pick(torch.split(t, size, axis)), [x])
