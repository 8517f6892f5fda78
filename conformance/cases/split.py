"""split cases: three or more unequal parts on every axis of a 4-D tensor, a
size-0 part, negative axes, ranks 1 to 4, integer and float dtypes, more parts
than one GPU launch takes (12), and YOLOv10's C2f split in halves and PSA's
{32, 32, 64} split of (B, heads, 128, HW) on axis 2 (both small)."""

import numpy as np

from kernels import SplitAttrs
from kernels.runtime.core import BFLOAT16

from ..case import CaseTable, int_pattern, nonfinite, pattern

TABLE = CaseTable("split")


def _values(dims, dtype, offset):
    return int_pattern(dims, offset=offset) if np.dtype(dtype).kind in "iu" else pattern(dims, offset=offset)


def _add(name, dims, splits, axis, dtype=np.float32, description=""):
    """An input of `dims`; each output_grad has its own values, none equal to the input's."""
    normalized = axis % len(dims)
    tensors = {"input": _values(dims, dtype, offset=0)}
    for i, size in enumerate(splits):
        part = dims[:normalized] + (size,) + dims[normalized + 1:]
        tensors[f"output_grads.{i}"] = _values(part, dtype, offset=3 + 4 * i)
    TABLE.add(name, SplitAttrs(splits=tuple(splits), axis=axis), tensors, dtype=dtype, description=description)


_add("axis0_rank4_three_unequal", (6, 2, 3, 2), (1, 3, 2), 0, description="outermost axis of a 4-D tensor")
_add("axis1_rank4_three_unequal", (2, 6, 3, 2), (3, 1, 2), 1, description="channel axis, batch 2")
_add("axis2_rank4_three_unequal", (2, 3, 6, 2), (2, 3, 1), 2)
_add("axis3_rank4_three_unequal", (2, 3, 2, 6), (1, 2, 3), 3, description="last axis of a 4-D tensor")
_add("axis_neg1_size0_part_int32", (2, 3, 5), (2, 0, 3), -1, np.int32, description="a part of size 0, negative axis")
_add("axis_neg3_four_unequal_int8", (7, 3, 2), (4, 1, 0, 2), -3, np.int8, description="-3 is axis 0; a size-0 part")
_add("axis1_three_uint16", (2, 6, 3), (1, 2, 3), 1, np.uint16, description="2-byte elements, odd widths")
_add("axis1_rank4_three_f16", (2, 6, 3, 2), (3, 1, 2), 1, np.float16, description="float16: 2-byte units")
_add("axis1_rank4_three_bf16", (2, 6, 3, 2), (3, 1, 2), 1, BFLOAT16, description="bfloat16 moved as its bits")
_add("axis_neg1_three_bf16", (2, 3, 7), (2, 4, 1), -1, BFLOAT16, description="bfloat16, last axis, odd widths")
_add("axis2_three_f64", (2, 2, 7), (3, 1, 3), 2, np.float64)
_add("axis0_three_uint8", (5, 3), (2, 1, 2), 0, np.uint8)
_add("rank1_three_int64", (9,), (4, 2, 3), 0, np.int64)
_add("one_part", (2, 4, 3), (4,), 1, description="a single part: a copy")
_add("thirteen_parts_axis1", (2, 25, 2), tuple(1 + i % 3 for i in range(13)), 1,
     description="more parts than one GPU launch takes (12)")
_add("zero_size_input", (0, 5, 2), (2, 3), 1, description="zero-size tensors: nothing to do")
_add("yolov10_c2f_halves_1x8x5x3", (1, 8, 5, 3), (4, 4), 1,
     description="C2f: the 1x1 conv's output split in two on channels (small)")
_add("yolov10_psa_qkv_1x2x8x6", (1, 2, 8, 6), (2, 2, 4), 2,
     description="PSA: (B, heads, 128, HW) split {32, 32, 64} on axis 2, at 1/16 the size")


# Pure data movement carries NaN, +inf and -inf unchanged, forward and backward.
TABLE.add("nonfinite_axis2_three", SplitAttrs(splits=(1, 3, 2), axis=2),
          {"input": nonfinite(pattern((2, 3, 6)), (2, 13, 30)),
           "output_grads.0": nonfinite(pattern((2, 3, 1), offset=3), (1,)),
           "output_grads.1": nonfinite(pattern((2, 3, 3), offset=7), (0, 8, 16)),
           "output_grads.2": nonfinite(pattern((2, 3, 2), offset=11), (5, 9))},
          description="NaN, +inf and -inf in the input and the output gradients, moved as they are")


def torch_program(case, tensors):
    import torch

    input = tensors["input"].requires_grad_()
    outputs = torch.split(input, list(case.attrs.splits), dim=case.attrs.axis)
    output_grads = [tensors[f"output_grads.{i}"] for i in range(len(outputs))]
    (input_grad,) = torch.autograd.grad(outputs, [input], output_grads)
    expected = {f"outputs.{i}": output for i, output in enumerate(outputs)}
    expected["input_grad"] = input_grad
    return expected
