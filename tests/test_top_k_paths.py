"""top_k's paths: the GPU plan as a pure function of the shape (checked on the CPU), the CPU against
torch.sort(descending=True, stable=True) on rows long and tied, and on a GPU every path (candidates in
shared memory or in the state's scratch; a row's keys cached in shared memory or read from global
memory) against the CPU bit for bit, run after run, with grids smaller than the rows (the grid-stride loop)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import kernels
from kernels import TensorShape, TopKAttrs, top_k
from kernels.runtime import gpu
from kernels.runtime.core import BFLOAT16
from kernels.top_k import cpu as top_k_cpu
from kernels.top_k.plan import (
    TOP_K_BLOCK,
    TOP_K_CACHE_BYTES,
    TOP_K_KEYS_PER_THREAD,
    TOP_K_SHARED_CANDIDATES,
    TOP_K_STATIC_BYTES,
    gpu_plan,
)

from .conftest import require

DTYPES = (np.float32, np.float64, np.float16, BFLOAT16)
H200_OPTIN = 232448  # cudaDevAttrMaxSharedMemoryPerBlockOptin of an H200 (227 KiB)


def _values(rng, dims, dtype, distinct=9):
    """Few distinct values (ties everywhere), with NaN, +-inf and +-0 among them."""
    pool = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0] + [v / 4 for v in range(-distinct, distinct + 1)])
    return pool[rng.integers(0, pool.size, dims)].astype(dtype)


def _reference(x, k):
    import torch

    values, indices = torch.sort(torch.from_numpy(x.astype(np.float64)), dim=-1, descending=True, stable=True)
    return values[..., :k].numpy().astype(x.dtype), indices[..., :k].numpy()


def _run(device, x, k):
    if device == "cpu":
        stream, handle, xp = kernels.cpu_stream(), kernels.cpu_handle(), np
    else:
        import cupy

        stream, handle, xp = kernels.gpu_stream(0), kernels.gpu_handle(0), cupy
    out_dims = x.shape[:-1] + (k,)
    attrs = TopKAttrs(k)
    with (stream if device != "cpu" else contextlib.nullcontext()):
        x_ = xp.asarray(x)
        # poisons made on the host (CuPy's fill takes no bfloat16): every value must be written
        values_ = xp.asarray(np.full(out_dims, np.nan, dtype=x.dtype))
        indices_ = xp.asarray(np.full(out_dims, -1, dtype=np.int64))
    state = top_k.init_kernel(handle, attrs, TensorShape.of(x), TensorShape(out_dims, x.dtype),
                              TensorShape(out_dims, np.int64))
    top_k.forward_kernel(stream, handle, state, attrs, x_, values_, indices_)
    stream.synchronize()
    result = (xp.asnumpy(values_) if xp is not np else values_, xp.asnumpy(indices_) if xp is not np else indices_)
    top_k.cleanup_kernel(handle, state)
    return result


def _same_bits(a, b):
    return a.shape == b.shape and np.array_equal(np.ascontiguousarray(a).view(np.uint8),
                                                 np.ascontiguousarray(b).view(np.uint8))


# --------------------------------------------------------------------------- the plan (device-free)


@pytest.mark.parametrize("dims, k, shared", [
    ((1, 8400), 300, True), ((16, 24000), 300, True), ((3, 7), 7, True), ((2, 1100), 1100, False),
    ((1, 24000), TOP_K_SHARED_CANDIDATES, True), ((1, 24000), TOP_K_SHARED_CANDIDATES + 1, False),
])
def test_the_plan_keeps_candidates_in_shared_memory_up_to_its_limit(dims, k, shared):
    plan = gpu_plan(dims, k, np.dtype(np.float32), H200_OPTIN)
    assert plan.shared == shared
    assert plan.forward == f"top_k_forward<float, {'true' if shared else 'false'}>"
    assert plan.paths[0] == "top_k.forward." + ("shared" if shared else "scratch")
    assert plan.scratch == (0 if shared else plan.grid * 2 * k)  # the candidates and the sort's other buffer
    assert plan.rows == int(np.prod(dims[:-1])) and plan.n == dims[-1]


@pytest.mark.parametrize("n, dtype, optin, cached", [
    (8400, np.float32, H200_OPTIN, True), (24000, np.float16, H200_OPTIN, True),  # YOLOv10's rows (4-byte keys)
    (24576, np.float32, H200_OPTIN, True), (24577, np.float32, H200_OPTIN, False),  # TOP_K_CACHE_BYTES
    (12288, np.float64, H200_OPTIN, True), (12289, np.float64, H200_OPTIN, False),  # 8-byte keys
    (12288, BFLOAT16, 64 * 1024, True), (12289, BFLOAT16, 64 * 1024, False),  # a 64 KiB device: less the static part
])
def test_the_plan_caches_a_rows_keys_up_to_its_limit(n, dtype, optin, cached):
    """A row's keys go to dynamic shared memory while they fit in TOP_K_CACHE_BYTES and in the device's
    opt-in shared memory less the kernel's own; the launch asks for exactly the row's keys."""
    plan = gpu_plan((3, n), 300, np.dtype(dtype), optin)
    key_bytes = 8 if dtype == np.float64 else 4
    assert plan.cache_bytes == (n * key_bytes if cached else 0)
    assert plan.paths[1] == "top_k.forward." + ("keys_cached" if cached else "keys_global")
    assert plan.cache_bytes <= min(TOP_K_CACHE_BYTES, optin - TOP_K_STATIC_BYTES)


@pytest.mark.parametrize("k, dtype, optin, sorted_in_shared", [
    (8400, np.float32, H200_OPTIN, True),  # k = n on YOLOv10's anchor row
    (13504, np.float16, H200_OPTIN, True), (13505, np.float16, H200_OPTIN, False),  # 4-byte keys: 16 B a candidate
    (9002, np.float64, H200_OPTIN, True), (9003, np.float64, H200_OPTIN, False),  # 8-byte keys: 24 B a candidate
    (3072, BFLOAT16, 64 * 1024, True), (3073, BFLOAT16, 64 * 1024, False),  # a 64 KiB device: less the static part
])
def test_the_plan_sorts_the_scratch_candidates_in_shared_memory_up_to_its_limit(k, dtype, optin, sorted_in_shared):
    """The scratch path's radix sort takes 2k keys and 2k int indices of dynamic shared memory while they fit in
    the device's opt-in limit less the kernel's own; the launch asks for the larger of that and the row's keys."""
    plan = gpu_plan((2, 30000), k, np.dtype(dtype), optin)
    key_bytes = 8 if dtype == np.float64 else 4
    assert not plan.shared
    assert plan.sort_bytes == (2 * k * (key_bytes + 4) if sorted_in_shared else 0)
    assert plan.sort_bytes <= optin - TOP_K_STATIC_BYTES
    assert plan.paths[2] == "top_k.forward." + ("sort_shared" if sorted_in_shared else "sort_global")
    assert plan.shared_mem == max(plan.cache_bytes, plan.sort_bytes)
    assert gpu_plan((2, 3000), 300, np.dtype(dtype), optin).sort_bytes == 0  # candidates in shared: no sort
    assert len(gpu_plan((2, 3000), 300, np.dtype(dtype), optin).paths) == 2


