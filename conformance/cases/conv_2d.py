"""conv_2d cases: every YOLOv10 convolution at a small size (the first k3 s2 conv on
3 channels, k1 and k3 convs, SCDown's depthwise k3 s2, the n/s variants' 7x7
depthwise, PSA's depthwise positional conv, the head's 1x1 convs with bias and DFL's
fixed 1x1 conv from 16 bins to 1), and the shapes that hid bugs before: kernels
and strides that differ in h and w, padding wider than half the kernel, dilation,
groups neither 1 nor C, batch > 1, odd spatial sizes, float64, zero batch, and
every fused activation, and the fused inference convs (states without backward).

Inputs and filters are quarters in [-2, 2] (pattern()), so every product is a
multiple of 1/16 and every partial sum of the forward and of both gradients is
exact in float32 (|sum| < 2^10): EXACT on every device, whatever order cuDNN sums in.

Half precision (float16, bfloat16; names f16_ and bf16_): the same inputs, exact in both
half dtypes. Products and sums are float32 (exact, as above) and each result is rounded to
the dtype, the golden being the float64 result rounded once. Without a bias or activation
the two round the same exact value once: EXACT. With a bias the kernels round twice (the
convolution, then the convolution plus the bias, as cuDNN's convolution and AddTensor do),
and where the first rounding was inexact the second can land one ulp from the golden's
single rounding; likewise the activation's input is the rounded pre-activation, and its
gradient is rounded before the backward's sums. See _HALF_TOLERANCE for the measured bounds.
The edges: float16 partial sums past 65504 (forward and filter gradient) that a float32
accumulator carries, float16 subnormal results, and bfloat16's 8-bit mantissa on a
reduction over 4608 terms.
"""

import dataclasses

import numpy as np

from kernels import Activation, Conv2DAttrs, conv_2d
from kernels.runtime.core import BFLOAT16

from ..case import EXACT, CaseTable, nonfinite, pattern, ulp

TABLE = CaseTable("conv_2d")


def _add(name, input_dims, attrs, dtype=np.float32, tolerance=EXACT, description="", filter=None, input=None,
         filter_scale=0.25, positive_output_grad=False, bias=None, output_grad=None):
    n, channels = input_dims[:2]
    filter_dims = conv_2d.filter_dims(attrs, channels)
    output_dims = conv_2d.output_dims(attrs, input_dims)
    inputs = {
        "input": pattern(input_dims) if input is None else input,
        "filter": pattern(filter_dims, modulus=8 if filter_scale < 0.25 else 17, scale=filter_scale, offset=2)
        if filter is None else filter,
    }
    if attrs.use_bias:
        inputs["bias"] = pattern((attrs.out_channels,), modulus=13, offset=5) if bias is None else bias
    # Positive output gradients for the activation cases: the bias gradient then adds terms of one sign
    # (mostly), so the few-ulp errors of the activation's derivative do not meet cancellation.
    if attrs.backward:  # a state made with backward=False runs the forward only
        inputs["output_grad"] = (pattern(output_dims, modulus=11, offset=4) + (1.5 if positive_output_grad else 0.0)
                                 if output_grad is None else output_grad)
    TABLE.add(name, attrs, inputs, dtype=dtype, tolerance=tolerance, description=description)


def _conv(out_channels, kernel, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, use_bias=False,
          activation=None):
    return Conv2DAttrs(out_channels, kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1],
                       dilation[0], dilation[1], groups, use_bias, activation)


# YOLOv10's convolutions, small.
_add("yolo_stem_k3_s2_p1", (1, 3, 9, 10), _conv(4, (3, 3), (2, 2), (1, 1)),
     description="the first conv: 3 input channels, k3 s2 p1, odd and even sizes")
