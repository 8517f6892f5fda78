"""conv_2d beyond the golden cases: random shapes against PyTorch on every device,
empty convolutions, skipped gradients, GPU determinism and resource cleanup, and
the cuDNN binding's loading and status checks (which need no GPU)."""

import ctypes
import dataclasses
import os

import numpy as np
import pytest

from kernels import Activation, Conv2DAttrs, CudaError, StateError, TensorShape, conv_2d
from kernels.runtime import cudnn
from kernels.runtime.core import BFLOAT16

from .conftest import Dev, require

# ------------------------------------------------------------------ random shapes against PyTorch


def _random_configs(count=40, seed=0):
    """(input dims, attrs) covering groups, dilation, strides and paddings that differ in h and w."""
    rng = np.random.default_rng(seed)
    configs = []
    while len(configs) < count:
        groups = int(rng.choice([1, 1, 2, 3]))
        channels = groups * int(rng.integers(1, 4))
        out_channels = groups * int(rng.integers(1, 4))
        if rng.random() < 0.2:  # depthwise
            groups, channels, out_channels = channels, channels, channels * int(rng.integers(1, 3))
        kernel = [int(k) for k in rng.integers(1, 5, size=2)]
        stride = [int(s) for s in rng.integers(1, 4, size=2)]
        dilation = [int(d) for d in rng.integers(1, 3, size=2)]
        padding = [int(p) for p in rng.integers(0, 4, size=2)]
        size = [int(s) for s in rng.integers(1, 10, size=2)]
        if any(size[i] + 2 * padding[i] < dilation[i] * (kernel[i] - 1) + 1 for i in range(2)):
            continue
        activation = rng.choice([None, None, *Activation])
        attrs = Conv2DAttrs(out_channels, kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1],
                            dilation[0], dilation[1], groups, bool(rng.random() < 0.5), activation)
        configs.append(((int(rng.integers(1, 4)), channels, size[0], size[1]), attrs))
    return configs


def _torch_reference(input, filter, bias, output_grad, attrs):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    tensors = [torch.from_numpy(a).requires_grad_() for a in (input, filter)]
    bias_tensor = torch.from_numpy(bias).requires_grad_() if bias is not None else None
    pre = F.conv2d(tensors[0], tensors[1], bias_tensor, (attrs.stride_h, attrs.stride_w),
                   (attrs.padding_h, attrs.padding_w), (attrs.dilation_h, attrs.dilation_w), attrs.groups)
    output = {None: lambda x: x, Activation.RELU: torch.relu, Activation.SIGMOID: torch.sigmoid,
              Activation.TANH: torch.tanh, Activation.GELU: F.gelu, Activation.SILU: F.silu}[attrs.activation](pre)
    wanted = tensors + ([bias_tensor] if bias_tensor is not None else [])
    grads = torch.autograd.grad(output, wanted, torch.from_numpy(output_grad))
    return [output.detach().numpy()] + [g.numpy() for g in grads] + ([None] if bias is None else [])


def _run(dev, attrs, input, filter, bias, output_grad, wanted=("input_grad", "filter_grad", "bias_grad")):
    """Forward and backward on a device; host copies of output, input_grad, filter_grad, bias_grad."""
    dtype = input.dtype
    output_dims = conv_2d.output_dims(attrs, input.shape)
    state = conv_2d.init_kernel(dev.handle, attrs, TensorShape(input.shape, dtype), TensorShape(output_dims, dtype))
    arrays = {name: dev.array(a) if a is not None else None
              for name, a in (("input", input), ("filter", filter), ("bias", bias), ("output_grad", output_grad))}
    output = dev.array(np.full(output_dims, np.nan, dtype))
    conv_2d.forward_kernel(dev.stream, dev.handle, state, attrs, arrays["input"], arrays["filter"], arrays["bias"],
                           output)
    grads = {
        "input_grad": dev.array(np.full(input.shape, np.nan, dtype)) if "input_grad" in wanted else None,
        "filter_grad": dev.array(np.full(filter.shape, np.nan, dtype)) if "filter_grad" in wanted else None,
        "bias_grad": dev.array(np.full(bias.shape, np.nan, dtype)) if bias is not None and "bias_grad" in wanted
        else None,
    }
    conv_2d.backward_kernel(dev.stream, dev.handle, state, attrs, output, arrays["output_grad"], arrays["input"],
                            grads["input_grad"], arrays["filter"], grads["filter_grad"], grads["bias_grad"])
    dev.stream.synchronize()
    conv_2d.cleanup_kernel(dev.handle, state)
    return [dev.host(output)] + [None if grads[k] is None else dev.host(grads[k])
                                 for k in ("input_grad", "filter_grad", "bias_grad")]


def _inputs(dims, attrs, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    filter = rng.standard_normal(conv_2d.filter_dims(attrs, dims[1])).astype(dtype)
    bias = rng.standard_normal(attrs.out_channels).astype(dtype) if attrs.use_bias else None
    output_grad = rng.standard_normal(conv_2d.output_dims(attrs, dims)).astype(dtype)
    return rng.standard_normal(dims).astype(dtype), filter, bias, output_grad


@pytest.mark.parametrize("index", range(40))
def test_random_shapes_match_torch(index, dev):
    dims, attrs = _random_configs()[index]
    input, filter, bias, output_grad = _inputs(dims, attrs, seed=index)
    expected = _torch_reference(input, filter, bias, output_grad, attrs)
    got = _run(dev, attrs, input, filter, bias, output_grad)
    for name, g, e in zip(("output", "input_grad", "filter_grad", "bias_grad"), got, expected):
        if e is not None:
            np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-10, err_msg=f"{name} of {dims} {attrs}")


