"""element_binary cases: every op on equal shapes and on every broadcasting pattern
(either side, both sides at once, size-1 dims in the middle, different ranks, a
one-element operand), MAX/MIN with ties and NaN, DIV by powers of two (exact) and by
other values (measured ulp bounds), float64, YOLOv10's residual add and broadcast
multiplies, and shapes that reach every GPU reduction path (split reductions
included).

Values are small dyadic fractions, so sums and products are exact in float32 in any
order: the CPU (pairwise np.sum) and GPU (per-thread or per-warp fixed-order sums)
must give the golden's bits. Only DIV by non-powers of two is inexact; see _DIV_ULPS.
"""

import numpy as np

from kernels import BinaryOpType, ElementBinaryAttrs, element_binary
from kernels.runtime.core import BFLOAT16

from ..case import EXACT, CaseTable, nonfinite, pattern, ulp

TABLE = CaseTable("element_binary")

ADD, SUB, MUL, DIV, MAX, MIN = (BinaryOpType.ADD, BinaryOpType.SUB, BinaryOpType.MUL, BinaryOpType.DIV,
                                BinaryOpType.MAX, BinaryOpType.MIN)

# (lhs dims, rhs dims) of each broadcasting pattern.
LAYOUTS = {
    "same": ((2, 3, 4), (2, 3, 4)),
    "bcast_lhs": ((2, 1, 4), (2, 3, 4)),
    "bcast_rhs": ((2, 3, 4), (2, 3, 1)),
    "bcast_both": ((2, 1, 4), (1, 3, 1)),
    "mid_ones": ((2, 1, 3, 4), (2, 5, 1, 4)),
    "rank_mismatch": ((4,), (2, 3, 4)),
    "scalar_rhs": ((2, 3, 4), (1,)),
}

# Divisors: powers of two (every quotient exact) and other short dyadic values.
_POW2 = [0.5, -2.0, 1.0, 4.0, -0.25, 2.0, -1.0, 0.125]
# Thirteen of them: a cycle of 12 repeated along the 12-element stride of (2, 3, 4).
_OTHER = [3.0, -5.0, 1.5, 7.0, -0.75, 6.0, 2.5, -3.5, 5.0, 1.25, -6.0, 0.75, -1.5]


def _cycle(dims, values, offset=0):
    count = int(np.prod(dims, dtype=np.int64))
    return np.array([values[(i * 5 + offset) % len(values)] for i in range(count)], dtype=np.float64).reshape(dims)


def _out_dims(lhs_dims, rhs_dims):
    return element_binary.broadcast_dims(lhs_dims, rhs_dims)


def _inputs(op, lhs_dims, rhs_dims, divisors=_POW2):
    out_dims = _out_dims(lhs_dims, rhs_dims)
    if op in (MAX, MIN):
        # lhs in {-1, -0.5, 0, 0.5, 1}, rhs in quarters of [-1, 1]: ties, where each side gets g / 2.
        # (rhs's period 9: a period of 5 on both sides repeated along strides of 20 and 400.)
        lhs, rhs = pattern(lhs_dims, 5, 0.5, 0), pattern(rhs_dims, 9, 0.25, 2)
    elif op is DIV:
        lhs, rhs = pattern(lhs_dims, 17, 0.25, 0), _cycle(rhs_dims, divisors, 3)
    else:
        lhs, rhs = pattern(lhs_dims, 17, 0.25, 0), pattern(rhs_dims, 11, 0.5, 4)
    return {"lhs": lhs, "rhs": rhs, "output_grad": pattern(out_dims, 13, 0.25, 5)}


def _add(name, op, lhs_dims, rhs_dims, dtype=np.float32, tolerance=EXACT, inputs=None, description=""):
    TABLE.add(name, ElementBinaryAttrs(op), inputs or _inputs(op, lhs_dims, rhs_dims), dtype=dtype,
              tolerance=tolerance, description=description or f"{op.name} {lhs_dims} with {rhs_dims}")


# Every op on every broadcasting pattern, float32, exact (DIV by powers of two).
for _op in BinaryOpType:
    for _layout, (_lhs, _rhs) in LAYOUTS.items():
        _add(f"{_op.name.lower()}_{_layout}", _op, _lhs, _rhs)

_add("sub_scalar_lhs", SUB, (1,), (3, 4), description="one-element lhs: lhs_grad sums every output element")
_add("div_scalar_lhs", DIV, (1,), (3, 4))

