"""pool_2d beyond the golden cases: many geometries full of ties, NaN and -inf against
PyTorch on the CPU, and on the GPU both MAX forward paths (tiled, direct) and the
backward gathers against the CPU, bit for bit (same order, same IEEE operations)."""

import numpy as np
import pytest

from conformance.case import EXACT, ulp
from conformance.compare import compare
from kernels import Pool2DAttrs, PoolOp, ShapeError, TensorShape, pool_2d
from kernels.runtime.core import BFLOAT16

from .conftest import Dev, require

# A 17x16 window (int32 taps) whose tile holds an odd count of values: in float16 and bfloat16 the
# taps after them need padding to 4-byte alignment in shared memory. Output 5x10.
ODD_INT_TAPS = (Pool2DAttrs(17, 16, 1, 1, 8, 8, PoolOp.MAX), (1, 2, 5, 9))


def _geometries(count, seed):
    rng = np.random.default_rng(seed)
    out = []
    for trial in range(count):
        kernel_h, kernel_w = (int(v) for v in rng.integers(1, 7, 2))
        stride_h, stride_w = (int(v) for v in rng.integers(1, 4, 2))
        padding_h, padding_w = int(rng.integers(0, kernel_h // 2 + 1)), int(rng.integers(0, kernel_w // 2 + 1))
        height = int(rng.integers(max(1, kernel_h - 2 * padding_h), 40))
        width = int(rng.integers(max(1, kernel_w - 2 * padding_w), 70))
        pool_type = PoolOp.MAX if trial % 3 else PoolOp.AVG
        attrs = Pool2DAttrs(kernel_h, kernel_w, stride_h, stride_w, padding_h, padding_w, pool_type, bool(trial % 2))
        out.append((attrs, (2, 3, height, width)))
    out.append((Pool2DAttrs(5, 5, 1, 1, 2, 2, PoolOp.MAX), (1, 4, 80, 80)))  # SPPF, several tiles a plane
    out.append((Pool2DAttrs(16, 17, 2, 1, 3, 8, PoolOp.MAX), (1, 2, 33, 40)))  # int32 taps
    out.append(ODD_INT_TAPS)  # int32 taps after an odd count of 2-byte values in the tile (half dtypes)
    return out


def _input(dims, attrs, dtype, seed):
    """Integers -3..3 (ties everywhere); MAX inputs also get NaN and -inf."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, dims).astype(dtype)
    if attrs.pool_type is PoolOp.MAX:
        x[rng.random(dims) < 0.3] = -np.inf
        if seed % 2:
            x[rng.random(dims) < 0.03] = np.nan
    return x


def _run(dev, attrs, x, output_grad):
    dtype = x.dtype
    out_dims = pool_2d.output_dims(attrs, x.shape)
    state = pool_2d.init_kernel(dev.handle, attrs, TensorShape(x.shape, dtype), TensorShape(out_dims, dtype))
    output, input_grad = dev.array(np.full(out_dims, np.nan, dtype)), dev.array(np.full(x.shape, np.nan, dtype))
    input = dev.array(x)
    pool_2d.forward_kernel(dev.stream, dev.handle, state, attrs, input, output)
    pool_2d.backward_kernel(dev.stream, dev.handle, state, attrs, output, dev.array(output_grad), input, input_grad)
    dev.stream.synchronize()
    taps = dev.host(state.saved["taps"]) if "taps" in state.saved else None
    result = dev.host(output), dev.host(input_grad), taps
    pool_2d.cleanup_kernel(dev.handle, state)
    return result


def _torch_pool(attrs, x, output_grad):
    """PyTorch's pooling of x (float64) and its input gradient from output_grad: (output, input_grad)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    tensor = torch.from_numpy(x).requires_grad_()
    kernel, stride = (attrs.kernel_h, attrs.kernel_w), (attrs.stride_h, attrs.stride_w)
    padding = (attrs.padding_h, attrs.padding_w)
    if attrs.pool_type is PoolOp.MAX:
        expected = F.max_pool2d(tensor, kernel, stride, padding)
    else:
        expected = F.avg_pool2d(tensor, kernel, stride, padding, count_include_pad=attrs.count_include_pad)
    (expected_grad,) = torch.autograd.grad(expected, [tensor], torch.from_numpy(output_grad))
    return expected, expected_grad


@pytest.mark.parametrize("index, case", list(enumerate(_geometries(60, seed=0))))
def test_cpu_matches_torch(index, case):
    attrs, dims = case
    x = _input(dims, attrs, np.float64, index)
    out_dims = pool_2d.output_dims(attrs, dims)
    output_grad = np.random.default_rng(index).standard_normal(out_dims)
    output, input_grad, _ = _run(Dev("cpu"), attrs, x, output_grad)
    expected, expected_grad = _torch_pool(attrs, x, output_grad)
    if attrs.pool_type is PoolOp.MAX:  # same values moved, same sums in the same order
        assert np.array_equal(output, expected.detach().numpy(), equal_nan=True)
        assert np.array_equal(input_grad, expected_grad.numpy(), equal_nan=True)
    else:
        np.testing.assert_allclose(output, expected.detach().numpy(), rtol=1e-15, atol=1e-15)
        np.testing.assert_allclose(input_grad, expected_grad.numpy(), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16], ids=["f16", "bf16"])
@pytest.mark.parametrize("index, case", list(enumerate(_geometries(20, seed=2))))
def test_cpu_half_matches_torch_rounded_once(index, case, dtype):
    """Half inputs against PyTorch in float64 rounded once to the dtype: MAX moves values and sums at
    most 36 gradients in quarters (exact in float32, and the result fits the half mantissa: exact);
    AVG divides once in float32 and rounds once: within 1 ulp of the half dtype. NaN matches NaN."""
    attrs, dims = case
    x = _input(dims, attrs, dtype, index)
    out_dims = pool_2d.output_dims(attrs, dims)
    output_grad = (np.random.default_rng(index).integers(-8, 9, out_dims) / 4).astype(dtype)
    output, input_grad, _ = _run(Dev("cpu"), attrs, x, output_grad)
    expected, expected_grad = _torch_pool(attrs, x.astype(np.float64), output_grad.astype(np.float64))
    expected_output = expected.detach().numpy().astype(dtype)
    expected_grad = expected_grad.numpy().astype(dtype)
    assert output.dtype == input_grad.dtype == dtype
    # (AVG's backward sums shares of both signs: an element near zero is held to 1 ulp of the largest, as
    # the conformance comparison's floor does.)
    tolerance = EXACT if attrs.pool_type is PoolOp.MAX else ulp(1)
    for name, got, want in (("output", output, expected_output), ("input_grad", input_grad, expected_grad)):
        assert compare(got, want, tolerance) is None, name


@pytest.mark.gpu
@pytest.mark.parametrize("tiled", [True, False], ids=["tiled", "direct"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BFLOAT16], ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("index, case", list(enumerate(_geometries(24, seed=1))))
def test_gpu_matches_cpu_bits(index, case, dtype, tiled, monkeypatch):
    require("gpu")
    attrs, dims = case
    if not tiled:
        monkeypatch.setattr(pool_2d.plan, "TILE_SHARED_LIMIT", -1)
    x = _input(dims, attrs, dtype, index)
    output_grad = np.random.default_rng(index).standard_normal(pool_2d.output_dims(attrs, dims)).astype(dtype)
    cpu = _run(Dev("cpu"), attrs, x, output_grad)
    gpu = _run(Dev("gpu"), attrs, x, output_grad)
    for name, got, expected in zip(("output", "input_grad", "taps"), gpu, cpu):
        if expected is not None:
            assert np.array_equal(got.view(np.uint8), expected.view(np.uint8)) or \
                np.array_equal(got, expected, equal_nan=True), f"{name} differs"


@pytest.mark.gpu
def test_gpu_backward_is_deterministic():
    """SPPF's overlapping windows send up to 25 gradients to one element: same bits every run."""
    require("gpu")
    attrs = Pool2DAttrs(5, 5, 1, 1, 2, 2, PoolOp.MAX)
    dims = (2, 64, 40, 40)
    x = np.random.default_rng(0).integers(-2, 3, dims).astype(np.float32)
    output_grad = np.random.default_rng(1).standard_normal(dims).astype(np.float32)
    runs = [_run(Dev("gpu"), attrs, x, output_grad)[1] for _ in range(3)]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])