_add("yolo_k1_s1", (2, 5, 6, 7), _conv(3, (1, 1)), description="1x1 conv (C2f cv1/cv2, SCDown cv1)")
_add("yolo_k3_s1_p1", (1, 4, 7, 6), _conv(5, (3, 3), (1, 1), (1, 1)), description="C2f bottleneck 3x3")
_add("yolo_k3_s2_p1_downsample", (2, 4, 8, 7), _conv(6, (3, 3), (2, 2), (1, 1)), description="backbone downsample")
_add("yolo_scdown_depthwise_k3_s2_p1", (2, 4, 9, 8), _conv(4, (3, 3), (2, 2), (1, 1), groups=4),
     description="SCDown cv2: depthwise 3x3 stride 2")
_add("yolo_depthwise_k7_p3", (1, 3, 9, 10), _conv(3, (7, 7), (1, 1), (3, 3), groups=3),
     description="C2fCIB (n/s variants): depthwise 7x7")
_add("yolo_psa_pe_depthwise_k3_p1", (1, 6, 4, 5), _conv(6, (3, 3), (1, 1), (1, 1), groups=6),
     description="PSA positional encoding: depthwise 3x3 stride 1")
_add("yolo_depthwise_multiplier_2", (1, 3, 6, 5), _conv(6, (3, 3), (1, 1), (1, 1), groups=3),
     description="depthwise with 2 filters per channel (groups = C, O = 2C)")
_add("yolo_head_1x1_bias", (2, 6, 5, 4), _conv(7, (1, 1), use_bias=True),
     description="head: 1x1 conv with bias to box/class channels")
_add("yolo_head_k3_p1_bias", (1, 4, 5, 6), _conv(3, (3, 3), (1, 1), (1, 1), use_bias=True),
     description="head 3x3 with bias")
_add("yolo_dfl_1x1_16_to_1", (1, 16, 4, 8), _conv(1, (1, 1)),
     filter=np.arange(16, dtype=np.float64).reshape(1, 16, 1, 1),
     description="DFL decode: fixed 1x1 conv of bins 0..15 from 16 channels to 1, on (B, 16, 4, A)")

# The shapes that hide bugs.
_add("kernel_3x2_stride_2x1_pad_1x0", (2, 3, 7, 5), _conv(4, (3, 2), (2, 1), (1, 0)),
     description="asymmetric kernel and stride")
_add("kernel_1x5_stride_1x3_pad_0x2", (1, 2, 4, 11), _conv(3, (1, 5), (1, 3), (0, 2)),
     description="a 1x5 kernel, stride 3 across")
_add("padding_wider_than_half_kernel", (1, 2, 5, 4), _conv(3, (3, 3), (1, 2), (2, 3)),
     description="padding 2 and 3 on a 3x3 kernel: windows wholly in the padding")
_add("dilation_2_pad_2", (1, 3, 9, 8), _conv(2, (3, 3), (1, 1), (2, 2), (2, 2)), description="dilation 2")
_add("dilation_2x1_stride_2_groups_3", (2, 6, 9, 7), _conv(3, (3, 2), (2, 2), (1, 1), (2, 1), groups=3),
     description="dilation only in h, stride 2, 3 groups of 2 channels to 1")
_add("groups_2_c4_o6_bias", (2, 4, 6, 5), _conv(6, (3, 3), (1, 1), (1, 1), groups=2, use_bias=True),
     description="groups neither 1 nor C: 2 groups of 2 input and 3 output channels")
_add("batch_3_odd_7x5", (3, 2, 7, 5), _conv(3, (3, 3), (2, 2), (1, 1)), description="batch 3, odd spatial sizes")
_add("kernel_covers_input", (2, 2, 3, 4), _conv(3, (3, 4)), description="one output pixel per image: 1x1 output")
_add("f64_groups_2_dilation_2_stride_2_bias", (2, 4, 9, 10),
     _conv(4, (3, 3), (2, 2), (2, 1), (2, 2), groups=2, use_bias=True), dtype=np.float64)
