"""batch_norm cases: SPATIAL and PER_ACTIVATION, with and without gamma/beta,
YOLOv10's eps 1e-3 / momentum 0.03 with SiLU, other eps and momentum, the
cumulative average (momentum None), inference after training, every fused
activation, rank 2 and 3 inputs, float64, and a channel long enough that the GPU
reduces it in several parts.

Every case runs two steps on one state (forward then backward each): the
expected tensors are each step's output and gradients (``*_step2`` for the
second) and the running statistics after both. ``extra["steps"]`` says which
steps train (True) and which infer (False).

Values: pattern() fractions; most channels hold 8, 16 or 32 values so that the
batch mean and variance are exact in float32 (one case holds 45, for an inexact
mean). What stays inexact is 1/sqrt(var + eps) (eps is no power of two, the root
rarely exact), the unbiased variance (divided by count - 1) and a momentum like
0.1 or 0.03: those tensors carry ulp bounds, measured on the CPU against the
float64 golden (see TOL).
"""

import numpy as np

from kernels import BatchNormAttrs, BatchNormMode
from kernels.runtime.core import BFLOAT16, HALF_DTYPES

from ..case import EXACT, CaseTable, nonfinite, pattern, ulp

TABLE = CaseTable("batch_norm")

SPATIAL, PER_ACTIVATION = BatchNormMode.SPATIAL, BatchNormMode.PER_ACTIVATION

# Bounds: the smallest n for which conformance.compare passes (its floor
# included), measured on the CPU against the golden (torch in float64, rounded)
# over every case of a group, and checked to cover the GPU's math library by
# perturbing every activation value and derivative on the CPU by CUDA's error
# (tests/test_batch_norm.py::test_activation_bounds_cover_cuda_math). Why not exact:
# - invstd = 1/sqrt(var + eps) is rounded (eps is no power of two): outputs and
#   gradients are the float64 result rounded once more to float32 (0 ulps
#   measured in most float32 cases, 1 where a tie breaks differently); in float64
#   torch's formula (x * (invstd * gamma) + (beta - mean * invstd * gamma)) and
#   ours ((x - mean) * invstd * gamma + beta) round differently (1 ulp).
# - the running statistics are kept in the dtype and rounded after each step,
#   where the golden rounds once after both; an inference step after training
#   normalizes with those rounded statistics (1 ulp).
# - input_grad cancels ((g - mean(g) - xhat * mean(g * xhat)) * invstd * gamma):
#   elements near zero are only as accurate as the largest ones, which the floor
#   of the comparison (n ulps of the tensor's largest magnitude) accounts for.
# - with an activation, the pre-activation is rounded to the dtype (the kernel
#   keeps it), f and f' are evaluated in float64 at it: 1 ulp in float32, where
#   the last rounding hides which device's exp/erf/tanh ran (GPU emulated: 1).
# beta_grad without an activation is a sum of short dyadic values: exact.
TOL = {"*": ulp(1), "beta_grad": EXACT, "beta_grad_step2": EXACT}
TOL_ACTIVATION = {"*": ulp(1)}
# float64 with SiLU: nothing rounds the math library's error away. Measured over every
# tensor against the correctly rounded golden (tools/measure_ulps.py): 2 ulps on the CPU
# (beta_grad and the second step's gradients, sums whose terms cancel), 3 on the H200
# (gamma_grad_step2, a sum of 32 rounded terms in the GPU's order).
TOL_ACTIVATION_F64 = {"*": ulp(2), "gamma_grad_step2": ulp(3)}


def _steps_inputs(dims, offset=0):
    """The two steps' inputs and output gradients: varied, never all ones (pattern steps by 7: no modulus 7)."""
    return {
        "input": pattern(dims, modulus=13, scale=0.5, offset=offset),
        "output_grad": pattern(dims, modulus=11, scale=0.25, offset=offset + 3),
        "input_step2": pattern(dims, modulus=19, scale=0.25, offset=offset + 5),
        "output_grad_step2": pattern(dims, modulus=9, scale=0.5, offset=offset + 1),
    }


