"""element_unary cases: every op type forward and backward, float32 and float64,
non-default ELU alpha and SiLU beta, POW exponents 2, 3, 0.5, -1, 0 and a general
one, RSQRT on powers of 4 and on other values, the edges (0 for RELU and ELU,
negative inputs for ELU), and YOLOv10's SiLU and PSA scale (x / sqrt(32)).

Values are quarter- and half-integers in [-2, 2] (wider for sin and cos, and for
GELU over every band of the CPU's erf), and
output gradients half-integers in [-2.5, 2.5] that differ from their
neighbours. Tolerances: EXACT where IEEE arithmetic on these values is exact on
both devices (relu, identity, scalar ops on dyadic values, pow 2 and 3, rsqrt of
powers of 4, pow 0). Elsewhere ulp(n), n chosen to cover both devices: the CPU
error and the H200's, each measured against the golden by tools/measure_ulps.py
(see each bound's comment).
"""

import math

import numpy as np

from kernels import ElementUnaryAttrs, UnaryOpType
from kernels.runtime.core import BFLOAT16

from ..case import EXACT, CaseTable, nonfinite, pattern, ulp

TABLE = CaseTable("element_unary")
F32, F64 = np.float32, np.float64
SHAPE = (2, 3, 5)


def _grad(shape):
    """Output gradients: half-integers in [-2.5, 2.5], never all equal."""
    return pattern(shape, modulus=11, scale=0.5, offset=3)


def _add(name, op_type, scalar=None, dtype=F32, tolerance=EXACT, input=None, shape=SHAPE, description=""):
    if input is None:
        input = pattern(shape)
    input = np.asarray(input, dtype=np.float64).reshape(shape)
    TABLE.add(name, ElementUnaryAttrs(UnaryOpType[op_type], scalar),
              {"input": input, "output_grad": _grad(shape)}, dtype=dtype, tolerance=tolerance,
              description=description)


def _both(name, op_type, scalar=None, tolerance32=EXACT, tolerance64=EXACT, **kwargs):
    _add(f"{name}_f32", op_type, scalar, F32, tolerance32, **kwargs)
    _add(f"{name}_f64", op_type, scalar, F64, tolerance64, **kwargs)


# Quarter-integers in [-2, 2] with 0 among them; sin and cos get [-4, 4].
WIDE = pattern(SHAPE, scale=0.5)
# Powers of 4 from 4^-3 to 4^3: rsqrt and its derivative are powers of 2.
POWERS_OF_4 = [4.0 ** k for k in (-3, -2, -1, 0, 1, 2, 3)] * 4 + [0.25, 1.0]
# Positive, mostly not powers of 4 (0.25 .. 4.0 in quarters).
POSITIVE = (np.arange(30) * 7 % 16 + 1) * 0.25

_both("relu", "RELU", description="relu(0) = 0 and relu'(0) = 0, as torch")
_both("identity", "IDENTITY")
# Bounds: the largest error over output and input_grad measured on the CPU and on the H200
# (tools/measure_ulps.py); float32 / float64 worst per device in each comment.
# sigmoid: 1 / (1 + exp(-x)); derivative (1 - s) s cancels in 1 - s. CPU 2/1, H200 2/1.
# Against the correctly rounded golden, float64's derivative s (1 - s) dy (three roundings, 1 - s
# cancelling for x > 0) measures 3 on the CPU.
_both("sigmoid", "SIGMOID", tolerance32=ulp(2), tolerance64=ulp(3))
# tanh: tanhf/tanh within 2 ulps; 1 - t^2 cancels. CPU 1/1, H200 1/1.
_both("tanh", "TANH", tolerance32=ulp(1), tolerance64=ulp(1))
# gelu: erff/erf, 1 + erf cancels for negative x (covered by the floor). CPU 0/1, H200 1/1.
_both("gelu", "GELU", tolerance32=ulp(1), tolerance64=ulp(1), description="exact (erf) GELU")
# GELU past [-2, 2]: erf(x / sqrt 2) in each of the CPU's bands (kernels/activation/cpu.py: the
# series below 1, the continued fraction in [1, 1.5), [1.5, 2.5), [2.5, 4), [4, 6), and 1 beyond),
# both signs. The values above reach only the first two: an erf good on [-2, 2] alone passed.
# For x < 0, GELU is x times a small erfc/2 that 1 + erf cancels to; the floor covers that.
GELU_BANDS = [0.75, 1.75, 2.25, 2.5, 3.0, 3.5, 4.25, 5.0, 5.75, 6.5, 7.75, 8.5, 9.0, 10.0, 12.0]
_both("gelu_bands", "GELU", tolerance32=ulp(1), tolerance64=ulp(1),  # CPU 1/1, H200 1/1
      input=GELU_BANDS + [-x for x in GELU_BANDS],
      description="exact (erf) GELU over every band of the CPU's erf, both signs")
