"""upsample cases: NEAREST with scale 2, 3 and 4 on non-square planes, batch and
channels > 1, float and integer dtypes; BILINEAR (align_corners=False) with scale
2 and 3; zero-size; and YOLOv10's nearest x2 at a small size."""

import numpy as np

from kernels import UpsampleAttrs, UpsampleMode, upsample
from kernels.runtime.core import BFLOAT16

from ..case import EXACT, CaseTable, int_pattern, nonfinite, pattern, ulp

TABLE = CaseTable("upsample")

NEAREST, BILINEAR = UpsampleMode.NEAREST, UpsampleMode.BILINEAR


def _add(name, dims, scale, mode=NEAREST, dtype=np.float32, tolerance=EXACT, description="", output_grad=None):
    attrs = UpsampleAttrs(scale, mode)
    out_dims = upsample.output_dims(attrs, tuple(dims))
    if np.dtype(dtype).kind in "iub":
        # Small non-negative integers: a block sum of 9 stays below 256 (uint8).
        inputs = {"input": int_pattern(dims), "output_grad": int_pattern(out_dims, modulus=19, offset=3)}
    else:
        inputs = {"input": pattern(dims), "output_grad": pattern(out_dims, modulus=13, offset=3, scale=0.5)}
    if output_grad is not None:
        inputs["output_grad"] = np.asarray(output_grad, dtype=np.float64).reshape(out_dims)
    TABLE.add(name, attrs, inputs, dtype=dtype, tolerance=tolerance, description=description)


# NEAREST: the backward is a sum of s*s small dyadic values, exact in every dtype.
_add("nearest_x2_2x3x4x5", (2, 3, 4, 5), 2, description="H != W, batch and channels > 1")
_add("nearest_x3_2x2x3x4", (2, 2, 3, 4), 3)
_add("nearest_x2_f64", (2, 3, 5, 3), 2, dtype=np.float64)
_add("nearest_x3_f64", (3, 2, 2, 5), 3, dtype=np.float64)
_add("nearest_x4_1x2x3x2", (1, 2, 3, 2), 4, description="a scale beyond YOLOv10's")
_add("nearest_x2_int32", (2, 3, 4, 5), 2, dtype=np.int32)
_add("nearest_x3_int32", (2, 2, 3, 4), 3, dtype=np.int32)
_add("nearest_x2_uint8", (2, 3, 3, 5), 2, dtype=np.uint8)
_add("nearest_x3_uint8", (2, 2, 4, 3), 3, dtype=np.uint8, description="block sums of 9 up to 162 fit uint8")
_add("nearest_x2_int64", (2, 2, 2, 3), 2, dtype=np.int64)
_add("nearest_x2_1x1_plane", (2, 3, 1, 1), 2, description="1x1 planes")
_add("nearest_zero_batch", (0, 2, 3, 4), 2, description="zero-size tensor: nothing to do")
_add("yolov10_nearest_x2_1x4x3x5", (1, 4, 3, 5), 2, description="YOLOv10 neck upsample x2, small")
# Half precision: the forward moves bits, the backward sums each block in float32 and rounds once
# (these sums of dyadic values are exact, so every case is exact).
for _suffix, _dtype in (("f16", np.float16), ("bf16", BFLOAT16)):
    _add(f"nearest_x2_{_suffix}", (2, 3, 4, 5), 2, dtype=_dtype, description="the x2 pair paths in half precision")
    _add(f"nearest_x3_{_suffix}", (2, 2, 3, 4), 3, dtype=_dtype)
# float16: each 2x2 block is 40000, 40000 / -40000, -30000 (rows summed first: 80000 then -70000);
# a float16 running sum overflows at 80000, float32 gives 10000.
_add("nearest_x2_near_max_pair_f16", (1, 1, 1, 2), 2, dtype=np.float16,
     output_grad=[[40000, 40000, 1, 2], [-40000, -30000, 3, 4]],
     description="a block whose row sum (80000) leaves float16's range: float32 sums keep it")
# bfloat16: a 4x4 block of 256 and fifteen ones: 271 in float32, rounded once to 272; a bfloat16
# running sum would stay at 256.
_add("nearest_x4_long_sum_bf16", (1, 1, 1, 1), 4, dtype=BFLOAT16, output_grad=[256] + [1] * 15,
     description="16 terms of a block: 256 + 15 ones, 271 in float32 rounded once to 272")