_add("f64_depthwise_k3_s2_p1", (1, 4, 7, 6), _conv(4, (3, 3), (2, 2), (1, 1), groups=4), dtype=np.float64)
# The GPU's cuBLAS paths for groups == 1 (kernels/conv_2d/): pointwise GEMMs, and im2col / col2im.
_add("gemm_pointwise_batch_3_c64", (3, 64, 3, 5), _conv(9, (1, 1), use_bias=True),
     description="pointwise GEMM path: batch 3 (a strided batched GEMM, the filter gradient summed per image), "
                 "64 input channels")
_add("columns_k3_s2_p1_batch_3_c8", (3, 8, 9, 8), _conv(5, (3, 3), (2, 2), (1, 1)),
     description="im2col / col2im path: stride 2 with padding, batch 3")
_add("columns_dilation_2_batch_2", (2, 3, 9, 8), _conv(4, (3, 3), (1, 1), (1, 2), (2, 2)),
     description="im2col / col2im path with dilation 2 and unequal padding")
_add("columns_kernel_2x3_stride_1x2_batch_2", (2, 3, 6, 9), _conv(4, (2, 3), (1, 2), (0, 1)),
     description="im2col / col2im path: asymmetric kernel and stride")
_add("columns_k1_s2", (2, 3, 5, 6), _conv(4, (1, 1), (2, 2)),
     description="a strided 1x1: not pointwise, so im2col / col2im (most input pixels get no gradient)")
_add("columns_k1_pad_1", (2, 3, 4, 3), _conv(2, (1, 1), padding=(1, 1), use_bias=True),
     description="a padded 1x1: the output's border is the bias alone")
_add("zero_batch", (0, 3, 5, 4), _conv(2, (3, 3), (1, 1), (1, 1), use_bias=True),
     description="N = 0: nothing to compute; filter and bias gradients are zero")

# Fused activations after the bias. Filters are eighths in [-0.5, 0.375] (modulus 8: a period
# that divides no stride of a 3x3 or 7x7 filter, where 9 made every plane alike) so that the
# pre-activations stay in about [-4, 4], where every activation still bends; the
# pre-activations themselves are exact, so RELU is exact. For the others every
# activation value and derivative is a few ulps off in the case's dtype (NumPy's exp,
# tanh and erf within 1 ulp, CUDA's expf, tanhf and erff within 2), and the gradients
# then add such values, some with cancellation (a small input_grad element made of
# larger terms). Each bound is the largest error measured over every tensor of the case
# on the CPU and on the H200 (tools/measure_ulps.py; the two agree within an ulp, CUDA's
# math being within 2 ulps of the exact value): sigmoid 3 (its input_grad: 1 - s
# cancels), tanh 2, gelu 1, silu 2, the depthwise silu 2, the float64 cases 1.
_ACTIVATION_TOLERANCE = {
    Activation.RELU: EXACT,
    Activation.SIGMOID: ulp(3),
    Activation.TANH: ulp(2),
    Activation.GELU: ulp(1),
    Activation.SILU: ulp(2),
}
for _activation, _tolerance in _ACTIVATION_TOLERANCE.items():
    _add(f"k3_s1_p1_bias_{_activation.name.lower()}", (2, 3, 4, 5),
         _conv(4, (3, 3), (1, 1), (1, 1), use_bias=True, activation=_activation), tolerance=_tolerance,
         filter_scale=0.125, positive_output_grad=True, description=f"3x3 conv with bias, then {_activation.name}")
_add("depthwise_k3_s2_p1_silu", (1, 4, 7, 6), _conv(4, (3, 3), (2, 2), (1, 1), groups=4, activation=Activation.SILU),
     tolerance=ulp(2), filter_scale=0.125, positive_output_grad=True,
     description="depthwise stride 2, then SILU (YOLOv10's Conv activation)")