def _exact_channels(dims, means, deviation_sets, stride):
    """An input (N, C, H, W) with N*H*W = 16 whose channel c holds means[c] plus the 16 values of
    deviation_sets[c] (variance 1 or 13: with eps 3, var + eps is 4 or 16, so invstd is 1/2 or 1/4),
    shuffled by k -> (k + 1) * stride mod 17, a permutation of 0..15 (17 is prime): unlike a stride
    mod 16, it leaves no period of 2 or 4 along N, H or W for a wrong stride to hide behind."""
    sets = {1: [1, -1] * 8, 13: [1, -1, 5, -5] * 4}
    order = (np.arange(1, 17) * stride) % 17 - 1
    channels = [means[c] + np.array(sets[deviation_sets[c]], np.float64)[order] for c in range(dims[1])]
    n, h, w = dims[0], dims[2], dims[3]
    return np.stack([v.reshape(n, h, w) for v in channels], axis=1)


def _add(name, dims, *, mode=SPATIAL, affine=True, eps=1e-5, momentum=0.1, activation=None, steps=(True, True),
         dtype=np.float32, tolerance=None, description="", inputs=None, input_grad=True):
    attrs = BatchNormAttrs(affine=affine, eps=eps, momentum=momentum, mode=mode, activation=activation)
    inputs = _steps_inputs(dims) if inputs is None else inputs
    if affine:
        stat_dims = (dims[1],) if mode is SPATIAL else tuple(dims[1:])
        inputs["gamma"] = pattern(stat_dims, modulus=9, scale=0.5, offset=5)  # includes 0 and negatives
        inputs["beta"] = pattern(stat_dims, modulus=5, scale=0.25, offset=1)
    if tolerance is None:
        tolerance = TOL if activation is None else TOL_ACTIVATION
    extra = {} if input_grad else {"input_grad": False}
    if np.dtype(dtype) in HALF_DTYPES:
        # Half data: gamma, beta, their gradients and the running statistics are float32 (mixed precision).
        if affine:
            extra["input_dtypes"] = {"gamma": np.float32, "beta": np.float32}
        extra["expected_dtypes"] = {name + suffix: np.float32 for suffix in ("", "_step2")
                                    for name in ("gamma_grad", "beta_grad")}
        extra["expected_dtypes"].update(running_mean=np.float32, running_var=np.float32)
    # input_grad=False: backward is given no input_grad (the GPU's SPATIAL finalize path); only then in extra.
    TABLE.add(name, attrs, inputs, dtype=dtype, tolerance=tolerance, description=description, steps=tuple(steps),
              **extra)


_add("spatial_affine_2x3x2x4", (2, 3, 2, 4), description="BatchNorm2d defaults, batch 2, H != W, 16 values a channel")
_add("spatial_no_affine_2x3x2x4", (2, 3, 2, 4), affine=False, description="no gamma/beta")
_add("spatial_affine_3x2x3x5", (3, 2, 3, 5), description="45 values a channel: an inexact mean")
_add("spatial_affine_f64", (2, 3, 2, 4), dtype=np.float64)
_add("per_activation_affine_4x2x3x2", (4, 2, 3, 2), mode=PER_ACTIVATION,
     description="statistics over N only, gamma/beta (C, H, W)")
_add("per_activation_no_affine_8x3x1x2", (8, 3, 1, 2), mode=PER_ACTIVATION, affine=False)
# Against the correctly rounded golden the CPU's step-2 input gradient (sums of rounded terms that
# cancel) measures 2 ulps.
_add("per_activation_f64", (4, 2, 3, 2), mode=PER_ACTIVATION, dtype=np.float64,
     tolerance={**TOL, "input_grad_step2": ulp(2)})
_add("yolov10_silu_2x4x2x4", (2, 4, 2, 4), eps=1e-3, momentum=0.03, activation="SILU",
     description="YOLOv10's Conv -> BatchNorm(eps 1e-3, momentum 0.03) -> SiLU")
