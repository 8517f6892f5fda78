"""Property tests: every op on shapes, attrs and values that hypothesis draws within the op's
limits, against PyTorch in float64 on the CPU, and the GPU against the CPU.

Each op has a strategy (`<op>_samples`), a runner that calls the four-function API on one
device (`<op>_run`) and a reference (`<op>_expect`): PyTorch in float64 and, per tensor, the
rule it is compared by (exact, a bound derived from the operation, or n ulps), with the reason
beside it. tests/properties.py says how each kind of bound is derived.

Profiles: "ci" (default: few examples, derandomized, for CI) and "device" (many more), chosen by
the environment variable HYPOTHESIS_PROFILE; see docs/conformance.md.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels import (
    Activation,
    BatchMatmulAttrs,
    BatchNormAttrs,
    BatchNormMode,
    BinaryOpType,
    ConcatAttrs,
    Conv2DAttrs,
    ElementBinaryAttrs,
    ElementUnaryAttrs,
    GradientReductionAttrs,
    Pool2DAttrs,
    PoolOp,
    ReshapeAttrs,
    SoftmaxAttrs,
    SplitAttrs,
    TensorShape,
    TopKAttrs,
    TransposeAttrs,
    UnaryOpType,
    UpsampleAttrs,
    UpsampleMode,
    batch_matmul,
    batch_norm,
    concat,
    conv_2d,
    element_binary,
    element_unary,
    gradient_reduction,
    pool_2d,
    reshape,
    softmax,
    split,
    top_k,
    transpose,
    upsample,
)

from .properties import (
    FLOATS,
    MOVABLE,
    Expect,
    Sample,
    activation_chain,
    check,
    check_gpu,
    draw_values,
    eps,
    exact_sum,
    grads_of,
    reduce_to,
    seeded,
    small_dims,
    sum_bound,
    torch_tensor,
)

torch = pytest.importorskip("torch")
F = torch.nn.functional

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=60, derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("device", max_examples=1000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ACTIVATIONS = st.sampled_from([None, None, *Activation])


def _dtype(draw, choices=FLOATS):
    return np.dtype(draw(st.sampled_from(choices)))


def _shape(array):
    return TensorShape(array.shape, array.dtype)


def _axis(draw, rank):
    """Any axis of `rank`, negative ones too."""
    return draw(st.integers(-rank, rank - 1))


def _grad_values(rng, dims, dtype, dyadic):
    """Upstream gradients: halves in [-4, 4] or normal floats, never all ones."""
    return draw_values(rng, dims, dtype, dyadic, step=0.5, limit=8)


def linear_expect(s, program, operands, grad_names, output_grad, terms, *, quantum=None, activation=None,
                  same_point=False, exact_forward=False, gpu_exact=False, roundings=2):
    """Expected output and gradients of `program`, linear in each operand (conv, matmul, pooling,
    bilinear, sums), followed by an optional activation.

    The bound of each tensor is sum_bound over `terms[name]` terms, with sum(|terms|) from the program
    on absolute operands and an absolute upstream gradient (`same_point`: on the same operands, for max
    pooling, whose routing depends on them); exact where the values are dyadic and the sums stay exact
    (`quantum`: the grid every product lies on), or `exact_forward` (a selection).
    """
    dtype = s.dtype
    names = [n for n, v in operands.items() if v is not None]
    given = {n: torch_tensor(operands[n], True) for n in names}
    absolute = {n: torch_tensor(operands[n] if same_point else np.abs(operands[n]), True) for n in names}
    pre = program(**given)
    pre_abs = program(**absolute)
    abs_sum = np.abs(pre_abs.detach().numpy())
    exact = exact_forward or (quantum is not None and exact_sum(abs_sum, dtype, s.dyadic, quantum))
    pre_bound = None if exact else sum_bound(abs_sum, terms["output"], dtype, roundings)
    out, out_bound, grad_pre, grad_pre_bound = activation_chain(activation, pre, pre_bound, output_grad, dtype)
    result = {"output": Expect(out, out_bound, gpu_exact=gpu_exact)}
    refs = grads_of(pre, [given[n] for n in names], grad_pre)
    sums = grads_of(pre_abs, [absolute[n] for n in names], np.abs(grad_pre))
    carried = (grads_of(pre_abs, [absolute[n] for n in names], grad_pre_bound) if grad_pre_bound is not None
               else [0.0] * len(names))
    for name, ref, abs_sum, carry in zip(names, refs, sums, carried):
        grad_name = grad_names[name]
        abs_sum = np.abs(abs_sum)
        exact = grad_pre_bound is None and quantum is not None and exact_sum(abs_sum, dtype, s.dyadic, quantum)
        if same_point and grad_pre_bound is None and s.dyadic:
            exact = exact_sum(abs_sum, dtype, True, 0.5)  # max pooling adds upstream halves
        bound = None if exact else sum_bound(abs_sum, terms[grad_name], dtype, roundings) + \
            np.abs(carry) * (1 + terms[grad_name] * eps(dtype))
        result[grad_name] = Expect(ref, bound, gpu_exact=gpu_exact)
    return result


# =========================================================================== conv_2d


@st.composite
def conv_2d_samples(draw):
    dtype, dyadic, rng = _dtype(draw), draw(st.booleans()), seeded(draw)
    if draw(st.booleans()):  # depthwise, with a channel multiplier of 1 or 2
        channels = draw(st.integers(1, 5))
        groups, out_channels = channels, channels * draw(st.integers(1, 2))
    else:
        groups = draw(st.integers(1, 3))
        channels = groups * draw(st.integers(0 if groups == 1 else 1, 3))  # 0 channels: an empty sum
        out_channels = groups * draw(st.integers(1, 3))
    kernel, stride, dilation, padding, size = [], [], [], [], []
    for _ in range(2):
        k, d = draw(st.integers(1, 4)), draw(st.integers(1, 3))
        p = draw(st.integers(0, 3))
        extent = d * (k - 1) + 1
        kernel.append(k), dilation.append(d), padding.append(p), stride.append(draw(st.integers(1, 3)))
        size.append(draw(st.integers(max(0, extent - 2 * p), extent + 6)))
    if draw(st.integers(0, 7)) == 0:  # now and then an output row of 64 or more: the CPU's strided im2col
        size[1] += conv_2d.cpu.WIDE_ROWS_BELOW * stride[1]
    attrs = Conv2DAttrs(out_channels, kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1],
                        dilation[0], dilation[1], groups, draw(st.booleans()), draw(ACTIVATIONS))
    input_dims = (draw(st.integers(0, 3)), channels, size[0], size[1])
    output_dims = conv_2d.output_dims(attrs, input_dims)
    inputs = {"input": draw_values(rng, input_dims, dtype, dyadic),
              "filter": draw_values(rng, conv_2d.filter_dims(attrs, channels), dtype, dyadic)}
    inputs["bias"] = draw_values(rng, (out_channels,), dtype, dyadic) if attrs.use_bias else None
    inputs["output_grad"] = _grad_values(rng, output_dims, dtype, dyadic)
    return Sample("conv_2d", attrs, inputs, dtype, dyadic)


def conv_2d_run(dev, s):
    a, x, w, b, g = s.attrs, *(s.inputs[n] for n in ("input", "filter", "bias", "output_grad"))
    state = conv_2d.init_kernel(dev.handle, a, _shape(x), _shape(g))
    x_, w_, b_ = dev.put(x), dev.put(w), None if b is None else dev.put(b)
    out = dev.poison(g.shape, s.dtype)
    conv_2d.forward_kernel(dev.stream, dev.handle, state, a, x_, w_, b_, out)
    grads = {"input_grad": dev.poison(x.shape, s.dtype), "filter_grad": dev.poison(w.shape, s.dtype),
             "bias_grad": None if b is None else dev.poison(b.shape, s.dtype)}
    conv_2d.backward_kernel(dev.stream, dev.handle, state, a, out, dev.put(g), x_, grads["input_grad"], w_,
                            grads["filter_grad"], grads["bias_grad"])
    result = {"output": dev.host(out), **{k: dev.host(v) for k, v in grads.items() if v is not None}}
    conv_2d.cleanup_kernel(dev.handle, state)
    return result


def conv_2d_expect(s):
    a, x, g = s.attrs, s.inputs["input"], s.inputs["output_grad"]
    n, _, out_h, out_w = g.shape

    def program(input, filter, bias=None):
        if x.shape[1] == 0:  # no input channels: PyTorch returns 0 output channels; the sum is empty
            empty = torch.zeros(g.shape, dtype=torch.float64) + (input.sum() + filter.sum()) * 0
            return empty if bias is None else empty + bias.reshape(1, -1, 1, 1)
        # Padding made explicit: PyTorch refuses an H or W of 0 even where the padding makes windows.
        padded = F.pad(input, (a.padding_w, a.padding_w, a.padding_h, a.padding_h))
        return F.conv2d(padded, filter, bias, stride=(a.stride_h, a.stride_w), dilation=(a.dilation_h, a.dilation_w),
                        groups=a.groups)

    # Terms of each sum: the forward sums C/groups * kh * kw products (and the bias), the input gradient
    # at most O/groups * kh * kw (fewer with stride), the filter and bias gradients N * Ho * Wo.
    taps = a.kernel_h * a.kernel_w
    terms = {"output": x.shape[1] // a.groups * taps + 1, "input_grad": a.out_channels // a.groups * taps,
             "filter_grad": n * out_h * out_w, "bias_grad": n * out_h * out_w}
    # Dyadic inputs and filters are quarters, gradients halves: every product lies on the 1/16 grid.
    return linear_expect(s, program, {"input": x, "filter": s.inputs["filter"], "bias": s.inputs["bias"]},
                         {"input": "input_grad", "filter": "filter_grad", "bias": "bias_grad"}, g, terms,
                         quantum=1 / 16, activation=a.activation)


# =========================================================================== batch_matmul


@st.composite
def batch_matmul_samples(draw):
    dtype, dyadic, rng = _dtype(draw), draw(st.booleans()), seeded(draw)
    batch = small_dims(draw, draw(st.integers(1, 3)), 0, 3)
    m, k, n = (draw(st.integers(0, 7)) for _ in range(3))
    inputs = {"lhs": draw_values(rng, (*batch, m, k), dtype, dyadic),
              "rhs": draw_values(rng, (*batch, k, n), dtype, dyadic),
              "output_grad": _grad_values(rng, (*batch, m, n), dtype, dyadic)}
    return Sample("batch_matmul", BatchMatmulAttrs(), inputs, dtype, dyadic)


def _binary_run(module, dev, s):
    a, lhs, rhs, g = s.attrs, s.inputs["lhs"], s.inputs["rhs"], s.inputs["output_grad"]
    state = module.init_kernel(dev.handle, a, _shape(lhs), _shape(rhs), _shape(g))
    lhs_, rhs_ = dev.put(lhs), dev.put(rhs)
    out = dev.poison(g.shape, s.dtype)
    module.forward_kernel(dev.stream, dev.handle, state, a, lhs_, rhs_, out)
    lhs_grad, rhs_grad = dev.poison(lhs.shape, s.dtype), dev.poison(rhs.shape, s.dtype)
    module.backward_kernel(dev.stream, dev.handle, state, a, out, dev.put(g), lhs_, lhs_grad, rhs_, rhs_grad)
    result = {"output": dev.host(out), "lhs_grad": dev.host(lhs_grad), "rhs_grad": dev.host(rhs_grad)}
    module.cleanup_kernel(dev.handle, state)
    return result


def batch_matmul_run(dev, s):
    return _binary_run(batch_matmul, dev, s)


def batch_matmul_expect(s):
    lhs, rhs = s.inputs["lhs"], s.inputs["rhs"]
    m, k = lhs.shape[-2:]
    n = rhs.shape[-1]
    # K products a forward element, N an lhs gradient element, M an rhs gradient element.
    return linear_expect(s, lambda lhs, rhs: torch.matmul(lhs, rhs), {"lhs": lhs, "rhs": rhs},
                         {"lhs": "lhs_grad", "rhs": "rhs_grad"}, s.inputs["output_grad"],
                         {"output": k, "lhs_grad": n, "rhs_grad": m}, quantum=1 / 16)


# =========================================================================== pool_2d


@st.composite
def pool_2d_samples(draw):
    dtype, dyadic, rng = _dtype(draw), draw(st.booleans()), seeded(draw)
    pool_type = draw(st.sampled_from(PoolOp))
    kernel = [draw(st.integers(1, 5)) for _ in range(2)]
    padding = [draw(st.integers(0, k // 2)) for k in kernel]  # at most half the kernel, as in PyTorch
    stride = [draw(st.integers(1, 3)) for _ in range(2)]
    size = [draw(st.integers(max(1, k - 2 * p), k + 7)) for k, p in zip(kernel, padding)]  # H, W of 0: no window
    activation = draw(ACTIVATIONS)
    attrs = Pool2DAttrs(kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1], pool_type,
                        draw(st.booleans()) if pool_type is PoolOp.AVG else True, activation)
    dims = (draw(st.integers(0, 3)), draw(st.integers(0, 3)), *size)
    # NaN, infinities and signed zeros in max pooling: PyTorch's NaN rule (docs/ops.md); ties are
    # frequent among dyadic values (the first maximum wins).
    specials = 0.1 if pool_type is PoolOp.MAX and activation in (None, Activation.RELU) and dyadic else 0.0
    inputs = {"input": draw_values(rng, dims, dtype, dyadic, limit=4, specials=specials)}
    inputs["output_grad"] = _grad_values(rng, pool_2d.output_dims(attrs, dims), dtype, dyadic)
    return Sample("pool_2d", attrs, inputs, dtype, dyadic)


def _unary_run(module, dev, s, backward_input=True, backward_output=True):
    a, x, g = s.attrs, s.inputs["input"], s.inputs["output_grad"]
    state = module.init_kernel(dev.handle, a, _shape(x), _shape(g))
    x_, out = dev.put(x), dev.poison(g.shape, g.dtype)
    module.forward_kernel(dev.stream, dev.handle, state, a, x_, out)
    result = {"output": dev.host(out)}
    if s.extra.get("backward", True):
        input_grad = dev.poison(x.shape, g.dtype)
        module.backward_kernel(dev.stream, dev.handle, state, a, out if backward_output else None, dev.put(g),
                               x_ if backward_input else None, input_grad)
        result["input_grad"] = dev.host(input_grad)
    module.cleanup_kernel(dev.handle, state)
    return result


def pool_2d_run(dev, s):
    return _unary_run(pool_2d, dev, s, backward_input=False, backward_output=False)  # "may be None"


def _empty_expect(s):
    """Where the input is empty so is every tensor (PyTorch refuses some of these shapes)."""
    result = {"output": Expect(np.zeros(s.inputs["output_grad"].shape, dtype=np.float64))}
    if s.extra.get("backward", True):
        result["input_grad"] = Expect(np.zeros(s.inputs["input"].shape, dtype=np.float64))
    return {k: Expect(v.ref.astype(s.dtype)) if s.dtype.kind != "f" else v for k, v in result.items()}


def pool_2d_expect(s):
    a, x = s.attrs, s.inputs["input"]
    if x.size == 0:
        return _empty_expect(s)
    # Both devices pool in the same order; an activation other than relu calls libm on the CPU and
    # CUDA's math on the GPU, which differ by an ulp or two.
    same_bits = a.activation in (None, Activation.RELU)
    kernel, stride, padding = (a.kernel_h, a.kernel_w), (a.stride_h, a.stride_w), (a.padding_h, a.padding_w)
    overlap = -(-a.kernel_h // a.stride_h) * -(-a.kernel_w // a.stride_w)  # windows that cover one element
    if a.pool_type is PoolOp.MAX:
        def program(input):
            return F.max_pool2d(input, kernel, stride, padding)
        # The forward selects (exact); the gradient adds upstream values of the windows whose maximum an
        # element is: at most `overlap` terms.
        return linear_expect(s, program, {"input": x}, {"input": "input_grad"}, s.inputs["output_grad"],
                             {"output": 1, "input_grad": overlap}, activation=a.activation, same_point=True,
                             exact_forward=True, gpu_exact=same_bits)

    def program(input):
        return F.avg_pool2d(input, kernel, stride, padding, count_include_pad=a.count_include_pad)
    # A window sum of kh * kw terms and a division; the gradient adds `overlap` upstream values, each
    # divided. The devices use the same order (a gather), so they agree bit for bit.
    return linear_expect(s, program, {"input": x}, {"input": "input_grad"}, s.inputs["output_grad"],
                         {"output": a.kernel_h * a.kernel_w, "input_grad": overlap}, activation=a.activation,
                         gpu_exact=same_bits)


# =========================================================================== upsample


@st.composite
def upsample_samples(draw):
    mode = draw(st.sampled_from(UpsampleMode))
    if mode is UpsampleMode.NEAREST:
        dtype = _dtype(draw, MOVABLE)
    else:
        dtype = _dtype(draw)
    dyadic, rng = draw(st.booleans()), seeded(draw)
    attrs = UpsampleAttrs(draw(st.integers(2, 4)), mode)
    dims = small_dims(draw, 4, 0, 4)
    # NEAREST's backward sums: float and integer dtypes only (docs/ops.md).
    backward = dtype.kind in "fiu" and dtype != np.float16
    inputs = {"input": draw_values(rng, dims, dtype, dyadic),
              "output_grad": _grad_values(rng, upsample.output_dims(attrs, dims), dtype, dyadic)}
    return Sample("upsample", attrs, inputs, dtype, dyadic, {"backward": backward})


def upsample_run(dev, s):
    return _unary_run(upsample, dev, s, backward_input=False, backward_output=False)


def upsample_expect(s):
    a, x, g = s.attrs, s.inputs["input"], s.inputs["output_grad"]
    scale = a.scale_factor
    if x.size == 0:
        return _empty_expect(s)
    if a.mode is UpsampleMode.NEAREST:
        # A copy forward; backward sums the s * s copies of each element (exact for dyadic values and
        # small integers; a sum of s * s terms otherwise). Both devices gather in one order: bit for bit.
        def program(input):
            return F.interpolate(input, scale_factor=scale, mode="nearest")

        if x.dtype.kind != "f":
            out = program(torch_tensor(x)).numpy()
            result = {"output": Expect(out.astype(x.dtype))}
            if s.extra["backward"]:
                summed = g.astype(np.int64).reshape(*x.shape[:2], x.shape[2], scale, x.shape[3], scale).sum(axis=(3, 5))
                result["input_grad"] = Expect(summed.astype(x.dtype))
            return result
        result = linear_expect(s, program, {"input": x}, {"input": "input_grad"}, g,
                               {"output": 0, "input_grad": scale * scale}, quantum=1 / 2, exact_forward=True,
                               gpu_exact=True)
        if not s.extra["backward"]:
            del result["input_grad"]
        return result
    # BILINEAR: each output element is 4 taps with weights rounded once (docs/ops.md: that rounding is
    # ours, not PyTorch's, which computes them in the dtype too): 4 products of a rounded weight,
    # summed, 4 + 2 roundings. Backward gathers at most (2 s)^2 such products. Same code order on
    # both devices (no FMA contraction on the GPU): bit for bit.
    def program(input):
        return F.interpolate(input, scale_factor=scale, mode="bilinear", align_corners=False)

    return linear_expect(s, program, {"input": x}, {"input": "input_grad"}, g,
                         {"output": 4 + 2, "input_grad": 4 * scale * scale + 2}, gpu_exact=True)


# =========================================================================== gradient_reduction


@st.composite
def gradient_reduction_samples(draw):
    dtype = _dtype(draw, FLOATS + (np.int8, np.int32, np.int64, np.uint8, np.uint16))
    dyadic, rng = draw(st.booleans()), seeded(draw)
    dims = small_dims(draw, draw(st.integers(0, 4)), 0, 4)
    count = draw(st.integers(1, 5))
    inputs = {"inputs": [draw_values(rng, dims, dtype, dyadic) for _ in range(count)],
              "output_grad": _grad_values(rng, dims, dtype, dyadic)}
    needed = [draw(st.booleans()) for _ in range(count)]
    return Sample("gradient_reduction", GradientReductionAttrs(), inputs, dtype, dyadic, {"needed": needed})


def _list_run(module, dev, s, forward_list):
    """concat and gradient_reduction (a list in, one out) or split (one in, a list out)."""
    a, needed = s.attrs, s.extra["needed"]
    if forward_list:
        g = s.inputs["output_grad"]
        xs = s.inputs["inputs"]
        state = module.init_kernel(dev.handle, a, [_shape(x) for x in xs], _shape(g))
        out = dev.poison(g.shape, g.dtype)
        module.forward_kernel(dev.stream, dev.handle, state, a, [dev.put(x) for x in xs], out)
        grads = [dev.poison(x.shape, x.dtype) if keep else None for x, keep in zip(xs, needed)]
        module.backward_kernel(dev.stream, dev.handle, state, a, None, dev.put(g), None, grads)
        result = {"output": dev.host(out)}
        result.update({f"input_grads.{i}": dev.host(v) for i, v in enumerate(grads) if v is not None})
    else:
        x, gs = s.inputs["input"], s.inputs["output_grads"]
        state = module.init_kernel(dev.handle, a, _shape(x), [_shape(v) for v in gs])
        outs = [dev.poison(v.shape, v.dtype) for v in gs]
        module.forward_kernel(dev.stream, dev.handle, state, a, dev.put(x), outs)
        input_grad = dev.poison(x.shape, x.dtype)
        module.backward_kernel(dev.stream, dev.handle, state, a, None, [dev.put(v) for v in gs], None, input_grad)
        result = {f"outputs.{i}": dev.host(v) for i, v in enumerate(outs)}
        result["input_grad"] = dev.host(input_grad)
    module.cleanup_kernel(dev.handle, state)
    return result


def gradient_reduction_run(dev, s):
    return _list_run(gradient_reduction, dev, s, True)


def gradient_reduction_expect(s):
    xs, g = s.inputs["inputs"], s.inputs["output_grad"]
    grads = {f"input_grads.{i}": Expect(g.astype(np.float64) if g.dtype.kind == "f" else g)
             for i, keep in enumerate(s.extra["needed"]) if keep}  # copies: exact
    if s.dtype.kind != "f":
        # Small integers: no wrap-around, exact.
        return {"output": Expect(np.sum(np.stack(xs).astype(np.int64), axis=0).astype(s.dtype)), **grads}
    total = torch_tensor(xs[0])
    for x in xs[1:]:
        total = total + torch_tensor(x)  # left to right, as the kernels
    abs_sum = np.sum(np.abs(np.stack(xs).astype(np.float64)), axis=0)
    # len(xs) - 1 additions, left to right on both devices: bit for bit; exact for dyadic quarters.
    exact = exact_sum(abs_sum, s.dtype, s.dyadic, 1 / 4)
    bound = None if exact else sum_bound(abs_sum, len(xs) - 1, s.dtype, 1)
    return {"output": Expect(total.numpy(), bound, gpu_exact=True), **grads}


# =========================================================================== concat and split


@st.composite
def concat_samples(draw):
    dtype, rng = _dtype(draw, MOVABLE), seeded(draw)
    rank = draw(st.integers(1, 5))
    dims = list(small_dims(draw, rank, 0, 4))
    axis = _axis(draw, rank)
    count = draw(st.integers(2, 5))
    pieces = []
    for _ in range(count):
        dims[axis] = draw(st.integers(0, 4))
        pieces.append(draw_values(rng, tuple(dims), dtype, True))
    dims[axis] = sum(p.shape[axis] for p in pieces)
    inputs = {"inputs": pieces, "output_grad": _grad_values(rng, tuple(dims), dtype, True)}
    needed = [draw(st.booleans()) for _ in range(count)]
    return Sample("concat", ConcatAttrs(axis, count), inputs, dtype, True, {"needed": needed})


def concat_run(dev, s):
    return _list_run(concat, dev, s, True)


def _exact(array, dtype):
    """An exact expectation: float64 results of data movement cast back (small values: exact)."""
    return Expect(array if np.dtype(dtype).kind == "f" else array.astype(dtype))


def concat_expect(s):
    a, xs, g = s.attrs, s.inputs["inputs"], s.inputs["output_grad"]
    given = [torch_tensor(x, True) for x in xs]
    out = torch.cat(given, dim=a.axis)
    grads = grads_of(out, given, g.astype(np.float64))
    # Data movement: exact on every dtype and both devices.
    result = {"output": _exact(out.detach().numpy(), s.dtype)}
    result.update({f"input_grads.{i}": _exact(v, s.dtype) for i, v in enumerate(grads) if s.extra["needed"][i]})
    return result


@st.composite
def split_samples(draw):
    dtype, rng = _dtype(draw, MOVABLE), seeded(draw)
    rank = draw(st.integers(1, 5))
    dims = list(small_dims(draw, rank, 0, 4))
    axis = _axis(draw, rank)
    splits = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=5)))  # unequal, zeros too
    dims[axis] = sum(splits)
    grads = []
    for size in splits:
        piece = list(dims)
        piece[axis] = size
        grads.append(_grad_values(rng, tuple(piece), dtype, True))
    inputs = {"input": draw_values(rng, tuple(dims), dtype, True), "output_grads": grads}
    return Sample("split", SplitAttrs(splits, axis), inputs, dtype, True, {"needed": []})


def split_run(dev, s):
    return _list_run(split, dev, s, False)


def split_expect(s):
    a, x = s.attrs, s.inputs["input"]
    given = torch_tensor(x, True)
    outs = torch.split(given, list(a.splits), dim=a.axis)
    (grad,) = torch.autograd.grad(outs, [given], [torch_tensor(g) for g in s.inputs["output_grads"]])
    result = {f"outputs.{i}": _exact(o.detach().numpy(), s.dtype) for i, o in enumerate(outs)}
    result["input_grad"] = _exact(grad.numpy(), s.dtype)
    return result


# =========================================================================== reshape and transpose


def _factors(number):
    found, p = [], 2
    while p * p <= number:
        while number % p == 0:
            found.append(p)
            number //= p
        p += 1
    return found + ([number] if number > 1 else [])


@st.composite
def reshape_samples(draw):
    dtype, rng = _dtype(draw, MOVABLE), seeded(draw)
    dims = small_dims(draw, draw(st.integers(0, 5)), 0, 6)
    count = int(np.prod(dims, dtype=np.int64))
    if count == 0:
        shape = list(small_dims(draw, draw(st.integers(0, 4)), 0, 5)) + [0]
    else:
        factors = draw(st.permutations(_factors(count)))
        rank = draw(st.integers(1 if factors else 0, max(1, len(factors)) + 1))
        shape = [1] * rank
        for f in factors:
            shape[draw(st.integers(0, rank - 1))] *= f
        if shape and draw(st.booleans()):
            shape[draw(st.integers(0, len(shape) - 1))] = -1  # inferred
    shape = draw(st.permutations(shape))
    inputs = {"input": draw_values(rng, dims, dtype, True)}
    out_dims = reshape.output_dims(ReshapeAttrs(tuple(shape)), dims)
    inputs["output_grad"] = _grad_values(rng, out_dims, dtype, True)
    return Sample("reshape", ReshapeAttrs(tuple(shape)), inputs, dtype, True)


def reshape_run(dev, s):
    return _unary_run(reshape, dev, s)


def reshape_expect(s):
    x, g = s.inputs["input"], s.inputs["output_grad"]
    given = torch_tensor(x, True)
    out = torch.reshape(given, s.attrs.shape)
    (grad,) = grads_of(out, [given], g)
    return {"output": _exact(out.detach().numpy(), s.dtype), "input_grad": _exact(grad, s.dtype)}


@st.composite
def transpose_samples(draw):
    dtype, rng = _dtype(draw, MOVABLE), seeded(draw)
    rank = draw(st.integers(1, 5))
    dims = small_dims(draw, rank, 0, 5)
    permutation = tuple(draw(st.permutations(range(rank))))
    inputs = {"input": draw_values(rng, dims, dtype, True),
              "output_grad": _grad_values(rng, tuple(dims[p] for p in permutation), dtype, True)}
    return Sample("transpose", TransposeAttrs(permutation), inputs, dtype, True)


def transpose_run(dev, s):
    return _unary_run(transpose, dev, s)


def transpose_expect(s):
    given = torch_tensor(s.inputs["input"], True)
    out = given.permute(*s.attrs.permutation)
    (grad,) = grads_of(out, [given], s.inputs["output_grad"])
    return {"output": _exact(out.detach().numpy(), s.dtype), "input_grad": _exact(grad, s.dtype)}


# =========================================================================== top_k


@st.composite
def top_k_samples(draw):
    dtype, rng = _dtype(draw, FLOATS + (np.float16,)), seeded(draw)
    rank = draw(st.integers(1, 4))
    dims = small_dims(draw, rank - 1, 0, 4) + (draw(st.integers(1, 40)),)
    k = draw(st.integers(1, dims[-1]))
    # Few distinct dyadic values (ties everywhere), with NaN, +-inf and +-0 sprinkled in.
    inputs = {"input": draw_values(rng, dims, dtype, True, limit=3, specials=0.2),
              "values_grad": _grad_values(rng, dims[:-1] + (k,), dtype, True)}
    return Sample("top_k", TopKAttrs(k), inputs, dtype, True)


def top_k_run(dev, s):
    a, x, g = s.attrs, s.inputs["input"], s.inputs["values_grad"]
    values, indices = dev.poison(g.shape, x.dtype), dev.poison(g.shape, np.int64)
    state = top_k.init_kernel(dev.handle, a, _shape(x), TensorShape(g.shape, x.dtype), TensorShape(g.shape, np.int64))
    top_k.forward_kernel(dev.stream, dev.handle, state, a, dev.put(x), values, indices)
    input_grad = dev.poison(x.shape, x.dtype)
    top_k.backward_kernel(dev.stream, dev.handle, state, a, None, dev.put(g), indices, None, input_grad)
    result = {"values": dev.host(values), "indices": dev.host(indices), "input_grad": dev.host(input_grad)}
    top_k.cleanup_kernel(dev.handle, state)
    return result


def top_k_expect(s):
    """torch.sort(descending=True, stable=True)'s first k: a selection, exact on every dtype and both devices."""
    given = torch_tensor(s.inputs["input"], True)
    values, indices = torch.sort(given, dim=-1, descending=True, stable=True)
    k = s.attrs.k
    values, indices = values[..., :k], indices[..., :k]
    (grad,) = grads_of(values, [given], s.inputs["values_grad"])
    return {"values": _exact(values.detach().numpy(), s.dtype), "indices": Expect(indices.numpy()),
            "input_grad": _exact(grad, s.dtype)}


