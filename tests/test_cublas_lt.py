"""GEMMs through cuBLASLt plans (kernels.runtime.cublas.MatmulPlan: the default; KERNELS_CUBLASLT=0 keeps
the legacy cublas<t>gemmStridedBatched / cublasGemmStridedBatchedEx calls).

Without a GPU: the switch, and each plan's descriptors against a stand-in library: the compute and
scale types of each dtype (pedantic float32 and float64, float32 compute for the half types, TF32 only
where asked), each stored matrix's rows, columns, leading dimension, batch count and stride (the
transposes are where a GEMM's geometry goes wrong), the heuristics' preferences (the handle's workspace,
split-K sums reduced in the compute type only, 16-byte alignment), a geometry with no algorithm, and
everything destroyed after a failure.

On a GPU (marked gpu), through batch_matmul's forward and both gradients (three geometries: no
transpose, A transposed, B transposed), in float32, float64, float16 and bfloat16:
- the plans are taken (the handle holds one per geometry, each with an algorithm) and the legacy
  handle holds none;
- on exact-valued inputs (entries in {-1, 0, 1}, K <= 256: every product and partial sum exact in
  every compute type, every result exact in every dtype) both give NumPy's float64 matmul's values
  exactly;
- float32 is computed in float32, not TF32: an operand of 12 significant bits (TF32 holds 11) against
  one of {-1, 0, 1} gives products and sums exact in float32, so the float64 values come out exactly;
  a TF32 handle's forward of PSA's size does not (the test can fail);
- on random data both stay within the error bound of a plain sum in the compute type;
- a call whose pointers are not 16-byte aligned takes the legacy call, with the same values.
"""

import ctypes

import numpy as np
import pytest

import kernels
from kernels import BatchMatmulAttrs, TensorShape, batch_matmul
from kernels.runtime import cublas
from kernels.runtime.core import BFLOAT16

from .conftest import require, unit_roundoffs

DTYPES = [pytest.param(np.dtype(np.float32), id="f32"), pytest.param(np.dtype(np.float64), id="f64"),
          pytest.param(np.dtype(np.float16), id="f16"), pytest.param(BFLOAT16, id="bf16")]


def test_lt_mode():
    assert cublas.lt_mode({}) == "on"
    assert cublas.lt_mode({"KERNELS_CUBLASLT": ""}) == "on"
    assert cublas.lt_mode({"KERNELS_CUBLASLT": "1"}) == "on"
    assert cublas.lt_mode({"KERNELS_CUBLASLT": " 0 "}) == "off"
    with pytest.raises(ValueError, match="KERNELS_CUBLASLT='off'"):
        cublas.lt_mode({"KERNELS_CUBLASLT": "off"})


class _StandIn:
    """cublasLt's descriptor functions, recording what each descriptor is given. Each create writes a new
    address through its out-pointer (ctypes.byref's object); the heuristics answer `heuristic_status` with
    `algorithms` results."""

    def __init__(self, heuristic_status=0, algorithms=1, fail_on=None):
        self.heuristic_status, self.algorithms, self.fail_on = heuristic_status, algorithms, fail_on
        self.next, self.alive, self.attributes, self.created = 100, set(), {}, {}

    def _create(self, kind, out, *args):
        if kind == self.fail_on:
            return 7  # CUBLAS_STATUS_INVALID_VALUE
        self.next += 1
        out._obj.value = self.next
        self.alive.add(self.next)
        self.created[self.next] = (kind, args)
        self.attributes[self.next] = {}
        return 0

    def _set(self, target, attribute, value, size):
        self.attributes[target][attribute] = (value._obj.value, size)
        return 0

    def _destroy(self, target):
        self.alive.remove(target)
        return 0

    def __getattr__(self, name):
        kinds = {"MatmulDesc": "desc", "MatrixLayout": "layout", "MatmulPreference": "preference"}
        for part, kind in kinds.items():
            if name == f"cublasLt{part}Create":
                return lambda out, *args: self._create(kind, out, *args)
            if name == f"cublasLt{part}SetAttribute":
                return _named(name, self._set)
            if name == f"cublasLt{part}Destroy":
                return self._destroy
        raise AttributeError(name)

    def cublasLtMatmulAlgoGetHeuristic(self, handle, desc, a, b, c, d, preference, requested, result, count):
        self.heuristic = (handle, desc, (a, b, c, d), preference, requested)
        count._obj.value = self.algorithms
        result._obj.workspace_size = 4096
        result._obj.state = 0
        return self.heuristic_status


def _named(name, function):
    def named(*args):
        return function(*args)
    named.__name__ = name
    return named