_add("yolov10_silu_1x4x4x8", (1, 4, 4, 8), eps=1e-3, momentum=0.03, activation="SILU",
     description="YOLOv10 at batch 1 (statistics over H x W only)")
_add("yolov10_silu_eval_2x4x2x4", (2, 4, 2, 4), eps=1e-3, momentum=0.03, activation="SILU", steps=(True, False),
     description="YOLOv10's eval: BatchNorm + SiLU with the running statistics of a training step (on the GPU "
                 "the inference kernel in 16-byte packs, 8 values a plane)")
_add("yolov10_silu_f64", (2, 4, 2, 4), eps=1e-3, momentum=0.03, activation="SILU", dtype=np.float64,
     tolerance=TOL_ACTIVATION_F64)
_add("exact_eps3_momentum_half", (2, 2, 2, 4), eps=3.0, momentum=0.5,
     inputs=dict(_steps_inputs((2, 2, 2, 4)),
                 input=_exact_channels((2, 2, 2, 4), (0.5, -1.0), (1, 13), 5),
                 input_step2=_exact_channels((2, 2, 2, 4), (2.0, 0.25), (13, 1), 3)),
     tolerance={"*": EXACT, "running_var": ulp(1)},
     description="var + eps a power of 4: every result exact, and the same bits on every device "
                 "(but the unbiased running variance, divided by 15)")
_add("eps_half_momentum_quarter", (2, 3, 2, 4), eps=0.5, momentum=0.25, description="non-default eps and momentum")
_add("eps_1e-1_momentum_0_9_per_activation", (4, 3, 2, 2), mode=PER_ACTIVATION, eps=0.1, momentum=0.9)
_add("momentum_none_cumulative", (2, 3, 2, 4), momentum=None,
     description="cumulative average: momentum 1 then 1/2 over the two steps")
_add("momentum_none_per_activation_no_affine", (4, 2, 2, 3), mode=PER_ACTIVATION, affine=False, momentum=None)
_add("momentum_zero", (2, 2, 2, 4), momentum=0.0, description="momentum 0: running statistics unchanged")
_add("momentum_one", (2, 2, 2, 4), momentum=1.0, description="momentum 1: running statistics are the last batch's")
_add("inference_after_training", (2, 3, 2, 4), eps=1e-3, momentum=0.03, steps=(True, False),
     description="step 2 infers with the running statistics of step 1, and backward is the inference gradient")
_add("inference_after_training_silu_per_activation", (4, 2, 2, 2), mode=PER_ACTIVATION, activation="SILU",
     steps=(True, False))
_add("inference_after_training_no_affine_f64", (2, 3, 2, 4), affine=False, steps=(True, False), dtype=np.float64)
_add("relu_2x3x2x4", (2, 3, 2, 4), activation="RELU")
_add("sigmoid_2x3x2x4", (2, 3, 2, 4), activation="SIGMOID")
_add("tanh_2x3x2x4", (2, 3, 2, 4), activation="TANH")
_add("gelu_2x3x2x4", (2, 3, 2, 4), activation="GELU")
_add("rank2_8x5", (8, 5), description="(N, C): BatchNorm1d")
_add("rank2_8x5_per_activation", (8, 5), mode=PER_ACTIVATION, affine=False)
_add("rank3_4x3x4", (4, 3, 4), momentum=0.5, description="(N, C, L): BatchNorm1d over N and L")
_add("long_channel_1x2x40x56", (1, 2, 40, 56), eps=1e-3, momentum=0.03, activation="SILU",
     description="2240 values a row: the GPU reduces each row in two parts (2048 + 192)")
_add("zero_size_channels", (2, 0, 3, 4), affine=False, description="no channels: nothing to do")
_add("zero_batch_training", (0, 3, 2, 2),
     description="channels with no values (batch 0), training: the running statistics stay as they were and the "
                 "gamma and beta gradients are zero, as torch gives")
