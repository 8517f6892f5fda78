"""batch_matmul in float16 and bfloat16 beyond the golden cases: on random shapes each result is
the float32 (exact) sum rounded once, bit for bit on both devices; on random normal values the
GPU's float32 sums (another order, tensor cores) land within one ulp of the dtype from the CPU's
(conformance.compare's ulp(1): one ulp, or one ulp of the tensor's largest value near zero)."""

import numpy as np
import pytest

from conformance.case import ulp
from conformance.compare import compare
from kernels import BatchMatmulAttrs, TensorShape, batch_matmul
from kernels.runtime.core import BFLOAT16

from .conftest import Dev, require

DTYPES = [pytest.param(np.dtype(np.float16), id="f16"), pytest.param(BFLOAT16, id="bf16")]


def _shapes(seed):
    rng = np.random.default_rng(seed)
    batch = tuple(int(b) for b in rng.integers(1, 4, size=int(rng.integers(1, 3))))
    m, k, n = (int(x) for x in rng.integers(1, 70, size=3))
    return batch, m, k, n


def _run(dev, lhs, rhs, grad):
    attrs, dtype = BatchMatmulAttrs(), lhs.dtype
    state = batch_matmul.init_kernel(dev.handle, attrs, TensorShape(lhs.shape, dtype), TensorShape(rhs.shape, dtype),
                                     TensorShape(grad.shape, dtype))
    a, b, g = dev.array(lhs), dev.array(rhs), dev.array(grad)
    output = dev.array(np.full(grad.shape, np.nan, dtype))
    lhs_grad, rhs_grad = dev.array(np.full(lhs.shape, np.nan, dtype)), dev.array(np.full(rhs.shape, np.nan, dtype))
    batch_matmul.forward_kernel(dev.stream, dev.handle, state, attrs, a, b, output)
    batch_matmul.backward_kernel(dev.stream, dev.handle, state, attrs, output, g, a, lhs_grad, b, rhs_grad)
    dev.stream.synchronize()
    batch_matmul.cleanup_kernel(dev.handle, state)
    return [dev.host(x) for x in (output, lhs_grad, rhs_grad)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(8))
def test_exact_sums_rounded_once(seed, dtype, dev):
    """Small integers times quarters: every float32 sum is exact, so each result is the float64
    product rounded once to the dtype."""
    batch, m, k, n = _shapes(seed)
    rng = np.random.default_rng(100 + seed)
    lhs = rng.integers(-7, 8, batch + (m, k)).astype(np.float64)
    rhs = rng.integers(-8, 9, batch + (k, n)) / 4.0
    grad = rng.integers(-7, 8, batch + (m, n)).astype(np.float64)
    got = _run(dev, *(x.astype(dtype) for x in (lhs, rhs, grad)))
    expected = [lhs @ rhs, grad @ np.swapaxes(rhs, -1, -2), np.swapaxes(lhs, -1, -2) @ grad]
    for name, g, e in zip(("output", "lhs_grad", "rhs_grad"), got, expected):
        assert g.dtype == dtype
        np.testing.assert_array_equal(g.view(np.uint16), e.astype(dtype).view(np.uint16), err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_gpu_within_one_ulp_of_the_cpu(seed, dtype):
    """Random normal values: both devices round a float32 sum once; the two sums differ by float32
    rounding only (about 2^-24 sqrt(K) of the values, far below the half dtypes' 2^-11 and 2^-8), so
    the rounded results are equal or adjacent (near zero, within an ulp of the largest)."""
    require("gpu")
    batch, m, k, n = _shapes(50 + seed)
    k *= 8  # longer sums
    rng = np.random.default_rng(seed)
    tensors = [rng.standard_normal(d).astype(dtype) for d in (batch + (m, k), batch + (k, n), batch + (m, n))]
    cpu, gpu = _run(Dev("cpu"), *tensors), _run(Dev("gpu"), *tensors)
    for name, c, g in zip(("output", "lhs_grad", "rhs_grad"), cpu, gpu):
        assert compare(g, c, ulp(1)) is None, name
