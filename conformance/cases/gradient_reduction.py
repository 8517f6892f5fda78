"""gradient_reduction cases: sums of 1, 2, 3, 5 and 13 tensors (13: more than one
GPU launch takes), float and integer dtypes, element counts that leave a tail
after the GPU's 16-byte packs, a gradient not wanted (None), zero-size tensors,
and YOLOv10's C2f, where a split half is read by the concat and by a bottleneck.

Every sum is of short dyadic fractions or small integers, so it is exact in any
order; the kernels still sum left to right on both devices."""

import numpy as np

from kernels import GradientReductionAttrs
from kernels.runtime.core import BFLOAT16

from ..case import CaseTable, int_pattern, pattern

TABLE = CaseTable("gradient_reduction")


def _values(dims, dtype, offset):
    return int_pattern(dims, offset=offset) if np.dtype(dtype).kind in "iu" else pattern(dims, offset=offset)


def _add(name, dims, count, dtype=np.float32, none_grads=(), description="", inputs=None):
    if inputs is None:
        tensors = {f"inputs.{i}": _values(dims, dtype, offset=4 * i) for i in range(count)}
    else:
        tensors = {f"inputs.{i}": np.asarray(value, dtype=np.float64).reshape(dims) for i, value in enumerate(inputs)}
    tensors["output_grad"] = _values(dims, dtype, offset=2)
    TABLE.add(name, GradientReductionAttrs(), tensors, dtype=dtype, description=description,
              none_grads=tuple(none_grads))


_add("two_f32_2x3x4", (2, 3, 4), 2)
_add("three_f32_rank4_batch2", (2, 3, 2, 5), 3)
_add("five_f64_3x7", (3, 7), 5, np.float64, description="21 elements: a tail after the GPU's pairs of doubles")
_add("five_f32_5x7", (5, 7), 5, description="35 elements: a tail of 3 after the GPU's packs of 4")
_add("thirteen_f32", (3, 4), 13, description="more inputs than one GPU launch takes (12): the sum is chained")
_add("one_input_copy", (2, 5), 1, description="one input: a copy")
_add("two_int32", (2, 3, 4), 2, np.int32)
_add("three_int64", (4, 5), 3, np.int64)
_add("five_int16", (3, 3, 3), 5, np.int16)
_add("three_uint8", (2, 9), 3, np.uint8, description="18 bytes: one 16-byte pack and a tail of 2")
_add("five_int8", (4, 5), 5, np.int8)
_add("input_grads_none", (2, 3), 3, none_grads=(1,), description="input_grads[1] is None: skipped, the others written")
_add("zero_size", (2, 0, 3), 3, description="zero-size tensors: nothing to do")
_add("yolov10_c2f_split_half_twice_1x4x5x3", (1, 4, 5, 3), 2,
     description="C2f: the second split half feeds both the concat and the first bottleneck (small)")


# Half precision: summed in float32 left to right and rounded once, on both devices. The sums
# of these short dyadic values are exact in float32, so every case is exact.
F16, BF16 = np.dtype(np.float16), BFLOAT16
for _suffix, _dtype in (("f16", F16), ("bf16", BF16)):
    _add(f"two_{_suffix}_2x3x4", (2, 3, 4), 2, _dtype)
    _add(f"three_{_suffix}_5x7", (5, 7), 3, _dtype, description="35 elements: a tail of 3 after the GPU's packs of 8")
    _add(f"thirteen_{_suffix}", (3, 4), 13, _dtype,
         description="13 inputs: two GPU launches chained through a float32 carry, rounded once")
    _add(f"input_grads_none_{_suffix}", (2, 3), 3, _dtype, none_grads=(1,))
# float16's maximum: 60000 + 60000 - 60000 is 60000 in float32; a float16 running sum is inf.
_add("near_max_f16", (4,), 3, F16, inputs=[[60000, 65504, -65504, 1], [60000, 32, 65504, 2], [-60000, -65504, -65504, -3]],
     description="partial sums beyond 65504 (float16's maximum) that come back: float32 keeps them finite")
# float16 subnormals (multiples of 2^-24) add exactly; so do their float32 sums.
_add("subnormal_f16", (4,), 3, F16, inputs=[[2.0 ** -24, 3 * 2.0 ** -24, 2.0 ** -15, -(2.0 ** -20)],
                                             [2.0 ** -24, 2.0 ** -17, 2.0 ** -15, 2.0 ** -21],
                                             [-(2.0 ** -23), 2.0 ** -17, 2.0 ** -14, 2.0 ** -21]],
     description="float16 subnormals (below 2^-14): exact sums, some normal")
# bfloat16's 8-bit mantissa: 256 then twelve ones. A bfloat16 running sum stays at 256 (256 + 1
# is a tie that rounds to even, 256); the float32 sum is 268, exactly representable in bfloat16.
_add("long_sum_bf16", (2,), 13, BF16, inputs=[[256, -256]] + [[1, -1]] * 12,
     description="256 + 1 + ... + 1 (13 terms): 268 in float32, where a bfloat16 running sum stays at 256")


def torch_program(case, tensors):
    import torch

    count = sum(1 for name in tensors if name.startswith("inputs."))
    inputs = [tensors[f"inputs.{i}"].requires_grad_() for i in range(count)]
    output = inputs[0].clone()
    for term in inputs[1:]:
        output = output + term
    grads = torch.autograd.grad(output, inputs, tensors["output_grad"])
    expected = {"output": output}
    for i, grad in enumerate(grads):
        if i not in case.extra["none_grads"]:
            expected[f"input_grads.{i}"] = grad
    return expected