# =========================================================================== softmax


@st.composite
def softmax_samples(draw):
    dtype, dyadic, rng = _dtype(draw), draw(st.booleans()), seeded(draw)
    rank = draw(st.integers(1, 5))
    dims = small_dims(draw, rank, 0, 6)
    inputs = {"input": draw_values(rng, dims, dtype, dyadic, scale=3.0),
              "output_grad": _grad_values(rng, dims, dtype, dyadic)}
    return Sample("softmax", SoftmaxAttrs(_axis(draw, rank)), inputs, dtype, dyadic)


def softmax_run(dev, s):
    return _unary_run(softmax, dev, s, backward_input=False)


def softmax_expect(s):
    x, g, dim = s.inputs["input"], s.inputs["output_grad"], s.attrs.dim
    given = torch_tensor(x, True)
    out = torch.softmax(given, dim)
    (grad,) = grads_of(out, [given], g)
    y = out.detach().numpy()
    n = x.shape[dim]
    e = eps(s.dtype)
    # Each y = exp(x - max) / sum: x - max rounds once (relative error |x - max| eps in exp's result),
    # exp is within 2 ulps, the sum of n positive terms adds n eps, the division one: a relative bound
    # of (n + 4 + max |x - max|) eps, taken over the row.
    spread = np.max(x.astype(np.float64), axis=dim, keepdims=True, initial=-np.inf) - x
    spread = np.max(np.where(np.isfinite(spread), spread, 0.0), axis=dim, keepdims=True, initial=0.0)
    relative = (n + 4 + spread) * e
    # input_grad = y (g - sum(g y)): a sum of n products and two more roundings on values each within
    # `relative` of their exact value.
    weighted = np.sum(np.abs(g) * y, axis=dim, keepdims=True)
    grad_bound = (2 * relative + (n + 3) * e) * y * (np.abs(g) + weighted)
    return {"output": Expect(y, relative * y), "input_grad": Expect(grad, grad_bound)}