# silu: x / (1 + exp(-x)). CPU 1/1, H200 1/0.
_both("silu", "SILU", tolerance32=ulp(1), tolerance64=ulp(1))
# CPU 1/1, H200 1/1.
# float64's derivative against the correctly rounded golden: 2 on the CPU.
_both("silu_beta_1p5", "SILU", 1.5, tolerance32=ulp(1), tolerance64=ulp(2), description="x * sigmoid(1.5 x)")
# elu: alpha expm1(x), derivative alpha exp(x). CPU 1/1, H200 1/1 (both cases).
_both("elu", "ELU", tolerance32=ulp(1), tolerance64=ulp(1), description="alpha 1 (scalar None)")
_both("elu_alpha_0p5", "ELU", 0.5, tolerance32=ulp(1), tolerance64=ulp(1),
      description="non-default alpha; at x = 0 the gradient is alpha * dy, as torch")
# Found by tests/test_properties.py (shrunk): torch's ELU backward is x <= 0 ? dy a exp(x) : dy, so
# a NaN input passes dy, as relu's does; exact values (2 -> dy, NaN -> dy, 0 -> a dy). Three elements:
# torch's vectorized loop (two vectors at a time, 16 float64 elements or more on AVX-512) gives NaN
# there instead; its scalar loop, which takes a tensor this short on any CPU, gives the formula's dy.
_add("elu_nan_input_passes_grad", "ELU", 1.0, input=[2.0, np.nan, 0.0], shape=(3,),
     description="a NaN input: output NaN, gradient dy (torch's x <= 0 test is false for NaN)")
# exp: CPU 2/0, H200 1/1.
_both("exp", "EXP", tolerance32=ulp(2), tolerance64=ulp(1))
# sin, cos: CPU 1/0, H200 1/1.
_both("sin", "SIN", tolerance32=ulp(1), tolerance64=ulp(1), input=WIDE)
_both("cos", "COS", tolerance32=ulp(1), tolerance64=ulp(1), input=WIDE)
_both("rsqrt_powers_of_4", "RSQRT", input=POWERS_OF_4, description="exact: 1/sqrt(4^k) = 2^-k")
# rsqrt is IEEE sqrt then IEEE division on both devices (no rsqrtf): two roundings, 1 ulp.
_both("rsqrt", "RSQRT", tolerance32=ulp(1), tolerance64=ulp(1), input=POSITIVE)
_both("pow_2", "POW", 2.0, description="x * x, as torch")
_both("pow_3", "POW", 3.0)
# sqrt is correctly rounded (exact forward); the derivative 0.5 / sqrt(x) rounds twice: 1 ulp.
_both("pow_0p5", "POW", 0.5, tolerance32=ulp(1), tolerance64=ulp(1), input=POSITIVE, description="sqrt")
# 1/x is correctly rounded; the derivative -1/(x*x) times dy rounds three times: 1 ulp measured.
_both("pow_minus_1", "POW", -1.0, tolerance32=ulp(1), tolerance64=ulp(1), input=POSITIVE - 2.125,
      description="reciprocal, negative and positive inputs")