_add("no_input_grad_2x3x2x4", (2, 3, 2, 4), input_grad=False,
     description="input_grad not wanted (None): gamma_grad and beta_grad only (the GPU's SPATIAL finalize kernel)")


# --------------------------------------------------------------------------- float16 and bfloat16
# Half data, float32 gamma / beta / running statistics / their gradients (PyTorch's mixed precision).
# Bounds in ulps of each tensor's own dtype, measured on the CPU and the H200 (tools/measure_ulps.py,
# 2026-12-01): HALF_MEASURED states the larger of the two devices' needs for every tensor that needs
# any (a tensor absent measured 0 on both: EXACT). The two devices measured the same but where noted.
# - Without an activation: every half output and input_grad, and the float32 gamma_grad and beta_grad,
#   0 on both. The float32 running statistics are rounded after each step where the golden rounds once
#   after both: running_mean and running_var 1 in per_activation_affine, running_var 1 in near_max,
#   running_mean 1 in subnormal_bf16; 0 elsewhere (exact_eps3_momentum_half's running_var included).
# - With SiLU (yolov10_silu, long_channel_bf16): output and input_grad 1 ulp of the half dtype (SiLU in
#   float32 at the rounded pre-activation, rounded once), running_mean 1 in yolov10_silu.
#   gamma_grad and beta_grad are float32 sums of g = dy * f'(pre) at the pre-activation rounded to
#   half, where the golden takes f' at the exact one: one half rounding, relative 2^-11 (float16) or
#   2^-8 (bfloat16), is up to 2^12 or 2^15 float32 ulps of the sum, and the sums cancel. Measured
#   CPU / H200 where they differ (the H200 sums in another order): float16 yolov10_silu
#   gamma_grad_step2 1721 / 1723; bfloat16 yolov10_silu beta_grad 5525 / 5526, gamma_grad_step2
#   24811 / 24810, beta_grad_step2 7249 / 7250; long_channel_bf16 beta_grad 5499 / 5500,
#   beta_grad_step2 6949 / 6948.
#   yolov10_silu_eval (a training step, then eval with its running statistics and the inference
#   backward): the first step is yolov10_silu's (the same bounds); the eval step's output and input_grad
#   1 ulp, its gamma_grad and beta_grad (same reason) float16 619 and 1015 / 1016 (CPU / H200),
#   bfloat16 12154 and 17646 / 17645.
_HALF = {"f16": np.float16, "bf16": BFLOAT16}
_SILU_HALF = {name: 1 for name in ("output", "input_grad", "output_step2", "input_grad_step2")}
HALF_MEASURED = {  # name -> {tensor: ulps}; a tensor absent is EXACT
    "yolov10_silu_2x4x2x4_f16": {**_SILU_HALF, "running_mean": 1, "gamma_grad": 672, "beta_grad": 845,
                                 "gamma_grad_step2": 1723, "beta_grad_step2": 1025},
    "yolov10_silu_2x4x2x4_bf16": {**_SILU_HALF, "running_mean": 1, "gamma_grad": 2087, "beta_grad": 5526,
                                  "gamma_grad_step2": 24811, "beta_grad_step2": 7250},
    "yolov10_silu_eval_2x4x2x4_f16": {**_SILU_HALF, "gamma_grad": 672, "beta_grad": 845,
                                      "gamma_grad_step2": 619, "beta_grad_step2": 1016},
    "yolov10_silu_eval_2x4x2x4_bf16": {**_SILU_HALF, "gamma_grad": 2087, "beta_grad": 5526,
                                       "gamma_grad_step2": 12154, "beta_grad_step2": 17646},
    "long_channel_bf16": {**_SILU_HALF, "gamma_grad": 3752, "beta_grad": 5500,
                          "gamma_grad_step2": 9376, "beta_grad_step2": 6949},
    "per_activation_affine_4x2x3x2_f16": {"running_mean": 1, "running_var": 1},
    "per_activation_affine_4x2x3x2_bf16": {"running_mean": 1, "running_var": 1},
    "near_max_2x3x2x4_f16": {"running_var": 1},
    "near_max_2x3x2x4_bf16": {"running_var": 1},
    "subnormal_bf16": {"running_mean": 1},
}


