"""concat cases: three or more inputs of unequal sizes on the outermost, middle,
last and negative axes, ranks 1 to 4, batch > 1, integer, bool and float dtypes,
zero-size pieces, more inputs than one GPU launch takes (12), a gradient not
wanted (None), and YOLOv10's SPPF, C2f, upsample and detection-head concats."""

import numpy as np

from kernels import ConcatAttrs
from kernels.runtime.core import BFLOAT16

from ..case import CaseTable, int_pattern, nonfinite, pattern

TABLE = CaseTable("concat")


def _values(dims, dtype, offset):
    kind = np.dtype(dtype).kind
    if kind == "b":
        # Period 11: no stride of these shapes is a multiple of it (modulus 3 repeated along rows of 3).
        return int_pattern(dims, modulus=11, offset=offset) % 2
    return int_pattern(dims, offset=offset) if kind in "iu" else pattern(dims, offset=offset)


def _add(name, input_dims, axis, dtype=np.float32, none_grads=(), description=""):
    """Inputs of `input_dims`, each with its own values; output_grad differs from all of them."""
    rank = len(input_dims[0])
    normalized = axis % rank
    out_dims = list(input_dims[0])
    out_dims[normalized] = sum(d[normalized] for d in input_dims)
    tensors = {f"inputs.{i}": _values(dims, dtype, offset=5 * i) for i, dims in enumerate(input_dims)}
    tensors["output_grad"] = _values(tuple(out_dims), dtype, offset=3)
    TABLE.add(name, ConcatAttrs(axis=axis, num_inputs=len(input_dims)), tensors, dtype=dtype,
              description=description, none_grads=tuple(none_grads))


_add("axis0_three_rank2", [(1, 4), (3, 4), (2, 4)], 0, description="outermost axis, unequal sizes")
_add("axis1_four_rank3_batch2", [(2, 1, 3), (2, 3, 3), (2, 2, 3), (2, 4, 3)], 1,
     description="middle axis, batch 2: each input's rows interleave in the output")
_add("axis3_three_rank4_f64", [(2, 3, 2, 1), (2, 3, 2, 4), (2, 3, 2, 2)], 3, np.float64, description="last axis")
_add("axis_neg2_three_rank4_int32", [(2, 3, 1, 5), (2, 3, 3, 5), (2, 3, 2, 5)], -2, np.int32,
     description="negative axis (-2 is axis 2)")
_add("rank1_five_int64", [(3,), (1,), (4,), (1,), (5,)], 0, np.int64)
_add("axis_neg1_three_uint8", [(2, 3, 3), (2, 3, 1), (2, 3, 5)], -1, np.uint8,
     description="odd byte widths: 1-byte copy units on the GPU")
_add("axis1_three_int16", [(3, 2, 5), (3, 1, 5), (3, 3, 5)], 1, np.int16)
_add("axis0_three_int8", [(1, 2, 3), (2, 2, 3), (3, 2, 3)], 0, np.int8)
_add("axis1_three_float16", [(2, 2, 3), (2, 5, 3), (2, 1, 3)], 1, np.float16)
_add("axis1_three_bfloat16", [(2, 2, 3), (2, 5, 3), (2, 1, 3)], 1, BFLOAT16,
     description="bfloat16 moved as its 16-bit patterns")
_add("yolov10_c2f_2plus2_f16", [(1, 3, 4, 5)] * 4, 1, np.float16, none_grads=(2,),
     description="C2f's concat in float16, a gradient not wanted")
_add("yolov10_c2f_2plus2_bf16", [(1, 3, 4, 5)] * 4, 1, BFLOAT16, none_grads=(2,),
     description="C2f's concat in bfloat16, a gradient not wanted")
_add("thirteen_inputs_axis1_bf16", [(2, 1 + i % 3, 2) for i in range(13)], 1, BFLOAT16,
     description="more bfloat16 inputs than one GPU launch takes (12)")
_add("axis2_three_bool", [(2, 2, 1, 3), (2, 2, 2, 3), (2, 2, 4, 3)], 2, np.bool_)
_add("zero_size_piece", [(2, 2, 3), (2, 0, 3), (2, 3, 3)], 1, description="a piece of size 0 along the axis")
_add("zero_size_all", [(0, 2, 3), (0, 1, 3), (0, 4, 3)], 1, description="zero-size tensors: nothing to do")
_add("input_grads_none", [(2, 2, 3), (2, 3, 3), (2, 1, 3)], 1, none_grads=(1,),
     description="input_grads[1] is None: skipped, the others written")