_both("pow_0", "POW", 0.0, description="ones, and a zero gradient")
# powf/pow (CUDA documents up to 9 and 2 ulps over the full range, worst at |y| ~ 260; at y = 1.5
# on [0.25, 4] far less); the derivative 1.5 sqrt(x) is IEEE. CPU 1/1, H200 1/1.
_both("pow_1p5", "POW", 1.5, tolerance32=ulp(1), tolerance64=ulp(1), input=POSITIVE, description="general powf/pow")
_both("scalar_multiply_0p25", "SCALAR_MULTIPLY", 0.25)
_both("scalar_multiply_minus_3", "SCALAR_MULTIPLY", -3.0)
_both("scalar_add_1p5", "SCALAR_ADD", 1.5)
_both("scalar_sub_0p75", "SCALAR_SUB", 0.75)
_both("scalar_true_div_4", "SCALAR_TRUE_DIV", 4.0)
# x / 3 is correctly rounded in either dtype, and rounding the float64 quotient to float32 again
# cannot differ (no quotient by 3 lies on a float32 midpoint): exact.
_both("scalar_true_div_3", "SCALAR_TRUE_DIV", 3.0)
_add("zero_size", "EXP", shape=(2, 0, 3), description="zero-size tensor: nothing to do")
# CPU 1/1 on these inputs. The H200's 1/1 was measured while the input argument was lost (inputs in
# [-2, 2]); on these it is still to be measured (tools/measure_ulps.py --device gpu).
_add("yolov10_silu", "SILU", shape=(2, 4, 3, 5), tolerance=ulp(1), input=pattern((2, 4, 3, 5), modulus=29),
     description="YOLOv10's SiLU on NCHW, batch 2, inputs in [-3.5, 3.5]")
# x * float32(1/sqrt(32)) against float64 x / sqrt(32) rounded once: at most 1 ulp apart.
_add("yolov10_psa_scale", "SCALAR_MULTIPLY", 1 / math.sqrt(32), shape=(1, 2, 4, 6), tolerance=ulp(1),
     description="PSA: q scaled by 1/sqrt(32) (head dim 32); the scalar rounds to float32 first, as torch")


# --------------------------------------------------------------------------- half precision
# float16 and bfloat16: the same op types on the same values (quarter-integers in [-2, 2] are
# exact in both), computed in float32 and rounded once on both devices; the golden is torch's
# float64 result rounded once. A float32 result that rounds to the other side of a half-way
# point than the float64 one differs by 1 ulp of the half dtype; the float32 functions' own
# errors (a few float32 ulps) are 2^13 (float16) or 2^16 (bfloat16) times smaller than a half ulp,
# so they show only through that double rounding. HALF_MEASURED: the ulps each case needs, the
# larger of the two devices' measurements, 0 for exact (absent: 0).
F16, BF16 = np.dtype(np.float16), BFLOAT16
HALF_MEASURED = {}  # name -> ulps (0: EXACT)


def _half(name, op_type, scalar=None, **kwargs):
    for suffix, dtype in (("f16", F16), ("bf16", BF16)):
        key = f"{name}_{suffix}"
        ulps = HALF_MEASURED.get(key, 0)
        _add(key, op_type, scalar, dtype, EXACT if ulps == 0 else ulp(ulps), **kwargs)


# Measured on the CPU and the H200 (tools/measure_ulps.py, 2026-12-01): 0 ulps for every half case,
# output and input_grad, so HALF_MEASURED stays empty: EXACT. Where the GPU does the same IEEE float32
# operations in the same order (sqrt, division, products: rsqrt, pow 0.5, pow -1, the scalar ops) its
# float32 values are the CPU's bits. Where it calls CUDA's expf/erff/tanhf/sinf/cosf/powf instead of
# NumPy's (sigmoid, tanh, gelu, silu, elu, exp, sin, cos, pow 1.5, exp near the float16 maximum) the
# float32 values may differ by a float32 ulp or two, which is 2^13 (float16) or 2^16 (bfloat16) times
# below a half ulp: none of these values lies that close to a half-way point, so both devices round
# every one to the golden's half value.
_half("relu", "RELU")
_half("identity", "IDENTITY")
_half("sigmoid", "SIGMOID")
_half("tanh", "TANH")
_half("gelu", "GELU")
_half("silu", "SILU")
_half("silu_beta_1p5", "SILU", 1.5)
_half("elu", "ELU")
_half("exp", "EXP")
_half("sin", "SIN", input=WIDE)
_half("cos", "COS", input=WIDE)
_half("rsqrt_powers_of_4", "RSQRT", input=POWERS_OF_4, description="exact: 1/sqrt(4^k) = 2^-k")
_half("rsqrt", "RSQRT", input=POSITIVE)
_half("pow_2", "POW", 2.0)
_half("pow_3", "POW", 3.0)
_half("pow_0p5", "POW", 0.5, input=POSITIVE)
_half("pow_minus_1", "POW", -1.0, input=POSITIVE - 2.125)
_half("pow_1p5", "POW", 1.5, input=POSITIVE)
_half("scalar_multiply_0p25", "SCALAR_MULTIPLY", 0.25)
_half("scalar_add_1p5", "SCALAR_ADD", 1.5)
_half("scalar_true_div_3", "SCALAR_TRUE_DIV", 3.0)
_half("yolov10_silu", "SILU", shape=(2, 4, 3, 5), input=pattern((2, 4, 3, 5), modulus=29),
      description="YOLOv10's SiLU on NCHW in half precision, inputs in [-3.5, 3.5]")
