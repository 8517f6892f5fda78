"""element_binary's GPU plans, checked without a GPU: a NumPy emulation of each
kernel of element_binary.cu (the same index arithmetic, 32-bit magic division
included, and the same summation order) must reproduce NumPy broadcasting and the
CPU kernels on many shape pairs, and meet every conformance case's golden."""

import itertools

import numpy as np
import pytest

from conformance.case import Golden
from conformance.cases import element_binary as cases
from conformance.compare import compare
from conformance.golden import GoldenStore
from kernels import BinaryOpType, ElementBinaryAttrs, TensorShape, cpu_handle, cpu_stream, element_binary
from kernels.element_binary.plan import Space, divider, gpu_plan
from kernels.runtime.core import HALF_DTYPES

# --------------------------------------------------------------------------- the emulation


def _divide(n: np.ndarray, size: int) -> np.ndarray:
    """divide<int> of element_binary.cu: (umulhi(n, magic) + n) >> shift, in 32-bit unsigned arithmetic."""
    packed = divider(size)
    magic, shift = np.uint64(packed & 0xFFFFFFFF), np.uint64(packed >> 32)
    n = n.astype(np.uint64)
    high = (n * magic) >> np.uint64(32)
    total = high + n
    assert np.all(total < 2**32), "the 32-bit sum would overflow"
    return (total >> shift).astype(np.int64)