def _half_tolerance(name):
    return {"*": EXACT, **{tensor: ulp(ulps) for tensor, ulps in HALF_MEASURED.get(name, {}).items()}}


def _big_channels(dims):
    """Values near the float16 maximum, exact in float16 and bfloat16 (multiples of 256 up to 65280):
    channel 0 holds +-65280 and +-60160 (mean 0, variance about 4e9: its square overflows in half),
    channel 1 holds 64768..65280 (its sum of 16 overflows in half, its mean does not)."""
    n, c, h, w = dims
    count = n * h * w
    signs = np.where(np.arange(count) % 2 == 0, 1.0, -1.0)
    magnitudes = np.where(np.arange(count) % 4 < 2, 65280.0, 60160.0)
    first = signs * magnitudes
    second = 65280.0 - 256.0 * (np.arange(count) % 3)
    channels = [first, second] + [pattern((count,), modulus=7, scale=0.5, offset=k) for k in range(c - 2)]
    return np.stack([v.reshape(n, h, w) for v in channels], axis=1)


def _subnormal_inputs(dims, tiny):
    """Inputs k * tiny (tiny the dtype's smallest subnormal, k in -8..8) and short dyadic gradients."""
    inputs = _steps_inputs(dims)
    inputs["input"] = pattern(dims, modulus=17, scale=tiny)
    inputs["input_step2"] = pattern(dims, modulus=13, scale=tiny, offset=4)
    return inputs


for _suffix, _dtype in _HALF.items():
    _add(f"spatial_affine_2x3x2x4_{_suffix}", (2, 3, 2, 4), dtype=_dtype,
         tolerance=_half_tolerance(f"spatial_affine_2x3x2x4_{_suffix}"),
         description="half data, float32 gamma/beta/running statistics: two training steps")
    _add(f"yolov10_silu_2x4x2x4_{_suffix}", (2, 4, 2, 4), eps=1e-3, momentum=0.03, activation="SILU", dtype=_dtype,
         tolerance=_half_tolerance(f"yolov10_silu_2x4x2x4_{_suffix}"),
         description="YOLOv10's BatchNorm + SiLU in half: the SiLU in float32 at the rounded pre-activation")
    _add(f"yolov10_silu_eval_2x4x2x4_{_suffix}", (2, 4, 2, 4), eps=1e-3, momentum=0.03, activation="SILU",
         steps=(True, False), dtype=_dtype, tolerance=_half_tolerance(f"yolov10_silu_eval_2x4x2x4_{_suffix}"),
         description="YOLOv10's eval in half: BatchNorm + SiLU with the float32 running statistics of a "
                     "training step (on the GPU the inference kernel, one 16-byte pack a plane)")
    _add(f"inference_after_training_{_suffix}", (2, 3, 2, 4), eps=1e-3, momentum=0.03, steps=(True, False),
         dtype=_dtype, tolerance=_half_tolerance(f"inference_after_training_{_suffix}"),
         description="eval with the float32 running statistics of a training step")
    _add(f"per_activation_affine_4x2x3x2_{_suffix}", (4, 2, 3, 2), mode=PER_ACTIVATION, dtype=_dtype,
         tolerance=_half_tolerance(f"per_activation_affine_4x2x3x2_{_suffix}"))
    _add(f"exact_eps3_momentum_half_{_suffix}", (2, 2, 2, 4), eps=3.0, momentum=0.5, dtype=_dtype,
         inputs=dict(_steps_inputs((2, 2, 2, 4)),
                     input=_exact_channels((2, 2, 2, 4), (0.5, -1.0), (1, 13), 5),
                     input_step2=_exact_channels((2, 2, 2, 4), (2.0, 0.25), (13, 1), 3)),
         tolerance=_half_tolerance(f"exact_eps3_momentum_half_{_suffix}"),
         description="var + eps a power of 4: every half result exact")
    _add(f"near_max_2x3x2x4_{_suffix}", (2, 3, 2, 4), dtype=_dtype,
         inputs=dict(_steps_inputs((2, 3, 2, 4)), input=_big_channels((2, 3, 2, 4)),
                     input_step2=_big_channels((2, 3, 2, 4))[::-1].copy()),
         tolerance=_half_tolerance(f"near_max_2x3x2x4_{_suffix}"),
         description="values near 65504: sums and squares overflow in half arithmetic, not in the float64 "
                     "statistics; the running variance (about 4e9) is float32")