# MAX/MIN where either side is NaN: the output is NaN and both sides get g (torch's rule).
_NAN_LHS = pattern((2, 3, 4), 5, 0.5, 0)
_NAN_RHS = pattern((2, 3, 4), 5, 0.5, 2)
_NAN_LHS.reshape(-1)[[1, 6, 11]] = np.nan
_NAN_RHS.reshape(-1)[[6, 17, 20]] = np.nan
for _op in (MAX, MIN):
    _add(f"{_op.name.lower()}_nan", _op, (2, 3, 4), (2, 3, 4),
         inputs={"lhs": _NAN_LHS, "rhs": _NAN_RHS, "output_grad": pattern((2, 3, 4), 13, 0.25, 5)},
         description="NaN on either side (one position on both): NaN propagates, both sides get g")
_NAN_ROW = pattern((3, 1), 5, 0.5, 1)
_NAN_ROW[1, 0] = np.nan
_add("max_nan_bcast", MAX, (3, 1), (3, 4),
     inputs={"lhs": _NAN_ROW, "rhs": pattern((3, 4), 5, 0.5, 2), "output_grad": pattern((3, 4), 13, 0.25, 5)},
     description="a NaN broadcast along a row: its lhs_grad sums the whole row of g")

# DIV by values that are not powers of two: the quotients round. Bounds are the smallest
# that pass, measured against torch's float64 result rounded to the case's dtype on the
# CPU and on the GPU's summation order (emulated bit for bit in
# tests/test_element_binary_plan.py; the same elementwise bits, another order of sums):
# - float32 output and unreduced lhs_grad = g / rhs: one correctly rounded division, and
#   rounding the float64 quotient of float32 values to float32 gives the same bits: exact.
# - float32 rhs_grad = -g * ((lhs / rhs) / rhs): three float32 roundings against one:
#   1 ulp. Reduced gradients add roundings of their sums: 1 ulp, except the one-element
#   rhs of scalar_rhs, a sum of 24 such terms: 2 ulp in the GPU's order (1 on the CPU).
# - float64: the same formulas in torch's order of operations, so unreduced results are
#   exact; sums of inexact terms in another order than torch's sum_to_size: 1 ulp where
#   measured (0 elsewhere, so exact).
_DIV_ULPS = {
    "same": {"output": EXACT, "lhs_grad": EXACT, "rhs_grad": ulp(1)},
    # rhs_grad sums 8 rounded quotients: 3 ulps of the correctly rounded sum on the CPU, 7 on the
    # H200 (its reduction adds them in another order).
    "bcast_both": {"output": EXACT, "lhs_grad": ulp(1), "rhs_grad": ulp(7)},
    "rank_mismatch": {"output": EXACT, "lhs_grad": ulp(1), "rhs_grad": ulp(1)},
    "scalar_rhs": {"output": EXACT, "lhs_grad": EXACT, "rhs_grad": ulp(2)},
}
_DIV_ULPS_F64 = {
    # -dy lhs / rhs^2 rounds three times: 1 ulp from the correctly rounded golden.
    "same": {"output": EXACT, "lhs_grad": EXACT, "rhs_grad": ulp(1)},
    # The broadcast gradients are sums of rounded quotients, 1 ulp from the correctly rounded sum.
    "bcast_both": {"output": EXACT, "lhs_grad": ulp(1), "rhs_grad": ulp(1)},
    "rank_mismatch": {"output": EXACT, "lhs_grad": ulp(1), "rhs_grad": ulp(1)},
    "scalar_rhs": {"output": EXACT, "lhs_grad": EXACT, "rhs_grad": ulp(1)},
}
for _layout in _DIV_ULPS:
    _lhs, _rhs = LAYOUTS[_layout]
    _add(f"div_nonpow2_{_layout}", DIV, _lhs, _rhs, tolerance=_DIV_ULPS[_layout],
         inputs=_inputs(DIV, _lhs, _rhs, _OTHER), description=f"DIV by 3, -5, 1.5, 7, ... {_lhs} / {_rhs}")
    _add(f"div_nonpow2_{_layout}_f64", DIV, _lhs, _rhs, np.float64, tolerance=_DIV_ULPS_F64[_layout],
         inputs=_inputs(DIV, _lhs, _rhs, _OTHER), description=f"float64 DIV by non-powers of two {_lhs} / {_rhs}")

# float64 on the other ops and patterns.
_add("add_bcast_both_f64", ADD, (2, 1, 4), (1, 3, 1), np.float64)
_add("sub_scalar_rhs_f64", SUB, (2, 3, 4), (1,), np.float64)
_add("mul_mid_ones_f64", MUL, (2, 1, 3, 4), (2, 5, 1, 4), np.float64)
_add("div_bcast_rhs_f64", DIV, (2, 3, 4), (2, 3, 1), np.float64)
_add("max_rank_mismatch_f64", MAX, (4,), (2, 3, 4), np.float64)
_add("min_same_f64", MIN, (2, 3, 4), (2, 3, 4), np.float64)

