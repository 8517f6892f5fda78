"""kernels.functional.topk and topk_backward against torch, on every device.

The op keeps the k largest of each row of the last dim in torch.sort(descending=True, stable=True)'s
order: ties lower index first, NaN above +inf, -0.0 and +0.0 equal (each keeps its sign bit). torch.topk
promises no order among ties, so indices are compared with the stable sort's, and values with both
(as numbers: the descending values are one list whichever tie comes first). Rows are non-square, several
per call, with ties, NaN, +-inf and +-0 among them, in every float dtype; values are small dyadic numbers,
exact in each. The backward is a scatter of the values' gradient (no arithmetic on distinct indices):
exact, compared with torch autograd through the same stable sort.

GPU variants carry the `gpu` marker and skip with the reason where there is no CUDA device or CuPy
(tests/conftest.py's `device` fixture)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kernels
import kernels.functional as F
from kernels.runtime.core import BFLOAT16

NAN, INF = np.nan, np.inf
DTYPES = [np.float16, BFLOAT16, np.float32, np.float64]
DTYPE_IDS = ["f16", "bf16", "f32", "f64"]

# Three rows of 7: NaN twice with a tie of 2.0 and both infinities; signed zeros tied with each other; a
# four-way tie below +inf. Non-square, so that a rows/columns mix-up shows.
TIED = np.array([
    [1.0, NAN, 2.0, NAN, -INF, INF, 2.0],
    [-0.0, 0.0, -1.0, 0.0, -0.0, -2.0, -INF],
    [0.5, 0.5, 0.5, 0.5, -0.5, INF, -INF],
])
POOL = np.array([NAN, INF, -INF, 0.0, -0.0, -1.5, -0.25, 0.25, 0.75, 2.0])


def _ties(seed, *dims):
    """Values drawn from POOL: ties everywhere, with NaN, +-inf and +-0."""
    return POOL[np.random.default_rng(seed).integers(0, POOL.size, dims)]


def _stable(x, k):
    """torch.sort(descending=True, stable=True)'s first k indices of each row (float64: exact for every dtype)."""
    return torch.sort(torch.from_numpy(x.astype(np.float64)), dim=-1, descending=True, stable=True).indices[..., :k].numpy()


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _check_forward(x, k, values, indices):
    expected = _stable(x, k)
    assert indices.dtype == np.int64 and indices.shape == x.shape[:-1] + (k,)
    assert np.array_equal(indices, expected), f"indices {indices.tolist()} != {expected.tolist()}"
    assert values.dtype == x.dtype
    # The input's elements themselves: -0.0 stays -0.0, NaN keeps its bits.
    assert np.array_equal(_bits(values), _bits(np.take_along_axis(x, expected, -1)))
    # And as numbers, torch.topk's values (its order among ties does not change them).
    theirs = torch.topk(torch.from_numpy(x.astype(np.float64)), k).values.numpy()
    assert np.array_equal(values.astype(np.float64), theirs, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("k", [1, 3, 7])
def test_topk_of_tied_rows_is_the_stable_descending_sort(dev, dtype, k):
    x = TIED.astype(dtype)
    values, indices = F.topk(dev.array(x), k, stream=dev.stream)
    _check_forward(x, k, dev.host(values), dev.host(indices))


def test_topk_orders_signed_zeros_and_nans_by_index(dev):
    """-0.0 == +0.0 and NaN == NaN for the order: the lower index first, each value's own bits kept."""
    x = np.array([[-0.0, 0.0, -1.0], [0.0, -0.0, -1.0], [NAN, -NAN, INF]])
    values, indices = F.topk(dev.array(x), 2, stream=dev.stream)
    assert dev.host(indices).tolist() == [[0, 1], [0, 1], [0, 1]]
    assert np.array_equal(_bits(dev.host(values)), _bits(x[:, :2]))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("dims, k, dim", [((2, 3, 5), 2, -1), ((4, 6), 6, 1), ((9,), 4, 0), ((1, 2, 1, 3), 1, 3)])
def test_topk_matches_torch(dev, dtype, dims, k, dim):
    x = _ties(sum(dims) + k, *dims).astype(dtype)
    result = F.topk(dev.array(x), k, dim, stream=dev.stream)
    _check_forward(x, k, dev.host(result.values), dev.host(result.indices))


def test_topk_of_distinct_values_is_torch_topk(dev):
    """Without ties, torch.topk's own values and indices."""
    x = np.random.default_rng(3).permutation(35).reshape(5, 7) * 0.25 - 4.0
    values, indices = F.topk(dev.array(x), 4, stream=dev.stream)
    expected = torch.topk(torch.from_numpy(x), 4)
    assert np.array_equal(dev.host(values), expected.values.numpy())
    assert np.array_equal(dev.host(indices), expected.indices.numpy())


def test_topk_returns_a_named_pair_of_new_arrays(dev):
    x = dev.array(TIED)
    result = F.topk(x, 2, stream=dev.stream)
    assert isinstance(result, F.TopK) and isinstance(result, tuple) and result._fields == ("values", "indices")
    values, indices = result
    assert values is result.values and indices is result.indices
    assert type(values) is type(x) and type(indices) is type(x)


def test_sorted_false_gives_the_sorted_result(dev):
    """sorted=False lets torch return the k in any order; ours are sorted all the same (a valid answer)."""
    x = dev.array(TIED)
    got = F.topk(x, 4, sorted=False, stream=dev.stream)
    want = F.topk(x, 4, stream=dev.stream)
    assert np.array_equal(_bits(dev.host(got.values)), _bits(dev.host(want.values)))
    assert np.array_equal(dev.host(got.indices), dev.host(want.indices))


# --------------------------------------------------------------------------- backward


def _grad(seed, *dims):
    """Nonzero dyadic gradients (no -0.0 to confuse with the zeros elsewhere), exact in every dtype."""
    rng = np.random.default_rng(seed)
    return rng.integers(1, 9, dims) * rng.choice([-0.25, 0.25], dims)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("x, k", [(TIED, 3), (TIED, 7), (_ties(5, 2, 3, 5), 2), (_ties(6, 4, 1), 1)],
                         ids=["tied_k3", "tied_k_n", "3d_k2", "n1"])
def test_topk_backward_is_torch_autograd(dev, dtype, x, k):
    """input_grad: grad_values at the forward's indices, zeros elsewhere; torch autograd through the same
    stable sort."""
    x = x.astype(dtype)
    ctx = F.Context()
    values, indices = F.topk(dev.array(x), k, ctx=ctx, stream=dev.stream)
    grad = _grad(k, *values.shape)
    input_grad = dev.host(F.topk_backward(dev.array(grad.astype(dtype)), ctx, stream=dev.stream))
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    torch.sort(tx, dim=-1, descending=True, stable=True).values[..., :k].backward(torch.from_numpy(grad))
    assert input_grad.dtype == dtype and input_grad.shape == x.shape
    assert np.array_equal(_bits(input_grad), _bits(tx.grad.numpy().astype(dtype)))
    with pytest.raises(kernels.StateError, match="^topk_backward: ctx: expected a context holding a topk forward, "
                                                 "found an empty or released context"):
        F.topk_backward(dev.array(grad.astype(dtype)), ctx, stream=dev.stream)  # backward released the context


def test_topk_backward_of_distinct_values_is_torch_topks(dev):
    x = np.random.default_rng(4).permutation(24).reshape(2, 3, 4) * 0.5
    ctx = F.Context()
    F.topk(dev.array(x), 3, ctx=ctx, stream=dev.stream)
    grad = _grad(9, 2, 3, 3)
    tx = torch.tensor(x, requires_grad=True)
    torch.topk(tx, 3).values.backward(torch.from_numpy(grad))
    assert np.array_equal(dev.host(F.topk_backward(dev.array(grad), ctx, stream=dev.stream)), tx.grad.numpy())


def test_topk_backward_retain_and_any_backward(dev):
    x, grad = dev.array(TIED), _grad(1, 3, 2)
    ctx = F.Context()
    F.topk(x, 2, ctx=ctx, stream=dev.stream)
    first = dev.host(F.topk_backward(dev.array(grad), ctx, retain=True, stream=dev.stream))
    again = dev.host(F.backward(ctx, dev.array(grad), stream=dev.stream))  # topk's backward, by the ctx's op
    assert np.array_equal(first, again) and ctx.state is None
    expected = np.zeros_like(TIED)
    np.put_along_axis(expected, _stable(TIED, 2), grad, -1)
    assert np.array_equal(first, expected)


def test_topk_of_no_rows_and_its_backward(dev):
    """(0, 5): no rows, outputs (0, 2); the backward's gradient is as empty."""
    ctx = F.Context()
    values, indices = F.topk(dev.array(np.zeros((0, 5))), 2, ctx=ctx, stream=dev.stream)
    assert values.shape == indices.shape == (0, 2)
    input_grad = F.topk_backward(dev.array(np.zeros((0, 2))), ctx, stream=dev.stream)
    assert input_grad.shape == (0, 5) and input_grad.dtype == np.float64


def test_topk_torch_tensors_in_and_out(dev):
    if dev.name == "gpu" and not torch.cuda.is_available():
        pytest.skip("gpu: this torch has no CUDA")
    device = "cpu" if dev.name == "cpu" else "cuda:0"
    x = torch.tensor(TIED, device=device, requires_grad=True)  # detached by the layer
    ctx = F.Context()
    values, indices = F.topk(x, 3, ctx=ctx, stream=dev.stream)
    assert isinstance(values, torch.Tensor) and values.device == x.device and indices.dtype == torch.int64
    grad = torch.tensor(_grad(2, 3, 3), device=device)
    input_grad = F.topk_backward(grad, ctx, stream=dev.stream)
    dev.stream.synchronize()
    expected = torch.sort(x.detach(), dim=-1, descending=True, stable=True)
    assert torch.equal(indices, expected.indices[:, :3])
    assert torch.equal(input_grad, torch.zeros_like(x).scatter(-1, indices, grad))


# --------------------------------------------------------------------------- poisoned outputs


def test_every_output_and_gradient_element_is_written(dev, monkeypatch):
    """Outputs and gradients allocated full of all-ones bits (NaN in every float dtype, -1 as int64): the
    forward writes every value and index, the backward every element (zeros where no value came from)."""
    original = F._Env.empty

    def poisoned(self, dims, dtype):
        array = original(self, dims, dtype)
        with self.active():
            unsigned = np.dtype(f"u{np.dtype(dtype).itemsize}")
            array.view(unsigned).fill(np.iinfo(unsigned).max)
        return array

    monkeypatch.setattr(F._Env, "empty", poisoned)
    x = np.arange(30.0).reshape(3, 10)[:, ::-1] % 7  # finite, tied
    ctx = F.Context()
    values, indices = F.topk(dev.array(x), 4, ctx=ctx, stream=dev.stream)
    _check_forward(np.ascontiguousarray(x), 4, dev.host(values), dev.host(indices))
    input_grad = dev.host(F.topk_backward(dev.array(np.ones((3, 4))), ctx, stream=dev.stream))
    assert not np.isnan(input_grad).any() and input_grad.sum() == 12 and set(np.unique(input_grad)) == {0.0, 1.0}


# --------------------------------------------------------------------------- the plan path (CPU, no ctx)


def test_repeated_cpu_calls_run_on_the_plan():
    """The first call without ctx keeps the form's plan; the repeated ones run top_k's CPU compute on it,
    with the full path's bits and no new state; another form (k, dim as given, dtype) gets its own."""
    F.clear_cache()
    x = _ties(11, 3, 9)
    first = F.topk(x, 4)
    assert F.cache_info() == {"top_k": 1} and len(F._PLANS) == 1
    for _ in range(3):
        again = F.topk(x, 4)
        assert isinstance(again, F.TopK)
        assert np.array_equal(_bits(again.values), _bits(first.values)) and np.array_equal(again.indices, first.indices)
        assert again.values is not first.values  # new arrays each call
    assert F.cache_info() == {"top_k": 1} and len(F._PLANS) == 1
    F.topk(x, 4, 1)  # dim 1 for -1: its own form, the same state
    F.topk(x, 5)
    F.topk(x.astype(np.float32), 4)
    assert F.cache_info() == {"top_k": 3} and len(F._PLANS) == 4
    _check_forward(x, 4, *F.topk(x, 4, 1))


def test_planned_empty_rows():
    F.clear_cache()
    x = np.zeros((0, 5))
    for _ in range(2):
        values, indices = F.topk(x, 2)
        assert values.shape == indices.shape == (0, 2) and indices.dtype == np.int64
    assert len(F._PLANS) == 1


def test_a_ctx_call_or_a_strided_input_takes_the_full_path():
    F.clear_cache()
    x = _ties(12, 4, 6)
    F.topk(x, 2, ctx=F.Context())
    strided = _ties(13, 4, 12)[:, ::2]
    _check_forward(np.ascontiguousarray(strided), 3, *F.topk(strided, 3))
    assert F._PLANS == {}


# --------------------------------------------------------------------------- refusals


def test_topk_refuses_what_the_kernel_lacks(dev):
    x = dev.array(TIED)
    with pytest.raises(kernels.AttrsError, match=r"^topk: dim: expected the last dim \(-1 or 1\): the kernel selects "
                                                 r"along the last dim .*found 0"):
        F.topk(x, 2, 0, stream=dev.stream)
    with pytest.raises(kernels.AttrsError, match=r"^topk: largest: expected True \(the kernel keeps the largest"):
        F.topk(x, 2, largest=False, stream=dev.stream)
    with pytest.raises(kernels.AttrsError, match=r"^topk: k: expected at most the last dim of input \(7\), found 8"):
        F.topk(x, 8, stream=dev.stream)