# BILINEAR, align_corners=False: with s = 2 (s = 4) every weight is a multiple of
# 1/4 (1/8), so with these dyadic values the results are exact. With s = 3 the
# weights are r/6 (1/6, 1/2, 5/6), not exact in binary. Smallest n that passes,
# measured on the CPU (the GPU rounds identically: same operations in the same
# order, no FMA contraction): float32 output 1, input_grad 2 (sums of up to 36
# rounded products); float64 output 3, input_grad 2, where the golden is the less
# accurate side: PyTorch's weight src - floor(src), src = (o + 0.5) / 3 - 0.5,
# loses low bits to cancellation, where ours is r/6 rounded once.
_add("bilinear_x2_2x3x4x5", (2, 3, 4, 5), 2, BILINEAR)
_add("bilinear_x2_f64", (2, 2, 3, 4), 2, BILINEAR, np.float64)
_add("bilinear_x2_1x2x1x3", (1, 2, 1, 3), 2, BILINEAR, description="H = 1: both rows clamp to the one row")
_add("bilinear_x4_1x2x3x2", (1, 2, 3, 2), 4, BILINEAR, description="weights in eighths")
_add("bilinear_x3_2x2x3x4", (2, 2, 3, 4), 3, BILINEAR, tolerance=ulp(2))
_add("bilinear_x3_f64", (2, 2, 4, 3), 3, BILINEAR, np.float64, tolerance=ulp(3))


# --------------------------------------------------------------------------- float16 and bfloat16
# NEAREST forward moves bits; its backward sums s*s gradients in float32 and rounds once; BILINEAR
# computes its weights, products and sums in float32 and rounds once. With s = 2 and s = 4 every
# weight is dyadic: exact in half (the sums of short dyadic values fit 8 bits). With s = 3 the
# float32 result is rounded once more to half: measured on the CPU and the H200 (tools/measure_ulps.py,
# 2026-12-01), output / input_grad, the same on both (the same float32 operations, no FMA): f16 0 / 0
# (EXACT), bf16 1 / 0 (the output: a float32 value and the float64 golden a half-way point apart).
_HALF = {"f16": np.float16, "bf16": BFLOAT16}
_X3_TOLERANCE = {"f16": EXACT, "bf16": {"*": EXACT, "output": ulp(1)}}


def _add_half(name, dims, scale, mode, dtype, tolerance=EXACT, description="", output_grad=None):
    attrs = UpsampleAttrs(scale, mode)
    out_dims = upsample.output_dims(attrs, tuple(dims))
    if output_grad is None:
        output_grad = pattern(out_dims, modulus=13, offset=3, scale=0.5)
    TABLE.add(name, attrs, {"input": pattern(dims), "output_grad": output_grad}, dtype=dtype, tolerance=tolerance,
              description=description)


