"""batch_matmul cases: ranks 3 and 4, M, K and N all different, batch > 1,
float64, K = 1, K = 0 (zeros), M = 0 (rhs_grad of zeros), sizes past cuBLAS's
tile edges, and YOLOv10's two PSA products at a small size.

Every value is a multiple of 1/4 (or 1/2) below 4 in magnitude, so every product
is a multiple of 1/16 and every partial sum stays far below 2^20: exact in
float32 whatever the summation order, hence EXACT everywhere.
"""

import numpy as np

from kernels import BatchMatmulAttrs, batch_matmul

from ..case import CaseTable, pattern
from ..harness import run_binary

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


def torch_program(case, tensors):
    import torch

    lhs = tensors["lhs"].requires_grad_()
    rhs = tensors["rhs"].requires_grad_()
    output = torch.matmul(lhs, rhs)
    lhs_grad, rhs_grad = torch.autograd.grad(output, [lhs, rhs], tensors["output_grad"], allow_unused=True)
    return {"output": output, "lhs_grad": lhs_grad, "rhs_grad": rhs_grad}


def run(case, env):
    run_binary(batch_matmul, case, env)
