"""pool_2d cases: YOLOv10's SPPF pool (MAX 5x5, stride 1, pad 2) on small maps
full of equal maxima, the usual MAX and AVG shapes, an asymmetric kernel and
stride, NaN and -inf windows, count_include_pad both ways, and each fused
activation.

MAX is exact: it moves values, and its gradients are sums of a few short dyadic
values. The tie rule is PyTorch's (checked on torch 2.13): the first maximum in
row-major window order takes the gradient, a NaN wins over everything (the last
NaN of a window), and a window of -inf sends it to its first element inside the
input. Overlapping windows send several gradients to one element.
"""

import numpy as np

from kernels import Activation, Pool2DAttrs, PoolOp, pool_2d
from kernels.runtime.core import BFLOAT16

from ..case import EXACT, CaseTable, aperiodic, nonfinite, pattern, ulp

TABLE = CaseTable("pool_2d")

MAX, AVG = PoolOp.MAX, PoolOp.AVG
NAN, INF = np.nan, np.inf


def _ties(dims, offset=0):
    """Integers in -2..2: almost every window holds its maximum several times. aperiodic(), not
    pattern(modulus=5), whose period of 5 made every row of a 5-wide map (and every plane of a
    5x7 one) alike."""
    return aperiodic(dims, modulus=5, scale=1.0, offset=offset)


def _add(name, dims, attrs, input=None, dtype=np.float32, tolerance=EXACT, description="", output_grad=None):
    out_dims = pool_2d.output_dims(attrs, dims)
    TABLE.add(name, attrs,
              {"input": _ties(dims) if input is None else input,
               "output_grad": pattern(out_dims, modulus=13, scale=0.25, offset=3) if output_grad is None else output_grad},
              dtype=dtype, tolerance=tolerance, description=description)


def _max(kernel, stride, padding, activation=None):
    return Pool2DAttrs(kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1], MAX, activation=activation)


def _avg(kernel, stride, padding, count_include_pad, activation=None):
    return Pool2DAttrs(kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1], AVG, count_include_pad,
                       activation)


# YOLOv10 SPPF: three chained MAX pools 5x5, stride 1, pad 2. Overlapping windows:
# each element can be the argmax of up to 25 windows and sums their gradients.
_add("sppf_max_5x5_s1_p2", (2, 3, 6, 7), _max((5, 5), (1, 1), (2, 2)),
     description="YOLOv10 SPPF pool, non-square map, values -2..2 full of ties")
_add("sppf_max_5x5_s1_p2_f64", (1, 2, 7, 5), _max((5, 5), (1, 1), (2, 2)), dtype=np.float64)
_add("sppf_max_5x5_s1_p2_plateau", (1, 1, 5, 6), _max((5, 5), (1, 1), (2, 2)),
     input=np.array([[[[1, 1, 1, 1, 1, 1], [1, 2, 1, 2, 1, 1], [1, 1, 1, 1, 1, 1],
                       [2, 1, 1, 1, 2, 2], [1, 1, 2, 1, 1, 1]]]], dtype=np.float64),
     description="a plateau of equal maxima: the first one in row-major window order takes each gradient")
_add("max_2x2_s2", (2, 3, 6, 8), _max((2, 2), (2, 2), (0, 0)))
_add("max_2x2_s2_odd", (1, 2, 7, 9), _max((2, 2), (2, 2), (0, 0)), description="odd sizes: the last row and column are dropped")
_add("max_3x3_s2_p1", (2, 2, 7, 6), _max((3, 3), (2, 2), (1, 1)))
_add("max_3x2_s21_p10", (1, 3, 7, 5), _max((3, 2), (2, 1), (1, 0)), description="asymmetric kernel and stride")
_add("max_2x3_s12_p11_f64", (2, 1, 5, 9), _max((2, 3), (1, 2), (1, 1)), dtype=np.float64)
_add("max_16x16_s2_wide_taps", (1, 2, 17, 19), _max((16, 16), (2, 2), (0, 0)),
     description="256 taps: the saved argmax no longer fits a byte")