_add("f64_k3_s2_p1_bias_gelu", (2, 3, 6, 5), _conv(4, (3, 3), (2, 2), (1, 1), use_bias=True, activation=Activation.GELU),
     dtype=np.float64, tolerance=ulp(1), filter_scale=0.125, positive_output_grad=True)
# Against the correctly rounded golden: the input gradient sums five rounded f'(x) dy w terms, 2 ulps on the CPU.
_add("f64_k1_silu", (2, 3, 4, 5), _conv(5, (1, 1), activation=Activation.SILU), dtype=np.float64, tolerance=ulp(2),
     filter_scale=0.125, positive_output_grad=True)


# Inference states (backward=False): no pre-activation kept, the bias and activation applied as one
# epilogue (in the depthwise kernel, else one conv_bias_activation launch on the GPU); the forward only.
# YOLOv10's fused inference convs: 3x3 and 1x1 with bias and SILU, RepVGGDW folded into a 7x7 depthwise
# with bias and SILU, SCDown's depthwise with bias alone. The pre-activations are exact (as above) and
# SILU's value is a few ulps off in the dtype: the forward's bound of the cases above, 2 (float64: 1).
def _inference(out_channels, kernel, stride=(1, 1), padding=(0, 0), groups=1, activation=Activation.SILU):
    return dataclasses.replace(_conv(out_channels, kernel, stride, padding, groups=groups, use_bias=True,
                                     activation=activation), backward=False)


_add("inference_k3_s1_p1_bias_silu", (2, 3, 4, 5), _inference(4, (3, 3), padding=(1, 1)), tolerance=ulp(2),
     filter_scale=0.125, description="fused inference: 3x3 conv, bias and SILU, no backward")
_add("inference_k1_bias_silu", (2, 5, 6, 7), _inference(3, (1, 1)), tolerance=ulp(2), filter_scale=0.125,
     description="fused inference: 1x1 conv (pointwise), bias and SILU, no backward")
_add("inference_depthwise_k7_p3_bias_silu", (1, 4, 9, 10), _inference(4, (7, 7), padding=(3, 3), groups=4),
     tolerance=ulp(2), filter_scale=0.125, description="fused inference: RepVGGDW folded, depthwise 7x7, bias, SILU")
_add("inference_depthwise_k3_s2_p1_bias", (2, 4, 9, 8), _inference(4, (3, 3), (2, 2), (1, 1), groups=4, activation=None),
     description="fused inference: SCDown cv2 folded, depthwise 3x3 stride 2 with bias, no activation")
_add("f64_inference_k1_bias_silu", (2, 3, 4, 5), _inference(5, (1, 1)), dtype=np.float64, tolerance=ulp(1),
     filter_scale=0.125, description="fused inference in float64")


# --------------------------------------------------------------------------- half precision