_half("yolov10_psa_scale", "SCALAR_MULTIPLY", 1 / math.sqrt(32), shape=(1, 2, 4, 6),
      description="PSA's 1/sqrt(32) scale: the scalar rounds to float32 (torch's opmath), the product once to the dtype")
# Edges. Subnormal results: x * 2^-16 is a float16 subnormal (below 2^-14), x * 2^-130 a bfloat16
# one (below 2^-126); both exact (float32 holds them, the rounding to the half dtype is exact).
_add("scalar_multiply_subnormal_f16", "SCALAR_MULTIPLY", 2.0 ** -16, F16,
     description="float16 subnormal outputs and gradients: exact")
_add("scalar_multiply_subnormal_bf16", "SCALAR_MULTIPLY", 2.0 ** -130, BF16,
     description="bfloat16 subnormal outputs and gradients (the float32 scalar is itself subnormal): exact")
# rsqrt of float16 subnormal powers of 4 (2^-24 .. 2^-16): 2^12 .. 2^8, exact; the derivative
# -0.5 dy r^3 (r^3 up to 2^36, finite in float32) overflows to inf in float16, as the golden does.
_add("rsqrt_subnormal_f16", "RSQRT", None, F16, input=[4.0 ** k for k in (-12, -11, -10, -9, -8, -8, -9, -10, -11, -12)],
     shape=(10,),
     description="rsqrt of float16 subnormals: exact 2^k; the derivative overflows float16 to inf, as torch's")
# exp near float16's maximum: exp(11) = 59874 is finite, exp(11.125) = 67846 overflows to inf.
_add("exp_near_max_f16", "EXP", None, F16, input=[10.0, 10.5, 10.75, 11.0, 11.0625, 11.125, -11.0, 0.0], shape=(8,),
     description="exp up to float16's maximum (65504) and past it (inf)")


# --------------------------------------------------------------------------- medium cases
# Past the sizes at which the CPU passes go blockwise and are shared out (kernels.runtime.cpu_paths: the
# conformance run reaches every size-gated CPU path, tests/test_cpu_paths.py). ReLU keeps them exact.
# 350003 elements: the forward (8 bytes an element) runs in 3 blocks, one part; the backward (12) is
# worth two parts on two threads, the last block ragged.
_add("medium_relu_blocks_threads", "RELU", shape=(350003,),
     description="activation.blockwise past BLOCK_ELEMENTS: blocks (forward), blocks shared out (backward)")