def test_skipped_gradients_leave_the_others_unchanged(dev):
    dims, attrs = (2, 4, 6, 5), Conv2DAttrs(6, 3, 2, 2, 1, 1, 1, groups=2, use_bias=True, activation=Activation.TANH)
    input, filter, bias, output_grad = _inputs(dims, attrs, seed=3)
    full = _run(dev, attrs, input, filter, bias, output_grad)
    for only in ("input_grad", "filter_grad", "bias_grad"):
        partial = _run(dev, attrs, input, filter, bias, output_grad, wanted=(only,))
        index = ("input_grad", "filter_grad", "bias_grad").index(only) + 1
        np.testing.assert_array_equal(partial[index], full[index])
        assert all(partial[i] is None for i in (1, 2, 3) if i != index)


# ------------------------------------------------------------------ half precision


def _plain(attrs):
    """The attrs without bias and activation: the convolution's own sums."""
    return Conv2DAttrs(attrs.out_channels, attrs.kernel_h, attrs.kernel_w, attrs.stride_h, attrs.stride_w,
                       attrs.padding_h, attrs.padding_w, attrs.dilation_h, attrs.dilation_w, attrs.groups)


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16], ids=["f16", "bf16"])
@pytest.mark.parametrize("index", range(12))
def test_half_rounds_at_the_stated_points(index, dtype, dev):
    """float16 and bfloat16 on random shapes (no activation, or RELU) with small-integer inputs and
    quarter filters, whose float32 sums are exact: the results are, bit for bit on both devices,
    the exact (float64) sums rounded at docs/ops.md's points: the convolution, then plus the bias,
    then the activation; backward: each gradient once, the bias gradient's float64 sum via float32.
    Skipped gradients leave the others' bits unchanged."""
    dims, attrs = _random_configs(count=12, seed=7)[index]
    if attrs.activation not in (None, Activation.RELU):
        attrs = Conv2DAttrs(*(getattr(attrs, f) for f in ("out_channels", "kernel_h", "kernel_w", "stride_h",
                            "stride_w", "padding_h", "padding_w", "dilation_h", "dilation_w", "groups", "use_bias")),
                            Activation.RELU)
    rng = np.random.default_rng(index)
    input = rng.integers(-3, 4, dims).astype(np.float64)
    filter = rng.integers(-8, 9, conv_2d.filter_dims(attrs, dims[1])) / 4.0
    bias = rng.integers(-8, 9, attrs.out_channels) / 8.0 if attrs.use_bias else None
    output_grad = rng.integers(-3, 4, conv_2d.output_dims(attrs, dims)).astype(np.float64)
    got = _run(dev, attrs, *(None if a is None else a.astype(dtype) for a in (input, filter, bias, output_grad)))
    # The exact sums: the CPU kernels in float64 without bias and activation.
    cpu = Dev("cpu")
    conv = _run(cpu, _plain(attrs), input, filter, None, output_grad)[0]
    pre = conv.astype(dtype)
    if bias is not None:
        pre = (pre.astype(np.float32) + bias.astype(np.float32).reshape(1, -1, 1, 1)).astype(dtype)
    relu = attrs.activation is Activation.RELU
    output = np.maximum(pre, 0).astype(dtype) if relu else pre
    grad = (output_grad * (pre.astype(np.float64) > 0) if relu else output_grad).astype(dtype).astype(np.float64)
    _, input_grad, filter_grad, _ = _run(cpu, _plain(attrs), input, filter, None, grad)
    expected = [output, input_grad.astype(dtype), filter_grad.astype(dtype)]
    expected.append(None if bias is None else grad.sum(axis=(0, 2, 3)).astype(np.float32).astype(dtype))
    for name, g, e in zip(("output", "input_grad", "filter_grad", "bias_grad"), got, expected):
        if e is not None:
            assert g.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(g.view(np.uint16), e.view(np.uint16), err_msg=f"{name} of {dims} {attrs}")
    half = [None if a is None else a.astype(dtype) for a in (input, filter, bias, output_grad)]
    for only in ("input_grad", "filter_grad"):
        partial = _run(dev, attrs, *half, wanted=(only,))
        index_of = ("input_grad", "filter_grad").index(only) + 1
        np.testing.assert_array_equal(partial[index_of].view(np.uint16), got[index_of].view(np.uint16))


