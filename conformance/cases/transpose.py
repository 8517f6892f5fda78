"""transpose cases: permutations that are not their own inverse, on non-square
shapes, every dtype family, and YOLOv10's PSA transpose of the last two dims."""

import numpy as np

from kernels import TransposeAttrs
from kernels.runtime.core import BFLOAT16

from ..case import CaseTable, int_pattern, nonfinite, pattern

TABLE = CaseTable("transpose")


def _add(name, dims, permutation, dtype=np.float32, description=""):
    out_dims = tuple(dims[p] for p in permutation)
    make = int_pattern if np.dtype(dtype).kind in "iub" else pattern
    TABLE.add(name, TransposeAttrs(permutation),
              {"input": make(dims), "output_grad": make(out_dims, offset=3)},
              dtype=dtype, description=description)


_add("2d_3x5", (3, 5), (1, 0), description="non-square matrix")
_add("3d_cycle_201", (2, 3, 4), (2, 0, 1), description="3-D cycle, not its own inverse (inverse is 1,2,0)")
_add("3d_cycle_120_f64", (4, 2, 3), (1, 2, 0), np.float64)
_add("4d_0231_nchw_to_nhwc", (2, 3, 4, 5), (0, 2, 3, 1), description="NCHW -> NHWC, inverse 0,3,1,2")
_add("4d_3102", (2, 3, 4, 5), (3, 1, 0, 2), description="4-D permutation moving every axis but one")
_add("4d_1032_int32", (2, 3, 4, 5), (1, 0, 3, 2), np.int32)
_add("4d_2310_int64", (3, 2, 5, 4), (2, 3, 1, 0), np.int64)
_add("3d_021_uint8", (2, 5, 3), (0, 2, 1), np.uint8)
_add("3d_102_int16", (4, 3, 2), (1, 0, 2), np.int16, description="innermost dim kept: gather path")
_add("4d_0231_f16", (2, 3, 4, 5), (0, 2, 3, 1), np.float16, description="NCHW -> NHWC in float16")
_add("4d_0231_bf16", (2, 3, 4, 5), (0, 2, 3, 1), BFLOAT16, description="NCHW -> NHWC in bfloat16 (bits)")
_add("3d_102_bf16", (4, 3, 2), (1, 0, 2), BFLOAT16, description="innermost dim kept: gather path, bfloat16")
_add("5d_40213", (2, 1, 3, 2, 5), (4, 0, 2, 1, 3), description="rank 5 with a size-1 dim")
_add("identity_2x3x4", (2, 3, 4), (0, 1, 2))
_add("tile_edges_2x33x37", (2, 33, 37), (0, 2, 1), description="sizes not multiples of the 64x64 tile")
_add("tile_edges_1x66x65", (1, 66, 65), (0, 2, 1), description="sizes just over one 64x64 tile")
_add("zero_size", (2, 0, 3), (2, 0, 1), description="zero-size tensor: nothing to do")
_add("yolov10_psa_last_two", (1, 2, 8, 12), (0, 1, 3, 2), description="PSA: (B, heads, d, HW) -> (B, heads, HW, d), small")


# --------------------------------------------------------------------------- medium cases
# A copy past cpu.PARALLEL_MIN_BYTES (kernels.runtime.cpu_paths): cpu_parts cuts the output, the parts shared out.
TABLE.add("medium_copy_threads", TransposeAttrs((2, 0, 1)),
          {"input": pattern((7, 293, 257), modulus=251, scale=1 / 32),
           "output_grad": pattern((257, 7, 293), modulus=241, scale=1 / 32, offset=3)},
          description="a 2 MB transpose: cpu_parts' parts of the output shared out to the threads")


# Pure data movement carries NaN, +inf and -inf unchanged, forward and backward.
TABLE.add("nonfinite_3d_cycle_201", TransposeAttrs((2, 0, 1)),
          {"input": nonfinite(pattern((2, 3, 4)), (1, 11, 18)),
           "output_grad": nonfinite(pattern((4, 2, 3), offset=3), (0, 7, 23))},
          description="NaN, +inf and -inf in input and output_grad, moved as they are")


def torch_program(case, tensors):
    import torch

    input = tensors["input"].requires_grad_()
    output = input.permute(case.attrs.permutation)
    (input_grad,) = torch.autograd.grad(output, [input], tensors["output_grad"])
    return {"output": output, "input_grad": input_grad}