# =========================================================================== element_unary

# Op types with a scalar, and how each draws it.
_SCALARS = {
    UnaryOpType.ELU: st.sampled_from([None, 0.5, 1.0, 1.75, 0.3]),
    UnaryOpType.SILU: st.sampled_from([None, 1.0, 1.5, 0.7, 2.0]),
    UnaryOpType.POW: st.sampled_from([2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 0.0, 1.0, 1.5, -1.25, 2.5]),
    UnaryOpType.SCALAR_MULTIPLY: st.sampled_from([0.25, -3.0, 0.1, 1 / 32 ** 0.5, 0.0]),
    UnaryOpType.SCALAR_ADD: st.sampled_from([0.5, -2.0, 0.1, 3.3]),
    UnaryOpType.SCALAR_SUB: st.sampled_from([0.5, -2.0, 0.1, 3.3]),
    UnaryOpType.SCALAR_TRUE_DIV: st.sampled_from([2.0, -0.5, 3.0, 0.1, 7.0]),
}


@st.composite
def element_unary_samples(draw):
    dtype, dyadic, rng = _dtype(draw), draw(st.booleans()), seeded(draw)
    op_type = draw(st.sampled_from(UnaryOpType))
    scalar = draw(_SCALARS[op_type]) if op_type in _SCALARS else None
    dims = small_dims(draw, draw(st.integers(0, 4)), 0, 5)
    # Domains: rsqrt and non-integer powers need positive inputs, negative powers nonzero ones.
    positive = op_type is UnaryOpType.RSQRT or (op_type is UnaryOpType.POW and scalar != int(scalar))
    nonzero = op_type is UnaryOpType.POW and scalar < 1
    inputs = {"input": draw_values(rng, dims, dtype, dyadic, scale=2.0, positive=positive, nonzero=nonzero,
                                   specials=0.1 if dyadic else 0.0),  # NaN, infinities, signed zeros
              "output_grad": _grad_values(rng, dims, dtype, dyadic)}
    return Sample("element_unary", ElementUnaryAttrs(op_type, scalar), inputs, dtype, dyadic)