_add("long_channel_bf16", (2, 2, 48, 64), eps=1e-3, momentum=0.03, activation="SILU", dtype=BFLOAT16,
     tolerance=_half_tolerance("long_channel_bf16"),
     description="6144 values a channel (2 rows of 3072, 2 parts each on the GPU): a sum that stalls in "
                 "bfloat16 arithmetic (its 8-bit mantissa) but not in the float64 statistics")
_add("subnormal_f16", (2, 2, 2, 4), affine=False, eps=1.0, dtype=np.float16,
     inputs=_subnormal_inputs((2, 2, 2, 4), 2.0 ** -24), tolerance=_half_tolerance("subnormal_f16"),
     description="float16 subnormal inputs (multiples of 2^-24) widened exactly; with eps 1 the outputs "
                 "x - mean round to subnormals")
_add("subnormal_bf16", (2, 2, 2, 4), affine=False, eps=1.0, dtype=BFLOAT16,
     inputs=_subnormal_inputs((2, 2, 2, 4), 2.0 ** -133), tolerance=_half_tolerance("subnormal_bf16"),
     description="bfloat16 subnormal inputs (multiples of 2^-133) widened exactly; the outputs round to subnormals")


# --------------------------------------------------------------------------- non-finite output gradients
# NaN, +inf and -inf in output_grad. Training: input_grad sums g over its channel (or, PER_ACTIVATION,
# over N), so a channel holding one is NaN throughout, and so are its gamma_grad and beta_grad; the other
# channels are the finite cases'. Inference (the second step of steps (True, False)): g * gamma * invstd,
# element by element.
def _nonfinite_steps(dims, positions, positions_step2):
    inputs = _steps_inputs(dims)
    inputs["output_grad"] = nonfinite(inputs["output_grad"], positions)
    inputs["output_grad_step2"] = nonfinite(inputs["output_grad_step2"], positions_step2)
    return inputs


_add("nonfinite_grad_spatial_2x3x2x4", (2, 3, 2, 4), inputs=_nonfinite_steps((2, 3, 2, 4), (1, 10), (18, 30, 33)),
     description="a NaN in channel 0 and +inf in channel 1 (step 1), -inf and NaN in channel 2, +inf in channel 0 "
                 "(step 2): channel 1 of step 2 stays finite")
_add("nonfinite_grad_inference_after_training", (2, 3, 2, 4), eps=1e-3, momentum=0.03, steps=(True, False),
     inputs=_nonfinite_steps((2, 3, 2, 4), (), (0, 9, 20, 35, 46)),
     description="the inference gradient, element by element: NaN, +inf and -inf stay where they are")
_add("nonfinite_grad_per_activation_silu", (4, 2, 2, 2), mode=PER_ACTIVATION, activation="SILU",
     inputs=_nonfinite_steps((4, 2, 2, 2), (3, 12), (5, 22, 31)),
     description="PER_ACTIVATION with SiLU: a feature's NaN or infinity reaches every sample of that feature")
# --------------------------------------------------------------------------- end of non-finite output gradients


_TORCH_ACTIVATIONS = {
    "RELU": "relu", "SIGMOID": "sigmoid", "TANH": "tanh", "GELU": "gelu", "SILU": "silu",
}