def _cancelling_near_max(dims):
    """Blocks of 2x2 gradients near 65504, two positive over two negative (block k: 60160 + 256 (k mod 5),
    64512 - 256 (k mod 3) / -65280 + 256 (k mod 4), and the one that brings the sum to 256 (k mod 3)): a
    left-to-right half sum overflows at its first add, the float32 sum (0, 256 or 512) does not. Each
    block differs from its neighbours (one tiled block repeated along every axis). Multiples of 256
    up to 65280: exact in float16 and bfloat16."""
    n, c, h, w = dims
    k = np.arange(n * c * (h // 2) * (w // 2)).reshape(n, c, h // 2, 1, w // 2, 1)
    first = 60160.0 + 256.0 * (k % 5)
    second = 64512.0 - 256.0 * (k % 3)
    third = -65280.0 + 256.0 * (k % 4)
    fourth = 256.0 * (k % 3) - first - second - third
    blocks = np.concatenate([np.concatenate([first, second], axis=5), np.concatenate([third, fourth], axis=5)], axis=3)
    return blocks.reshape(n, c, h, w)


for _suffix, _dtype in _HALF.items():
    _add_half(f"nearest_x2_near_max_{_suffix}", (1, 2, 3, 4), 2, NEAREST, _dtype,
              output_grad=_cancelling_near_max((1, 2, 6, 8)),
              description="gradients near 65504 whose half running sum overflows; the float32 sum does not")
    _add_half(f"bilinear_x2_{_suffix}", (2, 3, 4, 5), 2, BILINEAR, _dtype, description="weights in quarters: exact")
    _add_half(f"bilinear_x4_{_suffix}", (1, 2, 3, 2), 4, BILINEAR, _dtype, description="weights in eighths: exact")
    _add_half(f"bilinear_x3_{_suffix}", (2, 2, 3, 4), 3, BILINEAR, _dtype, tolerance=_X3_TOLERANCE[_suffix],
              description="weights r/6: the float32 result rounded to half")
_add_half("nearest_x2_subnormal_f16", (1, 2, 3, 4), 2, NEAREST, np.float16,
          output_grad=pattern((1, 2, 6, 8), modulus=13, scale=2.0 ** -24),
          description="float16 subnormal gradients (multiples of 2^-24): block sums exact")


# --------------------------------------------------------------------------- medium cases
# Planes past cpu.PARALLEL_MIN_BYTES, 4 MiB moved (kernels.runtime.cpu_paths): cpu_planes shares them out.
TABLE.add("medium_nearest_x2_planes_threads", UpsampleAttrs(2, NEAREST),
          {"input": pattern((1, 5, 213, 199), modulus=251, scale=1 / 32),
           "output_grad": pattern((1, 5, 426, 398), modulus=241, scale=1 / 32, offset=3)},
          description="nearest x2 to 3.4 MB: cpu_planes' parts shared out to the threads, forward and backward")


# --------------------------------------------------------------------------- non-finite output gradients
# NaN, +inf and -inf in output_grad. NEAREST sums each block (+inf with -inf: NaN). BILINEAR follows
# PyTorch's backward, which adds each output's gradient times its weight to both source pixels, a
# zero weight too (0 * inf is NaN): output coordinates before the first source centre (clamped to 0)
# give pixel 1 a zero weight, a coordinate on a pixel centre (odd scales) gives the next pixel one,
# and at the last pixel, or a plane 1 wide, both taps land on one pixel, one of them with weight 0.
def _nonfinite_points(out_dims, points):
    return nonfinite(pattern(out_dims, modulus=13, offset=3, scale=0.5),
                     [int(np.ravel_multi_index(point, out_dims)) for point in points])


def _add_nonfinite(name, dims, scale, mode, points, tolerance=EXACT, description=""):
    attrs = UpsampleAttrs(scale, mode)
    out_dims = upsample.output_dims(attrs, dims)
    _add(name, dims, scale, mode, tolerance=tolerance, description=description,
         output_grad=_nonfinite_points(out_dims, points))


_add_nonfinite("nearest_x2_nonfinite_grad", (2, 2, 3, 4), 2, NEAREST,
               [(0, 0, 0, 0), (0, 0, 2, 3), (0, 1, 4, 5), (0, 1, 5, 5), (1, 0, 3, 7), (1, 1, 1, 2)],
               description="NaN, +inf and -inf in output_grad; +inf and -inf in one block give NaN")
_add_nonfinite("bilinear_x2_nonfinite_grad", (1, 2, 3, 4), 2, BILINEAR,
               [(0, 0, 0, 3), (0, 0, 3, 0), (0, 0, 5, 7), (0, 1, 0, 0), (0, 1, 2, 6), (0, 1, 4, 3)],
               description="row 0 and column 0 (clamped: a zero weight to pixel 1), the last row and column, inside")
_add_nonfinite("bilinear_x3_nonfinite_grad", (1, 2, 3, 4), 3, BILINEAR,
               [(0, 0, 1, 5), (0, 0, 7, 2), (0, 0, 4, 10), (0, 1, 0, 4), (0, 1, 8, 11), (0, 1, 3, 1)],
               tolerance=ulp(2),  # measured 2 (the GPU: the same bits)
               description="scale 3: rows and columns on a pixel centre (a zero weight to the next pixel, or at the "
                           "last pixel to the same one), the clamped first ones, the last ones")
_add_nonfinite("bilinear_x3_one_row_nonfinite_grad", (1, 2, 1, 4), 3, BILINEAR,
               [(0, 0, 1, 4), (0, 0, 2, 7), (0, 1, 0, 10)], tolerance=ulp(1),  # measured 1 (the GPU: the same bits)
               description="a plane 1 high: every output row's two taps land on row 0, one with weight 0 for "
                           "rows 0 and 1")
_add_nonfinite("bilinear_x2_one_column_nonfinite_grad", (1, 2, 3, 1), 2, BILINEAR,
               [(0, 0, 1, 0), (0, 1, 4, 1), (0, 1, 0, 1)],
               description="a plane 1 wide: both column taps on column 0, the clamped column 0 with weight 0")


# A NaN gradient makes NaN whatever it is multiplied by, so only an infinite one tells whether a
# kernel adds the zero-weight term (0 * inf is NaN). In the cases above several rules meet at one
# point, or a NaN sits where the rule is the only one: a kernel that drops one of them passes them.
# Here each rule has an infinite gradient of its own, in a plane of its own, the other coordinate
# an ordinary one (two taps, both weights non-zero).
def _infinite_points(out_dims, points):
    values = pattern(out_dims, modulus=13, offset=3, scale=0.5)
    for k, point in enumerate(points):
        values[point] = (np.inf, -np.inf)[k % 2]
    return values


_add("bilinear_x3_zero_weight_inf_grad", (1, 6, 3, 4), 3, BILINEAR, tolerance=ulp(1),  # measured 1 (CPU and H200)
     output_grad=_infinite_points((1, 6, 9, 12), [(0, 0, 5, 0), (0, 1, 0, 5), (0, 2, 3, 1), (0, 3, 1, 5),
                                                 (0, 4, 6, 10), (0, 5, 7, 2)]),
     description="one rule a plane: the clamped column 0 and row 0 (weight 0 to pixel 1), column 1 and row 1 "
                 "on pixel 0's centre (weight 0 to pixel 1), column 10 and row 7 on the last pixel's centre "
                 "(both taps on it, one with weight 0)")
_add("bilinear_x4_clamped_inf_grad", (1, 2, 2, 2), 4, BILINEAR,
     output_grad=_infinite_points((1, 2, 8, 8), [(0, 0, 0, 5), (0, 1, 5, 0)]),
     description="scale 4 on planes 2 wide: rows and columns 0 and 1 are both clamped, and only 0's "
                 "gradient is infinite")
_add("bilinear_x3_one_row_inf_grad", (1, 2, 1, 4), 3, BILINEAR, tolerance=ulp(1),  # measured 1 (CPU and H200)
     output_grad=_infinite_points((1, 2, 3, 12), [(0, 0, 0, 2), (0, 1, 1, 5)]),
     description="a plane 1 high: rows 0 (clamped) and 1 (on row 0's centre) each give row 0 a second "
                 "tap of weight 0")
_add("bilinear_x2_one_column_inf_grad", (1, 2, 3, 1), 2, BILINEAR,
     output_grad=_infinite_points((1, 2, 6, 2), [(0, 0, 1, 0), (0, 1, 4, 1)]),
     description="a plane 1 wide: column 0 (clamped) gives column 0 a second tap of weight 0; column 1 "
                 "gives it weights 3/4 and 1/4, no zero, so its infinity stays one")
# --------------------------------------------------------------------------- end of non-finite output gradients


def torch_program(case, tensors):
    import torch
    import torch.nn.functional as F

    input = tensors["input"].requires_grad_()
    mode = case.attrs.mode
    extra = {"align_corners": False} if mode is BILINEAR else {}
    output = F.interpolate(input, scale_factor=case.attrs.scale_factor, mode=mode.value, **extra)
    (input_grad,) = torch.autograd.grad(output, [input], tensors["output_grad"])
    return {"output": output, "input_grad": input_grad}


def exact_program(case, values):
    """For BILINEAR at a scale that is not a power of two, torch_program's math at high precision
    (conformance.exact): the interpolation as the exact linear map it is (PyTorch's Jacobian, whose
    taps are ninths and thirds, as exact rationals), forward and adjoint, each result rounded once.
    NEAREST moves values, and BILINEAR at scale 2 or 4 has dyadic taps: exact in float64."""
    from .. import exact

    scale = case.attrs.scale_factor
    if case.attrs.mode is not BILINEAR or scale & (scale - 1) == 0:
        return {}
    import torch.nn.functional as F

    def interpolate(input):
        return F.interpolate(input, scale_factor=scale, mode="bilinear", align_corners=False)

    (linear,) = exact.linear_maps(interpolate, [case.inputs["input"]])
    return {"output": linear.forward(values["input"]), "input_grad": linear.adjoint(values["output_grad"])}