# (dtype, tf32): the (compute type, scale type, data type) a plan must describe.
TYPES = [
    (np.dtype(np.float32), False, (cublas.CUBLAS_COMPUTE_32F_PEDANTIC, cublas.CUDA_R_32F, cublas.CUDA_R_32F)),
    (np.dtype(np.float32), True, (cublas.CUBLAS_COMPUTE_32F_FAST_TF32, cublas.CUDA_R_32F, cublas.CUDA_R_32F)),
    (np.dtype(np.float64), False, (cublas.CUBLAS_COMPUTE_64F_PEDANTIC, cublas.CUDA_R_64F, cublas.CUDA_R_64F)),
    (np.dtype(np.float64), True, (cublas.CUBLAS_COMPUTE_64F_PEDANTIC, cublas.CUDA_R_64F, cublas.CUDA_R_64F)),
    (np.dtype(np.float16), False, (cublas.CUBLAS_COMPUTE_32F, cublas.CUDA_R_32F, cublas.CUDA_R_16F)),
    (BFLOAT16, True, (cublas.CUBLAS_COMPUTE_32F, cublas.CUDA_R_32F, cublas.CUDA_R_16BF)),
]


@pytest.mark.parametrize("dtype, tf32, types", TYPES)
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True)])
def test_plan_describes_the_gemm(monkeypatch, dtype, tf32, types, trans_a, trans_b):
    """m = 5, n = 3, k = 7, batch 4, leading dimensions and strides all distinct: op(A) is m x k, so A is
    stored k x m when transposed; op(B) is k x n, B stored n x k when transposed; C m x n."""
    lt = _StandIn()
    monkeypatch.setattr(cublas, "lt_library", lambda: lt)
    m, n, k = 5, 3, 7
    key = (dtype, trans_a, trans_b, m, n, k, 11, 101, 13, 103, 0.5, 17, 107, 4, tf32)
    plan = cublas.MatmulPlan(42, key, cublas.WORKSPACE_BYTES)
    compute, scale, kind = types
    desc, layouts = plan._desc, plan._layouts
    assert lt.created[desc] == ("desc", (compute, scale))
    assert lt.attributes[desc] == {cublas.LT_DESC_TRANSA: (int(trans_a), 4), cublas.LT_DESC_TRANSB: (int(trans_b), 4)}
    stored = [(k, m) if trans_a else (m, k), (n, k) if trans_b else (k, n), (m, n)]
    for layout, (rows, columns), ld, stride in zip(layouts, stored, (11, 13, 17), (101, 103, 107)):
        assert lt.created[layout] == ("layout", (kind, rows, columns, ld))
        assert lt.attributes[layout] == {cublas.LT_LAYOUT_BATCH_COUNT: (4, 4),
                                         cublas.LT_LAYOUT_STRIDED_BATCH_OFFSET: (stride, 8)}
    handle, heuristic_desc, matrices, preference, requested = lt.heuristic
    assert (handle, heuristic_desc, requested) == (42, desc, 1)
    assert matrices == (*layouts, layouts[2])  # D is C
    assert lt.attributes[preference] == {
        cublas.LT_PREF_MAX_WORKSPACE_BYTES: (cublas.WORKSPACE_BYTES, 8),
        cublas.LT_PREF_REDUCTION_SCHEME_MASK: (cublas.LT_REDUCTION_SCHEME_COMPUTE_TYPE, 4),
        **{attribute: (cublas.LT_ALIGNMENT, 4) for attribute in cublas.LT_PREF_MIN_ALIGNMENT}}
    assert preference not in lt.alive  # the preference is destroyed once the algorithm is chosen
    assert plan.found and plan.workspace_bytes == 4096
    scalar = ctypes.c_double if dtype == np.float64 else ctypes.c_float
    assert [type(value) for value in plan._scalars] == [scalar, scalar]
    assert [value.value for value in plan._scalars] == [1.0, 0.5]
    plan.destroy()
    assert not lt.alive and not plan.found


@pytest.mark.parametrize("status, algorithms", [(15, 0), (0, 0)])
def test_plan_without_an_algorithm(monkeypatch, status, algorithms):
    """CUBLAS_STATUS_NOT_SUPPORTED from the heuristics, or no result: the plan is not found (the call takes
    the legacy GEMM); its descriptors stay until it is destroyed."""
    lt = _StandIn(heuristic_status=status, algorithms=algorithms)
    monkeypatch.setattr(cublas, "lt_library", lambda: lt)
    key = (np.dtype(np.float32), False, False, 2, 2, 2, 2, 4, 2, 4, 0.0, 2, 4, 1, False)
    plan = cublas.MatmulPlan(42, key, cublas.WORKSPACE_BYTES)
    assert not plan.found
    assert len(lt.alive) == 4
    plan.destroy()
    assert not lt.alive