# Measured on the CPU and the H200 (tools/measure_ulps.py, 2026-12-01; ulps of the half dtype, with the
# floor of one ulp of the tensor's largest value), the same on both devices: the GPU rounds at the same
# points (kernels/conv_2d/__init__.py) and its float32 sums of these values are exact. Every half case
# not listed measured 0 on both (EXACT); so did the tensors listed 0 or -, the - having no such tensor.
#
#   case                              output  input_grad  filter_grad  bias_grad
#   bf16_groups_2_c4_o6_bias             1        0           0           0      (the bias: two roundings)
#   bf16_pointwise_batch_3_c64           1        0           0           0      (the bias: two roundings)
#   f16_k3_s1_p1_bias_silu               0        1           1           0      (the rounded activation
#   bf16_k3_s1_p1_bias_silu              0        1           1           0       gradient, then sums with
#   f16_k3_s1_p1_bias_sigmoid            0        1           1           0       cancellation)
#   bf16_k3_s1_p1_bias_sigmoid           0        1           1           1
#   f16_depthwise_k3_s2_p1_silu          0        1           1           -
#   bf16_depthwise_k3_s2_p1_silu         0        1           1           -
#   f16_inference_*_silu                 0        -           -           -      (SILU of the rounded
#   bf16_inference_k3_s1_p1_bias_silu    0        -           -           -       pre-activation, rounded:
#   bf16_inference_depthwise_k7_..._silu 1        -           -           -       a half-way point apart)
#
# The activation outputs measured 0 on the H200 too: CUDA's expf (within 2 float32 ulps of NumPy's)
# moves none of these values across a rounding boundary of the half dtype.
_MEASURED = {  # name -> {tensor: ulps}, the table above; a tensor absent is EXACT
    "bf16_groups_2_c4_o6_bias": {"output": 1},
    "bf16_pointwise_batch_3_c64": {"output": 1},
    **{f"{prefix}_{name}": {"input_grad": 1, "filter_grad": 1} for prefix in ("f16", "bf16")
       for name in ("k3_s1_p1_bias_silu", "k3_s1_p1_bias_sigmoid", "depthwise_k3_s2_p1_silu")},
    "bf16_inference_depthwise_k7_p3_bias_silu": {"output": 1},
}
_MEASURED["bf16_k3_s1_p1_bias_sigmoid"]["bias_grad"] = 1
_HALF_TOLERANCE = {
    name: {"*": EXACT, **{tensor: ulp(ulps) for tensor, ulps in tensors.items()}} for name, tensors in _MEASURED.items()
}


def _half(name, input_dims, attrs, tolerance=EXACT, **options):
    for prefix, dtype in (("f16", np.float16), ("bf16", BFLOAT16)):
        bound = _HALF_TOLERANCE.get(f"{prefix}_{name}", tolerance)
        _add(f"{prefix}_{name}", input_dims, attrs, dtype=dtype, tolerance=bound, **options)


_half("yolo_stem_k3_s2_p1", (1, 3, 9, 10), _conv(4, (3, 3), (2, 2), (1, 1)), description="the first conv")
_half("yolo_k1_s1", (2, 5, 6, 7), _conv(3, (1, 1)), description="1x1 conv")
_half("yolo_k3_s1_p1", (1, 4, 7, 6), _conv(5, (3, 3), (1, 1), (1, 1)), description="C2f bottleneck 3x3")
_half("yolo_k3_s2_p1_downsample", (2, 4, 8, 7), _conv(6, (3, 3), (2, 2), (1, 1)), description="backbone downsample")
_half("yolo_scdown_depthwise_k3_s2_p1", (2, 4, 9, 8), _conv(4, (3, 3), (2, 2), (1, 1), groups=4),
      description="SCDown cv2: depthwise 3x3 stride 2")
_half("yolo_depthwise_k7_p3", (1, 3, 9, 10), _conv(3, (7, 7), (1, 1), (3, 3), groups=3),
      description="C2fCIB: depthwise 7x7")
_half("yolo_depthwise_multiplier_2_bias", (1, 3, 6, 5), _conv(6, (3, 3), (1, 1), (1, 1), groups=3, use_bias=True),
      description="depthwise, 2 filters per channel, with bias (the depthwise kernel's own bias add)")
_half("yolo_head_1x1_bias", (2, 6, 5, 4), _conv(7, (1, 1), use_bias=True), description="head 1x1 with bias")
_half("yolo_head_k3_p1_bias", (1, 4, 5, 6), _conv(3, (3, 3), (1, 1), (1, 1), use_bias=True),
      description="head 3x3 with bias")
_half("yolo_dfl_1x1_16_to_1", (1, 16, 4, 8), _conv(1, (1, 1)), filter=np.arange(16, dtype=np.float64).reshape(1, 16, 1, 1),
      description="DFL decode: bins 0..15")
_half("groups_2_c4_o6_bias", (2, 4, 6, 5), _conv(6, (3, 3), (1, 1), (1, 1), groups=2, use_bias=True),
      description="2 groups, with bias")
