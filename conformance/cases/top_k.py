"""top_k cases: the k largest of each row (last dim) in torch.sort(descending=True, stable=True)'s
order. Ties (few distinct values, so the tie-break by index decides most places), NaN among numbers
and +-inf, -0.0 beside +0.0, k = 1, k = n (and k = n past the shared-memory candidates: the GPU's
scratch path), large k (1100 to 13600: the scratch path's radix sort, over mostly distinct keys, ties,
non-finite values and a row of one value; in the GPU's shared memory, and past it in the scratch), rows
longer than a GPU block (2500, 8400), a float64 row past the GPU's shared-memory cache of a row's keys
(12300 keys of 8 bytes: read from global memory), several rows, ranks 1 and 3, zero rows,
float64, float16 and bfloat16, and YOLOv10's two top-ks: 300 of the 8400 anchors of a 640x640 image,
then 300 of the 300 x 80 class scores of those anchors, and a single element. Every case also runs
the backward with a gradient of the values (input_grad: zero but at the selected indices); a few run it
on indices of their own instead: repeated (the terms summed, in float32 for the half dtypes) and outside
[0, n) (skipped).

Every expected value is a selection (values are input elements, indices integers, the gradient a
placement of values_grad): EXACT everywhere, on both devices.
"""

import numpy as np

from kernels import TopKAttrs
from kernels.runtime.core import BFLOAT16

from ..case import CaseTable, aperiodic, pattern

TABLE = CaseTable("top_k")
F16, BF16 = np.dtype(np.float16), BFLOAT16


