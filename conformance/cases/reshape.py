"""reshape cases: rank changes both ways, an inferred -1, every dtype family,
zero-size, and YOLOv10's PSA and detection-head reshapes at small sizes."""

import numpy as np

from kernels import ReshapeAttrs, reshape
from kernels.runtime.core import BFLOAT16

from ..case import CaseTable, int_pattern, pattern

TABLE = CaseTable("reshape")


def _add(name, dims, shape, dtype=np.float32, description=""):
    count = int(np.prod(dims, dtype=np.int64))
    out_dims = reshape.output_dims(ReshapeAttrs(shape), tuple(dims))
    assert int(np.prod(out_dims, dtype=np.int64)) == count
    make = int_pattern if np.dtype(dtype).kind in "iub" else pattern
    TABLE.add(name, ReshapeAttrs(shape),
              {"input": make(dims), "output_grad": make(out_dims, offset=3)},
              dtype=dtype, description=description)


_add("4d_to_2d", (2, 3, 4, 5), (6, 20), description="(N, C, H, W) -> (N*C, H*W)")
_add("2d_to_3d_f64", (6, 20), (4, 5, 6), np.float64, description="new dims that cut across the old ones")
_add("rank1_to_rank4_int32", (120,), (2, 3, 4, 5), np.int32)
_add("rank4_to_rank1_int64", (2, 3, 4, 5), (120,), np.int64)
_add("infer_middle_uint8", (2, 3, 4, 5), (3, -1, 5), np.uint8, description="-1 inferred as 8")
_add("infer_first_int16", (4, 6), (-1, 2, 3), np.int16, description="-1 inferred as 4, rank 2 -> 3")
_add("same_dims_f64", (3, 5), (3, 5), np.float64, description="a reshape that keeps the dims is still a copy")
_add("4d_to_2d_f16", (2, 3, 4, 5), (6, 20), np.float16)
_add("4d_to_2d_bf16", (2, 3, 4, 5), (6, 20), BFLOAT16, description="bfloat16 moved as its bits")
_add("infer_middle_bf16", (2, 3, 4, 5), (3, -1, 5), BFLOAT16)
_add("zero_size", (2, 0, 3), (0, 4), description="zero-size tensor: nothing to do")
_add("yolov10_psa_split_heads", (2, 16, 3, 4), (2, 2, 8, 12),
     description="PSA qkv: (B, C, H, W) -> (B, heads, 128, HW), small: 2 heads of 8 channels")
_add("yolov10_psa_merge_heads", (2, 2, 4, 12), (2, 8, 3, 4),
     description="PSA attention output back to (B, C, H, W), small")
_add("yolov10_head_flatten", (2, 6, 3, 5), (2, 6, -1), description="detection head: (B, C, H, W) -> (B, C, HW)")


def torch_program(case, tensors):
    import torch

    input = tensors["input"].requires_grad_()
    output = input.reshape(case.attrs.shape)
    (input_grad,) = torch.autograd.grad(output, [input], tensors["output_grad"])
    return {"output": output, "input_grad": input_grad}