@pytest.mark.parametrize("dims, attrs", [
    ((2, 0, 4, 3), Conv2DAttrs(3, 2, 2, use_bias=True, activation=Activation.SIGMOID)),  # zero input channels
    ((2, 2, 0, 3), Conv2DAttrs(3, 1, 1, padding_h=1, use_bias=True)),  # H = 0: every window in the padding
    ((0, 2, 4, 3), Conv2DAttrs(3, 3, 3, padding_h=1, padding_w=1, use_bias=True)),  # zero batch
])
def test_empty_sums(dims, attrs, dev):
    """A convolution with nothing to sum gives activation(bias); its input and filter gradients are zero."""
    input, filter, bias, output_grad = _inputs(dims, attrs, seed=5)
    output, input_grad, filter_grad, bias_grad = _run(dev, attrs, input, filter, bias, output_grad)
    pre = np.broadcast_to(bias.reshape(1, -1, 1, 1), output.shape)
    expected = 1 / (1 + np.exp(-pre)) if attrs.activation is Activation.SIGMOID else pre
    np.testing.assert_allclose(output, expected, rtol=1e-15)
    assert not np.any(input_grad) and not np.any(filter_grad)
    derivative = expected * (1 - expected) if attrs.activation is Activation.SIGMOID else 1.0
    np.testing.assert_allclose(bias_grad, (output_grad * derivative).sum(axis=(0, 2, 3)), rtol=1e-14)


def test_backward_without_forward_needs_none_without_activation(dev):
    attrs = Conv2DAttrs(2, 3, 3, padding_h=1, padding_w=1, use_bias=True)
    dims = (1, 2, 4, 4)
    state = conv_2d.init_kernel(dev.handle, attrs, TensorShape(dims, np.float64), TensorShape((1, 2, 4, 4), np.float64))
    grad, input_grad = dev.array(np.ones((1, 2, 4, 4))), dev.array(np.zeros(dims))
    filter = dev.array(np.ones((2, 2, 3, 3)))
    conv_2d.backward_kernel(dev.stream, dev.handle, state, attrs, None, grad, None, input_grad, filter, None, None)
    dev.stream.synchronize()
    assert dev.host(input_grad)[0, 0, 1, 1] == 18.0  # 2 output channels x 9 taps of ones
    conv_2d.cleanup_kernel(dev.handle, state)
    with_activation = Conv2DAttrs(2, 3, 3, padding_h=1, padding_w=1, activation=Activation.GELU)
    state = conv_2d.init_kernel(dev.handle, with_activation, TensorShape(dims, np.float64),
                                TensorShape((1, 2, 4, 4), np.float64))
    with pytest.raises(StateError, match=r"conv_2d: state: expected a forward before the backward"):
        conv_2d.backward_kernel(dev.stream, dev.handle, state, with_activation, None, grad, None, input_grad, filter,
                                None, None)
    conv_2d.cleanup_kernel(dev.handle, state)