_add("thirteen_inputs_axis1", [(2, 1 + i % 3, 2) for i in range(13)], 1,
     description="more inputs than one GPU launch takes (12)")
_add("yolov10_sppf_four_1x4x5x3", [(1, 4, 5, 3)] * 4, 1,
     description="SPPF: x and three chained max pools, concatenated on channels (small)")
_add("yolov10_c2f_2plus2_1x3x4x5", [(1, 3, 4, 5)] * 4, 1,
     description="C2f with n = 2: two split halves and two bottleneck outputs on channels (small)")
_add("yolov10_upsample_concat_1x4x6x4_1x2x6x4", [(1, 4, 6, 4), (1, 2, 6, 4)], 1,
     description="neck: upsampled map concatenated with a backbone map on channels (small)")
_add("yolov10_head_last_axis_b2", [(2, 6, 16), (2, 6, 4), (2, 6, 1)], -1,
     description="detection head: (B, C, HW) of three scales concatenated on the last axis (small)")

# --- GPU launch shapes (the "small" schedule: one SM, grids of at most two blocks; tests/test_gpu_paths.py).
# A piece of 1560 16-byte units (6240 float32 over 2 rows) is more than 3 strides of a 2-block grid: the
# copy's unrolled loop runs, then its tail; the same piece in 4-byte units (misaligned) too.
_add("rows_past_unrolled_small_device", [(2, 5, 24, 26), (2, 2, 24, 26), (2, 3, 24, 26)], 1,
     description="pieces of 2 rows longer than 3 grid strides of two blocks: unrolled copies, then the tail")
# A one-row join of 3 pieces, 128000 bytes (pieces of 3000 and 2000 16-byte units): the join and the
# cut both run the unrolled copy of the one-row form (no division of a unit index into row and column).
_add("one_row_past_unrolled_small_device", [(1, 30, 400), (1, 20, 400), (1, 30, 400)], 1,
     description="a one-row join and cut of pieces longer than 3 grid strides of two blocks")
# --- end of GPU launch shapes


# --------------------------------------------------------------------------- medium cases
# Wholes past cpu.PARALLEL_MIN_BYTES (kernels.runtime.cpu_paths): with a dim before the axis, parts of its
# rows (cpu_parts with skip_axis); without one (an image's channels), each piece cut along the axis.
for _name, _pieces, _axis, _what in (
        ("medium_rows_threads", [(2, 13, 40, 71), (2, 29, 40, 71), (2, 53, 40, 71)], 1, "rows of both images"),
        ("medium_pieces_threads", [(13, 80, 71), (29, 80, 71), (53, 80, 71)], 0, "each piece cut along the axis")):
    _out = list(_pieces[0])
    _out[_axis] = sum(p[_axis] for p in _pieces)
    _tensors = {f"inputs.{i}": pattern(dims, modulus=251, scale=1 / 32, offset=37 * i) for i, dims in enumerate(_pieces)}
    _tensors["output_grad"] = pattern(tuple(_out), modulus=241, scale=1 / 32, offset=3)
    TABLE.add(_name, ConcatAttrs(axis=_axis, num_inputs=len(_pieces)), _tensors, none_grads=(),
              description=f"a 2 MB join and cut of three pieces: {_what}, shared out to the threads")


# Pure data movement carries NaN, +inf and -inf unchanged, forward and backward.
TABLE.add("nonfinite_axis1_three", ConcatAttrs(axis=1, num_inputs=3),
          {"inputs.0": nonfinite(pattern((2, 1, 3)), (1,)), "inputs.1": nonfinite(pattern((2, 2, 3), offset=5), (0, 7, 11)),
           "inputs.2": pattern((2, 3, 3), offset=10),
           "output_grad": nonfinite(pattern((2, 6, 3), offset=3), (0, 4, 17, 20, 35))},
          description="NaN, +inf and -inf in inputs and output_grad, moved as they are", none_grads=())


def torch_program(case, tensors):
    import torch

    inputs = [tensors[f"inputs.{i}"].requires_grad_() for i in range(case.attrs.num_inputs)]
    output = torch.cat(inputs, dim=case.attrs.axis)
    grads = torch.autograd.grad(output, inputs, tensors["output_grad"])
    expected = {"output": output}
    for i, grad in enumerate(grads):
        if i not in case.extra["none_grads"]:
            expected[f"input_grads.{i}"] = grad
    return expected
