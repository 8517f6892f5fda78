"""batch_matmul: lhs (..., M, K) @ rhs (..., K, N) -> output (..., M, N), in float16, bfloat16,
float32 or float64.

Rank >= 3 and identical leading (batch) dims: no broadcasting. Backward writes
lhs_grad = output_grad @ rhs^T and rhs_grad = lhs^T @ output_grad; a None gradient
is skipped. K == 0 gives zeros. The GPU runs cuBLAS strided batched GEMM in
pedantic math (no TF32), so exactly representable products and sums stay exact.

Half precision (float16, bfloat16): every product and sum in float32, each result
rounded once to the dtype; on the GPU cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F
(tensor cores allowed), on the CPU a float32 matmul of the widened operands.

TF32: a float32 state initialised with a GpuHandle made with allow_tf32=True runs its
GEMMs with CUBLAS_COMPUTE_32F_FAST_TF32 (inputs rounded to TF32's 10-bit mantissa,
float32 sums). Without it, never.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime import core, cpu, cublas, gpu, gpu_paths
from ..runtime.core import ALL_FLOAT_DTYPES, ShapeError, TensorShape, fail
from ..runtime.spec import BINARY_FORWARD, BINARY_SHAPES, binary_backward, declare_op

OP = "batch_matmul"


@dataclass(frozen=True)
class BatchMatmulAttrs:
    """batch_matmul has no attrs; the class exists so that every op is called the same way."""


def output_dims(lhs_dims: tuple[int, ...], rhs_dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(lhs_dims[:-1]) + (rhs_dims[-1],)


def init_kernel(handle: Any, attrs: BatchMatmulAttrs, lhs_shape: TensorShape, rhs_shape: TensorShape,
                output_shape: TensorShape) -> core.KernelState:
    """Check ranks, batch and inner dims, the output shape and dtypes; record them."""
    state = core.make_state(OP, handle, attrs, BatchMatmulAttrs, lhs_shape=lhs_shape, rhs_shape=rhs_shape,
                            output_shape=output_shape)
    core.check_dtype(OP, "lhs_shape", lhs_shape, ALL_FLOAT_DTYPES)
    core.check_rank(OP, "lhs_shape", lhs_shape, min_rank=3)
    core.check_rank(OP, "rhs_shape", rhs_shape, min_rank=3)
    if rhs_shape.dims[:-2] != lhs_shape.dims[:-2]:
        raise fail(ShapeError, OP, "rhs_shape", f"leading dims {lhs_shape.dims[:-2]} (as lhs_shape; no broadcasting)",
                   rhs_shape.dims)
    if rhs_shape.dims[-2] != lhs_shape.dims[-1]:
        raise fail(ShapeError, OP, "rhs_shape", f"dim -2 equal to lhs_shape's inner dim K = {lhs_shape.dims[-1]}",
                   rhs_shape.dims)
    core.check_same_dtype(OP, "rhs_shape", rhs_shape, lhs_shape, "lhs_shape")
    core.check_dims(OP, "output_shape", output_shape, output_dims(lhs_shape.dims, rhs_shape.dims))
    core.check_same_dtype(OP, "output_shape", output_shape, lhs_shape, "lhs_shape")
    # TF32 is the handle's setting at init (a CPU handle has none), for float32 only.
    state.saved["tf32"] = bool(getattr(handle, "allow_tf32", False)) and lhs_shape.dtype == np.float32
    return state


def _check_forward(stream, handle, state, attrs, lhs, rhs, output) -> None:
    core.check_call(OP, stream, handle, state, attrs, [
        ("lhs", lhs, state.shapes["lhs_shape"], True),
        ("rhs", rhs, state.shapes["rhs_shape"], True),
        ("output", output, state.shapes["output_shape"], True),
    ])


def _check_backward(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad) -> None:
    # lhs_grad needs rhs and rhs_grad needs lhs; the output itself is never needed.
    core.check_call(OP, stream, handle, state, attrs, [
        ("output", output, state.shapes["output_shape"], False),
        ("output_grad", output_grad, state.shapes["output_shape"], True),
        ("lhs", lhs, state.shapes["lhs_shape"], rhs_grad is not None),
        ("lhs_grad", lhs_grad, state.shapes["lhs_shape"], False),
        ("rhs", rhs, state.shapes["rhs_shape"], lhs_grad is not None),
        ("rhs_grad", rhs_grad, state.shapes["rhs_shape"], False),
    ])


# --------------------------------------------------------------------------- CPU


def _matmul(left: np.ndarray, right: np.ndarray, out: np.ndarray) -> None:
    """out = left @ right; half dtypes widened to float32, multiplied and summed in float32, and the
    result rounded once to out's dtype (as the GPU's float32-compute GEMM)."""
    if out.dtype in core.HALF_DTYPES:
        compute = core.compute_dtype(out.dtype)
        np.copyto(out, np.matmul(left.astype(compute), right.astype(compute)).astype(out.dtype))
    else:
        np.matmul(left, right, out=out)



@cpu.cpu_kernel
def cpu_forward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: BatchMatmulAttrs,
                       lhs: core.Array, rhs: core.Array, output: core.Array) -> None:
    """output = lhs @ rhs, batched over the leading dims."""
    _check_forward(stream, handle, state, attrs, lhs, rhs, output)
    if output.size:
        with cpu.blas_threads():
            _matmul(lhs, rhs, output)


@cpu.cpu_kernel
def cpu_backward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: BatchMatmulAttrs,
                        output: core.Array | None, output_grad: core.Array, lhs: core.Array | None, lhs_grad: core.Array | None,
                        rhs: core.Array | None, rhs_grad: core.Array | None) -> None:
    """lhs_grad = output_grad @ rhs^T; rhs_grad = lhs^T @ output_grad (None grads skipped)."""
    _check_backward(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad)
    with cpu.blas_threads():
        if lhs_grad is not None and lhs_grad.size:
            _matmul(output_grad, np.swapaxes(rhs, -1, -2), lhs_grad)
        if rhs_grad is not None and rhs_grad.size:
            _matmul(np.swapaxes(lhs, -1, -2), output_grad, rhs_grad)


# --------------------------------------------------------------------------- GPU
#
# cuBLAS is column-major. A row-major (r, c) matrix is, to cuBLAS, its (c, r)
# transpose with leading dimension c. So the row-major product C = op(A) @ op(B) is
# computed as the column-major C^T = op(B)^T @ op(A)^T: B first, sizes (N, M, K).


# Each direction's GEMM is worked out once per state (state.saved["gemm:<direction>"]): a call
# only fills in the three data pointers.


@dataclass(frozen=True)
class GemmPlan:
    """One column-major C (m x n) = op(A) @ op(B) for `batch` matrices `stride_*` elements apart.
    kind: "skip" (nothing to write), "zero" (k == 0: an empty sum is zero; cuBLAS is not asked)
    or "gemm"."""

    kind: str
    trans_a: bool = False
    trans_b: bool = False
    m: int = 0
    n: int = 0
    k: int = 0
    lda: int = 0
    stride_a: int = 0
    ldb: int = 0
    stride_b: int = 0
    ldc: int = 0
    stride_c: int = 0
    batch: int = 0


gpu_paths.declare(OP, {
    **{f"cublas.{direction}": f"the {direction.replace('_', ' ')}: one cuBLAS strided batched GEMM (pedantic math)"
       for direction in ("forward", "lhs_grad", "rhs_grad")},
    "zero_fill": "K = 0: an empty sum, the result zeros by a memset on the stream",
})


def _gemm_plan(transa: bool, transb: bool, m: int, n: int, k: int, lda: int, stride_a: int, ldb: int, stride_b: int,
               ldc: int, stride_c: int, batch: int) -> GemmPlan:  # pragma: no cover - GPU: cuBLAS's arguments
    if m == 0 or n == 0 or batch == 0:
        return GemmPlan("skip")
    if k == 0:
        return GemmPlan("zero")
    return GemmPlan("gemm", transa, transb, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch)


def _plan(state: core.KernelState, direction: str) -> GemmPlan:  # pragma: no cover - GPU: the cuBLAS GEMM of a call
    """The GEMM of `direction` ("forward", "lhs_grad", "rhs_grad"), made on first use."""
    key = "gemm:" + direction
    plan = state.saved.get(key)
    if plan is not None:
        return plan
    lhs_dims, rhs_dims = state.shapes["lhs_shape"].dims, state.shapes["rhs_shape"].dims
    batch, m, k, n = core.numel(lhs_dims[:-2]), lhs_dims[-2], lhs_dims[-1], rhs_dims[-1]
    if direction == "forward":
        # output^T (N x M) = rhs^T (N x K) @ lhs^T (K x M); A = rhs, B = lhs
        plan = _gemm_plan(False, False, n, m, k, n, k * n, k, m * k, n, m * n, batch)
    elif direction == "lhs_grad":
        # lhs_grad^T (K x M) = rhs (K x N; its memory is the N x K rhs^T, so transposed) @ output_grad^T (N x M);
        # A = rhs, B = output_grad
        plan = _gemm_plan(True, False, k, m, n, n, k * n, n, m * n, k, m * k, batch)
    else:
        # rhs_grad^T (N x K) = output_grad^T (N x M) @ lhs (M x K; its memory is the K x M lhs^T, so transposed);
        # A = output_grad, B = lhs
        plan = _gemm_plan(False, True, n, k, m, n, m * n, k, m * k, n, k * n, batch)
    state.saved[key] = plan
    return plan


def _run(stream, handle, dtype: np.dtype, plan: GemmPlan, a: Any, b: Any, c: Any, path: str,
         tf32: bool) -> None:  # pragma: no cover - GPU: cuBLAS
    """Enqueue one planned GEMM (or its zero fill) on the stream; `path` names the GEMM (kernels.runtime.gpu_paths)."""
    if plan.kind == "skip":
        return
    if plan.kind == "zero":
        gpu_paths.reach("batch_matmul.zero_fill")
        gpu.cupy.cuda.runtime.memsetAsync(c.data.ptr, 0, c.nbytes, stream.ptr)
        return
    gpu_paths.reach(path)
    cublas.gemm_strided_batched(stream, handle, dtype, plan.trans_a, plan.trans_b, plan.m, plan.n, plan.k, a.data.ptr,
                                plan.lda, plan.stride_a, b.data.ptr, plan.ldb, plan.stride_b, 0.0, c.data.ptr,
                                plan.ldc, plan.stride_c, plan.batch, OP, tf32)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: BatchMatmulAttrs,
                       lhs: core.Array, rhs: core.Array, output: core.Array) -> None:
    """output = lhs @ rhs through cuBLAS strided batched GEMM, enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, lhs, rhs, output)
    _run(stream, handle, output.dtype, _plan(state, "forward"), rhs, lhs, output, "batch_matmul.cublas.forward",
         state.saved["tf32"])


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: BatchMatmulAttrs,
                        output: core.Array | None, output_grad: core.Array, lhs: core.Array | None, lhs_grad: core.Array | None,
                        rhs: core.Array | None, rhs_grad: core.Array | None) -> None:
    """lhs_grad = output_grad @ rhs^T, rhs_grad = lhs^T @ output_grad through cuBLAS, enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad)
    if lhs_grad is not None:
        _run(stream, handle, output_grad.dtype, _plan(state, "lhs_grad"), rhs, output_grad, lhs_grad,
             "batch_matmul.cublas.lhs_grad", state.saved["tf32"])
    if rhs_grad is not None:
        _run(stream, handle, output_grad.dtype, _plan(state, "rhs_grad"), output_grad, lhs, rhs_grad,
             "batch_matmul.cublas.rhs_grad", state.saved["tf32"])


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=BatchMatmulAttrs,
    shapes=BINARY_SHAPES,
    forward=BINARY_FORWARD,
    backward=binary_backward(output=False, lhs=False, rhs=False),
    dtypes=ALL_FLOAT_DTYPES,
    forward_doc="Write output = lhs @ rhs (batched), on the stream's device.",
    backward_doc="Write lhs_grad and rhs_grad (each skipped when None), on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