_half("pointwise_batch_3_c64", (3, 64, 3, 5), _conv(9, (1, 1), use_bias=True),
      description="pointwise, 64 input channels, batch 3")
_half("zero_batch", (0, 3, 5, 4), _conv(2, (3, 3), (1, 1), (1, 1), use_bias=True), description="N = 0")
for _activation in (Activation.SILU, Activation.SIGMOID):
    _half(f"k3_s1_p1_bias_{_activation.name.lower()}", (2, 3, 4, 5),
          _conv(4, (3, 3), (1, 1), (1, 1), use_bias=True, activation=_activation), filter_scale=0.125,
          positive_output_grad=True, description=f"3x3 conv with bias, then {_activation.name}")
_half("depthwise_k3_s2_p1_silu", (1, 4, 7, 6), _conv(4, (3, 3), (2, 2), (1, 1), groups=4, activation=Activation.SILU),
      filter_scale=0.125, positive_output_grad=True, description="depthwise stride 2, then SILU")

# Inference states in half: the epilogue kernels (conv_bias_activation, the depthwise forward's own)
# round at the same points as the backward states' separate passes.
_half("inference_k3_s1_p1_bias_silu", (2, 3, 4, 5), _inference(4, (3, 3), padding=(1, 1)), filter_scale=0.125,
      description="fused inference: 3x3 conv, bias and SILU, no backward")
_half("inference_depthwise_k7_p3_bias_silu", (1, 4, 9, 10), _inference(4, (7, 7), padding=(3, 3), groups=4),
      filter_scale=0.125, description="fused inference: depthwise 7x7, bias, SILU")

# float16's largest finite value is 65504. A 1x1 conv of 3 channels of about 200 with filter (240, 240,
# -240): at the 3 pixels partial sums 48000, 96000 (inf in a float16 accumulator), 48000; 49920, 96000,
# 46080; 46080, 97920, 49920; the bias -32 gives 47968, 46048, 49888 (each exact in float16). The
# filter gradient sums over the 3 pixels of gradients (200, 200, -200) times the input: partial sums
# 40000, 81600, 43200; 40000, 78400, 35200; 40000, 81600, 41600.
_add("f16_partial_sums_past_65504", (1, 3, 1, 3), _conv(1, (1, 1), use_bias=True), dtype=np.float16,
     input=np.array([[200.0, 208.0, 192.0], [200.0, 192.0, 216.0], [200.0, 208.0, 200.0]]).reshape(1, 3, 1, 3),
     filter=np.array([240.0, 240.0, -240.0]).reshape(1, 3, 1, 1),
     bias=np.array([-32.0]), output_grad=np.array([200.0, 200.0, -200.0]).reshape(1, 1, 1, 3),
     description="float16: partial sums past 65504 in the forward and the filter gradient, carried in float32")
# float16's subnormals are below 2^-14: inputs, filters and output gradients of 2^-8 scale give
# products of 2^-20 and sums around 2^-14, rounded to float16's subnormal spacing 2^-24.
_add("f16_subnormal_results", (1, 3, 5, 4), _conv(2, (3, 3), (1, 1), (1, 1)), dtype=np.float16,
     input=pattern((1, 3, 5, 4)) * 2.0 ** -8, filter=pattern((2, 3, 3, 3), modulus=8, offset=2) * 2.0 ** -8,
     output_grad=pattern((1, 2, 5, 4), modulus=11, offset=4) * 2.0 ** -8,
     description="float16: results below 2^-14 (subnormal) and just above")
