"""softmax cases: every dim of non-square 3-D and 4-D tensors (negative dims too),
ranks 1 and 2, a row holding +-1000 (stability), float64, the row lengths and
layouts that reach each GPU kernel, and YOLOv10's PSA and DFL softmaxes.

Tolerances: softmax needs exp and a division, so results are not exact; one
bound for every case, measured as conformance.compare counts it (ulps, with the
floor of n ulps of the tensor's largest magnitude):
- on the CPU (NumPy in the case's dtype): output <= 7 ulps (column_600_block:
  NumPy sums the 600 terms of a non-contiguous axis one after another; every
  other case <= 1), input_grad <= 6 (column_600_block, rank2_3x6_dim_neg2;
  others <= 3.5: g - sum(g * y) cancels where g is close to the dot);
- on the H200 (each kernel's own summation order, expf): output <= 2,
  input_grad <= 4.
Each case states the larger of the two devices' measurements (tools/measure_ulps.py),
at least 1: MEASURED below.
"""

import numpy as np

from kernels import SoftmaxAttrs
from kernels.runtime.core import BFLOAT16

from ..case import EXACT, CaseTable, nonfinite, pattern, ulp

TABLE = CaseTable("softmax")

# ulps each case needs, the larger of the CPU's and the H200's (see the module docstring).
MEASURED = {
    "3d_dim0": 3,
    "3d_dim1": 1,
    "3d_dim2": 2,
    "3d_dim_neg1": 4,
    "3d_dim_neg3": 1,
    "4d_dim0": 2,
    "4d_dim1": 3,
    "4d_dim2": 1,
    "4d_dim3": 4,
    "4d_dim_neg2": 3,
    "column_20_cached": 2,
    "column_40": 2,
    "column_600_block": 7,
    "f64_3d_dim0": 2,
    "f64_3d_dim_neg1": 3,
    "f64_4d_dim2": 1,
    "rank1_7": 1,
    "rank1_neg1_33": 1,
    "rank2_3x6_dim1": 2,
    "rank2_3x6_dim_neg2": 6,
    "row_1100_block": 2,
    "row_20_warp": 1,  # the CPU measured; the H200 not yet (a warp's shuffle sums: see row_70)
    "row_70": 2,
    "size1_dim": 1,
    "stable_pm1000": 1,
    "stable_pm1000_dim0": 1,
    "yolov10_dfl": 2,
    "yolov10_psa_scores": 3,
    "zero_size": 1,
}