@pytest.mark.parametrize("n, block", [
    (1, 256), (300, 256), (1024, 256), (1025, 512), (2048, 512), (2049, 1024), (8400, 1024), (24000, 1024),
    (2**31 - 1, 1024),
])
def test_the_plan_widens_the_block_with_the_row(n, block):
    """The narrowest of 256, 512 and 1024 threads with at most TOP_K_KEYS_PER_THREAD keys a thread, the
    widest for any longer row (the constants pinned, so that the boundaries below are the rule's)."""
    assert (TOP_K_BLOCK, TOP_K_KEYS_PER_THREAD) == (1024, 4)
    plan = gpu_plan((2, n), 1, np.dtype(np.float32), H200_OPTIN)
    assert plan.block == block


def test_the_plan_refuses_rows_of_2_31_elements():
    """The kernel indexes a row with int32: a row that long is refused before any launch, by name."""
    gpu_plan((1, 2**31 - 1), 300, np.dtype(np.float16), H200_OPTIN)
    with pytest.raises(kernels.ShapeError, match="rows shorter than 2\\^31"):
        gpu_plan((1, 2**31), 300, np.dtype(np.float16), H200_OPTIN)


def test_the_plan_strides_over_rows_on_a_small_device():
    with gpu.simulated_device(sm_count=1, max_blocks=2):
        plan = gpu_plan((7, 100), 50, np.dtype(np.float64), H200_OPTIN)
    assert plan.grid == 2 and plan.key_dtype == np.uint64 and plan.backward == "top_k_backward<double>"
    assert plan.backward_grid == 2