# YOLOv10, small: C2f's residual add, PSA's attention scaling broadcast over one dim,
# and a per-channel (1, C, 1, 1) multiply.
_add("yolov10_residual_add", ADD, (1, 4, 5, 3), (1, 4, 5, 3))
_add("yolov10_attention_scale_mul", MUL, (1, 2, 4, 6), (1, 2, 1, 6))
_add("yolov10_per_channel_mul", MUL, (1, 4, 5, 3), (1, 4, 1, 1))

# The GPU's reduction paths (element_binary.plan.grad_plan): a warp per gradient element with
# two reduced dims; split reductions (partial sums, then their sum) in both kernels.
_add("per_channel_batch2_mul", MUL, (2, 3, 5, 8), (1, 3, 1, 1),
     description="rhs_grad: warp per channel, reduced over batch and 40 positions")
_add("per_channel_split_mul", MUL, (1, 2, 24, 25), (1, 2, 1, 1),
     description="rhs_grad sums 600 positions a channel: a split warp reduction (2 chunks)")
_add("rows_split_add", ADD, (3, 100, 4), (4,), description="rhs_grad sums 300 rows: a split thread-per-element reduction")
_add("rows_split_max", MAX, (4,), (3, 100, 4), description="lhs_grad of a broadcast MAX with ties, split reduction")

# The GPU's forward along rows (element_binary.plan: an innermost dim of ROWS_MIN_INNER elements or more,
# each row's offsets found once): in 16-byte vectors where the row length allows them, one element at a
# time where it does not, with either side broadcast along the rows, or both sides along different outer dims.
# Periods 31 and 37 (primes dividing no row length or row count here), so no slice repeats another.
def _rows_inputs(op, lhs_dims, rhs_dims):
    inputs = {"lhs": pattern(lhs_dims, 31, 0.25, 0), "rhs": pattern(rhs_dims, 37, 0.5, 4),
              "output_grad": pattern(_out_dims(lhs_dims, rhs_dims), 31, 0.25, 5)}
    if op is DIV:
        inputs["rhs"] = _cycle(rhs_dims, _POW2, 3)
    return inputs


_add("rows_vector_mul", MUL, (2, 3, 1040), (2, 3, 1), inputs=_rows_inputs(MUL, (2, 3, 1040), (2, 3, 1)),
     description="rows of 1040 (a multiple of every dtype's vector), rhs one value a row: the vector path")
_add("rows_scalar_add", ADD, (2, 1, 1037), (1, 3, 1037), inputs=_rows_inputs(ADD, (2, 1, 1037), (1, 3, 1037)),
     description="rows of 1037 (no vectors), lhs broadcast along dim 1 and rhs along dim 0")
_add("rows_lhs_broadcast_div", DIV, (3, 1), (3, 1100), inputs=_rows_inputs(DIV, (3, 1), (3, 1100)),
     description="lhs one value a row divided by rows of 1100 (1100 = 4 * 275, 8 does not divide it)")
_add("rows_nan_max", MAX, (2, 1024), (1, 1024),
     inputs={"lhs": nonfinite(pattern((2, 1024), 5, 0.5, 0), [1, 700, 1030]),
             "rhs": nonfinite(pattern((1, 1024), 9, 0.25, 2), [5, 700]),
             "output_grad": pattern((2, 1024), 13, 0.25, 5)},
     description="MAX along rows with NaN and infinities on either side: NaN propagates in the vector path")

# Zero-size: nothing to compute, but a broadcast operand's gradient is an empty sum (zeros).
_add("zero_size_mul", MUL, (2, 0, 3), (2, 1, 3), description="output (2, 0, 3): rhs_grad is all zeros")


# --------------------------------------------------------------------------- half precision
# float16 and bfloat16 on the same dyadic values: each element is computed in float32 and rounded
# once, each broadcast gradient summed in float32 (the GPU's partial sums too) and rounded once, so
# every case whose float32 results are exact is exact here as well (the values are short dyadic
# fractions, exact in both half dtypes, and so are their sums). DIV by non-powers of two rounds:
# HALF_MEASURED states the ulps its cases need, the larger of the two devices' measurements.
F16, BF16 = np.dtype(np.float16), BFLOAT16
HALF_MEASURED = {}  # name -> {tensor: ulps}; absent: EXACT


