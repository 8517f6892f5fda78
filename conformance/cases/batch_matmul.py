"""batch_matmul cases: ranks 3 and 4, M, K and N all different, batch > 1,
float64, K = 1, K = 0 (zeros), M = 0 (rhs_grad of zeros), sizes past cuBLAS's
tile edges, and YOLOv10's two PSA products at a small size.

Every value is a multiple of 1/4 (or 1/2) below 4 in magnitude, so every product
is a multiple of 1/16 and every partial sum stays far below 2^20: exact in
float32 whatever the summation order, hence EXACT everywhere.

Half precision (float16, bfloat16): the same inputs are exact in both half dtypes,
and every product and sum is formed in float32 (exact, as above) and rounded once to
the dtype, exactly as the golden (PyTorch in float64, rounded once): EXACT on both
devices, also where the half result itself is not the exact sum (bfloat16's 8-bit
mantissa). The edge cases: float16 partial sums past 65504 (inf in naive float16
accumulation, not in float32) and a result of exactly 65504, float16 subnormal
results, bfloat16 on a K = 4096 reduction (a naive bfloat16 sum stalls at 256 + 1),
and bfloat16 values far outside float16's range.
"""

import numpy as np

from kernels import BatchMatmulAttrs
from kernels.runtime.core import BFLOAT16

from ..case import CaseTable, nonfinite, pattern

TABLE = CaseTable("batch_matmul")


def _add(name, batch, m, k, n, dtype=np.float32, description=""):
    TABLE.add(name, BatchMatmulAttrs(),
              {"lhs": pattern(batch + (m, k)),
               "rhs": pattern(batch + (k, n), modulus=13, offset=4),
               "output_grad": pattern(batch + (m, n), modulus=11, scale=0.5, offset=2)},
              dtype=dtype, description=description)


_add("rank3_2x3x4_4x5", (2,), 3, 4, 5, description="M, K, N all different, batch 2")
_add("rank4_2x3_2x5_5x4", (2, 3), 2, 5, 4, description="two leading dims")
_add("rank3_batch1_3x5_5x2", (1,), 3, 5, 2)
_add("f64_rank3_3x4x2_2x5", (3,), 4, 2, 5, np.float64)
_add("f64_rank4_2x2_3x4_4x2", (2, 2), 3, 4, 2, np.float64)
_add("k1_outer_product", (2,), 3, 1, 4, description="K = 1: outer products")
_add("m1_row", (3,), 1, 4, 3, description="M = 1")
_add("n1_column", (2,), 3, 4, 1, description="N = 1")
_add("tile_edges_2x35x18_18x40", (2,), 35, 18, 40, description="sizes off every power of two")
_add("k0_zeros", (2,), 3, 0, 4, description="K = 0: the output is zeros, the gradients zero-size")
_add("m0_rhs_grad_zeros", (2,), 0, 3, 4, description="M = 0: the output is zero-size, rhs_grad is zeros")
_add("zero_batch", (0, 2), 3, 4, 5, description="zero-size batch: nothing to do")
_add("yolov10_psa_scores", (1, 2), 6, 4, 6, description="PSA q^T k: (B, heads, HW, d) x (B, heads, d, HW), small")
_add("yolov10_psa_values", (1, 2), 8, 6, 6, description="PSA v attn^T: (B, heads, d, HW) x (B, heads, HW, HW), small")

# Half precision: the float32 cases' shapes, in both half dtypes (names f16_ and bf16_).
for _prefix, _dtype in (("f16", np.float16), ("bf16", BFLOAT16)):
    _add(f"{_prefix}_rank3_2x3x4_4x5", (2,), 3, 4, 5, _dtype, description="M, K, N all different, batch 2")
    _add(f"{_prefix}_rank4_2x3_2x5_5x4", (2, 3), 2, 5, 4, _dtype, description="two leading dims")
    _add(f"{_prefix}_tile_edges_2x35x18_18x40", (2,), 35, 18, 40, _dtype,
         description="sizes off every power of two (and off the tensor cores' tiles)")
    _add(f"{_prefix}_k0_zeros", (2,), 3, 0, 4, _dtype, description="K = 0: zeros")
    _add(f"{_prefix}_yolov10_psa_scores", (1, 2), 6, 4, 6, _dtype, description="PSA q^T k, small")
    _add(f"{_prefix}_yolov10_psa_values", (1, 2), 8, 6, 6, _dtype, description="PSA v attn^T, small")