def _scores(dims, modulus=97, scale=1 / 128):
    """Scores like a detector's, few distinct (m / 128, m < modulus: exact in every dtype) from a quadratic in
    the flat index, so most values recur many times in a row, in no period."""
    index = np.arange(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
    return ((index * (index + 3) // 2 % modulus) * scale).reshape(dims)


def _spread(dims, nonfinite=False, modulus=1999):
    """Many distinct values in about [-1, 1]: quadratic residues of the flat index mod `modulus` (a prime),
    less (modulus - 1) / 2, over the power of two above that (1999: about 1000 values over 1024, exact in
    float16, float32 and float64; 251: about 125 over 128, exact in bfloat16 too), most recurring a few
    times in a row, negatives among them; with nonfinite, every 7th NaN, every 11th -0.0, every 13th +0.0,
    every 17th +inf and every 19th -inf (the later rule winning)."""
    half = (modulus - 1) // 2
    values = (_scores(dims, modulus=modulus, scale=1) - half) / 2 ** int(np.ceil(np.log2(half + 1)))
    if nonfinite:
        flat = values.reshape(-1)
        for step, value in ((7, np.nan), (11, -0.0), (13, 0.0), (17, np.inf), (19, -np.inf)):
            flat[::step] = value
    return values


def _add(name, dims, k, dtype=np.float32, description="", input=None, backward=True, repeats=None):
    out_dims = tuple(dims[:-1]) + (k,)
    inputs = {"input": _scores(dims) if input is None else np.asarray(input, dtype=np.float64)}
    if backward:
        inputs["values_grad"] = pattern(out_dims, modulus=13, scale=0.5, offset=5)
    TABLE.add(name, TopKAttrs(k), inputs, dtype=dtype, description=description, repeats=repeats,
              expected_dtypes={"indices": np.int64})


_SIGNED = np.array([[0.0, -0.0, 1.5, -0.0, 0.0, -1.0, 0.0, 1.5, -0.0],
                    [-0.0, -2.0, 0.0, 0.0, -0.0, 2.0, -0.0, -2.0, 0.0]])
_NONFINITE = np.array([[1.0, np.nan, -np.inf, 2.0, np.inf, np.nan, 0.5, -1.0, np.nan, np.inf, 2.0, -np.inf],
                       [-np.inf, 0.25, np.nan, -3.0, np.nan, np.inf, -np.inf, 0.25, 4.0, np.nan, -0.5, np.inf]])

_add("ties_3x40_k10", (3, 40), 10, input=aperiodic((3, 40), modulus=5),
     description="five distinct values: equal values side by side, the lower index first")
_add("ties_2x37_k37", (2, 37), 37, input=aperiodic((2, 37), modulus=4, offset=1),
     description="k = n with ties: the whole row sorted, stable")
_add("nan_inf_2x12_k8", (2, 12), 8, input=_NONFINITE,
     description="NaN counts above +inf (NaNs among themselves by index), then +inf, numbers, -inf")
_add("nan_inf_2x12_k12", (2, 12), 12, input=_NONFINITE, description="k = n: -inf last")
_add("signed_zeros_2x9_k6", (2, 9), 6, input=_SIGNED,
     description="-0.0 and +0.0 are equal: ties by index, each keeping its sign")
_add("k1_4x33", (4, 33), 1, description="k = 1: the first largest of each row")
_add("k_equals_n_3x7", (3, 7), 7)
_add("k_equals_n_2x1100", (2, 1100), 1100,
     description="k = n past the GPU's shared-memory candidates (1024): the candidates in the state's scratch")
_add("k_equals_n_1x8400", (1, 8400), 8400,
     description="k = n = 8400: YOLOv10's anchor row sorted whole (97 distinct values), ranked by the GPU's "
                 "radix sort of the scratch candidates")
_add("large_k_all_equal_1x1300_k1100", (1, 1300), 1100, input=np.full((1, 1300), 0.75),
     description="a large k with every key equal to the threshold: none above it to sort, the first 1100 by index",
     repeats={"input": "one value throughout: every key is the threshold, so the indices alone say what was taken"})
_add("large_k_nonfinite_1x2000_k1500", (1, 2000), 1500, input=_spread((1, 2000), nonfinite=True),
     description="a large k over NaN, +-inf, -0.0 beside +0.0 and negative and positive numbers")
_add("rank1_19_k5", (19,), 5, description="a single row, rank 1")
_add("rank3_2x3x10_k4", (2, 3, 10), 4, description="rows of the dims before the last: 6 rows")
_add("zero_rows_0x5_k3", (0, 5), 3, description="no rows: nothing to do")
_add("rows_2500_k300", (2, 2500), 300, description="rows of 2500, past a block's 256 threads, not a power of two")
_add("rows_5x8400_k7", (5, 8400), 7, description="several long rows, a small k")
_add("f64_ties_3x40_k10", (3, 40), 10, np.float64, input=aperiodic((3, 40), modulus=5, offset=2))
_add("f64_nan_inf_2x12_k8", (2, 12), 8, np.float64, input=_NONFINITE)
_add("f64_row_1x12300_k20", (1, 12300), 20, np.float64,
     description="12300 float64 keys (96.1 KiB), past the GPU's shared-memory cache of a row's keys "
                 "(plan.TOP_K_CACHE_BYTES): each radix pass reads the row from global memory")
_add("yolov10_anchors_1x8400_k300", (1, 8400), 300,
     description="YOLOv10's first top-k: 300 of the 8400 anchors' best scores (640x640 input)")
_add("yolov10_classes_1x24000_k300", (1, 24000), 300,
     description="YOLOv10's second top-k: 300 of the 300 x 80 class scores of those anchors")
_add("yolov10_anchors_2x2100_k300", (2, 2100), 300, description="batch 2 at 320x320: 2100 anchors")
_add("large_k_2x3000_k2500", (2, 3000), 2500, input=_spread((2, 3000)),
     description="k = 2500 of 3000 mostly distinct keys: the GPU's radix sort of the candidates over every digit")
_add("f64_large_k_2x3000_k2500", (2, 3000), 2500, np.float64, input=_spread((2, 3000)))

for _suffix, _dtype in (("f16", F16), ("bf16", BF16)):
    _add(f"ties_3x40_k10_{_suffix}", (3, 40), 10, _dtype, input=aperiodic((3, 40), modulus=5))
    _add(f"nan_inf_2x12_k8_{_suffix}", (2, 12), 8, _dtype, input=_NONFINITE)
    _add(f"signed_zeros_2x9_k6_{_suffix}", (2, 9), 6, _dtype, input=_SIGNED)
    _add(f"rows_2500_k300_{_suffix}", (2, 2500), 300, _dtype)
    _add(f"yolov10_anchors_1x8400_k300_{_suffix}", (1, 8400), 300, _dtype)
    _add(f"yolov10_classes_1x24000_k300_{_suffix}", (1, 24000), 300, _dtype)
    _modulus = 1999 if _dtype == F16 else 251  # values exact in the dtype
    _add(f"large_k_2x3000_k2500_{_suffix}", (2, 3000), 2500, _dtype, input=_spread((2, 3000), modulus=_modulus))
    _add(f"large_k_nonfinite_1x2000_k1500_{_suffix}", (1, 2000), 1500, _dtype,
         input=_spread((1, 2000), nonfinite=True, modulus=_modulus))
_add("large_k_past_shared_sort_1x14000_k13600_f16", (1, 14000), 13600, F16, input=_spread((1, 14000)),
     description="k = 13600 of 14000: past the candidates' shared-memory sort (13504 four-byte keys in an H200's "
                 "227 KiB), the GPU's radix sort in the scratch")


_add("one_element_k1", (1,), 1, description="a row of one element: k = n = 1, the whole tensor one element")


# --------------------------------------------------------------------------- backward on given indices
# The backward's contract goes past the gradient of a sort, whose indices are distinct and in [0, n): a
# caller's indices may repeat (each repeat adds its term, in ascending j, in float32 for the half dtypes,
# rounded once) or fall outside [0, n) (skipped; an index of 2^40 or -2^63 too, where a 32-bit index or a
# cast would land inside). A case holding backward_indices runs its forward as the others do, then its
# backward on those indices rather than the forward's (run, below).
def _add_given(name, dims, k, indices, values_grad, dtype=np.float32, description="", repeats=None):
    out_dims = tuple(dims[:-1]) + (k,)
    inputs = {"input": _scores(dims), "values_grad": np.asarray(values_grad, dtype=np.float64).reshape(out_dims),
              "backward_indices": np.asarray(indices, dtype=np.int64).reshape(out_dims)}
    TABLE.add(name, TopKAttrs(k), inputs, dtype=dtype, description=description, repeats=repeats,
              input_dtypes={"backward_indices": np.int64}, expected_dtypes={"indices": np.int64})


_ONE_INDEX = {"backward_indices": "one index throughout: every term lands on it, their sum is what the case checks"}


_add_given("backward_given_indices_2x6_k5", (2, 6), 5, [[3, -1, 3, 6, 0], [5, 5, 2**40, 5, -2**63]],
           [[0.5, 3.0, 1.25, -2.0, 0.75], [1.5, -0.25, 4.0, 2.0, -3.0]],
           description="given indices: 3 twice (0.5 + 1.25) and 5 three times (1.5 - 0.25 + 2.0), each sum unlike "
                       "any one of its terms; -1, 6 = n, 2^40 and -2^63 skipped")
_add_given("backward_given_indices_f16_1x8_k4", (1, 8), 4, [[2, 2, 2, 2]], [[40000, 40000, -40000, -30000]], F16,
           description="four terms at one index: 10000 in float32, where a float16 running sum overflows at 80000",
           repeats=_ONE_INDEX)
_add_given("backward_given_indices_bf16_1x20_k16", (1, 20), 16, [[4] * 16], [[256] + [1] * 15], BF16,
           description="16 terms at one index: 256 and fifteen ones, 271 in float32 rounded once to 272, where a "
                       "bfloat16 running sum stays at 256", repeats=_ONE_INDEX)


def run(case, env):
    """A case by the registry's harness (run_op), unless it holds backward_indices: then its forward as
    there, and backward on those indices in place of the forward's."""
    from ..harness import run_op

    if "backward_indices" not in env.golden.inputs:
        return run_op(case, env)
    top_k = env.op()
    state = top_k.init_kernel(env.handle, case.attrs, env.shape("input"), env.shape("values"), env.shape("indices"))
    input, values, indices = env.read("input"), env.write("values"), env.write("indices")
    top_k.forward_kernel(env.stream, env.handle, state, case.attrs, input, values, indices)
    top_k.backward_kernel(env.stream, env.handle, state, case.attrs, values, env.read("values_grad"),
                          env.read("backward_indices"), input, env.write("input_grad"))
    top_k.cleanup_kernel(env.handle, state)


def torch_program(case, tensors):
    import torch

    input = tensors["input"].requires_grad_()
    values, indices = torch.sort(input, dim=-1, descending=True, stable=True)
    k = case.attrs.k
    values, indices = values[..., :k], indices[..., :k]
    result = {"values": values, "indices": indices}
    if "backward_indices" in tensors:
        # The contract: every term whose index is in [0, n) added at it (index_put_ accumulates; the terms are
        # dyadic and their float64 sums exact, so the order does not matter here), the others skipped.
        n, given = input.shape[-1], tensors["backward_indices"].long().reshape(-1, k)
        rows = torch.arange(given.shape[0]).unsqueeze(1).expand_as(given)
        valid = (given >= 0) & (given < n)
        total = torch.zeros(given.shape[0], n, dtype=torch.float64)
        total.index_put_((rows[valid], given[valid]), tensors["values_grad"].reshape(-1, k)[valid], accumulate=True)
        result["input_grad"] = total.reshape(input.shape)
    elif "values_grad" in tensors:
        (result["input_grad"],) = torch.autograd.grad(values, [input], tensors["values_grad"])
    return result