def _offsets(space: Space, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """offsets() of element_binary.cu for many indices at once: every dim divided, innermost first."""
    out, lhs, rhs = (np.zeros_like(index) for _ in range(3))
    rest = index.copy()
    for d in reversed(range(len(space.sizes))):
        quotient = _divide(rest, space.sizes[d])
        coordinate = rest - quotient * space.sizes[d]
        rest = quotient
        out += coordinate * space.out_strides[d]
        lhs += coordinate * space.lhs_strides[d]
        rhs += coordinate * space.rhs_strides[d]
    assert not np.any(rest), "an index beyond the space"
    return out, lhs, rhs


def _apply(op, l, r):
    with np.errstate(all="ignore"):
        return {BinaryOpType.ADD: np.add, BinaryOpType.SUB: np.subtract, BinaryOpType.MUL: np.multiply,
                BinaryOpType.DIV: np.divide}.get(op, None)(l, r) if op not in (BinaryOpType.MAX, BinaryOpType.MIN) \
            else np.where((l < r if op is BinaryOpType.MAX else l > r) | np.isnan(r), r, l)


def _row_offsets(plan):
    """binary_rows and binary_grad_along_rows: each row's offsets through the outer dims (offsets()), then
    the row's elements with stride 1 on a side that has the innermost dim, 0 on one broadcast along it;
    the lhs, rhs and output offsets of every element, row by row."""
    o0, l0, r0 = _offsets(plan.outer, np.arange(plan.outer.count, dtype=np.int64))
    within = np.arange(plan.inner, dtype=np.int64)
    return ((l0[:, None] + within * plan.sides_inner[0]).reshape(-1),
            (r0[:, None] + within * plan.sides_inner[1]).reshape(-1), (o0[:, None] + within).reshape(-1))


def emulate_forward(op, lhs, rhs, out_dims):
    plan = gpu_plan(lhs.shape, rhs.shape, out_dims)
    l, r = lhs.reshape(-1), rhs.reshape(-1)
    if plan.same:
        return _apply(op, l, r).reshape(out_dims)
    if plan.rows:
        lo, ro, oo = _row_offsets(plan)
        output = np.empty(plan.count, lhs.dtype)
        output[oo] = _apply(op, l[lo], r[ro])
        return output.reshape(out_dims)
    _, lo, ro = _offsets(plan.space, np.arange(plan.count, dtype=np.int64))
    return _apply(op, l[lo], r[ro]).reshape(out_dims)


def _grad_values(op, side, l, r, g):
    with np.errstate(all="ignore"):
        return element_binary.cpu.grad(op, side, l, r, g)


def _shuffle_tree(lanes):
    """The __shfl_down_sync tree: lane i adds lane i + offset for offsets 16, 8, 4, 2, 1; lane 0's sum."""
    lanes = lanes.copy()
    for offset in (16, 8, 4, 2, 1):
        lanes[:, :offset] = lanes[:, :offset] + lanes[:, offset:2 * offset]
    return lanes[:, 0]


def emulate_backward(op, lhs, rhs, output_grad):
    """(lhs_grad, rhs_grad) in the order the GPU kernels sum them."""
    out_dims = output_grad.shape
    plan = gpu_plan(lhs.shape, rhs.shape, out_dims)
    l, r, g = lhs.reshape(-1), rhs.reshape(-1), output_grad.reshape(-1)
    results = []
    for side, operand in ((0, lhs), (1, rhs)):
        if plan.count == 0:
            results.append(np.zeros(operand.shape, operand.dtype))
            continue
        if plan.same:
            results.append(_grad_values(op, side, l, r, g).reshape(operand.shape))
            continue
        grad = plan.grads[side]
        if plan.rows and not grad.reduced.sizes:  # binary_grad_along_rows: no sum, the rows' offsets
            lo, ro, go = _row_offsets(plan)
            gradient = np.empty(plan.count, g.dtype)
            gradient[go] = _grad_values(op, side, l[lo], r[ro], g[go])  # the side has every dim: the output's layout
            results.append(gradient.reshape(operand.shape))
            continue
        kept_count, reduced_count = grad.kept.count, grad.reduced.count
        go0, lo0, ro0 = _offsets(grad.kept, np.arange(kept_count, dtype=np.int64))
        go1, lo1, ro1 = _offsets(grad.reduced, np.arange(reduced_count, dtype=np.int64))
        values = _grad_values(op, side, l[lo0[:, None] + lo1[None, :]], r[ro0[:, None] + ro1[None, :]],
                              g[go0[:, None] + go1[None, :]])  # (kept, reduced)
        partials = []
        for s in range(grad.chunks):
            chunk = values[:, s * grad.chunk:min((s + 1) * grad.chunk, reduced_count)]
            if grad.kind == "rows":
                total = np.zeros(kept_count, dtype=g.dtype)
                for k in range(chunk.shape[1]):
                    total = total + chunk[:, k]
            else:
                lanes = np.zeros((kept_count, 32), dtype=g.dtype)
                for k in range(chunk.shape[1]):
                    lanes[:, k % 32] = lanes[:, k % 32] + chunk[:, k]
                total = _shuffle_tree(lanes)
            partials.append(total)
        if grad.chunks > element_binary.plan.WARP_SUM_CHUNKS:  # binary_sum_partials_warps
            lanes = np.zeros((kept_count, 32), dtype=g.dtype)
            for s, partial in enumerate(partials):
                lanes[:, s % 32] = lanes[:, s % 32] + partial
            total = _shuffle_tree(lanes)
        else:  # binary_sum_partials
            total = partials[0]
            for partial in partials[1:]:
                total = total + partial
        results.append(total.reshape(operand.shape))
    return tuple(results)


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 24, 25, 100, 600, 25600, 65537, 2**20 + 3, 2**31 - 1])
def test_divider_matches_integer_division(size):
    rng = np.random.default_rng(size)
    n = np.concatenate([np.arange(min(size * 3, 5000)), rng.integers(0, 2**31, 20000), [2**31 - 1, size - 1, size]])
    n = n[n < 2**31].astype(np.int64)
    assert np.array_equal(_divide(n, size), n // size)


def _shape_pairs():
    """Shape pairs of rank 1 to 4 with every mix of broadcast dims, plus ones that reach the split reductions."""
    pairs = []
    rng = np.random.default_rng(7)
    for rank in (1, 2, 3, 4):
        for _ in range(12):
            out = tuple(int(d) for d in rng.choice([2, 3, 5], size=rank))
            lhs = tuple(1 if rng.random() < 0.4 else d for d in out)
            rhs = tuple(1 if rng.random() < 0.4 else d for d in out)
            lhs = lhs[int(rng.integers(0, rank)):] if rng.random() < 0.3 else lhs
            pairs.append((lhs, rhs))
    pairs += [((1, 80, 6, 7), (1, 80, 1, 1)), ((3, 100, 4), (4,)), ((1, 2, 24, 25), (1, 2, 1, 1)),
              ((2, 700), (2, 1)), ((700, 3), (1, 3)), ((5, 1, 40), (1, 7, 40)), ((1,), (1, 1)), ((2, 40), (2, 40))]
    # along rows (ROWS_MIN_INNER elements or more): either side broadcast along the rows, outer dims
    # broadcast on either side, one row (no outer dims), and the conformance cases' row lengths
    pairs += [((2, 3, 1040), (2, 3, 1)), ((2, 1, 1037), (1, 3, 1037)), ((3, 1), (3, 1100)), ((1030,), (1,)),
              ((2, 1, 2, 1024), (3, 1, 1024)), ((1, 1024), (4, 1))]
    return pairs


@pytest.mark.parametrize("lhs_dims, rhs_dims", _shape_pairs(), ids=str)
def test_emulated_gpu_plan_matches_cpu(lhs_dims, rhs_dims):
    out_dims = element_binary.broadcast_dims(lhs_dims, rhs_dims)
    lhs = (np.arange(np.prod(lhs_dims)) % 9 - 4).reshape(lhs_dims).astype(np.float32) * np.float32(0.5)
    rhs = (np.arange(np.prod(rhs_dims)) % 5 - 2).reshape(rhs_dims).astype(np.float32) * np.float32(0.5)
    grad = ((np.arange(np.prod(out_dims)) * 7) % 11 - 5).reshape(out_dims).astype(np.float32) * np.float32(0.25)
    for op in BinaryOpType:
        r = np.where(rhs == 0, np.float32(2), rhs) if op is BinaryOpType.DIV else rhs
        attrs = ElementBinaryAttrs(op)
        handle, stream = cpu_handle(), cpu_stream()
        state = element_binary.init_kernel(handle, attrs, TensorShape(lhs_dims, np.float32),
                                           TensorShape(r.shape, np.float32), TensorShape(out_dims, np.float32))
        output = np.empty(out_dims, np.float32)
        lhs_grad, rhs_grad = np.empty(lhs_dims, np.float32), np.empty(r.shape, np.float32)
        element_binary.forward_kernel(stream, handle, state, attrs, lhs, r, output)
        element_binary.backward_kernel(stream, handle, state, attrs, output, grad, lhs, lhs_grad, r, rhs_grad)
        assert np.array_equal(emulate_forward(op, lhs, r, out_dims), output, equal_nan=True), op
        emulated = emulate_backward(op, lhs, r, grad)
        assert np.array_equal(emulated[0], lhs_grad), (op, "lhs_grad")
        assert np.array_equal(emulated[1], rhs_grad), (op, "rhs_grad")


def test_plans_reach_every_reduction_path():
    kinds = set()
    for case in cases.TABLE:
        lhs, rhs = case.inputs["lhs"].shape, case.inputs["rhs"].shape
        plan = gpu_plan(lhs, rhs, element_binary.broadcast_dims(lhs, rhs))
        kinds.add("same" if plan.same else "rows" if plan.rows else "broadcast")
        if not plan.same:
            kinds.update(f"{g.kind}{'_split' if g.chunks > 1 else ''}" for g in plan.grads)
            kinds.update("warp_sum" for g in plan.grads if g.chunks > element_binary.plan.WARP_SUM_CHUNKS)
    assert kinds >= {"same", "broadcast", "rows", "rows_split", "warps", "warps_split", "warp_sum"}, kinds


def test_rows_only_from_the_innermost_dims_length():
    """binary_rows takes a broadcasting forward whose innermost collapsed dim is ROWS_MIN_INNER long or more,
    never an unbroadcast one; the row count, row length and which sides have the innermost dim come from
    the collapsed dims."""
    limit = element_binary.plan.ROWS_MIN_INNER
    assert not gpu_plan((2, limit - 1), (2, 1), (2, limit - 1)).rows
    plan = gpu_plan((2, limit), (2, 1), (2, limit))
    assert plan.rows and (plan.outer.count, plan.inner, plan.sides_inner) == (2, limit, (True, False))
    assert not gpu_plan((2, limit), (2, limit), (2, limit)).rows  # same shapes: binary_same
    plan = gpu_plan((5, 1), (1, limit), (5, limit))
    assert plan.rows and (plan.outer.count, plan.sides_inner) == (5, (False, True))
    assert (plan.outer.lhs_strides, plan.outer.rhs_strides, plan.outer.out_strides) == ((1,), (0,), (limit,))
    plan = gpu_plan((limit + 3,), (1,), (limit + 3,))
    assert plan.rows and plan.outer.sizes == () and plan.outer.count == 1


def test_bench_shapes_plan():
    plan = gpu_plan((1, 80, 160, 160), (1, 80, 1, 1), (1, 80, 160, 160))
    assert plan.space.sizes == (80, 25600) and plan.space.rhs_strides == (1, 0)
    assert plan.rows and plan.inner == 25600 and plan.sides_inner == (True, False)
    assert plan.outer.sizes == (80,) and (plan.outer.lhs_strides, plan.outer.rhs_strides) == ((25600,), (1,))
    assert plan.grads[0].kind == "rows" and plan.grads[0].chunks == 1  # lhs_grad: an elementwise gather
    assert plan.grads[1].kind == "warps" and plan.grads[1].chunks == 50
    assert gpu_plan((1, 80, 160, 160), (1, 80, 160, 160), (1, 80, 160, 160)).same


@pytest.fixture(scope="module")
def store():
    return GoldenStore()


@pytest.mark.parametrize("case", list(cases.TABLE), ids=[c.name for c in cases.TABLE])
def test_emulated_gpu_meets_goldens(case, store):
    """The GPU's summation order within each case's stated tolerance (the lead checks the real GPU)."""
    golden: Golden = store.get(case)
    lhs, rhs, grad = (golden.inputs[n] for n in ("lhs", "rhs", "output_grad"))
    if case.dtype in HALF_DTYPES:  # the GPU computes and sums half tensors in float32, rounding each result once
        lhs, rhs, grad = (a.astype(np.float32) for a in (lhs, rhs, grad))
    op = case.attrs.op_type
    got = {"output": emulate_forward(op, lhs, rhs, grad.shape)}
    got["lhs_grad"], got["rhs_grad"] = emulate_backward(op, lhs, rhs, grad)
    problems = [f"{name}: {report}" for name, report in
                ((n, compare(got[n].astype(case.dtype), golden.expected[n], case.tolerance_for(n))) for n in got) if report]
    assert not problems, "\n".join(problems)


def test_collapse_merges_and_drops_size_one_dims():
    assert element_binary.plan.collapse((2, 3, 4), (2, 3, 4), (2, 3, 4)) == ([24], [1], [1])
    assert element_binary.plan.collapse((2, 5, 3, 4), (2, 1, 3, 4), (2, 5, 1, 4)) == ([2, 5, 3, 4], [12, 0, 4, 1], [20, 4, 0, 1])
    assert element_binary.plan.collapse((1, 80, 7, 7), (1, 80, 7, 7), (1, 80, 1, 1)) == ([80, 49], [49, 1], [1, 0])
    assert element_binary.plan.collapse((1, 1), (1,), (1, 1)) == ([1], [1], [1])
    assert element_binary.plan.collapse((2, 0, 3), (2, 0, 3), (2, 1, 3)) == ([2, 0, 3], [0, 3, 1], [3, 0, 1])
    # Every (lhs, rhs) broadcast on three dims collapses to strides that address the same elements.
    for mask in itertools.product([0, 1], repeat=6):
        out = (2, 3, 4)
        lhs = tuple(1 if m else d for m, d in zip(mask[:3], out))
        rhs = tuple(1 if m else d for m, d in zip(mask[3:], out))
        plan = gpu_plan(lhs, rhs, out)
        _, lo, ro = _offsets(plan.space, np.arange(24))
        index = np.arange(24).reshape(out)
        assert np.array_equal(lo, np.broadcast_to(np.arange(np.prod(lhs)).reshape(lhs), out).reshape(-1)), (lhs, rhs)
        assert np.array_equal(ro, np.broadcast_to(np.arange(np.prod(rhs)).reshape(rhs), out).reshape(-1)), (lhs, rhs)
        assert index.size == plan.count


def test_reduction_split_depends_on_the_shapes_alone():
    """The split orders the sums, so it is the same on every GPU: 2**18 threads' worth of chunks."""
    assert element_binary.plan.REDUCTION_THREADS == 262144
    dims = ((1, 64, 400, 400), (64, 1, 1), (1, 64, 400, 400))
    assert gpu_plan(*dims).grads[1].chunks == 125