@pytest.mark.parametrize("k, optin, sorted_pairs", [
    (TOP_K_SHARED_CANDIDATES, H200_OPTIN, False),  # candidates in shared memory: the gather
    (TOP_K_SHARED_CANDIDATES + 1, H200_OPTIN, True), (13504, H200_OPTIN, True), (13505, H200_OPTIN, False),
    (3072, 64 * 1024, True), (3073, 64 * 1024, False),  # a 64 KiB device: less the static part
])
def test_the_plan_sorts_a_large_ks_backward_pairs_in_shared_memory_up_to_its_limit(k, optin, sorted_pairs):
    """Past the shared candidates, the backward sorts each row's (index, j) pairs in the launch's dynamic shared
    memory (16 bytes a pair, two buffers of a 4-byte key and a 4-byte position) while they fit in the opt-in
    limit less the kernel's own, a block a row; else it gathers, a block a chunk of a row. The pairs' size does
    not depend on the dtype."""
    for dtype in DTYPES:
        plan = gpu_plan((3, 30000), k, np.dtype(dtype), optin)
        t = gpu.cuda_type(np.dtype(dtype))
        assert plan.backward_shared_mem == (16 * k if sorted_pairs else 0)
        assert plan.backward_shared_mem <= optin - TOP_K_STATIC_BYTES
        assert plan.backward == (f"top_k_backward_sorted<{t}>" if sorted_pairs else f"top_k_backward<{t}>")
        assert plan.backward_path == "top_k.backward." + ("sorted" if sorted_pairs else "gather")
        assert plan.backward_grid == (plan.grid if sorted_pairs else 3 * -(-30000 // plan.block))


@pytest.mark.parametrize("dims, block, backward_grid", [
    ((1, 8400), 1024, 9), ((16, 24000), 1024, 16 * 24), ((3, 1024), 256, 12), ((3, 1025), 512, 9),
    ((5, 1), 256, 5), ((70000, 5), 256, 65536),
])
def test_the_plan_spreads_the_backward_over_chunks_of_each_row(dims, block, backward_grid):
    """The backward takes a block a chunk of `block` elements of a row (a row's chunks on many SMs), the grid
    capped at GRID_BLOCKS, over which its blocks stride; the forward keeps a block a row."""
    plan = gpu_plan(dims, 1, np.dtype(np.float32), H200_OPTIN)
    assert (plan.block, plan.backward_grid, plan.grid) == (block, backward_grid, min(dims[0], 65536))


# --------------------------------------------------------------------------- the CPU


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dims, k", [((3, 2500), 300), ((2, 8400), 300), ((1, 24000), 300), ((4, 1100), 1100),
                                     ((2, 3, 33), 1)])
def test_cpu_is_torch_sort_descending_stable(dtype, dims, k):
    rng = np.random.default_rng(sum(dims) + k)
    x = _values(rng, dims, dtype)
    values, indices = _run("cpu", x, k)
    want_values, want_indices = _reference(x, k)
    assert np.array_equal(indices, want_indices)
    assert _same_bits(values, np.take_along_axis(x, want_indices, axis=-1))
    assert np.array_equal(values.astype(np.float64), want_values.astype(np.float64), equal_nan=True)