@pytest.mark.parametrize("fail_on", ["desc", "layout", "preference"])
def test_plan_failure_leaks_nothing(monkeypatch, fail_on):
    lt = _StandIn(fail_on=fail_on)
    monkeypatch.setattr(cublas, "lt_library", lambda: lt)
    key = (np.dtype(np.float16), False, True, 2, 2, 2, 2, 4, 2, 4, 0.0, 2, 4, 1, False)
    with pytest.raises(kernels.CudaError, match="cuBLASLt.*CUBLAS_STATUS_INVALID_VALUE"):
        cublas.MatmulPlan(42, key, cublas.WORKSPACE_BYTES)
    assert not lt.alive


# (batch, M, K, N) of lhs (batch, M, K) @ rhs (batch, K, N): small and odd, PSA's attention sizes, one element.
SHAPES = [pytest.param((2, 5, 7, 3), id="2x5x7x3"), pytest.param((3, 33, 17, 65), id="3x33x17x65"),
          pytest.param((5, 64, 200, 96), id="5x64x200x96"), pytest.param((1, 1, 1, 1), id="1x1x1x1")]


@pytest.fixture
def handles(monkeypatch):
    """(the default handle: plans, a handle made under KERNELS_CUBLASLT=0: legacy calls) and their stream."""
    require("gpu")
    monkeypatch.setenv(cublas.LT_ENV, "0")
    legacy = kernels.gpu_handle(0)
    legacy.cublas()
    monkeypatch.delenv(cublas.LT_ENV)
    planned = kernels.gpu_handle(0)
    yield kernels.gpu_stream(0), planned, legacy
    planned.close()
    legacy.close()


def _run(stream, handle, dtype, lhs, rhs, output_grad, offset=0):
    """batch_matmul's forward and both gradients into NaN-poisoned outputs (each output, and each input
    where `offset`, placed `offset` elements into a larger buffer): their float64 host copies."""
    import cupy

    def place(value):
        host = np.full(value.size + offset, np.nan, np.float32).astype(dtype)
        host[offset:] = np.asarray(value, np.float32).astype(dtype).ravel()
        with stream:  # the upload ordered before the kernels that read it, on their stream
            return cupy.asarray(host)[offset:].reshape(value.shape)

    def poisoned(shape):
        return place(np.full(shape, np.nan, np.float32))

    attrs = BatchMatmulAttrs()
    state = batch_matmul.init_kernel(handle, attrs, TensorShape(lhs.shape, dtype), TensorShape(rhs.shape, dtype),
                                     TensorShape(output_grad.shape, dtype))
    lhs_d, rhs_d, og_d = place(lhs), place(rhs), place(output_grad)
    out, lhs_grad, rhs_grad = poisoned(output_grad.shape), poisoned(lhs.shape), poisoned(rhs.shape)
    batch_matmul.forward_kernel(stream, handle, state, attrs, lhs_d, rhs_d, out)
    batch_matmul.backward_kernel(stream, handle, state, attrs, out, og_d, lhs_d, lhs_grad, rhs_d, rhs_grad)
    stream.synchronize()
    batch_matmul.cleanup_kernel(handle, state)
    return [cupy.asnumpy(value).astype(np.float64) for value in (out, lhs_grad, rhs_grad)]


def _expected(lhs, rhs, output_grad):
    lhs, rhs, output_grad = (np.asarray(v, np.float64) for v in (lhs, rhs, output_grad))
    return [lhs @ rhs, output_grad @ rhs.transpose(0, 2, 1), lhs.transpose(0, 2, 1) @ output_grad]


