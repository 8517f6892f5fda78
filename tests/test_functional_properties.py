"""kernels.functional against torch.nn.functional over drawn argument forms (hypothesis), on each device.

tests/test_functional.py checks each function on chosen cases. Here hypothesis draws what a caller
may pass: ints, pairs and one-element lists for the pair arguments, stride None, padding "same" and
"valid", negative dims, split sizes as an int or as sections, sizes or scale factors, numbers or
broadcast tensors as `other`, affine or not, training or not. Each draw runs the forward with a
Context and its backward against torch's autograd in float64, then the same forward twice without a
Context (the second call runs on the form's plan) for the same bits: every form a caller writes must
mean what it means to torch, and no two forms may share a plan.

Values are small dyadic numbers (multiples of 1/4 or 1/2), so every product and sum here is exact in
float64: `EXACT` wherever the math is a sum of products, a selection or a copy (bilinear at scale 2
too: weights 1/4 and 3/4). Where it is not: a few ulps for one rounded operation (softmax's exp, a
division, avg pooling's divisor), and where rounded terms are summed and may cancel (div's broadcast
gradients, avg pooling's and softmax's gradients, batch norm), a bound made of the terms' magnitudes
(_close), since ulps of a cancelled result say nothing. Profiles as tests/test_properties.py's: `ci` (the
default, derandomized, 40 examples a function) and `device` (HYPOTHESIS_PROFILE=device, 500, random).
On the GPU (marked `gpu`, skipped with the reason where there is none) every call is given the device's
stream, and the plans are the GPU's own (kept in the stream's runtime).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernels.functional as F
from conformance.case import EXACT, ulp

from .conftest import require
from .properties import Device, Expect, check, draw_values, eps, reduce_to, seeded

torch = pytest.importorskip("torch")
TF = torch.nn.functional

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_PROFILES = {"ci": dict(max_examples=40, derandomize=True, print_blob=True, **_COMMON),
             "device": dict(max_examples=500, **_COMMON)}
_profile = settings(**_PROFILES.get(os.environ.get("HYPOTHESIS_PROFILE", "ci"), _PROFILES["ci"]))


@pytest.fixture(scope="module", params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def dev(request):
    """The device's stream, handle and arrays (tests/properties.py's Device); the GPU skipped with the reason
    where it is unavailable. `call` holds the keywords every call takes: the device's stream."""
    require(request.param)
    device = Device(request.param)
    device.call = {"stream": device.stream}
    yield device
    device.close()


def _check(got, expected, tolerance, what):
    """got against expected (float64) within `tolerance` (EXACT or ulp(n)): tests/properties.py's check."""
    report = check(what, np.asarray(got), Expect(np.asarray(expected, np.float64), ulps=tolerance.ulps), np.float64)
    assert report is None, report


def _close(got, expected, bound, what):
    """|got - expected| <= bound elementwise (NaN matching NaN): for sums whose terms are inexact and may cancel,
    where ulps of the result say nothing; the bound is made of the magnitudes of the terms."""
    expected = np.asarray(expected, np.float64)
    report = check(what, np.asarray(got), Expect(expected, np.broadcast_to(bound, expected.shape)), np.float64)
    assert report is None, report


EPS = eps(np.float64)