# --------------------------------------------------------------------------- medium cases
# Past CPU_BLOCK_ELEMENTS (kernels.runtime.cpu_paths): rows of 65792 inner values cut into parts, in a pass worth
# two parts (4 MB at 16 bytes an element); and 64 rows of 1147, blocks of 57 of them. One training step.
# The second image is the first negated: every channel's mean is exactly 0 and its sum of squares
# exact, so float64 holds the statistics of these long sums to an ulp.


def _zero_mean(dims, **options):
    half = pattern((1,) + dims[1:], **options)
    return np.concatenate([half, -half])


for _name, _dims, _what in (
        ("medium_inner_parts_threads", (2, 2, 256, 257),
         "SPATIAL, 131584 values a channel: inner in parts, the blocks shared out to the threads"),
        ("medium_stat_groups", (2, 64, 31, 37), "SPATIAL, 64 channels of 2294: blocks of 57 channels' rows")):
    _add(_name, _dims, eps=1e-3, momentum=0.03, steps=(True,), description=_what,
         inputs={"input": _zero_mean(_dims, modulus=13, scale=0.5),
                 "output_grad": pattern(_dims, modulus=11, scale=0.25, offset=3)})


def torch_program(case, tensors):
    import torch
    import torch.nn.functional as F

    attrs = case.attrs
    dims = tuple(tensors["input"].shape)
    stat_dims = (dims[1],) if attrs.mode is SPATIAL else dims[1:]
    stats = int(np.prod(stat_dims, dtype=np.int64))
    running_mean = torch.zeros(stats, dtype=torch.float64)
    running_var = torch.ones(stats, dtype=torch.float64)
    trained = 0
    expected = {}
    for step, training in enumerate(case.extra["steps"]):
        suffix = "" if step == 0 else "_step2"
        input = tensors["input" + suffix].clone().requires_grad_()
        weights = []
        gamma = beta = None
        if attrs.affine:
            gamma = tensors["gamma"].reshape(stats).clone().requires_grad_()
            beta = tensors["beta"].reshape(stats).clone().requires_grad_()
            weights = [gamma, beta]
        if training:
            trained += 1
        momentum = attrs.momentum if attrs.momentum is not None else 1.0 / trained
        # PER_ACTIVATION is BatchNorm1d over N of the flattened (C, H, W) features.
        x = input if attrs.mode is SPATIAL else input.reshape(dims[0], stats)
        output = F.batch_norm(x, running_mean, running_var, gamma, beta, training=training, momentum=momentum,
                              eps=attrs.eps).reshape(dims)
        if attrs.activation is not None:
            output = getattr(F, _TORCH_ACTIVATIONS[attrs.activation.name])(output)
        grads = torch.autograd.grad(output, [input] + weights, tensors["output_grad" + suffix])
        expected["output" + suffix] = output
        if case.extra.get("input_grad", True):
            expected["input_grad" + suffix] = grads[0]
        if attrs.affine:
            expected["gamma_grad" + suffix] = grads[1].reshape(stat_dims)
            expected["beta_grad" + suffix] = grads[2].reshape(stat_dims)
    expected["running_mean"] = running_mean.reshape(stat_dims)
    expected["running_var"] = running_var.reshape(stat_dims)
    return expected