_add("max_nan_and_neg_inf", (1, 1, 4, 6), _max((3, 3), (1, 1), (1, 1)),
     input=np.array([[[[1, NAN, 3, -INF, -INF, -INF], [NAN, 2, 3, -INF, -INF, -INF],
                       [0, 3, NAN, 1, -INF, -INF], [2, 2, 1, -INF, -INF, -INF]]]], dtype=np.float64),
     description="NaN propagates; the last NaN of a window takes its gradient; an all -inf window sends it to "
                 "its first element inside the input")
_add("max_nan_f64", (2, 1, 3, 4), _max((2, 2), (1, 1), (1, 1)), dtype=np.float64,
     input=np.array([[[[NAN, 1, 2, 2], [3, 3, NAN, 0], [1, -1, 4, NAN]]],
                     [[[0, 0, 0, 0], [0, NAN, 0, 0], [-2, 0, NAN, -1]]]], dtype=np.float64))
_add("max_zero_batch", (0, 3, 5, 6), _max((3, 3), (1, 1), (1, 1)), description="zero-size: nothing to do")

# AVG: window sums of small integers are exact; the one division by 6, 9 or 25
# rounds, and the float32 rounding of the float64 golden may differ from a float32
# division by one ulp (double rounding): ulp(1), measured 0. Backward sums up to 9
# (or 25) rounded quotients in row-major output order, as PyTorch: measured 1.
# (The GPU sums in the same order with the same IEEE divisions: the same bits.)
_AVG_TOLERANCE = {"output": ulp(1), "input_grad": ulp(1)}
_add("avg_2x2_s2", (2, 3, 6, 8), _avg((2, 2), (2, 2), (0, 0), True), description="divides by 4: exact")
_add("avg_3x3_s1_p1_include_pad", (2, 2, 5, 7), _avg((3, 3), (1, 1), (1, 1), True), tolerance=_AVG_TOLERANCE,
     description="count_include_pad: every window divides by 9")
_add("avg_3x3_s2_p1_exclude_pad", (1, 3, 7, 6), _avg((3, 3), (2, 2), (1, 1), False), tolerance=_AVG_TOLERANCE,
     description="count_include_pad false: edge windows divide by 4 or 6")
_add("avg_5x5_s1_p2_exclude_pad_f64", (2, 1, 6, 5), _avg((5, 5), (1, 1), (2, 2), False), dtype=np.float64,
     tolerance={"output": ulp(1), "input_grad": ulp(2)},  # input_grad: up to 25 rounded shares, 2 on the CPU
     description="SPPF geometry, AVG, divisors from 9 to 25")
_add("avg_3x2_s21_p11_include_pad", (2, 2, 5, 4), _avg((3, 2), (2, 1), (1, 1), True), tolerance=_AVG_TOLERANCE,
     description="asymmetric AVG with padding counted: divides by 6")

# Fused activations on the pooled values (forward) and the gradients (backward).
# Inputs in [-1, 1] keep the derivatives' cancellations (1 - s, 1 - t^2) mild.
# Each bound is the largest error measured over output and input_grad on the CPU (at
# most 1 ulp) and on the H200 (CUDA's expf, tanhf, erff within 2 ulps; the input_grad
# of sigmoid and silu measured 3, tanh 2, gelu 1), with tools/measure_ulps.py.
_ACTIVATION_TOLERANCE = {
    Activation.RELU: EXACT,
    Activation.SIGMOID: ulp(3),
    Activation.TANH: ulp(2),
    Activation.GELU: ulp(1),
    Activation.SILU: ulp(3),
}
_ACTIVATION_INPUT = pattern((1, 2, 5, 6), modulus=9, scale=0.25)  # -1 .. 1 in quarters
for _activation, _tolerance in _ACTIVATION_TOLERANCE.items():
    _add(f"max_3x3_s1_p1_{_activation.name.lower()}", (1, 2, 5, 6),
         _max((3, 3), (1, 1), (1, 1), activation=_activation), input=_ACTIVATION_INPUT,
         tolerance=_tolerance, description=f"MAX then {_activation.name}")