def element_unary_run(dev, s):
    return _unary_run(element_unary, dev, s, backward_output=False)


# The forward and gradient of each op type in float64, PyTorch's formulas; c is the scalar rounded to
# the dtype (docs/ops.md: "The scalar is rounded to the tensor's dtype", as PyTorch does).
def _unary_program(op_type, x, c):
    name = op_type.name
    if name == "ELU":
        return F.elu(x, alpha=c)
    if name == "SILU":
        return x * torch.sigmoid(c * x)
    if name == "GELU":
        return F.gelu(x)
    if name == "POW":
        return torch.pow(x, c)
    if name == "RSQRT":
        return torch.rsqrt(x)
    if name == "IDENTITY":
        return x * 1
    if name.startswith("SCALAR_"):
        return {"MULTIPLY": x * c, "ADD": x + c, "SUB": x - c, "TRUE_DIV": x / c}[name[len("SCALAR_"):]]
    return getattr(torch, name.lower())(x)


# One correctly rounded operation (or none) forward and backward: exact against the float64 reference
# rounded once, and the same bits on the GPU. POW 2 is x * x, its gradient (g * 2) * x; POW 0 and 1 are
# constants and copies; RSQRT and POW's other shortcuts (0.5: sqrt, -0.5: 1/sqrt, -1, -2: reciprocals, 3:
# products) are IEEE operations on both devices, so the GPU equals the CPU, but two or three roundings
# away from the reference.
_EXACT_UNARY = {"RELU", "IDENTITY", "SCALAR_MULTIPLY", "SCALAR_ADD", "SCALAR_SUB", "SCALAR_TRUE_DIV"}
_IEEE_POWERS = {2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 0.0, 1.0}
# Transcendental functions, forward: one libm or CUDA call (within 2 ulps) and a product or two: 4 ulps
# of the reference, with compare.py's floor.
_FORWARD_ULPS = 4
# Their gradients cannot be held to ulps: PyTorch's formulas cancel (1 - t^2 near |t| = 1, 1 - s, GELU's
# 1 + erf), so an ulp of t becomes many ulps of 1 - t^2 (in PyTorch's own float32 too). The bound is
# derived instead: the derivative is a few (<= 4) operations on values within 2 ulps each, so its
# absolute error is below _GRADIENT_ROUNDINGS * eps times the magnitudes of its terms (below), and the
# product with the upstream gradient adds one rounding.
_GRADIENT_ROUNDINGS = 8