def _exact(shape, rng):
    return rng.integers(-1, 2, shape).astype(np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dims", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_plans_are_taken_and_exact(handles, dims, dtype):
    stream, planned, legacy = handles
    batch, m, k, n = dims
    rng = np.random.default_rng(1)
    lhs, rhs, output_grad = _exact((batch, m, k), rng), _exact((batch, k, n), rng), _exact((batch, m, n), rng)
    expected = _expected(lhs, rhs, output_grad)
    for handle in (planned, legacy):
        for got, want, name in zip(_run(stream, handle, dtype, lhs, rhs, output_grad), expected,
                                   ("output", "lhs_grad", "rhs_grad")):
            np.testing.assert_array_equal(got, want, err_msg=f"{name}, {'plans' if handle is planned else 'legacy'}")
    plans = planned.cublas().plans
    assert len(plans) == 3  # one a geometry: the forward's, lhs_grad's (A transposed), rhs_grad's (B transposed)
    assert {(key[1], key[2]) for key in plans} == {(False, False), (True, False), (False, True)}
    assert all(plan.found for plan in plans.values()), {key[1:3]: plan.found for key, plan in plans.items()}
    assert legacy.cublas().lt is None and not legacy.cublas().plans


@pytest.mark.gpu
@pytest.mark.parametrize("dims", SHAPES[:3])
def test_float32_plans_are_not_tf32(handles, dims):
    """lhs: odd integers of 2049 to 4093 in magnitude (12 significant bits, which TF32's 11 cannot hold);
    rhs and the output gradient in {-1, 0, 1}. Every product in the forward and in rhs_grad (lhs^T @
    output_grad) is then a 12-bit integer and every sum of at most 200 of them stays below 2^20, exact in
    float32: the float64 values come out exactly, which lhs rounded to TF32 would not give."""
    stream, planned, _ = handles
    batch, m, k, n = dims
    rng = np.random.default_rng(2)
    lhs = (rng.choice([-1, 1], (batch, m, k)) * (2049 + 2 * rng.integers(0, 1023, (batch, m, k)))).astype(np.float32)
    rhs, output_grad = _exact((batch, k, n), rng), _exact((batch, m, n), rng)
    assert (np.abs(lhs) > 2048).all() and (lhs % 2 != 0).all()  # none representable in TF32
    for got, want in zip(_run(stream, planned, np.dtype(np.float32), lhs, rhs, output_grad),
                         _expected(lhs, rhs, output_grad)):
        np.testing.assert_array_equal(got, want)
    assert all(plan.found for plan in planned.cublas().plans.values())
    if dims == (5, 64, 200, 96):
        # The test can tell: on PSA's size a TF32 handle's forward runs on tensor cores and is not exact. (On
        # the two smaller shapes cuBLASLt's TF32-allowed algorithm is an FMA kernel: exact too, on an H100.)
        with kernels.gpu_handle(0, allow_tf32=True) as tf32:
            got = _run(stream, tf32, np.dtype(np.float32), lhs, rhs, output_grad)[0]
        assert (got != _expected(lhs, rhs, output_grad)[0]).any()




@pytest.mark.gpu
@pytest.mark.parametrize("dims", SHAPES[:3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_plans_within_the_sum_bound(handles, dims, dtype):
    """Random data (inputs rounded to the dtype first). Any order of a plain sum of K products in a compute
    type of unit roundoff u errs by at most gamma_K = K u / (1 - K u) times sum |a| |b| (Higham, 3.1);
    rounded once more to a half dtype of unit roundoff v: gamma_K (1 + v) sum |a| |b| + v |exact|. TF32,
    a reduction in the half type or inputs converted down exceed it by orders of magnitude."""
    stream, planned, legacy = handles
    batch, m, k, n = dims
    rng = np.random.default_rng(3)
    values = [rng.standard_normal(shape).astype(np.float32).astype(dtype).astype(np.float64)
              for shape in ((batch, m, k), (batch, k, n), (batch, m, n))]
    expected = _expected(*values)
    magnitudes = _expected(*(np.abs(v) for v in values))
    u, v = unit_roundoffs(dtype)
    for handle in (planned, legacy):
        got = _run(stream, handle, dtype, *values)
        for got_one, want, size, name in zip(got, expected, magnitudes, ("output", "lhs_grad", "rhs_grad")):
            terms = {"output": k, "lhs_grad": n, "rhs_grad": m}[name]
            gamma = terms * u / (1 - terms * u)
            bound = gamma * (1 + v) * size + v * np.abs(want)
            excess = np.abs(got_one - want) - bound
            assert (excess <= 0).all(), f"{name}: {excess.max():.3g} past the bound"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16)])
def test_misaligned_pointers_take_the_legacy_call(handles, monkeypatch, dtype):
    """Every operand one element past a 512-byte boundary (4 or 2 bytes: not 16-byte aligned): no plan runs
    (none is even made), and the values are exact as ever."""
    stream, planned, _ = handles
    calls = []
    monkeypatch.setattr(cublas.MatmulPlan, "__call__", lambda self, *args: calls.append(args))
    rng = np.random.default_rng(4)
    lhs, rhs, output_grad = _exact((2, 9, 11), rng), _exact((2, 11, 6), rng), _exact((2, 9, 6), rng)
    for got, want in zip(_run(stream, planned, dtype, lhs, rhs, output_grad, offset=1), _expected(lhs, rhs, output_grad)):
        np.testing.assert_array_equal(got, want)
    assert not calls and not planned.cublas().plans