_add("avg_2x2_s2_silu_f64", (2, 1, 4, 6), _avg((2, 2), (2, 2), (0, 0), True, activation=Activation.SILU),
     input=pattern((2, 1, 4, 6), modulus=9, scale=0.25), dtype=np.float64, tolerance=ulp(2),
     description="AVG then SILU")  # against the correctly rounded golden: 2 on the CPU


# --------------------------------------------------------------------------- float16 and bfloat16
# Stored in half, computed in float32, rounded once. MAX moves values and sums at most 25 short
# dyadic gradients (exact in float32 and in half: no more than 8 significant bits); AVG divides once.
# Measured on the CPU and the H200 (tools/measure_ulps.py, 2026-12-01; output / input_grad, ulps of the
# half dtype), the same on both devices (the same float32 operations in the same order):
#   avg_3x3 include_pad, exclude_pad, near_max: f16 0 / 0; bf16 0 / 1 (the float32 sum of shares
#   rounded once, the golden's float64 sum rounded once: a tie apart); avg_subnormal f16 0 / 0;
#   avg_long_16x16 bf16 0 / 0; max + silu: f16 0 / 1 (the gradient f'(x) g in float32 rounded once,
#   a half-way point from the golden's), bf16 0 / 0.
# HALF_MEASURED states them: name -> {tensor: ulps}; a tensor absent is EXACT, a case absent too.
_HALF = {"f16": np.float16, "bf16": BFLOAT16}
HALF_MEASURED = {
    **{f"{name}_bf16": {"input_grad": 1}
       for name in ("avg_3x3_s1_p1_include_pad", "avg_3x3_s2_p1_exclude_pad", "avg_near_max_3x3_s1_p1")},
    "max_3x3_s1_p1_silu_f16": {"input_grad": 1},
}


def _half_tolerance(name):
    return {"*": EXACT, **{tensor: ulp(ulps) for tensor, ulps in HALF_MEASURED.get(name, {}).items()}}


_NEAR_MAX = np.array([65280.0, 65024.0, 64768.0, 64512.0, 60160.0])  # exact in float16 and bfloat16


def _near_max(dims):
    """Values near the float16 maximum: a window sum overflows in half arithmetic, never in float32.
    Picked by aperiodic() (a cycle of 5 made both channels of a 5x6 plane alike)."""
    return _NEAR_MAX[aperiodic(dims, modulus=5).astype(np.int64) + 2]


for _suffix, _dtype in _HALF.items():
    _add(f"sppf_max_5x5_s1_p2_{_suffix}", (2, 3, 6, 7), _max((5, 5), (1, 1), (2, 2)), dtype=_dtype,
         description="YOLOv10 SPPF pool in half: ties, up to 25 gradients summed in float32 (exact)")
    _add(f"max_3x3_s2_p1_{_suffix}", (2, 2, 7, 6), _max((3, 3), (2, 2), (1, 1)), dtype=_dtype)
    _add(f"max_nan_and_neg_inf_{_suffix}", (1, 1, 4, 6), _max((3, 3), (1, 1), (1, 1)), dtype=_dtype,
         input=np.array([[[[1, NAN, 3, -INF, -INF, -INF], [NAN, 2, 3, -INF, -INF, -INF],
                           [0, 3, NAN, 1, -INF, -INF], [2, 2, 1, -INF, -INF, -INF]]]], dtype=np.float64),
         description="PyTorch's NaN and -inf rules in half")
    _add(f"avg_2x2_s2_{_suffix}", (2, 3, 6, 8), _avg((2, 2), (2, 2), (0, 0), True), dtype=_dtype,
         description="divides by 4: exact")
    _add(f"avg_3x3_s1_p1_include_pad_{_suffix}", (2, 2, 5, 7), _avg((3, 3), (1, 1), (1, 1), True), dtype=_dtype,
         tolerance=_half_tolerance(f"avg_3x3_s1_p1_include_pad_{_suffix}"),
         description="divides by 9 in float32, rounded once to half")
    _add(f"avg_3x3_s2_p1_exclude_pad_{_suffix}", (1, 3, 7, 6), _avg((3, 3), (2, 2), (1, 1), False), dtype=_dtype,
         tolerance=_half_tolerance(f"avg_3x3_s2_p1_exclude_pad_{_suffix}"), description="edge windows divide by 4 or 6")
    _add(f"avg_near_max_3x3_s1_p1_{_suffix}", (1, 2, 5, 6), _avg((3, 3), (1, 1), (1, 1), False), dtype=_dtype,
         input=_near_max((1, 2, 5, 6)), tolerance=_half_tolerance(f"avg_near_max_3x3_s1_p1_{_suffix}"),
         description="values near 65504: the window sums (up to 9 x 65280) overflow in half, not in float32")
    _add(f"max_3x3_s1_p1_silu_{_suffix}", (1, 2, 5, 6), _max((3, 3), (1, 1), (1, 1), activation=Activation.SILU),
         input=_ACTIVATION_INPUT, dtype=_dtype, tolerance=_half_tolerance(f"max_3x3_s1_p1_silu_{_suffix}"),
         description="MAX then SiLU in half: f in float32 at the pooled value, rounded once")