def _values(draw, dims, scale=0.25, limit=8, positive=False, distinct=False):
    """Multiples of `scale` in [-limit * scale, limit * scale] (in [scale, limit * scale] where positive), seeded by
    the draw (tests/properties.py's draw_values); `distinct`: no two equal (no ties for an argmax)."""
    rng = seeded(draw)
    if distinct:
        count = math.prod(dims)
        return ((rng.permutation(count) - count // 2) * scale).reshape(dims).astype(np.float64)
    return draw_values(rng, tuple(dims), np.float64, True, step=scale, limit=limit, positive=positive)


def _pair(form):
    """A pair argument's (h, w), as the layer and torch read it."""
    if isinstance(form, int):
        return form, form
    return (form[0], form[0]) if len(form) == 1 else tuple(form)


def _pair_form(draw, pair):
    """A pair argument as a caller may write it: an int where both are equal, a tuple, a list, [k]."""
    if pair[0] == pair[1]:
        return draw(st.sampled_from([pair[0], tuple(pair), list(pair), [pair[0]]]))
    return draw(st.sampled_from([tuple(pair), list(pair)]))


def _run(dev, draw, forward, backward, torch_forward, inputs, tolerance=EXACT, grad_tolerance=None, grad_scale=0.5):
    """Forward with a Context and backward on `dev` against torch autograd (float64, on the CPU); then two
    forwards without a Context (the second on the form's plan), which must give the Context forward's bits.
    `forward(*arrays, **keywords)` and `torch_forward(*tensors)` return one tensor; `backward(grad, ctx,
    **keywords)` the inputs' gradients. `inputs` are host arrays."""
    ctx = F.Context()
    arrays = [dev.put(a) for a in inputs]
    output = dev.host(forward(*arrays, ctx=ctx, **dev.call))
    tensors = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in inputs]
    expected = torch_forward(*tensors)
    _check(output, expected.detach().numpy(), tolerance, "output")
    grad = _values(draw, tuple(expected.shape), scale=grad_scale)
    expected.backward(torch.from_numpy(grad))
    grads = backward(dev.put(grad), ctx, **dev.call)
    grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
    assert len(grads) == len(tensors)
    for i, (got, tensor) in enumerate(zip(grads, tensors)):
        if callable(grad_tolerance):  # a bound of the terms' magnitudes (_close)
            _close(dev.host(got), tensor.grad.numpy(), grad_tolerance(i, grad), f"gradient of input {i}")
        else:
            _check(dev.host(got), tensor.grad.numpy(), grad_tolerance or tolerance, f"gradient of input {i}")
    _same_again(dev, output, lambda: forward(*arrays, **dev.call))


def _same_again(dev, output, call):
    """Two calls without a Context (the second on the form's plan) give the Context call's bits."""
    for _ in range(2):
        again = dev.host(call())
        assert again.shape == output.shape and again.tobytes() == output.tobytes(), "a call without a Context"


@st.composite
def _image(draw, channels=None, min_side=1, max_side=7):
    n = draw(st.integers(1, 3))
    c = channels if channels is not None else draw(st.integers(1, 4))
    return (n, c, draw(st.integers(min_side, max_side)), draw(st.integers(min_side, max_side)))


# --------------------------------------------------------------------------- conv2d


@_profile
@given(data=st.data())
def test_conv2d_forms(dev, data):
    draw = data.draw
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    per_group = draw(st.integers(1, 3))
    depthwise = draw(st.booleans())
    out_channels = groups * (1 if depthwise else draw(st.integers(1, 3)))
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding_form = draw(st.sampled_from(["pairs", "pairs", "same", "valid"]))
    stride = (1, 1) if padding_form == "same" else (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    if padding_form == "same":  # an even total dilation * (kernel - 1): the kernels pad symmetrically (refused else)
        kernel = tuple(k + 1 if d % 2 and k % 2 == 0 else k for k, d in zip(kernel, dilation))
    padding = (draw(st.integers(0, (kernel[0] - 1) * dilation[0] // 2 + 1)),
               draw(st.integers(0, (kernel[1] - 1) * dilation[1] // 2 + 1)))
    reach = ((kernel[0] - 1) * dilation[0] + 1, (kernel[1] - 1) * dilation[1] + 1)
    pad_h, pad_w = padding if padding_form == "pairs" else (0, 0)
    dims = (draw(st.integers(1, 3)), groups * per_group,
            draw(st.integers(max(1, reach[0] - 2 * pad_h), 8)), draw(st.integers(max(1, reach[1] - 2 * pad_w), 8)))
    keywords = {"stride": _pair_form(draw, stride), "dilation": _pair_form(draw, dilation), "groups": groups,
                "padding": _pair_form(draw, padding) if padding_form == "pairs" else padding_form}
    if keywords["stride"] == 1 and draw(st.booleans()):
        del keywords["stride"]  # the default
    inputs = [_values(draw, dims), _values(draw, (out_channels, per_group, *kernel), scale=0.5)]
    if draw(st.booleans()):
        inputs.append(_values(draw, (out_channels,)))
    with_bias = len(inputs) == 3

    def backward(g, ctx, **kw):
        grads = F.conv2d_backward(g, ctx, **kw)
        assert (grads.bias is None) != with_bias
        return grads if with_bias else grads[:2]

    _run(dev, draw, lambda *a, **kw: F.conv2d(*a, **keywords, **kw), backward,
         lambda *t: TF.conv2d(*t, **keywords), inputs)


# --------------------------------------------------------------------------- pooling


@st.composite
def _pool_forms(draw):
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride = None if draw(st.booleans()) else (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, kernel[0] // 2)), draw(st.integers(0, kernel[1] // 2)))
    dims = draw(_image(min_side=max(kernel)))
    keywords = {"kernel_size": _pair_form(draw, kernel), "padding": _pair_form(draw, padding)}
    if stride is not None:
        keywords["stride"] = _pair_form(draw, stride)
    return dims, keywords


@_profile
@given(data=st.data())
def test_max_pool2d_forms(dev, data):
    dims, keywords = data.draw(_pool_forms())
    _run(dev, data.draw, lambda x, **kw: F.max_pool2d(x, **keywords, **kw), F.max_pool2d_backward,
         lambda x: TF.max_pool2d(x, **keywords), [_values(data.draw, dims, distinct=True)])


@_profile
@given(data=st.data())
def test_avg_pool2d_forms(dev, data):
    dims, keywords = data.draw(_pool_forms())
    keywords["count_include_pad"] = data.draw(st.booleans())
    x = _values(data.draw, dims)
    windows = math.prod(_pair(keywords["kernel_size"]))

    def bound(_, grad):  # each input's sum of g / divisor over the windows holding it, of |g|: torch's own
        tensor = torch.tensor(x, requires_grad=True)
        TF.avg_pool2d(tensor, **keywords).backward(torch.from_numpy(np.abs(grad)))
        return (windows + 4) * EPS * tensor.grad.numpy()

    # The window's sum is exact and its division by a divisor other than a power of two rounds once (ulp(1) on
    # either side of it: a division, or a product by the reciprocal); the gradient adds rounded quotients in
    # another order than torch's, which may cancel: within (window + 4) eps of the sum of their magnitudes.
    _run(dev, data.draw, lambda a, **kw: F.avg_pool2d(a, **keywords, **kw), F.avg_pool2d_backward,
         lambda t: TF.avg_pool2d(t, **keywords), [x], ulp(2), bound)


# --------------------------------------------------------------------------- interpolate


@_profile
@given(data=st.data())
def test_interpolate_forms(dev, data):
    draw = data.draw
    dims = draw(_image(max_side=5))
    mode = draw(st.sampled_from(["nearest", "bilinear"]))
    scale = 2 if mode == "bilinear" else draw(st.integers(2, 4))  # bilinear at 2: weights 1/4 and 3/4, exact
    how = draw(st.sampled_from(["int", "float", "pair", "size"]))
    keywords = {"mode": mode, **({"align_corners": draw(st.sampled_from([None, False]))} if mode == "bilinear" else {})}
    if how == "size":
        size = (dims[2] * scale, dims[3] * scale)  # torch takes an int or one size a dim here (no [k])
        keywords["size"] = draw(st.sampled_from([tuple(size), list(size)] + ([size[0]] if size[0] == size[1] else [])))
    else:
        keywords["scale_factor"] = {"int": scale, "float": float(scale), "pair": (float(scale), float(scale))}[how]
    _run(dev, draw, lambda x, **kw: F.interpolate(x, **keywords, **kw), F.interpolate_backward,
         lambda x: TF.interpolate(x, **keywords), [_values(draw, dims)])


# --------------------------------------------------------------------------- softmax and data movement


def _dims(draw, min_rank=1, max_rank=4, max_side=4):
    return tuple(draw(st.integers(1, max_side)) for _ in range(draw(st.integers(min_rank, max_rank))))


def _dims_and_axis(draw):
    """Dims of rank 1 to 4 and a dim of them, negative or not."""
    dims = _dims(draw)
    return dims, draw(st.integers(-len(dims), len(dims) - 1))


@_profile
@given(data=st.data())
def test_softmax_dims(dev, data):
    dims, dim = _dims_and_axis(data.draw)
    x = _values(data.draw, dims)
    ctx = F.Context()
    array = dev.put(x)
    got = dev.host(F.softmax(array, dim, ctx=ctx, **dev.call))
    tensor = torch.tensor(x, requires_grad=True)
    expected = TF.softmax(tensor, dim)
    # exp comes from NumPy or CUDA here and from ATen there: a few ulps (tests/test_functional.py).
    _check(got, expected.detach().numpy(), ulp(4), "output")
    _same_again(dev, got, lambda: F.softmax(array, dim, **dev.call))
    grad = _values(data.draw, dims, scale=0.5)
    expected.backward(torch.from_numpy(grad))
    # y (g - sum(g y)) cancels: within (n + 8) eps of its terms' magnitudes, n the length of the dim, and
    # 4 ulps of y's own error in each (4 more).
    y = expected.detach().numpy()
    terms = y * (np.abs(grad) + (np.abs(grad) * y).sum(axis=dim, keepdims=True))
    _close(dev.host(F.softmax_backward(dev.put(grad), ctx, **dev.call)), tensor.grad.numpy(),
           (dims[dim] + 12) * EPS * terms, "input gradient")


@_profile
@given(data=st.data())
def test_cat_dims(dev, data):
    draw = data.draw
    dims, axis = _dims_and_axis(draw)
    sizes = draw(st.lists(st.integers(1, 3), min_size=2, max_size=4))
    inputs = [_values(draw, tuple(s if d == axis % len(dims) else n for d, n in enumerate(dims))) for s in sizes]

    def forward(*arrays, **kw):
        return F.cat(list(arrays), axis, **kw)

    _run(dev, draw, forward, F.cat_backward, lambda *t: torch.cat(t, axis), inputs)


@_profile
@given(data=st.data())
def test_split_forms(dev, data):
    draw = data.draw
    dims, axis = _dims_and_axis(draw)
    length = dims[axis]
    if draw(st.booleans()):
        sections = draw(st.integers(1, length + 1))  # a size: the last part may be shorter
    else:
        cuts = sorted(draw(st.lists(st.integers(0, length), max_size=3)))
        sections = [b - a for a, b in zip([0, *cuts], [*cuts, length])]
    x = _values(draw, dims)
    ctx = F.Context()
    array = dev.put(x)
    parts = [dev.host(part) for part in F.split(array, sections, axis, ctx=ctx, **dev.call)]
    tensor = torch.tensor(x, requires_grad=True)
    expected = torch.split(tensor, sections, axis)
    assert len(parts) == len(expected)
    for i, (got, part) in enumerate(zip(parts, expected)):
        _check(got, part.detach().numpy(), EXACT, f"part {i}")
    # Output gradients for some parts only: the others are None, as torch's for an unused output (at least one
    # is a tensor: split_backward refuses a list of None, whose arrays' kind it could not tell).
    keep = [draw(st.booleans()) for _ in parts]
    keep[draw(st.integers(0, len(parts) - 1))] = True
    grads = [_values(draw, tuple(p.shape)) if k else None for p, k in zip(expected, keep)]
    sum((p * torch.from_numpy(g)).sum() for p, g in zip(expected, grads) if g is not None).backward()
    _check(dev.host(F.split_backward([None if g is None else dev.put(g) for g in grads], ctx, **dev.call)),
           tensor.grad.numpy(), EXACT, "input gradient")
    for _ in range(2):
        again = [dev.host(part) for part in F.split(array, sections, axis, **dev.call)]
        assert [a.tobytes() for a in again] == [p.tobytes() for p in parts], "a call without a Context"


@_profile
@given(data=st.data())
def test_reshape_forms(dev, data):
    draw = data.draw
    dims = _dims(draw)
    size = math.prod(dims)
    shape = [d for d in draw(st.permutations(_factors(size)))] or [1]
    if draw(st.booleans()):
        shape[draw(st.integers(0, len(shape) - 1))] = -1
    form = draw(st.sampled_from([tuple, list]))(shape)
    _run(dev, draw, lambda x, **kw: F.reshape(x, form, **kw), F.reshape_backward, lambda x: torch.reshape(x, form),
         [_values(draw, dims)])


def _factors(size):
    """size as a product of its prime factors (an empty list for 1)."""
    factors, p = [], 2
    while size > 1:
        while size % p == 0:
            factors.append(p)
            size //= p
        p += 1
    return factors


@_profile
@given(data=st.data())
def test_permute_and_transpose_forms(dev, data):
    draw = data.draw
    dims = _dims(draw)
    rank = len(dims)
    x = _values(draw, dims)
    order = [p - rank if draw(st.booleans()) else p for p in draw(st.permutations(range(rank)))]
    _run(dev, draw, lambda a, **kw: F.permute(a, order, **kw), F.permute_backward, lambda t: t.permute(order), [x])
    first, second = draw(st.integers(-rank, rank - 1)), draw(st.integers(-rank, rank - 1))
    _run(dev, draw, lambda a, **kw: F.transpose(a, first, second, **kw), F.transpose_backward,
         lambda t: torch.transpose(t, first, second), [x])


@_profile
@given(data=st.data())
def test_matmul_forms(dev, data):
    draw = data.draw
    leading = _dims(draw, 1, 2, 3)
    m, k, n = draw(st.integers(1, 5)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    _run(dev, draw, F.matmul, F.matmul_backward, torch.matmul,
         [_values(draw, (*leading, m, k)), _values(draw, (*leading, k, n), scale=0.5)])


# --------------------------------------------------------------------------- elementwise


_BINARY = {"add": (F.add, F.add_backward, torch.add), "sub": (F.sub, F.sub_backward, torch.sub),
           "mul": (F.mul, F.mul_backward, torch.mul), "div": (F.div, F.div_backward, torch.div),
           "maximum": (F.maximum, F.maximum_backward, torch.maximum),
           "minimum": (F.minimum, F.minimum_backward, torch.minimum)}


@_profile
@given(data=st.data())
def test_binary_broadcasting_and_numbers(dev, data):
    draw = data.draw
    name = draw(st.sampled_from(sorted(_BINARY)))
    forward, backward, torch_forward = _BINARY[name]
    out = _dims(draw, 1, 4, 3)
    # x / y rounds; its gradients round in another order than torch's (tests/test_functional.py): 2 ulps.
    tolerance = ulp(2) if name == "div" else EXACT  # with a number: g / c, one rounding each side
    # Few values (ties for maximum and minimum), divisors positive (nonzero).
    if name not in ("maximum", "minimum") and draw(st.booleans()):  # a number as `other`
        number = draw(st.sampled_from([0.375, -2.0, 1.5, 3.0]))
        x = _values(draw, out, limit=3)
        _run(dev, draw, lambda a, **kw: forward(a, number, **kw), lambda g, ctx, **kw: backward(g, ctx, **kw).input,
             lambda t: torch_forward(t, number), [x], tolerance)
        return

    def operand():  # right-aligned: a suffix of the output's dims, each kept or 1
        rank = draw(st.integers(0, len(out)))
        return tuple(d if draw(st.booleans()) else 1 for d in out[len(out) - rank:])

    lhs, rhs = operand(), operand()
    if not lhs and not rhs:
        lhs = out
    x, y = _values(draw, lhs, limit=3), _values(draw, rhs, limit=3, positive=name == "div")
    if name != "div":
        _run(dev, draw, forward, backward, torch_forward, [x, y])
        return
    # x / y rounds once (ulps); a broadcast operand's gradient sums rounded quotients -g / y and -g x / y^2
    # over the dims it was broadcast along, in another order than torch's, and they may cancel: within
    # (count + 4) eps of the sum of the terms' magnitudes.
    ctx = F.Context()
    arrays = dev.put(x), dev.put(y)
    got = dev.host(F.div(*arrays, ctx=ctx, **dev.call))
    tx, ty = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    expected = torch.div(tx, ty)
    _check(got, expected.detach().numpy(), EXACT, "output")  # one correctly rounded division
    _same_again(dev, got, lambda: F.div(*arrays, **dev.call))
    grad = _values(draw, tuple(expected.shape), scale=0.5)
    expected.backward(torch.from_numpy(grad))
    grads = [dev.host(g) for g in F.div_backward(dev.put(grad), ctx, **dev.call)]
    count = grad.size // max(min(x.size, y.size), 1) + 4
    _close(grads[0], tx.grad.numpy(), count * EPS * reduce_to(np.abs(grad / y), x.shape), "gradient of input")
    _close(grads[1], ty.grad.numpy(), count * EPS * reduce_to(np.abs(grad * x / (y * y)), y.shape),
           "gradient of other")


# --------------------------------------------------------------------------- batch_norm


@_profile
@given(data=st.data())
def test_batch_norm_forms(dev, data):
    draw = data.draw
    dims = draw(_image(max_side=5))
    if math.prod(dims) // dims[1] < 2:
        dims = (2, *dims[1:])  # training needs more than one value a channel
    channels = dims[1]
    training = draw(st.booleans())
    momentum = draw(st.sampled_from([0.1, 0.03, 0.5]))
    eps = draw(st.sampled_from([1e-5, 1e-3]))
    affine = draw(st.sampled_from(["weight and bias", "weight", "bias", "none"]))
    x = _values(draw, dims)
    mean, var = _values(draw, (channels,)), np.abs(_values(draw, (channels,))) + 0.5
    weight = _values(draw, (channels,), scale=0.5) if "weight" in affine else None
    bias = _values(draw, (channels,)) if affine in ("weight and bias", "bias") else None
    torch_mean, torch_var = torch.tensor(mean), torch.tensor(var)
    tensors = [torch.tensor(x, requires_grad=True)]
    for array in (weight, bias):
        tensors.append(None if array is None else torch.tensor(array, requires_grad=True))
    ctx = F.Context()
    running = dev.put(mean), dev.put(var)  # updated in place by a training call
    got = dev.host(F.batch_norm(dev.put(x), *running, None if weight is None else dev.put(weight),
                                None if bias is None else dev.put(bias), training, momentum, eps, ctx=ctx, **dev.call))
    ours_mean, ours_var = dev.host(running[0]), dev.host(running[1])
    expected = TF.batch_norm(tensors[0], torch_mean, torch_var, tensors[1], tensors[2], training, momentum, eps)
    # Bounds from the magnitudes of the terms, which cancel: the statistics are sums of `count` inexact terms
    # (mean, the squared deviations), invstd adds a few roundings, and each gradient is such a sum again. On the
    # CPU (3 runs of 500 random draws) the largest error was 0.16 (count + 8) eps of its terms (the output's;
    # the gradients' 0.06); 8 of them leaves 50x for the GPU's other summation order, and is far inside what a
    # wrong form (momentum, eps, affine, mode) would move.
    count = math.prod(dims) // channels
    slack = 8 * (count + 8) * EPS
    per_channel = (1, channels, 1, 1)
    center = x.mean(axis=(0, 2, 3)) if training else mean
    invstd = 1 / np.sqrt((x.var(axis=(0, 2, 3)) if training else var) + eps)
    w = np.ones(channels) if weight is None else np.abs(weight)
    b = np.zeros(channels) if bias is None else np.abs(bias)
    xhat = (np.abs(x) + np.abs(center).reshape(per_channel)) * invstd.reshape(per_channel)
    _close(got, expected.detach().numpy(), slack * (xhat * w.reshape(per_channel) + b.reshape(per_channel)), "output")
    _close(ours_mean, torch_mean.numpy(), slack * (np.abs(center) + np.abs(mean)), "running_mean")
    _close(ours_var, torch_var.numpy(), slack * (np.abs(x).max() ** 2 + np.abs(mean).max() ** 2 + var), "running_var")
    grad = _values(draw, dims, scale=0.5)
    expected.backward(torch.from_numpy(grad))
    grads = [None if g is None else dev.host(g) for g in F.batch_norm_backward(dev.put(grad), ctx, **dev.call)]
    terms = np.abs(grad) * (1 + xhat) ** 2  # g, mean(g) and xhat mean(g xhat)
    bounds = {"input": slack * (w * invstd).reshape(per_channel) * terms.max(axis=(0, 2, 3), keepdims=True),
              "weight": slack * (np.abs(grad) * xhat).sum(axis=(0, 2, 3)), "bias": 0.0}
    for name, got_grad, tensor in zip(("input", "weight", "bias"), grads, tensors):
        if tensor is None:
            assert got_grad is None, f"{name}: no gradient without the tensor"
        else:
            _close(got_grad, tensor.grad.numpy(), bounds[name], f"{name} gradient")