def test_cpu_order_key_orders_every_float32_class():
    x = np.array([np.nan, -np.nan, np.inf, 1.0, 1e-45, 0.0, -0.0, -1e-45, -1.0, -np.inf], dtype=np.float32)
    key = top_k_cpu.order_key(x)
    assert key[0] == key[1] == np.iinfo(np.uint32).max
    assert key[5] == key[6]  # +0 and -0
    assert np.all(np.diff(key[1:].astype(np.int64)) <= 0) and np.all(np.diff(np.delete(key[1:], 5).astype(np.int64)) < 0)


# --------------------------------------------------------------------------- the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dims, k", [
    ((1, 8400), 300), ((16, 8400), 300), ((16, 24000), 300), ((3, 2500), 1), ((5, 333), 333),  # shared
    ((7, 1500), 300),  # a block of 512 (the others: 1024 from 2049 keys a row, 256 up to 1024)
    ((2, 3000), 1500), ((3, 1100), 1100),  # scratch, the sort in shared memory
    # float64's sort takes 48000 bytes, past 48 KiB only with the kernel's static shared memory: launch opts in
    ((1, 24000), 2000),
    # cached keys of 38.5-48 KiB, past 48 KiB only with the kernel's static shared memory: launch opts in
    # (11000 4-byte keys, 5000 float64 ones)
    ((2, 11000), 300), ((1, 5000), 300),
    ((2, 30000), 300), ((1, 30000), 1500),  # keys past the cache, from global memory (float64's from 12289)
    ((70000, 5), 3),  # more rows than the grid: the grid-stride loop
])
def test_gpu_equals_cpu_bit_for_bit(dtype, dims, k):
    require("gpu")
    rng = np.random.default_rng(sum(dims) + k)
    x = _values(rng, dims, dtype)
    cpu_values, cpu_indices = _run("cpu", x, k)
    gpu_values, gpu_indices = _run("gpu", x, k)
    assert np.array_equal(gpu_indices, cpu_indices), \
        f"{int(np.count_nonzero(gpu_indices != cpu_indices))} of {cpu_indices.size} indices differ"
    assert _same_bits(gpu_values, cpu_values)
    again_values, again_indices = _run("gpu", x, k)  # run to run: the same bits
    assert _same_bits(again_values, gpu_values) and np.array_equal(again_indices, gpu_indices)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dims, k", [
    ((1, 8400), 8400), ((16, 2000), 1500), ((3, 5000), 4000), ((1, 1025), 1025),
    ((1, 30000), 20000),  # keys past the cache, from global memory
])
def test_gpu_large_k_equals_cpu_bit_for_bit(dtype, dims, k):
    """A large k (the candidates in the scratch, ranked by the radix sort) over mostly distinct keys (normal
    draws: distinct in float32 and float64, ties in the half types), negatives, NaN, +-inf and +-0 among
    them, so that every digit of the sort decides places."""
    require("gpu")
    rng = np.random.default_rng(k)
    x = rng.standard_normal(dims)
    flat = x.reshape(-1)
    for step, value in ((97, np.nan), (89, np.inf), (83, -np.inf), (79, 0.0), (73, -0.0)):
        flat[rng.integers(0, flat.size, flat.size // step)] = value
    x = x.astype(dtype)
    cpu_values, cpu_indices = _run("cpu", x, k)
    gpu_values, gpu_indices = _run("gpu", x, k)
    assert np.array_equal(gpu_indices, cpu_indices), \
        f"{int(np.count_nonzero(gpu_indices != cpu_indices))} of {cpu_indices.size} indices differ"
    assert _same_bits(gpu_values, cpu_values)


@pytest.mark.gpu
def test_gpu_forward_kernels_keep_their_own_shared_memory_within_the_plans_reserve():
    """The plan gives a row's keys the device's opt-in shared memory less TOP_K_STATIC_BYTES: every forward
    instantiation's static shared memory must fit in that reserve, or a launch past it would fail."""
    require("gpu")
    import cupy

    from kernels.top_k import gpu as top_k_gpu

    sizes = {}
    for name in top_k_gpu._CUDA.name_expressions:
        if name.startswith(("top_k_forward", "top_k_backward_sorted")):
            function = top_k_gpu._CUDA.function(name)
            sizes[name] = cupy.cuda.driver.funcGetAttribute(cupy.cuda.driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                                                            function.ptr)
    assert len(sizes) == 12 and all(0 < size <= TOP_K_STATIC_BYTES for size in sizes.values()), sizes


@pytest.mark.gpu
@pytest.mark.parametrize("k", [300, 1500])
def test_gpu_on_a_small_device_equals_cpu(k):
    """Grids of at most two blocks over 5 rows: each block runs rows in turn, reusing its shared memory
    or its row of the scratch."""
    require("gpu")
    rng = np.random.default_rng(k)
    x = _values(rng, (5, 3001), np.float32, distinct=3)
    with gpu.simulated_device(sm_count=1, max_blocks=2):
        gpu_values, gpu_indices = _run("gpu", x, k)
    cpu_values, cpu_indices = _run("cpu", x, k)
    assert np.array_equal(gpu_indices, cpu_indices) and _same_bits(gpu_values, cpu_values)


@pytest.mark.gpu
@pytest.mark.parametrize("small", [False, True], ids=["grid", "two_blocks"])
@pytest.mark.parametrize("n, k", [
    (900, 400), (1500, 400), (2600, 400),  # the gather, blocks of 256, 512 and 1024
    (1500, 1100), (2600, 1100),  # past the shared candidates: the sorted pairs
], ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gpu_backward_equals_cpu(dtype, n, k, small):
    """Distinct indices (a forward's) and, on purpose, repeated and out-of-range ones: each element sums its
    gradients in order of j on both devices; out-of-range ones are skipped. The gather: each row is 3 or 4
    chunks of a block; small: a grid of two blocks striding over the 9 to 12 (row, chunk) pairs. The sorted
    pairs: a block a row; small: two blocks over the 3 rows, one of them sorting a second row in the same
    shared memory."""
    require("gpu")
    import cupy

    rows = 3
    rng = np.random.default_rng(7)
    indices = np.stack([rng.permutation(n)[:k] for _ in range(rows)]).astype(np.int64)
    indices[1, ::5] = indices[1, 3]  # repeats
    indices[2, :7] = [-1, n, n + 5, -100, 0, 0, 0]  # out of range, and repeats of 0
    grad = (rng.integers(-8, 9, (rows, k)) / 4).astype(dtype)
    results = []
    for device in ("cpu", "gpu"):
        attrs = TopKAttrs(k)
        handle = kernels.cpu_handle() if device == "cpu" else kernels.gpu_handle(0)
        stream = kernels.cpu_stream() if device == "cpu" else kernels.gpu_stream(0)
        state = top_k.init_kernel(handle, attrs, TensorShape((rows, n), dtype), TensorShape((rows, k), dtype),
                                  TensorShape((rows, k), np.int64))
        if device == "cpu":
            input_grad = np.full((rows, n), np.nan, dtype)
            top_k.backward_kernel(stream, handle, state, attrs, None, grad, indices, None, input_grad)
            results.append(input_grad)
        else:
            with stream:
                input_grad = cupy.asarray(np.full((rows, n), np.nan, dtype))
                g, i = cupy.asarray(grad), cupy.asarray(indices)
            with gpu.simulated_device(sm_count=1, max_blocks=2) if small else contextlib.nullcontext():
                top_k.backward_kernel(stream, handle, state, attrs, None, g, i, None, input_grad)
            stream.synchronize()
            results.append(cupy.asnumpy(input_grad))
        top_k.cleanup_kernel(handle, state)
    assert _same_bits(results[1], results[0])