# bfloat16 on a long reduction: 512 channels of a 3x3 kernel, 4608 terms of (1, 1.25, ... or 2) * (1, 1.125,
# ... or 1.75) per output (fewer at the border); the float32 sum (about 10000, in 32nds) needs 19 bits and
# is rounded once to 8. Periods 5 and 7 divide no stride of these dims (9 * 2^k, 3, 1).
_add("bf16_long_reduction_c512_k3", (1, 512, 3, 3), _conv(2, (3, 3), padding=(1, 1)), dtype=BFLOAT16,
     input=(1 + (np.arange(512 * 9) % 5) * 0.25).reshape(1, 512, 3, 3),
     filter=(1 + (np.arange(2 * 512 * 9) % 7) * 0.125).reshape(2, 512, 3, 3),
     description="bfloat16: 4608-term sums rounded once to the 8-bit mantissa")

# --- GPU launch shapes (tests/test_gpu_paths.py). Dilation 55 on a 3x3 kernel: one output's taps reach a
# 111x111 input region, past the shared memory of a tiled depthwise block (conv_2d/plan.py
# DEPTHWISE_SHARED_LIMIT), so the untiled depthwise forward runs (a thread an output).
_add("depthwise_dilation_55_untiled", (1, 2, 111, 112), _conv(2, (3, 3), dilation=(55, 55), groups=2, use_bias=True),
     description="a depthwise tap region past a block's shared memory: the untiled depthwise forward")
# --- end of GPU launch shapes


# --------------------------------------------------------------------------- non-finite output gradients
# NaN, +inf and -inf in output_grad, at border and inner outputs: every input, filter and bias gradient
# that sums one of them is NaN or infinite (a zero filter or input value times inf is NaN), on each path
# (direct, depthwise, pointwise, columns) and through an activation's derivative (relu'(x <= 0) = 0:
# PyTorch's threshold_backward gives 0 there, not 0 * NaN). Finite elements as in the cases above.
def _nonfinite_grad(attrs, input_dims, positions, positive=False):
    values = pattern(conv_2d.output_dims(attrs, input_dims), modulus=11, offset=4) + (1.5 if positive else 0.0)
    return nonfinite(values, positions)


for _name, _dims, _attrs, _positions, _tolerance, _scale in (
        ("k3_s2_p1_bias", (2, 3, 7, 6), _conv(4, (3, 3), (2, 2), (1, 1), use_bias=True), (0, 5, 17, 30, 47), EXACT, 0.25),
        ("depthwise_k3_s2_p1", (1, 4, 7, 6), _conv(4, (3, 3), (2, 2), (1, 1), groups=4), (0, 13, 26, 40, 47), EXACT, 0.25),
        ("pointwise_bias", (2, 5, 3, 4), _conv(3, (1, 1), use_bias=True), (1, 14, 30, 45, 71), EXACT, 0.25),
        ("k3_s1_p1_bias_relu", (2, 3, 4, 5), _conv(4, (3, 3), (1, 1), (1, 1), use_bias=True, activation=Activation.RELU),
         (0, 7, 22, 41, 66, 100, 159), EXACT, 0.125),
        ("k3_s1_p1_bias_silu", (2, 3, 4, 5), _conv(4, (3, 3), (1, 1), (1, 1), use_bias=True, activation=Activation.SILU),
         (0, 7, 22, 41, 66, 100, 159), ulp(2), 0.125)):
    _add(f"nonfinite_grad_{_name}", _dims, _attrs, tolerance=_tolerance, filter_scale=_scale,
         output_grad=_nonfinite_grad(_attrs, _dims, _positions, positive=_scale < 0.25),
         description="NaN, +inf and -inf in output_grad")
# --------------------------------------------------------------------------- end of non-finite output gradients


def _torch_activation(activation, value):
    import torch
    import torch.nn.functional as F

    if activation is None:
        return value
    return {
        Activation.RELU: torch.relu, Activation.SIGMOID: torch.sigmoid, Activation.TANH: torch.tanh,
        Activation.GELU: F.gelu, Activation.SILU: F.silu,
    }[activation](value)