def exact_program(case, values):
    """torch_program's math at high precision (conformance.exact), each result rounded once: batch
    statistics (variance biased in the output, unbiased in the running variance), 1 / sqrt(var + eps),
    the running statistics' update, the activation, and the gradients of the output."""
    import mpmath

    from .. import exact

    attrs = case.attrs
    dims = values["input"].shape
    if not values["input"].size:
        return {}  # no values: nothing is computed, and PyTorch's zero gradients and unchanged statistics are exact
    stat_dims = (dims[1],) if attrs.mode is SPATIAL else dims[1:]
    stats = int(np.prod(stat_dims, dtype=np.int64))

    def features(array):  # (N, stats) for PER_ACTIVATION; SPATIAL keeps the layout, channels on axis 1
        return array.reshape(dims[0], stats) if attrs.mode is not SPATIAL else array

    axes = (0,) if attrs.mode is not SPATIAL else tuple(a for a in range(len(dims)) if a != 1)
    view = (1, stats) if attrs.mode is not SPATIAL else (1, dims[1]) + (1,) * (len(dims) - 2)
    one, eps = mpmath.mpf(1), exact.scalar(attrs.eps)
    running_mean = exact.apply(lambda v: mpmath.mpf(0), np.empty(stats, dtype=object))
    running_var = exact.apply(lambda v: one, np.empty(stats, dtype=object))
    if attrs.affine:
        gamma, beta = values["gamma"].reshape(view), values["beta"].reshape(view)
    else:
        gamma, beta = exact.apply(lambda v: one, np.empty(view, dtype=object)), mpmath.mpf(0)
    trained, expected = 0, {}
    for step, training in enumerate(case.extra["steps"]):
        suffix = "" if step == 0 else "_step2"
        x = features(values["input" + suffix])
        count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        if training:
            trained += 1
            momentum = exact.scalar(attrs.momentum) if attrs.momentum is not None else one / trained
            mean = exact.total(x, axis=axes, keepdims=True) / count
            var = exact.total((x - mean) ** 2, axis=axes, keepdims=True) / count
            running_mean = (1 - momentum) * running_mean + momentum * mean.reshape(stats)
            running_var = (1 - momentum) * running_var + momentum * var.reshape(stats) * count / (count - 1)
        else:
            mean, var = running_mean.reshape(view), running_var.reshape(view)
        invstd = exact.apply(lambda v: 1 / mpmath.sqrt(v + eps), var)
        normalized = (x - mean) * invstd
        pre = normalized * gamma + beta
        if attrs.activation is None:
            output, derivative = pre, exact.apply(lambda v: one, pre)
        else:
            output, derivative = exact.activation(attrs.activation.name, pre)
        grad = features(values["output_grad" + suffix]) * derivative
        grad_sum = exact.total(grad, axis=axes, keepdims=True)
        grad_dot = exact.total(grad * normalized, axis=axes, keepdims=True)
        expected["output" + suffix] = output.reshape(dims)
        if case.extra.get("input_grad", True):
            if training:
                input_grad = gamma * invstd / count * (count * grad - grad_sum - normalized * grad_dot)
            else:
                input_grad = grad * gamma * invstd
            expected["input_grad" + suffix] = input_grad.reshape(dims)
        if attrs.affine:
            expected["gamma_grad" + suffix] = grad_dot.reshape(stat_dims)
            expected["beta_grad" + suffix] = grad_sum.reshape(stat_dims)
    expected["running_mean"] = running_mean.reshape(stat_dims)
    expected["running_var"] = running_var.reshape(stat_dims)
    return expected


def run(case, env):
    attrs = case.attrs
    batch_norm = env.op()
    state = batch_norm.init_kernel(env.handle, attrs, env.shape("input"), env.shape("input"))
    gamma = env.read("gamma") if attrs.affine else None
    beta = env.read("beta") if attrs.affine else None
    for step, training in enumerate(case.extra["steps"]):
        suffix = "" if step == 0 else "_step2"
        input = env.read("input" + suffix)
        output = env.write("output" + suffix)
        batch_norm.forward_kernel(env.stream, env.handle, state, attrs, input, gamma, beta, output, training=training)
        gamma_grad = env.write("gamma_grad" + suffix) if attrs.affine else None
        beta_grad = env.write("beta_grad" + suffix) if attrs.affine else None
        batch_norm.backward_kernel(env.stream, env.handle, state, attrs, output, env.read("output_grad" + suffix),
                                   input, env.write("input_grad" + suffix) if case.extra.get("input_grad", True) else None,
                                   gamma, beta, gamma_grad, beta_grad)
    env.observe("running_mean", state.running_mean)
    env.observe("running_var", state.running_var)
    batch_norm.cleanup_kernel(env.handle, state)