def _derivative_terms(name, x, c):
    """The magnitude of the terms each derivative is made of, at x (float64)."""
    with np.errstate(all="ignore"):
        if name == "SIGMOID":
            sig = 1 / (1 + np.exp(-x))
            return sig * (1 + sig)  # s * (1 - s): 1 - s is off by an ulp of 1
        if name == "TANH":
            return 1 + np.tanh(x) ** 2  # 1 - t^2
        if name == "ELU":  # dy passes where x <= 0 is false: x > 0 and NaN
            return np.where(x <= 0, abs(c) * np.exp(np.minimum(x, 0)), 1.0)
        if name == "GELU":
            return 1 + np.abs(x) * np.exp(-x * x / 2)  # Phi(x) = (1 + erf) / 2, plus x phi(x)
        if name == "SILU":
            sig = 1 / (1 + np.exp(-c * x))
            return sig * (1 + np.abs(c * x) * (1 + sig))  # s (1 + b x (1 - s))
        if name == "EXP":
            return np.exp(x)
        if name in ("SIN", "COS"):
            return np.ones_like(x)
        if name == "RSQRT":
            return np.abs(x) ** -1.5
        if name == "POW":
            return np.abs(c * np.abs(x) ** (c - 1))
    raise AssertionError(name)


def element_unary_expect(s):
    a, x, g = s.attrs, s.inputs["input"], s.inputs["output_grad"]
    c = None if a.scalar is None else float(s.dtype.type(a.scalar))
    given = torch_tensor(x, True)
    out = _unary_program(a.op_type, given, c)
    (grad,) = grads_of(out, [given], g)
    out = out.detach().numpy()
    name = a.op_type.name
    if name == "ELU":
        # PyTorch's ELU backward is x <= 0 ? dy a exp(x) : dy, so a NaN x passes dy (docs/ops.md), and its
        # scalar loop gives that. Its vectorized loop (torch 2.13, AVX-512: 32 float32 or 16 float64 elements
        # at a time) gives NaN there instead, so its answer for one NaN depends on the tensor's length and on
        # the CPU. The reference takes the formula's value.
        grad = np.where(np.isnan(x), g.astype(np.float64), grad)
    # The GPU equals the CPU where both take the same IEEE operations: RSQRT, and POW where the exponent
    # (forward: p; gradient: p - 1) has a shortcut; elsewhere powf / pow, a libm or CUDA function.
    ieee = name == "RSQRT" or (name == "POW" and c in _IEEE_POWERS)
    ieee_grad = name == "RSQRT" or (name == "POW" and (c == 0 or c - 1 in _IEEE_POWERS))
    if name in _EXACT_UNARY or (name == "POW" and c in (0.0, 1.0, 2.0)):
        return {"output": Expect(out), "input_grad": Expect(grad)}
    terms = np.abs(g.astype(np.float64)) * _derivative_terms(name, x.astype(np.float64), c)
    if name == "GELU":
        # x (1 + erf(x / sqrt 2)) / 2 cancels for negative x: erf's error (2 ulps of 1) becomes up to
        # |x| eps absolute, many ulps of a small result. Derived like the gradients instead.
        forward_bound = _GRADIENT_ROUNDINGS * eps(s.dtype) * (np.abs(out) + np.abs(x.astype(np.float64)))
        return {"output": Expect(out, forward_bound),
                "input_grad": Expect(grad, _GRADIENT_ROUNDINGS * eps(s.dtype) * terms)}
    return {"output": Expect(out, ulps=_FORWARD_ULPS, gpu_exact=ieee),
            "input_grad": Expect(grad, _GRADIENT_ROUNDINGS * eps(s.dtype) * terms, gpu_exact=ieee_grad)}