@pytest.mark.parametrize("attrs", [
    Conv2DAttrs(4, 3, 3, padding_h=1, padding_w=1, use_bias=True, activation=Activation.SILU),
    Conv2DAttrs(4, 1, 1, use_bias=True, activation=Activation.SILU),
    Conv2DAttrs(4, 3, 3, stride_h=2, stride_w=2, padding_h=1, padding_w=1, groups=4, use_bias=True,
                activation=Activation.SILU),
    Conv2DAttrs(4, 3, 3, padding_h=1, padding_w=1),
], ids=["columns", "pointwise", "depthwise", "no_activation"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_state_without_backward_keeps_nothing_and_writes_the_same_bits(dev, attrs, dtype):
    """attrs.backward=False (inference only): the output is the bits of a state made for a backward, the
    fused activation applied in the output itself (no pre-activation kept), and a backward is refused."""
    dims = (2, 4, 9, 10)
    rng = np.random.default_rng(5)
    x = dev.array(rng.standard_normal(dims).astype(dtype))
    filter = dev.array(rng.standard_normal((4, 4 // attrs.groups, attrs.kernel_h, attrs.kernel_w)).astype(dtype))
    bias = dev.array(rng.standard_normal(4).astype(dtype)) if attrs.use_bias else None
    outputs = []
    for backward in (True, False):
        call_attrs = dataclasses.replace(attrs, backward=backward)
        out_dims = conv_2d.output_dims(call_attrs, dims)
        state = conv_2d.init_kernel(dev.handle, call_attrs, TensorShape(dims, dtype), TensorShape(out_dims, dtype))
        output = dev.array(np.full(out_dims, np.nan, dtype))
        conv_2d.forward_kernel(dev.stream, dev.handle, state, call_attrs, x, filter, bias, output)
        dev.stream.synchronize()
        outputs.append(dev.host(output))
        assert (state.pre is None) is (not backward or attrs.activation is None)
        if not backward:
            grad = dev.array(np.ones(out_dims, dtype))
            with pytest.raises(StateError, match=r"conv_2d: state: expected a state made for a backward"):
                conv_2d.backward_kernel(dev.stream, dev.handle, state, call_attrs, None, grad, None, x, filter,
                                        None, None)
        conv_2d.cleanup_kernel(dev.handle, state)
    assert np.array_equal(outputs[0].view(np.uint8), outputs[1].view(np.uint8))
    assert np.isfinite(outputs[1]).all()


# ------------------------------------------------------------------ the depthwise forward's own kernels

_ROWS_CASES = [  # (input dims, kernel, stride, padding): awkward sizes, rows not a multiple of the rows a thread
    ((2, 8, 40, 40), 3, 1, 1), ((1, 5, 37, 23), 3, 1, 1), ((1, 3, 5, 6), 3, 1, 0), ((1, 3, 6, 7), 3, 1, 2),
    ((1, 2, 1, 1), 3, 1, 1), ((2, 6, 41, 39), 3, 2, 1), ((2, 6, 40, 40), 3, 2, 1), ((1, 4, 2, 3), 3, 2, 1),
    ((1, 4, 9, 10), 7, 1, 3), ((1, 3, 23, 17), 7, 1, 3), ((1, 2, 3, 2), 7, 1, 3),
    # padding (h, w) unequal: the stride-1 input gradient's turned padding is kernel - 1 - padding a side
    ((1, 3, 11, 9), 3, 1, (2, 0)), ((2, 2, 9, 12), 7, 1, (1, 3)), ((1, 3, 9, 8), 3, 2, (0, 1)),
]


def _depthwise_attrs(channels, kernel, stride, padding, **options):
    padding_h, padding_w = padding if isinstance(padding, tuple) else (padding, padding)
    return Conv2DAttrs(channels, kernel, kernel, stride, stride, padding_h, padding_w, groups=channels, **options)


@pytest.mark.parametrize("attrs, rows", [
    (_depthwise_attrs(4, 3, 1, 1), (3, 3, 1)), (_depthwise_attrs(4, 3, 2, 1), (3, 3, 2)),
    (_depthwise_attrs(4, 7, 1, 3), (7, 7, 1)), (_depthwise_attrs(4, 3, 1, 0, use_bias=True), (3, 3, 1)),
    (_depthwise_attrs(4, 5, 1, 2), None), (_depthwise_attrs(4, 7, 2, 3), None),  # shapes without a kernel
    (Conv2DAttrs(8, 3, 3, 1, 1, 1, 1, groups=4), None),  # two filters a channel
    (Conv2DAttrs(4, 3, 3, 1, 1, 2, 2, 2, 2, groups=4), None),  # dilation 2
    (Conv2DAttrs(4, 3, 3, 2, 1, 1, 1, groups=4), None),  # strides that differ
])
def test_depthwise_rows_takes_yolov10s_depthwise_kernels_only(attrs, rows):
    import types

    from kernels.conv_2d import plan

    dims = (1, 4, 20, 20)
    state = types.SimpleNamespace(attrs=attrs, shapes={"input_shape": TensorShape(dims, np.float32)})
    assert plan.depthwise_rows(state) == rows


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BFLOAT16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", range(len(_ROWS_CASES)))
def test_gpu_depthwise_rows_writes_the_bits_of_the_tiled_and_untiled_kernels(case, dtype):
    """conv_depthwise_forward_rows against conv_depthwise_forward_tiled and conv_depthwise_forward (the state's
    rows, then its tile, taken away): the same bits, with and without bias, with SILU applied in the kernel
    (a state without backward) and kept as the pre-activation (with backward). NaN and infinities among the
    inputs, and an infinite tap at each corner of the filter: a tap over the padding that was added rather
    than skipped (0 * inf) would write NaN at the border."""
    from kernels.runtime import gpu_paths

    require("gpu")
    dims, kernel, stride, padding = _ROWS_CASES[case]
    rng = np.random.default_rng(case)
    x = rng.standard_normal(dims)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, max(1, flat.size // 97))] = np.nan
    flat[rng.integers(0, flat.size, max(1, flat.size // 89))] = np.inf
    channels = dims[1]
    filter = rng.standard_normal((channels, 1, kernel, kernel))
    filter[0, 0, 0, 0] = filter[-1, 0, -1, -1] = np.inf
    filter[0, 0, -1, 0] = -np.inf
    bias = rng.standard_normal(channels)
    dev = Dev("gpu")
    try:
        for options in ({}, {"use_bias": True}, {"use_bias": True, "activation": Activation.SILU, "backward": False},
                        {"activation": Activation.SILU}):
            attrs = _depthwise_attrs(channels, kernel, stride, padding, **options)
            out_dims = conv_2d.output_dims(attrs, dims)
            arrays = [dev.array(a.astype(dtype)) for a in (x, filter)]
            arrays.append(dev.array(bias.astype(dtype)) if attrs.use_bias else None)
            outputs = []
            for kept in ("rows", "tile", None):
                state = conv_2d.init_kernel(dev.handle, attrs, TensorShape(dims, dtype), TensorShape(out_dims, dtype))
                assert state.rows == (kernel, kernel, stride)
                if kept != "rows":
                    state.rows = None
                if kept is None:
                    state.tile = None
                assert kept != "tile" or state.tile is not None
                output = dev.array(np.full(out_dims, np.nan, dtype))
                with gpu_paths.recording() as reached:
                    conv_2d.forward_kernel(dev.stream, dev.handle, state, attrs, *arrays, output)
                path = {"rows": "forward_rows", "tile": "forward", None: "forward_untiled"}[kept]
                assert "conv_2d.depthwise." + path in reached.reached
                dev.stream.synchronize()
                outputs.append(dev.host(output))
                conv_2d.cleanup_kernel(dev.handle, state)
            rows, tiled, untiled = outputs
            assert not np.isnan(rows).all()
            for name, other in (("tiled", tiled), ("untiled", untiled)):
                differ = rows.view(np.uint8) != other.view(np.uint8)
                assert not differ.any(), f"{options}: rows and {name} differ at {np.argwhere(differ)[:4].tolist()}"
    finally:
        dev.handle.close()


@pytest.mark.parametrize("channels, sm_count, rows, taps", [
    (66, 132, (3, 3, 1), True), (65, 132, (3, 3, 1), False), (128, 132, (7, 7, 1), True), (64, 132, (3, 3, 2), False),
    (1, 1, (3, 3, 1), True),  # the small device: every golden case with rows
    (640, 132, None, False),  # no rows: the general kernels
])
def test_depthwise_filter_taps_needs_rows_and_a_channel_for_every_two_sms(channels, sm_count, rows, taps):
    import types

    from kernels.conv_2d import plan

    state = types.SimpleNamespace(rows=rows, shapes={"input_shape": TensorShape((1, channels, 8, 8), np.float32)})
    assert plan.DEPTHWISE_FILTER_TAPS_SMS_PER_CHANNEL == 2
    assert plan.depthwise_filter_taps(state, sm_count) is taps


@pytest.mark.parametrize("channels, sm_count, rows, blocks", [
    (529, 132, (3, 3, 1), 5), (528, 132, (3, 3, 1), 1), (640, 132, (3, 3, 2), 5), (1280, 132, (3, 3, 1), 5),
    (320, 132, (3, 3, 2), 1), (128, 132, (3, 3, 1), 1),
    (5000, 132, (7, 7, 1), 1),  # 7x7: never capped
    (5, 1, (3, 3, 1), 5),  # the small device
])
def test_depthwise_filter_taps_caps_registers_where_the_channels_need_more_than_four_blocks_an_sm(channels, sm_count,
                                                                                                  rows, blocks):
    import types

    from kernels.conv_2d import plan

    state = types.SimpleNamespace(rows=rows, shapes={"input_shape": TensorShape((1, channels, 8, 8), np.float32)})
    assert (plan.DEPTHWISE_FILTER_TAPS_SPARSE_BLOCKS, plan.DEPTHWISE_FILTER_TAPS_DENSE_BLOCKS) == (4, 5)
    assert plan.depthwise_filter_taps_blocks(state, sm_count) == blocks


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BFLOAT16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", range(len(_ROWS_CASES)))
def test_gpu_depthwise_fixed_gradients_write_the_bits_of_the_general_kernels(case, dtype, monkeypatch):
    """The input gradient with rows (at stride 1 conv_depthwise_forward_rows of the turned filter, at stride 2
    conv_depthwise_input_grad compiled for the kernel and stride) against conv_depthwise_input_grad's general
    form, and conv_depthwise_filter_grad_taps (a block a channel, in both its forms at 3x3: plan.
    depthwise_filter_taps_blocks) against conv_depthwise_filter_grad (a block a tap): the same bits, with and
    without a fused SILU (whose gradient comes first); and with infinite taps at
    the filter's corners, where a tap over the turned filter's padding that was added rather than skipped
    (0 * inf) would write NaN at the input gradient's border."""
    from kernels.runtime import gpu_paths

    require("gpu")
    dims, kernel, stride, padding = _ROWS_CASES[case]
    rng = np.random.default_rng(100 + case)
    channels = dims[1]
    x, filter = rng.standard_normal(dims), rng.standard_normal((channels, 1, kernel, kernel))
    cornered = filter.copy()
    cornered[0, 0, 0, 0] = cornered[-1, 0, -1, -1] = np.inf
    cornered[0, 0, -1, 0] = -np.inf
    dev = Dev("gpu")
    try:
        for options, taps_used in (({}, filter), ({"activation": Activation.SILU}, filter), ({}, cornered)):
            attrs = _depthwise_attrs(channels, kernel, stride, padding, **options)
            out_dims = conv_2d.output_dims(attrs, dims)
            grad = dev.array(rng.standard_normal(out_dims).astype(dtype))
            input, weights = dev.array(x.astype(dtype)), dev.array(taps_used.astype(dtype))
            results = []
            rows_of = (kernel, kernel, stride)
            for rows, taps, sparse in ((rows_of, True, 0), (rows_of, True, 10**9), (rows_of, False, 0), (None, False, 0)):
                # sparse: plan.DEPTHWISE_FILTER_TAPS_SPARSE_BLOCKS, 0 for the capped form at 3x3, 10**9 for the other
                monkeypatch.setattr(conv_2d.plan, "DEPTHWISE_FILTER_TAPS_SPARSE_BLOCKS", sparse)
                state = conv_2d.init_kernel(dev.handle, attrs, TensorShape(dims, dtype), TensorShape(out_dims, dtype))
                assert state.rows == (kernel, kernel, stride)
                state.rows, state.filter_taps = rows, taps
                output = dev.array(np.full(out_dims, np.nan, dtype))
                conv_2d.forward_kernel(dev.stream, dev.handle, state, attrs, input, weights, None, output)
                input_grad = dev.array(np.full(dims, np.nan, dtype))
                filter_grad = dev.array(np.full(filter.shape, np.nan, dtype))
                with gpu_paths.recording() as reached:
                    conv_2d.backward_kernel(dev.stream, dev.handle, state, attrs, output, grad, input, input_grad,
                                            weights, filter_grad, None)
                suffix = "" if rows is None else "_rows" if stride == 1 else "_fixed"
                assert "conv_2d.depthwise.input_grad" + suffix in reached.reached
                capped = taps and kernel == 3 and sparse == 0  # the capped form at 3x3
                assert ("conv_2d.depthwise.filter_grad" + ("_taps" if taps else "") + ("_capped" if capped else "")
                        in reached.reached)
                dev.stream.synchronize()
                results.append((dev.host(input_grad), dev.host(filter_grad)))
                conv_2d.cleanup_kernel(dev.handle, state)
            if taps_used is filter:
                assert all(np.isfinite(a).all() for a in results[0])
            else:  # where a corner tap meets the input, its infinity reaches the input gradient
                ph, pw = attrs.padding_h, attrs.padding_w
                reached = any(0 <= oh * stride - ph + i < dims[2] and 0 <= ow * stride - pw + j < dims[3]
                              for i, j in ((0, 0), (kernel - 1, kernel - 1), (kernel - 1, 0))
                              for oh in range(out_dims[2]) for ow in range(out_dims[3]))
                assert np.isfinite(results[0][0]).all() != reached
            for name, i in (("input_grad", 0), ("filter_grad", 1)):
                for other in results[1:]:
                    assert np.array_equal(results[0][i].view(np.uint8), other[i].view(np.uint8)), (name, options)
    finally:
        dev.handle.close()


# (rows, columns) a thread of conv_depthwise_forward_rows, compared with the library's share of each dtype
# (plan.DEPTHWISE_SHARES): each output's sum is the same operations in the same order whatever a thread's
# share, so the shares can be tuned without changing a bit (docs/performance.md#depthwise-rows).
_ROWS_VARIANTS = [(1, 1), (4, 1), (8, 1), (2, 2), (4, 2), (8, 2), (2, 4)]


@pytest.fixture(scope="module")
def rows_variants():
    """The rows kernels compiled for each of _ROWS_VARIANTS (conv_2d/gpu.py's rows_variant)."""
    require("gpu")
    from kernels.conv_2d import gpu as conv_gpu

    # every library share is among the variants: each dtype's own is compared with every other share
    assert set(conv_gpu.DEPTHWISE_SHARES.values()) <= set(_ROWS_VARIANTS)
    return {variant: conv_gpu.rows_variant(*variant) for variant in _ROWS_VARIANTS}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BFLOAT16], ids=lambda d: np.dtype(d).name)
def test_gpu_depthwise_rows_write_the_same_bits_for_any_share_of_a_thread(dtype, rows_variants, monkeypatch):
    """The rows forward (plain; bias and SILU in the kernel) and the stride-1 input gradient (the turned filter) of
    every _ROWS_CASES shape, with each (rows, columns) a thread of _ROWS_VARIANTS: the bits of the library's own
    share for the dtype. NaN and an infinite corner tap among the values, as in the forward's test."""
    from kernels.conv_2d import gpu as conv_gpu
    from kernels.runtime import gpu_paths

    require("gpu")
    dev = Dev("gpu")
    try:
        for case, (dims, kernel, stride, padding) in enumerate(_ROWS_CASES):
            rng = np.random.default_rng(200 + case)
            channels = dims[1]
            x = rng.standard_normal(dims)
            x.reshape(-1)[rng.integers(0, x.size, max(1, x.size // 97))] = np.nan
            filter = rng.standard_normal((channels, 1, kernel, kernel))
            filter[-1, 0, -1, -1] = np.inf
            bias = rng.standard_normal(channels)
            for options in ({}, {"use_bias": True, "activation": Activation.SILU, "backward": False}):
                attrs = _depthwise_attrs(channels, kernel, stride, padding, **options)
                out_dims = conv_2d.output_dims(attrs, dims)
                grad = dev.array(rng.standard_normal(out_dims).astype(dtype))
                arrays = [dev.array(a.astype(dtype)) for a in (x, filter)]
                arrays.append(dev.array(bias.astype(dtype)) if attrs.use_bias else None)
                results = {}
                for variant in [None] + _ROWS_VARIANTS:
                    if variant is not None:
                        monkeypatch.setattr(conv_gpu, "_CUDA", rows_variants[variant])
                        monkeypatch.setattr(conv_gpu, "DEPTHWISE_SHARES", conv_gpu.variant_shares(*variant))
                    state = conv_2d.init_kernel(dev.handle, attrs, TensorShape(dims, dtype),
                                                TensorShape(out_dims, dtype))
                    output = dev.array(np.full(out_dims, np.nan, dtype))
                    with gpu_paths.recording() as reached:
                        conv_2d.forward_kernel(dev.stream, dev.handle, state, attrs, *arrays, output)
                    assert "conv_2d.depthwise.forward_rows" in reached.reached
                    input_grad = None
                    if stride == 1 and attrs.backward:
                        input_grad = dev.array(np.full(dims, np.nan, dtype))
                        with gpu_paths.recording() as reached:
                            conv_2d.backward_kernel(dev.stream, dev.handle, state, attrs, output, grad, arrays[0],
                                                    input_grad, arrays[1], None, None)
                        assert "conv_2d.depthwise.input_grad_rows" in reached.reached
                    dev.stream.synchronize()
                    results[variant] = [dev.host(output)] + ([] if input_grad is None else [dev.host(input_grad)])
                    conv_2d.cleanup_kernel(dev.handle, state)
                    monkeypatch.undo()
                mine = results.pop(None)
                assert not np.isnan(mine[0]).all()
                for variant, got in results.items():
                    for name, a, b in zip(("output", "input_grad"), mine, got):
                        differ = a.view(np.uint8) != b.view(np.uint8)
                        assert not differ.any(), (case, options, variant, name, np.argwhere(differ)[:4].tolist())
    finally:
        dev.handle.close()


# ------------------------------------------------------------------ GPU only


@pytest.mark.gpu
def test_gpu_same_bits_every_run():
    """Deterministic algorithms: two runs on inexact (random float32) data give the same bits."""
    require("gpu")
    dev = Dev("gpu")
    try:
        dims, attrs = (2, 32, 20, 18), Conv2DAttrs(48, 3, 3, 2, 1, 1, 1, groups=2, use_bias=True,
                                                  activation=Activation.SILU)
        data = _inputs(dims, attrs, seed=11, dtype=np.float32)
        first, second = _run(dev, attrs, *data), _run(dev, attrs, *data)
        for a, b in zip(first, second):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    finally:
        dev.handle.close()


@pytest.mark.gpu
def test_gpu_algorithms_are_deterministic_sums():
    require("gpu")
    dev = Dev("gpu")
    try:
        for dims, attrs in _random_configs(count=12, seed=1):
            output_dims = conv_2d.output_dims(attrs, dims)
            for dtype in (np.float32, np.float64, np.float16, BFLOAT16):
                state = conv_2d.init_kernel(dev.handle, attrs, TensorShape(dims, dtype), TensorShape(output_dims, dtype))
                # cuDNN is asked for the directions it runs, and only those.
                assert set(state.algorithms) == {d for d, path in state.paths.items() if path == "cudnn"}
                exact = {"forward": cudnn.EXACT_FWD_ALGOS, "backward_data": cudnn.EXACT_BWD_DATA_ALGOS,
                         "backward_filter": cudnn.EXACT_BWD_FILTER_ALGOS}
                assert all(a.algo in exact[d] for d, a in state.algorithms.items())
                if dtype == np.float32:
                    assert all(a.math_type == cudnn.FMA_MATH for a in state.algorithms.values())
                else:  # tensor cores allowed for the half dtypes, never the math that converts data to float16
                    assert all(a.math_type in cudnn.TENSOR_MATH for a in state.algorithms.values())
                conv_2d.cleanup_kernel(dev.handle, state)
    finally:
        dev.handle.close()


@pytest.mark.gpu
def test_gpu_cleanup_releases_descriptors_and_memory():
    """Hundreds of states made and cleaned up leave no descriptor and no pool memory behind."""
    require("gpu")
    import cupy

    pool = cupy.get_default_memory_pool()
    dev = Dev("gpu")
    configs = _random_configs(count=20, seed=2)
    try:
        # Warm up: the cuDNN handle, the NVRTC modules and the handle's workspace at its largest.
        for dims, attrs in configs:
            _run(dev, attrs, *_inputs(dims, attrs, seed=0, dtype=np.float32))
        live, used = cudnn.live_descriptors(), pool.used_bytes()
        for round in range(15):
            states = []
            for dims, attrs in configs:
                output_dims = conv_2d.output_dims(attrs, dims)
                states.append(conv_2d.init_kernel(dev.handle, attrs, TensorShape(dims, np.float32),
                                                  TensorShape(output_dims, np.float32)))
            assert sum(cudnn.live_descriptors().values()) > sum(live.values())
            for state in states:
                conv_2d.cleanup_kernel(dev.handle, state)
            if round % 5 == 0:  # with forward and backward (the pre-activation buffers) too
                for dims, attrs in configs:
                    _run(dev, attrs, *_inputs(dims, attrs, seed=round, dtype=np.float32))
            assert cudnn.live_descriptors() == live
            assert pool.used_bytes() == used
    finally:
        dev.handle.close()


# ------------------------------------------------------------------ the cuDNN binding without a GPU


def test_binding_declares_perf_struct_as_in_the_header():
    # cudnnConvolution*AlgoPerf_t: algo, status (int), time (float), memory (size_t at 16),
    # determinism, mathType (int), reserved[3]: 48 bytes on x86-64.
    assert ctypes.sizeof(cudnn.AlgoPerf) == 48
    assert (cudnn.AlgoPerf.memory.offset, cudnn.AlgoPerf.determinism.offset, cudnn.AlgoPerf.mathType.offset) == \
        (16, 24, 28)
    for name in ("cudnnConvolutionForward", "cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter"):
        assert len(cudnn.FUNCTIONS[name][1]) == 13


def test_status_names_and_check():
    assert cudnn.status_name(2000) == "CUDNN_STATUS_BAD_PARAM"
    assert cudnn.status_name(3000) == "CUDNN_STATUS_NOT_SUPPORTED"
    cudnn.check(0, "cudnnAnything")
    with pytest.raises(CudaError, match=r"cuDNN failed with CUDNN_STATUS_BAD_PARAM") as raised:
        cudnn.check(2000, "cudnnSetTensor4dDescriptor")
    assert raised.value.status == "CUDNN_STATUS_BAD_PARAM" and raised.value.library == "cuDNN"


def test_missing_library_is_a_cuda_error(monkeypatch, tmp_path):
    monkeypatch.setattr(cudnn.library, "loaded", None)
    monkeypatch.setenv(cudnn.ENV_PATH, str(tmp_path / "nowhere" / "libcudnn.so.9"))
    with pytest.raises(CudaError, match=r"LIBRARY_NOT_FOUND.*nowhere"):
        cudnn.library()
    with pytest.raises(CudaError, match=r"LIBRARY_NOT_FOUND"):
        cudnn.TensorDescriptor((1, 1, 1, 1), np.float32)
    assert cudnn.live_descriptors()["tensor"] >= 0


def test_library_candidates(monkeypatch, tmp_path):
    folder = tmp_path / "lib"
    folder.mkdir()
    monkeypatch.setenv(cudnn.ENV_PATH, str(folder))
    assert cudnn.candidates() == [str(folder / "libcudnn.so.9")]
    monkeypatch.setenv(cudnn.ENV_PATH, str(folder / "libcudnn.so.9.19.0"))
    assert cudnn.candidates() == [str(folder / "libcudnn.so.9.19.0")]
    # The wheel's layout: site-packages/nvidia/cudnn/lib/libcudnn.so.9 in the 'nvidia' namespace package.
    monkeypatch.delenv(cudnn.ENV_PATH)
    wheel = tmp_path / "site" / "nvidia" / "cudnn" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libcudnn.so.9").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    found = cudnn.candidates()
    assert os.path.join(str(wheel), "libcudnn.so.9") in found
    assert found[-1] == "libcudnn.so.9"


def _cudnn_or_skip():
    try:
        cudnn.library()
    except CudaError as error:
        pytest.skip(f"cuDNN is not loadable here: {error}")


def test_cudnn_descriptors_agree_with_the_formula():
    """cuDNN's own output dims (host-only calls: no GPU needed, only the library) equal ours for every
    case shape and random config: the descriptors get pad, stride, dilation, groups and filter right."""
    _cudnn_or_skip()
    from conformance.cases import conv_2d as cases

    shapes = [(case.inputs["input"].shape, case.attrs) for case in cases.TABLE if case.inputs["input"].size]
    before = cudnn.live_descriptors()
    for dims, attrs in shapes + _random_configs(count=40, seed=4):
        for dtype in (np.float32, np.float64):
            x = cudnn.TensorDescriptor(dims, dtype)
            w = cudnn.FilterDescriptor(conv_2d.filter_dims(attrs, dims[1]), dtype)
            conv = cudnn.ConvolutionDescriptor((attrs.padding_h, attrs.padding_w), (attrs.stride_h, attrs.stride_w),
                                               (attrs.dilation_h, attrs.dilation_w), attrs.groups, dtype)
            try:
                assert cudnn.convolution_output_dims(conv, x, w) == conv_2d.output_dims(attrs, dims), (dims, attrs)
            finally:
                for descriptor in (x, w, conv):
                    descriptor.destroy()
    assert cudnn.live_descriptors() == before
    with pytest.raises(CudaError, match=r"CUDNN_STATUS_BAD_PARAM"):
        cudnn.TensorDescriptor((1, 0, 2, 2), np.float32)
    assert cudnn.live_descriptors() == before


class _Descriptor:
    def __init__(self, destroyed, name, error=None):
        self.destroyed, self.name, self.error = destroyed, name, error

    def destroy(self):
        self.destroyed.append(self.name)
        if self.error is not None:
            raise self.error


def test_release_destroys_every_descriptor_then_raises_the_first_failure():
    """A descriptor whose destroy fails does not keep the others alive; the state is released and the
    first failure raised (the descriptors are cuDNN's on the GPU; stand-ins here)."""
    handle = Dev("cpu").handle
    attrs = Conv2DAttrs(4, 3, 3)
    state = conv_2d.init_kernel(handle, attrs, TensorShape((1, 2, 5, 5), np.float32), TensorShape((1, 4, 3, 3), np.float32))
    destroyed = []
    first, second = CudaError("cuDNN", "CUDNN_STATUS_BAD_PARAM"), CudaError("cuDNN", "CUDNN_STATUS_INTERNAL_ERROR")
    descriptors = state.descriptors
    descriptors.y, descriptors.x = _Descriptor(destroyed, "y", first), _Descriptor(destroyed, "x", second)
    descriptors.conv = _Descriptor(destroyed, "conv")
    with pytest.raises(CudaError) as raised:
        conv_2d.cleanup_kernel(handle, state)
    assert raised.value is first
    assert destroyed == ["y", "x", "conv"] and state.closed
    assert (descriptors.y, descriptors.x, descriptors.conv) == (None, None, None)
    conv_2d.cleanup_kernel(handle, state)  # released: nothing left to destroy
    assert destroyed == ["y", "x", "conv"]