def _half_tolerance(name):
    ulps = HALF_MEASURED.get(name)
    return EXACT if ulps is None else {k: (EXACT if v == 0 else ulp(v)) for k, v in ulps.items()}


# Measured on the CPU and the H200 (tools/measure_ulps.py, 2026-12-01): 0 ulps on every half DIV case,
# output, lhs_grad and rhs_grad, so HALF_MEASURED stays empty: EXACT. Unreduced results are the same
# float32 operations in the same order on both devices (no FMA contraction on the GPU: mul_rn, div_rn).
# The broadcast gradients of div_nonpow2_bcast_both are float32 sums of inexact terms in another order
# on the GPU, but no sum of these values lies within a float32 ulp of a half-way point of the half dtype.
for _suffix, _dtype in (("f16", F16), ("bf16", BF16)):
    for _op in BinaryOpType:
        for _layout in ("same", "bcast_both", "mid_ones"):
            _lhs, _rhs = LAYOUTS[_layout]
            _add(f"{_op.name.lower()}_{_layout}_{_suffix}", _op, _lhs, _rhs, _dtype,
                 description=f"{_op.name} {_lhs} with {_rhs} in {_dtype.name}")
    for _layout in ("same", "bcast_both"):
        _lhs, _rhs = LAYOUTS[_layout]
        _name = f"div_nonpow2_{_layout}_{_suffix}"
        _add(_name, DIV, _lhs, _rhs, _dtype, tolerance=_half_tolerance(_name), inputs=_inputs(DIV, _lhs, _rhs, _OTHER),
             description=f"{_dtype.name} DIV by 3, -5, 1.5, 7, ...: the quotients round once")
    _add(f"max_nan_{_suffix}", MAX, (2, 3, 4), (2, 3, 4), _dtype,
         inputs={"lhs": _NAN_LHS, "rhs": _NAN_RHS, "output_grad": pattern((2, 3, 4), 13, 0.25, 5)},
         description="NaN on either side in half precision: NaN propagates, both sides get g")
    _add(f"yolov10_per_channel_mul_{_suffix}", MUL, (1, 4, 5, 3), (1, 4, 1, 1), _dtype)
    _add(f"per_channel_split_mul_{_suffix}", MUL, (1, 2, 24, 25), (1, 2, 1, 1), _dtype,
         description="rhs_grad sums 600 positions a channel (a split warp reduction): float32 partial sums")
    _add(f"rows_vector_mul_{_suffix}", MUL, (2, 3, 1040), (2, 3, 1), _dtype,
         inputs=_rows_inputs(MUL, (2, 3, 1040), (2, 3, 1)),
         description=f"rows of 1040 in {_dtype.name} (130 vectors of 8): the rows' vector path")
    _add(f"rows_scalar_add_{_suffix}", ADD, (2, 1, 1037), (1, 3, 1037), _dtype,
         inputs=_rows_inputs(ADD, (2, 1, 1037), (1, 3, 1037)),
         description=f"rows of 1037 in {_dtype.name}: the rows' element path")
    _add(f"rows_split_add_{_suffix}", ADD, (3, 100, 4), (4,), _dtype,
         description="rhs_grad sums 300 rows (split thread-per-element reduction), float32 sums rounded once: "
                     "bfloat16 accumulation (8-bit mantissa) would lose the small terms")

# Sums that leave float16's range on the way and come back: each column of output_grad is
# 40000, 40000, -40000, -32768, 2c + 1, 0.5; a float16 running sum would overflow to inf at
# 80000, the float32 sum is exact (7233.5 + 2c) and rounds once.
_BIG = np.array([[40000.0] * 4, [40000.0] * 4, [-40000.0] * 4, [-32768.0] * 4, [1.0, 3.0, 5.0, 7.0], [0.5] * 4])
_add("add_bcast_sum_near_max_f16", ADD, (6, 4), (1, 4), F16,
     inputs={"lhs": pattern((6, 4)), "rhs": pattern((1, 4), offset=3), "output_grad": _BIG},
     description="rhs_grad sums columns through 80000 (beyond 65504): finite in float32, rounded once")
# bfloat16: 256 + 1 + 1 + ... (one term 2 * 128, then 15 terms 1 * 1): a bfloat16 running sum stays at
# 256 (256 + 1 rounds back to 256), the float32 sum is 271 and rounds once to 272.
_LONG = np.array([128.0] + [1.0] * 15).reshape(16, 1)
_add("mul_bcast_long_sum_bf16", MUL, (16, 1), (1, 1), BF16,
     inputs={"lhs": _LONG, "rhs": np.ones((1, 1)), "output_grad": np.array([2.0] + [1.0] * 15).reshape(16, 1)},
     description="rhs_grad = sum(g * lhs) over 16 rows: 256 + 15 ones, 271 in float32 rounded once to 272")