# --------------------------------------------------------------------------- non-finite output gradients
# NaN, +inf and -inf in output_grad, at x = 0 (relu'(0) = 0: PyTorch's threshold_backward gives 0 there,
# not 0 * NaN) and at negative and positive x. The finite elements are the float32 cases' (same bounds).
# SiLU with beta != 1 is left out: PyTorch has no such op, and its program here is a composition
# (x * sigmoid(beta x)) whose autograd adds inf - inf where the kernels' g * f'(x) keeps inf (docs/ops.md).
_NONFINITE_AT = (6, 23, 0, 12, 5, 19, 28)  # x = 0, 0, -2, 2, -1.75, 1.5, 0.25 in pattern(SHAPE)
for _name, _op, _scalar, _input, _tolerance in (
        ("relu", "RELU", None, None, EXACT), ("identity", "IDENTITY", None, None, EXACT),
        ("sigmoid", "SIGMOID", None, None, ulp(2)), ("tanh", "TANH", None, None, ulp(1)),
        ("gelu", "GELU", None, None, ulp(1)), ("silu", "SILU", None, None, ulp(1)),
        ("elu_alpha_0p5", "ELU", 0.5, None, ulp(1)), ("exp", "EXP", None, None, ulp(2)),
        ("sin", "SIN", None, WIDE, ulp(1)), ("cos", "COS", None, WIDE, ulp(1)),
        ("rsqrt", "RSQRT", None, POSITIVE, ulp(1)), ("pow_2", "POW", 2.0, None, EXACT),
        ("pow_0p5", "POW", 0.5, POSITIVE, ulp(1)), ("pow_minus_1", "POW", -1.0, POSITIVE - 2.125, ulp(1)),
        ("pow_0", "POW", 0.0, None, EXACT), ("pow_1p5", "POW", 1.5, POSITIVE, ulp(1)),
        ("scalar_multiply_minus_3", "SCALAR_MULTIPLY", -3.0, None, EXACT),
        ("scalar_multiply_0", "SCALAR_MULTIPLY", 0.0, None, EXACT),
        ("scalar_add_1p5", "SCALAR_ADD", 1.5, None, EXACT), ("scalar_sub_0p75", "SCALAR_SUB", 0.75, None, EXACT),
        ("scalar_true_div_3", "SCALAR_TRUE_DIV", 3.0, None, EXACT)):
    TABLE.add(f"nonfinite_grad_{_name}", ElementUnaryAttrs(UnaryOpType[_op], _scalar),
              {"input": pattern(SHAPE) if _input is None else np.asarray(_input, np.float64).reshape(SHAPE),
               "output_grad": nonfinite(_grad(SHAPE), _NONFINITE_AT)},
              tolerance=_tolerance, description=f"{_op} backward with NaN, +inf and -inf in output_grad")
# --------------------------------------------------------------------------- end of non-finite output gradients


def torch_program(case, tensors):
    import torch
    import torch.nn.functional as F

    op, scalar = case.attrs.op_type, case.attrs.scalar
    x = tensors["input"].requires_grad_()
    functions = {
        UnaryOpType.RELU: torch.relu,
        UnaryOpType.SIGMOID: torch.sigmoid,
        UnaryOpType.TANH: torch.tanh,
        UnaryOpType.ELU: lambda x: F.elu(x, alpha=scalar),
        UnaryOpType.GELU: F.gelu,
        UnaryOpType.SILU: lambda x: F.silu(x) if scalar == 1.0 else x * torch.sigmoid(scalar * x),
        UnaryOpType.EXP: torch.exp,
        UnaryOpType.IDENTITY: torch.clone,
        UnaryOpType.RSQRT: torch.rsqrt,
        UnaryOpType.SIN: torch.sin,
        UnaryOpType.COS: torch.cos,
        UnaryOpType.POW: lambda x: torch.pow(x, scalar),
        UnaryOpType.SCALAR_MULTIPLY: lambda x: x * scalar,
        UnaryOpType.SCALAR_ADD: lambda x: x + scalar,
        UnaryOpType.SCALAR_SUB: lambda x: x - scalar,
        UnaryOpType.SCALAR_TRUE_DIV: lambda x: x / scalar,
    }
    output = functions[op](x)
    (input_grad,) = torch.autograd.grad(output, [x], tensors["output_grad"])
    return {"output": output, "input_grad": input_grad}


# Op types whose output and gradient are one IEEE operation on the inputs at most (or none): PyTorch's
# float64 result is already the same on every host (no reference).
_ONE_IEEE_OPERATION = {"RELU", "IDENTITY", "SCALAR_MULTIPLY", "SCALAR_ADD", "SCALAR_SUB", "SCALAR_TRUE_DIV"}


def exact_program(case, values):
    """The same math at high precision (conformance.exact): output f(x) and input_grad dy f'(x),
    each rounded once, so no golden depends on the host's libm."""
    from .. import exact

    if case.attrs.op_type.name in _ONE_IEEE_OPERATION:
        return {}
    output, derivative = exact.activation(case.attrs.op_type.name, values["input"], case.attrs.scalar)
    input_grad = values["output_grad"] * derivative
    if case.attrs.op_type is UnaryOpType.RELU or (case.attrs.op_type is UnaryOpType.POW and case.attrs.scalar == 0):
        # PyTorch's backward selects there (threshold_backward; zeros for exponent 0): a zero
        # derivative gives 0 even where dy is NaN or infinite.
        input_grad = exact.where(lambda d: d == 0, derivative, 0 * derivative, input_grad)
    return {"output": output, "input_grad": input_grad}