# --------------------------------------------------------------------------- medium cases
# Past the sizes the CPU code gates on (kernels.runtime.cpu_paths): output rows 140 wide (im2col as a strided
# view, forward and filter gradient), a 4 MB im2col (its channels shared out to the threads) and two
# groups of it (the grouped products shared out). No activation: every sum exact.
_add("medium_wide_rows_groups2_threads", (1, 8, 100, 140), _conv(8, (3, 3), (1, 1), (1, 1), groups=2),
     description="k3 s1 p1, 2 groups, 100x140 outputs: wide rows, channels and groups shared out")
# Rows 64 wide or more take the strided im2col of the padded input (cpu.WIDE_ROWS_BELOW), whose padding,
# stride and dilation only the medium case above reached, all square: two small ones with one padding
# 0 and the other not, each way, beside stride and dilation along one axis.
_add("wide_rows_pad_0x2_stride_1x2_dilation_1x2", (1, 3, 6, 133), _conv(4, (3, 3), (1, 2), (0, 2), (1, 2)),
     description="67 outputs a row: im2col as a strided view, padded along W only, stride and dilation 2 along W")
_add("wide_rows_pad_2x0_kernel_2x3_bias", (2, 2, 5, 70), _conv(3, (2, 3), (1, 1), (2, 0), use_bias=True),
     description="68 outputs a row: padded along H only (two rows of zeros above and below), batch 2, bias")


def torch_program(case, tensors):
    import torch
    import torch.nn.functional as F

    attrs = case.attrs
    input = tensors["input"].requires_grad_()
    filter = tensors["filter"].requires_grad_()
    bias = tensors["bias"].requires_grad_() if attrs.use_bias else None
    pre = F.conv2d(input, filter, bias, stride=(attrs.stride_h, attrs.stride_w),
                   padding=(attrs.padding_h, attrs.padding_w), dilation=(attrs.dilation_h, attrs.dilation_w),
                   groups=attrs.groups)
    output = _torch_activation(attrs.activation, pre)
    if not attrs.backward:
        return {"output": output}
    wanted = [input, filter] + ([bias] if bias is not None else [])
    grads = torch.autograd.grad(output, wanted, tensors["output_grad"], allow_unused=True)
    # An unused gradient (N = 0) is a zero gradient.
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(wanted, grads)]
    expected = {"output": output, "input_grad": grads[0], "filter_grad": grads[1]}
    if bias is not None:
        expected["bias_grad"] = grads[2]
    return expected


def exact_program(case, values):
    """For the cases with an activation, torch_program's math at high precision
    (conformance.exact): the convolution exactly (its coefficients from PyTorch's Jacobian), the
    activation and its derivative at high precision, and the gradients as exact sums of those
    terms, each rounded once. Without an activation every result is an exact sum of short
    dyadic products, which PyTorch's float64 already gives (no reference)."""
    from .. import exact

    attrs = case.attrs
    if attrs.activation is None:
        return {}
    import torch.nn.functional as F

    def convolution(input, filter, bias=None):
        return F.conv2d(input, filter, bias, stride=(attrs.stride_h, attrs.stride_w),
                        padding=(attrs.padding_h, attrs.padding_w), dilation=(attrs.dilation_h, attrs.dilation_w),
                        groups=attrs.groups)

    names = ["input", "filter"] + (["bias"] if attrs.use_bias else [])
    maps = exact.linear_maps(convolution, [case.inputs[name] for name in names])
    pre = maps[0].forward(values["input"])
    if attrs.use_bias:
        pre = pre + maps[2].forward(values["bias"])
    output, derivative = exact.activation(attrs.activation.name, pre)
    if not attrs.backward:
        return {"output": output}
    grad = values["output_grad"] * derivative
    if attrs.activation is Activation.RELU:
        # PyTorch's threshold_backward selects: 0 where relu' is 0, even where dy is NaN or infinite.
        grad = exact.where(lambda d: d == 0, derivative, 0 * derivative, grad)
    expected = {"output": output}
    for name, linear in zip(names, maps):
        expected[name + "_grad"] = linear.adjoint(grad)
    return expected