def _edge(name, lhs, rhs, output_grad, dtype, description):
    TABLE.add(name, BatchMatmulAttrs(), {"lhs": lhs, "rhs": rhs, "output_grad": output_grad}, dtype=dtype,
              description=description)


# float16's largest finite value is 65504. Row 0 sums 240 * 200 three times with signs +, +, -:
# partial sums 48000, 96000 (past 65504: inf in a float16 accumulator), then 48000. Row 1 is
# 256 * 255.875 = 65504 exactly. The gradients add products of the same size the same way.
_big_lhs = np.array([[[240.0, 240.0, -240.0], [256.0, 0.0, 0.0]]])
_big_rhs = np.array([[[200.0, 255.875], [200.0, 0.5], [200.0, -0.5]]])
_edge("f16_partial_sums_past_65504", _big_lhs, _big_rhs, np.array([[[200.0, -200.0], [-200.0, 1.0]]]), np.float16,
      "float16: partial sums past 65504 that a float32 accumulator carries, and a result of exactly 65504")
# float16's subnormals are below 2^-14: products of 2^-8-scale values (2^-16) and their sums are
# subnormal in float16 (normal in float32), rounded once to float16's subnormal spacing 2^-24.
_edge("f16_subnormal_results", pattern((2, 3, 4)) * 2.0 ** -8, pattern((2, 4, 3), modulus=13, offset=4) * 2.0 ** -8,
      pattern((2, 3, 3), modulus=11, offset=2) * 2.0 ** -8, np.float16,
      "float16: results below 2^-14 (subnormal), rounded to the subnormal spacing")
# bfloat16 on a long reduction: K = 4096 terms of (1, 1.25 or 1.5) * (1, 1.25, ... or 2); the sum
# (about 7000) needs 17 bits (products are sixteenths), is exact in float32 and rounded once to
# bfloat16 (8 bits); a bfloat16 accumulator would stop growing at 256 (256 + 1 rounds back to 256).
# The operands cycle with odd periods (3 and 5), which no stride of these power-of-two dims repeats.
_K = 4096
_edge("bf16_long_reduction_k4096", (1 + (np.arange(2 * _K) % 3) * 0.25).reshape(1, 2, _K),
      (1 + (np.arange(_K * 2) % 5) * 0.25).reshape(1, _K, 2),
      np.array([[[1.0, 0.5], [0.25, 2.0]]]), BFLOAT16,
      "bfloat16: K = 4096, the float32 sum rounded once to bfloat16's 8-bit mantissa")
# bfloat16 keeps float32's exponent range: values of 2^100 (and 2^-100), far outside float16's.
_edge("bf16_wide_exponents", pattern((1, 3, 4)) * 2.0 ** 100, pattern((1, 4, 2), modulus=13, offset=4) * 2.0 ** -100,
      pattern((1, 3, 2), modulus=11, offset=2) * 2.0 ** 20, BFLOAT16,
      "bfloat16: operands of 2^100 and 2^-100 (float32's exponent range)")


# NaN, +inf and -inf in output_grad: each lhs_grad row and rhs_grad column that sums one is NaN or
# infinite (times a zero operand: NaN), in cuBLAS's GEMMs as in the CPU's.
_edge("nonfinite_grad_rank3_2x3x4_4x5", pattern((2, 3, 4)), pattern((2, 4, 5), modulus=13, offset=4),
      nonfinite(pattern((2, 3, 5), modulus=11, scale=0.5, offset=2), (0, 7, 19, 28)), np.float32,
      "NaN, +inf and -inf in output_grad")


def torch_program(case, tensors):
    import torch

    lhs = tensors["lhs"].requires_grad_()
    rhs = tensors["rhs"].requires_grad_()
    output = torch.matmul(lhs, rhs)
    lhs_grad, rhs_grad = torch.autograd.grad(output, [lhs, rhs], tensors["output_grad"], allow_unused=True)
    return {"output": output, "lhs_grad": lhs_grad, "rhs_grad": rhs_grad}