def _scores(dims):
    """Multiples of 1/4 in [-2.25, 2.25] from a quadratic in the flat index: unlike a linear
    pattern, the differences along any dim vary, and softmax depends only on those."""
    index = np.arange(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
    return ((index * (index + 3) // 2 % 19 - 9) * 0.25).reshape(dims)


def _add(name, dims, dim, dtype=np.float32, description="", input=None, output_grad=None):
    TABLE.add(name, SoftmaxAttrs(dim),
              {"input": _scores(dims) if input is None else input,
               "output_grad": pattern(dims, modulus=13, scale=0.5, offset=5) if output_grad is None else output_grad},
              dtype=dtype, tolerance=ulp(MEASURED[name]), description=description)


_add("3d_dim0", (3, 4, 5), 0, description="outer dim: inner > 1 (thread per column)")
_add("3d_dim1", (3, 4, 5), 1)
_add("3d_dim2", (3, 4, 5), 2, description="last dim: rows of 5 (8-lane groups)")
_add("3d_dim_neg1", (4, 2, 3), -1, description="negative dim counts from the end")
_add("3d_dim_neg3", (4, 2, 3), -3)
_add("4d_dim0", (2, 3, 4, 5), 0)
_add("4d_dim1", (2, 3, 4, 5), 1)
_add("4d_dim2", (2, 3, 4, 5), 2)
_add("4d_dim3", (2, 3, 4, 5), 3)
_add("4d_dim_neg2", (2, 3, 5, 4), -2)
_add("rank1_7", (7,), 0)
_add("rank1_neg1_33", (33,), -1, description="one row of 33: a full warp, two values per lane")
_add("rank2_3x6_dim1", (3, 6), 1)
_add("rank2_3x6_dim_neg2", (3, 6), -2)
_add("size1_dim", (3, 1, 4), 1, description="a softmax over one element is 1, its gradient 0")
_add("stable_pm1000", (2, 4), -1, input=[[1000, -1000, 999.5, 998], [-1000, -1000.5, -999, 0]],
     description="exp without the max subtracted overflows: no inf or NaN allowed")
_add("stable_pm1000_dim0", (2, 3), 0, input=[[1000, -1000, 0.5], [-1000, 1000, 0]])
_add("f64_4d_dim2", (2, 3, 4, 5), 2, np.float64)
_add("f64_3d_dim_neg1", (3, 2, 7), -1, np.float64)
_add("f64_3d_dim0", (3, 2, 7), 0, np.float64)
_add("row_20_warp", (3, 20), -1, description="rows of 20: a warp a row, one value a lane (rows of 17 to 32)")
_add("row_70", (3, 70), 1, description="rows of 70: a warp with 4 values per lane, the last ones padded")
_add("row_1100_block", (2, 1100), -1, description="rows longer than 1024: one block per row")
_add("column_20_cached", (2, 20, 3), 1, description="inner > 1, a dim of 20: the column in registers (up to 32)")
_add("column_40", (2, 40, 3), 1, description="inner > 1, a dim of 40: a thread loops over its column")
_add("column_600_block", (2, 600, 3), 1, description="few columns and a long dim: one block per column")
_add("zero_size", (2, 0, 3), 2, description="zero-size tensor: nothing to do")
_add("yolov10_psa_scores", (1, 2, 6, 6), -1, description="PSA: softmax of (B, heads, HW, HW) scores over the last dim")
_add("yolov10_dfl", (2, 16, 4, 5), 1, description="DFL decode: softmax over the 16 bins of (B, 16, 4, anchors)")


# --------------------------------------------------------------------------- half precision
# float16 and bfloat16, computed in float32 (max, exp, sums, quotients; backward's dot) and rounded
# once per result on both devices. The float32 error (a few float32 ulps) is far below a half ulp,
# so a half result differs from the golden (float64 rounded once) only where the float32 value and
# the float64 one round to different sides of a half-way point: HALF_MEASURED, the ulps a case needs
# per tensor, the larger of the two devices' measurements (absent: EXACT).
F16, BF16 = np.dtype(np.float16), BFLOAT16
HALF_MEASURED = {}  # name -> {tensor: ulps}


def _half(name, dims, dim, input=None, dtypes=(("f16", F16), ("bf16", BF16)), description=""):
    for suffix, dtype in dtypes:
        key = f"{name}_{suffix}"
        measured = HALF_MEASURED.get(key, {})
        TABLE.add(key, SoftmaxAttrs(dim),
                  {"input": _scores(dims) if input is None else input,
                   "output_grad": pattern(dims, modulus=13, scale=0.5, offset=5)},
                  dtype=dtype, tolerance={"*": EXACT, **{k: ulp(v) for k, v in measured.items()}},
                  description=description)


# Measured on the CPU and the H200 (tools/measure_ulps.py, 2026-12-01): 0 ulps on every half case,
# output and input_grad, on both devices (the H200's other summation orders and expf move no value
# across a half-way point), but stable_pm1024_bf16's input_grad: 1 on both (its dot g - sum(g y)
# cancels to about one float32 ulp, which the two devices and the float64 golden round apart).
HALF_MEASURED.update({"stable_pm1024_bf16": {"input_grad": 1}})
_half("3d_dim0", (3, 4, 5), 0, description="inner > 1 (thread per column) in half precision")
_half("3d_dim2", (3, 4, 5), 2, description="rows of 5 (8-lane groups) in half precision")
_half("4d_dim1", (2, 3, 4, 5), 1)
_half("row_20_warp", (3, 20), -1, description="rows of 20: a warp a row")
_half("row_70", (3, 70), 1, description="rows of 70: 4 values a lane (scalar loads: 70 is not a multiple of 8)")
_half("row_256_packs", (3, 256), 1, description="rows of 256: 8 values a lane, one 16-byte pack of halves")
_half("row_1100_block", (2, 1100), -1,
      description="rows of 1100, a block per row: float32 sums of 1100 terms (bfloat16's 8-bit mantissa would not hold them)")
_half("column_20_cached", (2, 20, 3), 1, description="inner > 1, a dim of 20 in registers")
_half("column_40", (2, 40, 3), 1)
_half("column_600_block", (2, 600, 3), 1, description="few columns, a long dim: a block per column")
_half("yolov10_psa_scores", (1, 2, 6, 6), -1, description="PSA's attention softmax in half precision")
_half("yolov10_dfl", (2, 16, 4, 5), 1, description="DFL's softmax over 16 bins in half precision")
_half("stable_near_max", (2, 4), -1, dtypes=(("f16", F16),),
      input=[[65504, -65504, 65472, 0], [-65504, -65472, -65504, 60000]],
      description="float16's extremes: x - max (to -131008) leaves float16's range but not float32's; no NaN")
_half("stable_pm1024", (2, 4), -1, dtypes=(("bf16", BF16),), input=[[1024, -1024, 1016, 992], [-1024, -1020, -1016, 0]],
      description="bfloat16: exp without the max subtracted overflows; no inf or NaN allowed")


# --------------------------------------------------------------------------- medium cases
# Past CPU_BLOCK_ELEMENTS (kernels.runtime.cpu_paths): each way _cpu_blocks cuts a tensor, and a pass worth two
# parts. Bounds: the larger of the ulps measured on the CPU and on the H200 (tools/measure_ulps.py, the
# larger of output and input_grad). The rows of 131075 and the dim of 32769 are the H200's: its float32
# block sums of that many terms come 4 and 6 ulps from the correctly rounded output, and the gradient's
# dot 7 and 9 (the CPU, summing in float64 there, 1).
MEDIUM_MEASURED = {"medium_rows_blocks_threads": 2, "medium_rows_long": 7, "medium_planes_blocks": 2,
                   "medium_inner_columns": 2, "medium_whole_inner": 9}
for _name, _dims, _dim, _what in (
        ("medium_rows_blocks_threads", (875, 401), -1, "rows in blocks; the backward (4 MB) shared out"),
        ("medium_rows_long", (2, 131075), -1, "rows longer than a block: a block a row"),
        ("medium_planes_blocks", (5, 7, 4001), 1, "an inner dim: blocks of whole (dim, inner) planes"),
        ("medium_inner_columns", (1, 16, 8193), 1, "a plane past a block: parts of inner"),
        ("medium_whole_inner", (1, 32769, 4), 1, "a dim so long that 4 columns pass a block: whole planes")):
    TABLE.add(_name, SoftmaxAttrs(_dim), {"input": _scores(_dims), "output_grad": pattern(_dims, modulus=13, scale=0.5,
                                                                                         offset=5)},
              tolerance=ulp(MEDIUM_MEASURED[_name]), description=_what)


# --------------------------------------------------------------------------- non-finite values
# NaN, +inf and -inf in output_grad: input_grad = y (g - sum(g y)) is NaN along every row that holds
# one (the sum carries it to the whole row). A row with a -inf input has y = 0 there, and 0 times an
# infinite g - sum(g y) is NaN too. Rows without one are the finite cases' (bounds measured the same way).
# Measured on the CPU (tools/measure_ulps.py); the H200 to be measured (the finite twins 3d_dim2 and
# 3d_dim0 measured no more there than here).
MEASURED.update({"nonfinite_grad_3d_dim2": 2, "nonfinite_grad_3d_dim0": 3, "nonfinite_grad_neg_inf_input": 1})
_add("nonfinite_grad_3d_dim2", (3, 4, 5), 2, description="rows of 5: NaN, +inf, -inf in three rows' output_grad",
     output_grad=nonfinite(pattern((3, 4, 5), modulus=13, scale=0.5, offset=5), (2, 13, 27, 29, 44)))
_add("nonfinite_grad_3d_dim0", (3, 4, 5), 0, description="an outer dim: columns with NaN, +inf, -inf in output_grad",
     output_grad=nonfinite(pattern((3, 4, 5), modulus=13, scale=0.5, offset=5), (2, 13, 27, 33, 59)))
_NEG_INF_ROWS = _scores((3, 6))
_NEG_INF_ROWS[0, 1] = _NEG_INF_ROWS[1, 4] = _NEG_INF_ROWS[2, 0] = -np.inf
_add("nonfinite_grad_neg_inf_input", (3, 6), -1, input=_NEG_INF_ROWS,
     output_grad=nonfinite(pattern((3, 6), modulus=13, scale=0.5, offset=5), (1, 9, 15)),
     description="-inf inputs (y = 0) meeting NaN and infinite output gradients")
# --------------------------------------------------------------------------- end of non-finite values


def torch_program(case, tensors):
    import torch

    input = tensors["input"].requires_grad_()
    output = torch.softmax(input, case.attrs.dim)
    if case.dtype in (F16, BF16):
        # The backward reads the output as stored, in the half dtype (as PyTorch's half softmax
        # backward does): y rounded once, then y (g - sum(g y)) in float64. From the unrounded y a
        # near one-hot row's gradient (y = 0.99966 stored as 1.0) would be one no kernel can give.
        half = torch.float16 if case.dtype == F16 else torch.bfloat16
        stored = output.detach().to(half).to(torch.float64)
        g = tensors["output_grad"]
        input_grad = stored * (g - (g * stored).sum(case.attrs.dim, keepdim=True))
        return {"output": output, "input_grad": input_grad}
    (input_grad,) = torch.autograd.grad(output, [input], tensors["output_grad"])
    return {"output": output, "input_grad": input_grad}


def exact_program(case, values):
    """The same math at high precision (conformance.exact): y = exp(x - max) / sum, and
    y (g - sum(g y)), with the half cases' stored y as in torch_program; each rounded once."""
    import mpmath

    from .. import exact

    x, g, dim = values["input"], values["output_grad"], case.attrs.dim
    if x.size == 0:
        return {"output": x.copy(), "input_grad": x.copy()}
    shifted = x - exact.apply(lambda v: v, np.max(x, axis=dim, keepdims=True))
    e = exact.apply(mpmath.exp, shifted)
    y = e / exact.total(e, axis=dim, keepdims=True)
    stored = y
    if case.dtype in (F16, BF16):
        stored = exact.hp(exact.round_to(y, case.dtype))
    return {"output": y, "input_grad": stored * (g - exact.total(g * stored, axis=dim, keepdims=True))}