# =========================================================================== element_binary


@st.composite
def element_binary_samples(draw):
    dtype, dyadic, rng = _dtype(draw), draw(st.booleans()), seeded(draw)
    op_type = draw(st.sampled_from(BinaryOpType))
    out_dims = small_dims(draw, draw(st.integers(0, 4)), 0, 4)
    if out_dims and draw(st.integers(0, 7)) == 0:  # now and then 2**16 elements or more: the CPU's threads
        leading = int(np.prod(out_dims[:-1], dtype=np.int64)) or 1
        out_dims = (*out_dims[:-1], -(-element_binary.cpu._CPU_PARALLEL_MIN // leading) + out_dims[-1])

    def operand():  # right-aligned: a suffix of the output's dims, each kept or 1
        rank = draw(st.integers(0, len(out_dims)))
        return tuple(d if draw(st.booleans()) else 1 for d in out_dims[len(out_dims) - rank:])

    lhs_dims, rhs_dims = operand(), operand()
    specials = 0.1 if op_type in (BinaryOpType.MAX, BinaryOpType.MIN) and dyadic else 0.0
    # Few distinct values for MAX and MIN (ties); nonzero divisors.
    limit = 3 if specials else 16
    inputs = {"lhs": draw_values(rng, lhs_dims, dtype, dyadic, limit=limit, specials=specials),
              "rhs": draw_values(rng, rhs_dims, dtype, dyadic, limit=limit, specials=specials,
                                 nonzero=op_type is BinaryOpType.DIV)}
    inputs["output_grad"] = _grad_values(rng, np.broadcast_shapes(lhs_dims, rhs_dims), dtype, dyadic)
    return Sample("element_binary", ElementBinaryAttrs(op_type), inputs, dtype, dyadic)


def element_binary_run(dev, s):
    return _binary_run(element_binary, dev, s)


_BINARY = {"ADD": torch.add, "SUB": torch.sub, "MUL": torch.mul, "DIV": torch.div, "MAX": torch.maximum,
           "MIN": torch.minimum}
# Roundings inside one gradient term: g, -g, g / 2 are exact; g * rhs, g / rhs one; DIV's rhs term
# -g * ((lhs / rhs) / rhs) three (docs/ops.md).
_TERM_ROUNDINGS = {"ADD": (0, 0), "SUB": (0, 0), "MUL": (1, 1), "DIV": (1, 3), "MAX": (0, 0), "MIN": (0, 0)}


def element_binary_expect(s):
    name = s.attrs.op_type.name
    lhs, rhs, g = s.inputs["lhs"], s.inputs["rhs"], s.inputs["output_grad"]
    out_dims = g.shape
    # Gradient terms per output element: the gradient for operands expanded to the output's dims.
    expanded = [torch_tensor(np.broadcast_to(v, out_dims), True) for v in (lhs, rhs)]
    out = _BINARY[name](*expanded)
    terms = grads_of(out, expanded, g)
    # Forward: one correctly rounded operation or a selection: exact, the same bits on the GPU.
    result = {"output": Expect(out.detach().numpy())}
    for side, operand, term, roundings in zip(("lhs", "rhs"), (lhs, rhs), terms, _TERM_ROUNDINGS[name]):
        ref = reduce_to(term, operand.shape)
        count = int(np.prod(out_dims, dtype=np.int64)) // max(1, operand.size) if operand.size else 0
        abs_sum = reduce_to(np.abs(term), operand.shape)
        # One term (no broadcast) with at most one rounding: correctly rounded, exact. Dyadic terms
        # without a division: exact sums. Otherwise a sum of `count` terms of `roundings` each.
        if count <= 1 and roundings <= 1:
            bound = None
        elif roundings <= 1 and name != "DIV" and exact_sum(abs_sum, s.dtype, s.dyadic, 1 / 8):
            bound = None
        else:
            bound = sum_bound(abs_sum, count, s.dtype, roundings + 2)
        result[f"{side}_grad"] = Expect(ref, bound)
    return result


# =========================================================================== batch_norm

SPATIAL = BatchNormMode.SPATIAL


@st.composite
def batch_norm_samples(draw):
    dtype, dyadic, rng = _dtype(draw), draw(st.booleans()), seeded(draw)
    mode = draw(st.sampled_from(BatchNormMode))
    rank = draw(st.integers(2, 5))
    steps = draw(st.lists(st.booleans(), min_size=1, max_size=3))
    dims = (draw(st.integers(1, 4)), *small_dims(draw, rank - 1, 1, 4))
    counted = dims[0] * (int(np.prod(dims[2:], dtype=np.int64)) if mode is SPATIAL else 1)
    if any(steps) and counted < 2:  # training needs more than one value per statistic
        dims = (dims[0] + 1, *dims[1:])
    momentum = draw(st.sampled_from([None, 0.0, 1.0, 0.1, 0.03, 0.7]))
    eps_ = draw(st.sampled_from([1e-5, 1e-3, 0.1, 0.5]))
    attrs = BatchNormAttrs(draw(st.booleans()), eps_, momentum, mode, draw(ACTIVATIONS))
    stat_dims = (dims[1],) if mode is SPATIAL else dims[1:]
    inputs = {}
    for step in range(len(steps)):
        suffix = "" if step == 0 else f"_step{step + 1}"
        inputs["input" + suffix] = draw_values(rng, dims, dtype, dyadic, scale=2.0)
        inputs["output_grad" + suffix] = _grad_values(rng, dims, dtype, dyadic)
    if attrs.affine:
        inputs["gamma"] = draw_values(rng, stat_dims, dtype, dyadic)
        inputs["beta"] = draw_values(rng, stat_dims, dtype, dyadic)
    return Sample("batch_norm", attrs, inputs, dtype, dyadic, {"steps": steps})


def batch_norm_run(dev, s):
    a, dtype = s.attrs, s.dtype
    x0 = s.inputs["input"]
    state = batch_norm.init_kernel(dev.handle, a, _shape(x0), _shape(x0))
    gamma = dev.put(s.inputs["gamma"]) if a.affine else None
    beta = dev.put(s.inputs["beta"]) if a.affine else None
    result = {}
    for step, training in enumerate(s.extra["steps"]):
        suffix = "" if step == 0 else f"_step{step + 1}"
        x = dev.put(s.inputs["input" + suffix])
        out = dev.poison(x0.shape, dtype)
        batch_norm.forward_kernel(dev.stream, dev.handle, state, a, x, gamma, beta, out, training=training)
        input_grad = dev.poison(x0.shape, dtype)
        gamma_grad = dev.poison(s.inputs["gamma"].shape, dtype) if a.affine else None
        beta_grad = dev.poison(s.inputs["beta"].shape, dtype) if a.affine else None
        batch_norm.backward_kernel(dev.stream, dev.handle, state, a, None, dev.put(s.inputs["output_grad" + suffix]),
                                   x, input_grad, gamma, None, gamma_grad, beta_grad)
        result["output" + suffix] = dev.host(out)
        result["input_grad" + suffix] = dev.host(input_grad)
        if a.affine:
            result["gamma_grad" + suffix] = dev.host(gamma_grad)
            result["beta_grad" + suffix] = dev.host(beta_grad)
    result["running_mean"] = dev.host(state.running_mean)
    result["running_var"] = dev.host(state.running_var)
    batch_norm.cleanup_kernel(dev.handle, state)
    return result


def batch_norm_expect(s):
    """PyTorch's values; bounds from the error of each quantity (see the comments)."""
    a, dtype = s.attrs, s.dtype
    e = eps(dtype)
    dims = s.inputs["input"].shape
    n = dims[0]
    stat_dims = (dims[1],) if a.mode is SPATIAL else dims[1:]
    stats = int(np.prod(stat_dims, dtype=np.int64))
    rest = int(np.prod(dims[2:], dtype=np.int64)) if a.mode is SPATIAL else 1
    count = n * rest  # values per statistic

    def view(array):  # (N, statistic, values of it within one image)
        return np.asarray(array, dtype=np.float64).reshape(n, stats, rest)

    def per_stat(array):
        return array.reshape(stats)[None, :, None]

    gamma = s.inputs["gamma"].astype(np.float64).reshape(stats) if a.affine else np.ones(stats)
    beta = s.inputs["beta"].astype(np.float64).reshape(stats) if a.affine else np.zeros(stats)
    running_mean, running_var = torch.zeros(stats, dtype=torch.float64), torch.ones(stats, dtype=torch.float64)
    mean_error, var_error = np.zeros(stats), np.zeros(stats)  # of the kernels' running statistics
    trained, result = 0, {}
    for step, training in enumerate(s.extra["steps"]):
        suffix = "" if step == 0 else f"_step{step + 1}"
        x, up = s.inputs["input" + suffix], s.inputs["output_grad" + suffix]
        given = torch_tensor(x, True)
        weights = [torch_tensor(gamma, True), torch_tensor(beta, True)] if a.affine else [None, None]
        old_mean, old_var = running_mean.numpy().copy(), running_var.numpy().copy()
        trained += training
        momentum = a.momentum if a.momentum is not None else 1.0 / max(trained, 1)
        flat = given if a.mode is SPATIAL else given.reshape(n, stats)
        pre = F.batch_norm(flat, running_mean, running_var, *weights, training=training, momentum=momentum,
                           eps=a.eps).reshape(dims)
        X = view(x)
        if training:
            center = X.mean(axis=(0, 2))
            var = X.var(axis=(0, 2))
            # The mean of `count` values: within (count + 2) eps of mean(|x|).
            center_error = (count + 2) * e * np.abs(X).mean(axis=(0, 2))
        else:
            center, var, center_error = old_mean, old_var, mean_error
        magnitude = np.abs(X) + per_stat(np.abs(center))  # |x| + |center|: the size of x - center's terms
        if training:
            # The variance of the deviations: a sum of `count` squares of values within their own
            # error; in absolute terms within (count + 6) eps * mean((|x| + |center|)^2).
            var_abs_error = (count + 6) * e * (magnitude ** 2).mean(axis=(0, 2))
        else:
            var_abs_error = var_error
        invstd = 1 / np.sqrt(var + a.eps)
        rho = var_abs_error / (var + a.eps) + 4 * e  # relative error of invstd (sqrt halves it; spare 2x)
        # xhat = (x - center) invstd: the center's error, the subtraction's and invstd's, and 2 roundings.
        xhat_abs = magnitude * per_stat(invstd)
        xhat_error = per_stat(invstd) * (per_stat(center_error) + 4 * e * magnitude) + xhat_abs * per_stat(rho)
        # pre = gamma xhat + beta: two more roundings.
        pre_bound = per_stat(np.abs(gamma)) * xhat_error + 4 * e * (per_stat(np.abs(gamma)) * xhat_abs +
                                                                  per_stat(np.abs(beta)))
        out, out_bound, G, G_error = activation_chain(a.activation, pre, pre_bound.reshape(dims), up, dtype)
        G, G_error = view(G), (np.zeros(X.shape) if G_error is None else view(G_error))
        grads = grads_of(pre, [given] + ([w for w in weights] if a.affine else []), up if a.activation is None else
                         G.reshape(dims))
        absG = np.abs(G)

        def mean_of(values):
            return values.mean(axis=(0, 2), keepdims=True)

        if training:
            # input_grad = gamma invstd (G - mean(G) - xhat mean(G xhat)): two sums of `count` terms
            # and a few roundings on values each within their own error.
            size = absG + mean_of(absG) + xhat_abs * mean_of(absG * xhat_abs)
            input_bound = per_stat(np.abs(gamma) * invstd) * (
                ((count + 8) * e + per_stat(rho)) * size + xhat_error * mean_of(absG * xhat_abs) +
                xhat_abs * mean_of(absG * xhat_error) +
                G_error + mean_of(G_error) + xhat_abs * mean_of(G_error * xhat_abs))
        else:
            # input_grad = G gamma invstd: two roundings and invstd's error.
            input_bound = per_stat(np.abs(gamma) * invstd) * ((4 * e + per_stat(rho)) * absG + G_error)
        result["output" + suffix] = Expect(out, out_bound)
        result["input_grad" + suffix] = Expect(grads[0], input_bound.reshape(dims))
        if a.affine:
            # gamma_grad = sum(G xhat), beta_grad = sum(G): sums of `count` terms.
            gamma_bound = ((count + 4) * e * (absG * xhat_abs) + absG * xhat_error + G_error * xhat_abs).sum(axis=(0, 2))
            beta_exact = a.activation is None and exact_sum(absG.sum(axis=(0, 2)), dtype, s.dyadic, 1 / 2)
            beta_bound = None if beta_exact else ((count + 2) * e * absG + G_error).sum(axis=(0, 2)).reshape(stat_dims)
            result["gamma_grad" + suffix] = Expect(grads[1].reshape(stat_dims), gamma_bound.reshape(stat_dims))
            result["beta_grad" + suffix] = Expect(grads[2].reshape(stat_dims), beta_bound)
        if training:
            # running = momentum * batch + (1 - momentum) * running, rounded to the dtype: the batch
            # statistics' errors (the unbiased variance scaled by count / (count - 1)) carried, and
            # 4 roundings on the magnitudes.
            unbiased = var * count / (count - 1)
            mean_error = momentum * center_error + (1 - momentum) * mean_error + 4 * e * (
                momentum * np.abs(center) + (1 - momentum) * np.abs(old_mean))
            var_error = momentum * var_abs_error * count / (count - 1) + (1 - momentum) * var_error + 4 * e * (
                momentum * unbiased + (1 - momentum) * old_var)
    result["running_mean"] = Expect(running_mean.numpy().reshape(stat_dims), mean_error.reshape(stat_dims))
    result["running_var"] = Expect(running_var.numpy().reshape(stat_dims), var_error.reshape(stat_dims))
    return result


# =========================================================================== the tests

OPS = {
    "conv_2d": (conv_2d_samples, conv_2d_run, conv_2d_expect),
    "batch_norm": (batch_norm_samples, batch_norm_run, batch_norm_expect),
    "pool_2d": (pool_2d_samples, pool_2d_run, pool_2d_expect),
    "concat": (concat_samples, concat_run, concat_expect),
    "split": (split_samples, split_run, split_expect),
    "reshape": (reshape_samples, reshape_run, reshape_expect),
    "transpose": (transpose_samples, transpose_run, transpose_expect),
    "batch_matmul": (batch_matmul_samples, batch_matmul_run, batch_matmul_expect),
    "upsample": (upsample_samples, upsample_run, upsample_expect),
    "element_unary": (element_unary_samples, element_unary_run, element_unary_expect),
    "element_binary": (element_binary_samples, element_binary_run, element_binary_expect),
    "softmax": (softmax_samples, softmax_run, softmax_expect),
    "gradient_reduction": (gradient_reduction_samples, gradient_reduction_run, gradient_reduction_expect),
    "top_k": (top_k_samples, top_k_run, top_k_expect),
}


def _failures(results, expected, compare_one):
    missing = sorted(set(expected) ^ set(results))
    failures = [f"tensors differ: expected {sorted(expected)}, got {sorted(results)}"] if missing else []
    for name, expect in expected.items():
        if name in results:
            report = compare_one(name, results[name], expect)
            if report is not None:
                failures.append(report)
    return failures


@pytest.mark.parametrize("op", list(OPS))
@given(data=st.data())
def test_cpu_matches_torch(op, data, cpu):
    """Forward and gradients on the CPU against PyTorch in float64, within each tensor's bound."""
    samples, run, expect = OPS[op]
    sample = data.draw(samples(), label="sample")
    with np.errstate(all="ignore"):
        failures = _failures(run(cpu, sample), expect(sample),
                             lambda name, got, e: check(name, got, e, got.dtype))
    assert not failures, f"{op} on the CPU, {sample!r}:\n" + "\n".join(failures)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_elu_reference_passes_dy_at_a_nan_whatever_torchs_loop(dtype, cpu):
    """A NaN input of ELU passes dy (x <= 0 is false) in the reference too, at every position: PyTorch's
    vectorized loop gives NaN there on long tensors (found by the device profile), its scalar loop dy."""
    x = np.full(64, 0.5, dtype)
    x[[0, 9, 40, 63]] = np.nan  # inside the vectorized loop's reach and in the tail, on any vector width
    x[[1, 2]] = -1.0, 0.0
    g = np.arange(1, 65).astype(dtype) / 4
    sample = Sample("element_unary", ElementUnaryAttrs(UnaryOpType.ELU, 1.0), {"input": x, "output_grad": g},
                    np.dtype(dtype), True)
    expected = element_unary_expect(sample)
    nan = np.isnan(x)
    assert np.array_equal(expected["input_grad"].ref[nan], g[nan].astype(np.float64))
    assert np.isnan(expected["output"].ref[nan]).all()
    failures = _failures(element_unary_run(cpu, sample), expected, lambda name, got, e: check(name, got, e, got.dtype))
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(OPS))
@given(data=st.data())
def test_gpu_matches_cpu(op, data, gpu, cpu):
    """The GPU against our CPU: bit for bit where both do the same operations, else within twice the bound."""
    samples, run, expect = OPS[op]
    sample = data.draw(samples(), label="sample")
    with np.errstate(all="ignore"):
        on_cpu = run(cpu, sample)
        failures = _failures(run(gpu, sample), expect(sample),
                             lambda name, got, e: check_gpu(name, got, on_cpu[name], e, got.dtype))
    assert not failures, f"{op} on the GPU, {sample!r}:\n" + "\n".join(failures)