_add("avg_subnormal_3x3_s1_p1_f16", (1, 2, 5, 6), _avg((3, 3), (1, 1), (1, 1), True), dtype=np.float16,
     input=pattern((1, 2, 5, 6), modulus=17, scale=2.0 ** -24), tolerance=_half_tolerance("avg_subnormal_3x3_s1_p1_f16"),
     description="float16 subnormals (multiples of 2^-24): sums exact in float32, the quotient rounds to a subnormal")
_add("avg_long_16x16_s8_bf16", (1, 2, 24, 32), _avg((16, 16), (8, 8), (0, 0), True), dtype=BFLOAT16,
     input=1.0 + pattern((1, 2, 24, 32), modulus=15, scale=2.0 ** -7), tolerance=_half_tolerance("avg_long_16x16_s8_bf16"),
     description="256-tap windows of 1 + k/128: a bfloat16 running sum would stall at 256 (8-bit mantissa); "
                 "the float32 sum is exact")

# --- GPU launch shapes (the "small" schedule: one SM, grids of at most two blocks; tests/test_gpu_paths.py).
# 31x33 outputs: the tiled MAX forward's tiles are 17 + 16 columns and 16 + 15 rows (partial last tiles
# both ways), 4 tiles a plane, and 3 planes for a grid of 2 plane blocks (the plane loop goes round).
_add("max_3x3_s1_p1_partial_tiles_31x33", (1, 3, 31, 33), _max((3, 3), (1, 1), (1, 1)),
     description="MAX forward tiles of 17 x 16 over a 31x33 plane: the last tile of each row and column partial")
# A 64x97 window of float64 and its 64x2 row maxima pass 48 KB of shared memory even for a tile of one
# row: the direct MAX forward (a thread an output), with int argmax taps (6208 taps).
_add("max_64x97_direct_f64", (1, 1, 64, 98), _max((64, 97), (1, 1), (0, 0)), dtype=np.float64,
     input=pattern((1, 1, 64, 98), modulus=4093, scale=0.5),
     description="a window past the tiled forward's shared memory: the direct MAX forward, int argmax taps")
# --- end of GPU launch shapes


# --------------------------------------------------------------------------- NaN, infinities and borders
# NaN at stride 2, alone and where windows overlap (a row or column two windows share), and twice in
# one window (the last takes the gradient); NaN, +inf and -inf in output_grad, with inputs that are
# the maximum of windows whose gradients are +inf and -inf (their sum is NaN); windows at a padded
# border whose part inside the input is all -inf, in an input that is -inf but for a few values (the
# output is -inf and the gradient goes to the window's first element inside the input, PyTorch's
# rule); AVG at such borders with count_include_pad both ways (-inf and padding average to -inf,
# +inf with -inf to NaN). A window wholly in the padding cannot occur: padding is at most half the kernel.
def _with(values, points):
    """A copy of `values` with the value of each (point, value) pair set at its (n, c, h, w) point."""
    out = np.array(values, dtype=np.float64)
    for point, value in points:
        out[point] = value
    return out


def _nonfinite_grad(attrs, dims, positions):
    return nonfinite(pattern(pool_2d.output_dims(attrs, dims), modulus=13, scale=0.25, offset=3), positions)