def test_max_tile_too_large_for_shared_memory_falls_back():
    """A 41x41 window in float64: a 16x32 tile reads 56x72 inputs and keeps 56x32 row maxima and taps,
    52.5 KiB of shared memory, over the 48 KiB limit: no tile (the direct kernel); SPPF's 5x5 window gets one."""
    big = Pool2DAttrs(41, 41, 1, 1, 20, 20, PoolOp.MAX)
    assert pool_2d.plan.max_forward_tile(big, 64, 64, 8) is None
    tile_h, tile_w, tiles_h, tiles_w, shared = pool_2d.plan.max_forward_tile(Pool2DAttrs(5, 5, 1, 1, 2, 2, PoolOp.MAX), 20, 20, 4)
    assert (tile_w, tiles_w) == (20, 1) and tile_h * tiles_h >= 20 and shared <= pool_2d.plan.TILE_SHARED_LIMIT


def test_max_tile_aligns_int_taps_after_half_values():
    """2-byte values can end at an odd multiple of 2 bytes: the int32 taps after them start at the next
    multiple of 4 (the kernel's column_offset), and the shared size counts that padding."""
    attrs = ODD_INT_TAPS[0]  # 272 taps: int32
    tile_h, tile_w, _, _, shared = pool_2d.plan.max_forward_tile(attrs, 5, 10, 2)
    in_h, in_w = tile_h - 1 + 17, tile_w - 1 + 16
    values = (in_h * in_w + in_h * tile_w) * 2
    taps = in_h * tile_w * 4
    assert values % 4 == 2  # this geometry needs the padding
    assert shared == values + 2 + taps
    assert pool_2d.plan.max_forward_tile(attrs, 5, 10, 4)[4] == (in_h * in_w + in_h * tile_w) * 4 + taps


def test_output_dims_refuse_a_rank_other_than_4():
    with pytest.raises(ShapeError, match=r"pool_2d: input_shape: expected rank 4 \(N, C, H, W\), found rank 3"):
        pool_2d.output_dims(Pool2DAttrs(2, 2, 2, 2, 0, 0, PoolOp.MAX), (2, 3, 4))