# --------------------------------------------------------------------------- non-finite output gradients
# NaN, +inf and -inf in output_grad where it matters: at MAX/MIN ties (each side gets g / 2) and
# where one side wins (the other gets 0, not 0 * NaN), at lhs = 0 (MUL's and DIV's rhs_grad multiply
# by it: 0 * inf is NaN), and in the broadcast sums (inf + -inf). The finite elements are the plain
# cases'; DIV by powers of two, so exact.
def _nonfinite_inputs(op, lhs_dims, rhs_dims):
    inputs = _inputs(op, lhs_dims, rhs_dims)
    out_dims = _out_dims(lhs_dims, rhs_dims)
    lhs = np.broadcast_to(inputs["lhs"], out_dims).reshape(-1)
    rhs = np.broadcast_to(inputs["rhs"], out_dims).reshape(-1)
    ties, zeros = np.flatnonzero(lhs == rhs), np.flatnonzero(lhs == 0)
    positions = sorted(set(ties[:3]) | set(zeros[:3]) | {1, len(lhs) // 2, len(lhs) - 1})
    inputs["output_grad"] = nonfinite(inputs["output_grad"], positions)
    return inputs


for _op in BinaryOpType:
    for _layout in ("same", "bcast_both"):
        _lhs, _rhs = LAYOUTS[_layout]
        _add(f"nonfinite_grad_{_op.name.lower()}_{_layout}", _op, _lhs, _rhs, inputs=_nonfinite_inputs(_op, _lhs, _rhs),
             description=f"{_op.name} {_lhs} with {_rhs}: NaN, +inf and -inf in output_grad")
# --------------------------------------------------------------------------- end of non-finite output gradients


_TORCH_OPS = {ADD: "add", SUB: "sub", MUL: "mul", DIV: "div", MAX: "maximum", MIN: "minimum"}


# --------------------------------------------------------------------------- medium cases
# Past _CPU_PARALLEL_MIN outputs and 4 MiB moved (kernels.runtime.cpu_paths): the forward and the gradient
# with nothing to sum cut along an axis and shared out; the broadcast side's gradient summed in parts
# along the axis it keeps. MUL of short dyadics: every product and every sum of 1750 exact.
_add("medium_mul_broadcast_threads", MUL, (1, 300), (1750, 300),
     inputs={"lhs": pattern((1, 300), modulus=13, offset=2), "rhs": pattern((1750, 300), modulus=251, scale=1 / 32),
             "output_grad": pattern((1750, 300), modulus=241, scale=1 / 16, offset=7)},
     description="element_binary on 525000 outputs: parts of rows (forward, rhs_grad), lhs_grad summed in parts")


def torch_program(case, tensors):
    import torch

    lhs = tensors["lhs"].requires_grad_()
    rhs = tensors["rhs"].requires_grad_()
    output = getattr(torch, _TORCH_OPS[case.attrs.op_type])(lhs, rhs)
    lhs_grad, rhs_grad = torch.autograd.grad(output, [lhs, rhs], tensors["output_grad"])
    return {"output": output, "lhs_grad": lhs_grad, "rhs_grad": rhs_grad}


def exact_program(case, values):
    """For DIV by values that are not powers of two, torch_program's math at high precision
    (conformance.exact): the quotient, and the gradients dy / rhs and -dy lhs / rhs^2 summed
    exactly over the broadcast axes, each rounded once. Every other op and divisor is exact in
    float64 (no reference)."""
    from .. import exact

    lhs, rhs, output_grad = values["lhs"], values["rhs"], values["output_grad"]
    if case.attrs.op_type is not DIV or all(exact.is_power_of_two(v) for v in rhs.reshape(-1)):
        return {}

    def reduce_to(gradient, shape):  # sums over the axes the operand was broadcast along
        leading = gradient.ndim - len(shape)
        gradient = exact.total(gradient, axis=tuple(range(leading))) if leading else gradient
        axes = tuple(axis for axis, size in enumerate(shape) if size == 1 and gradient.shape[axis] != 1)
        return exact.total(gradient, axis=axes, keepdims=True) if axes else gradient

    return {"output": lhs / rhs, "lhs_grad": reduce_to(output_grad / rhs, lhs.shape),
            "rhs_grad": reduce_to(-output_grad * lhs / (rhs * rhs), rhs.shape)}