def _neg_inf_but(dims, points):
    """-inf everywhere but at the given points, which hold 1, 2, 3 ..."""
    return _with(np.full(dims, -INF), [(point, float(k + 1)) for k, point in enumerate(points)])


_add("max_nan_3x3_s2_p1_overlap", (1, 2, 7, 6), _max((3, 3), (2, 2), (1, 1)),
     input=_with(_ties((1, 2, 7, 6)), [((0, 0, 1, 1), NAN), ((0, 0, 3, 4), NAN), ((0, 1, 5, 3), NAN),
                                       ((0, 1, 0, 0), NAN), ((0, 0, 5, 0), NAN), ((0, 0, 6, 1), NAN)]),
     description="NaN where two or four windows overlap (kernel 3, stride 2), at a padded corner, twice in a window")
_add("max_nan_2x2_s2", (2, 1, 6, 8), _max((2, 2), (2, 2), (0, 0)),
     input=_with(_ties((2, 1, 6, 8)), [((0, 0, 0, 1), NAN), ((0, 0, 3, 3), NAN), ((0, 0, 3, 2), NAN),
                                       ((1, 0, 4, 7), NAN), ((1, 0, 2, 0), NAN)]),
     description="NaN at stride 2 without overlap, and twice in one window")
_add("max_nonfinite_grad_5x5_s1_p2", (1, 2, 6, 7), _max((5, 5), (1, 1), (2, 2)),
     output_grad=_nonfinite_grad(_max((5, 5), (1, 1), (2, 2)), (1, 2, 6, 7), (0, 8, 9, 20, 44, 45, 46, 70)),
     description="SPPF geometry: NaN, +inf and -inf gradients of windows that share their maximum")
_add("max_nonfinite_grad_3x3_s2_p1", (2, 1, 7, 6), _max((3, 3), (2, 2), (1, 1)),
     output_grad=_nonfinite_grad(_max((3, 3), (2, 2), (1, 1)), (2, 1, 7, 6), (0, 1, 5, 6, 13, 19, 22)),
     description="stride 2 with overlap: NaN, +inf and -inf gradients, some meeting at one input")
_add("max_neg_inf_border_2x2_s2_p1", (1, 2, 5, 6), _max((2, 2), (2, 2), (1, 1)),
     input=_neg_inf_but((1, 2, 5, 6), [(0, 0, 2, 3), (0, 0, 3, 1), (0, 1, 1, 2), (0, 1, 4, 4), (0, 1, 2, 5)]),
     description="-inf but for 5 values: border windows of -inf and padding give -inf and send the gradient "
                 "to their first element inside the input")
_add("max_neg_inf_border_3x3_s2_p1", (1, 1, 6, 7), _max((3, 3), (2, 2), (1, 1)),
     input=_neg_inf_but((1, 1, 6, 7), [(0, 0, 2, 2), (0, 0, 3, 5)]),
     description="-inf but for 2 values, kernel 3 stride 2: overlapping all -inf windows at every border")
_add("max_neg_inf_border_5x5_s1_p2", (1, 2, 6, 7), _max((5, 5), (1, 1), (2, 2)),
     input=_neg_inf_but((1, 2, 6, 7), [(0, 0, 4, 5), (0, 1, 1, 1), (0, 1, 5, 6)]),
     description="SPPF geometry (stride 1, padding 2: the CPU's flat path) over -inf but for 3 values: all -inf "
                 "windows two rows or columns into the padding and one, each sending its gradient to its first "
                 "element inside the input")
_BORDERS = _with(_ties((1, 2, 5, 6)), [((0, 0, 0, 0), -INF), ((0, 0, 4, 5), INF), ((0, 0, 3, 5), -INF),
                                       ((0, 1, 0, 3), INF), ((0, 1, 0, 4), -INF), ((0, 1, 4, 0), -INF)])
for _include in (True, False):
    _suffix = "include_pad" if _include else "exclude_pad"
    _attrs2, _attrs3 = _avg((2, 2), (2, 2), (1, 1), _include), _avg((3, 3), (2, 2), (1, 1), _include)
    _add(f"avg_nonfinite_2x2_s2_p1_{_suffix}", (1, 2, 5, 6), _attrs2, input=_BORDERS,
         output_grad=_nonfinite_grad(_attrs2, (1, 2, 5, 6), (0, 3, 11, 12, 23)),
         description="infinities at the padded borders (a corner window holds one input element), divisors 4 "
                     "or 1, 2: NaN, +inf and -inf in output_grad")
    _add(f"avg_nonfinite_3x3_s2_p1_{_suffix}", (1, 2, 5, 6), _attrs3, input=_BORDERS, tolerance=_AVG_TOLERANCE,
         output_grad=_nonfinite_grad(_attrs3, (1, 2, 5, 6), (0, 2, 5, 8, 13, 17)),
         description="infinities at the padded borders, divisors 9 or 4, 6: NaN, +inf and -inf in output_grad")
# --------------------------------------------------------------------------- end of NaN, infinities and borders


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
# Past the block sizes of the CPU forward and MAX backward (kernels.runtime.cpu_paths): SPPF's 170 planes
# of 20x20 in two blocks of several planes; planes of 342x343 outputs, a block each, shared out to the
# threads (a 4 MB forward, a backward of 117306 outputs a plane).
TABLE.add("medium_sppf_plane_blocks", _max((5, 5), (1, 1), (2, 2)),
          {"input": pattern((1, 170, 20, 21), modulus=251, scale=1 / 32),
           "output_grad": pattern((1, 170, 20, 21), modulus=241, scale=1 / 16, offset=3)},
          description="SPPF over 170 planes: blocks of several whole planes, forward and MAX backward")
TABLE.add("medium_max_one_plane_blocks_threads", _max((3, 3), (1, 1), (1, 1)),
          {"input": pattern((1, 3, 342, 343), modulus=251, scale=1 / 32),
           "output_grad": pattern((1, 3, 342, 343), modulus=241, scale=1 / 16, offset=3)},
          description="planes past a block: a block a plane, shared out to the threads, forward and MAX backward")


def torch_program(case, tensors):
    import torch
    import torch.nn.functional as F

    attrs = case.attrs
    kernel, stride = (attrs.kernel_h, attrs.kernel_w), (attrs.stride_h, attrs.stride_w)
    padding = (attrs.padding_h, attrs.padding_w)
    input = tensors["input"].requires_grad_()
    if attrs.pool_type is PoolOp.MAX:
        pooled = F.max_pool2d(input, kernel, stride, padding)
    else:
        pooled = F.avg_pool2d(input, kernel, stride, padding, count_include_pad=attrs.count_include_pad)
    output = _torch_activation(attrs.activation, pooled)
    (input_grad,) = torch.autograd.grad(output, [input], tensors["output_grad"])
    return {"output": output, "input_grad": input_grad}


def exact_program(case, values):
    """For AVG pooling and every fused activation, torch_program's math at high precision
    (conformance.exact): the pooling as the exact linear map it is at the case's input (PyTorch's
    Jacobian: shares 1/count, or the maximum's selection), the activation and its derivative at
    high precision, and the input gradient as exact sums, each rounded once. MAX pooling alone
    moves values and sums short dyadic gradients: exact in float64 (no reference)."""
    from .. import exact

    attrs = case.attrs
    if attrs.pool_type is PoolOp.MAX and attrs.activation is None:
        return {}
    import torch.nn.functional as F

    kernel, stride = (attrs.kernel_h, attrs.kernel_w), (attrs.stride_h, attrs.stride_w)
    padding = (attrs.padding_h, attrs.padding_w)

    def pool(input):
        if attrs.pool_type is PoolOp.MAX:
            return F.max_pool2d(input, kernel, stride, padding)
        return F.avg_pool2d(input, kernel, stride, padding, count_include_pad=attrs.count_include_pad)

    (linear,) = exact.linear_maps(pool, [case.inputs["input"]])
    pre = linear.forward(values["input"])
    if attrs.activation is None:
        return {"output": pre, "input_grad": linear.adjoint(values["output_grad"])}
    output, derivative = exact.activation(attrs.activation.name, pre)
    return {"output": output, "input_grad": linear.adjoint(values["output_grad"] * derivative)}
