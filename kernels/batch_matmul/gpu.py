"""batch_matmul on the GPU: one cuBLAS strided batched GEMM a direction (kernels/runtime/cublas.py),
in pedantic math (TF32 only where the state allows it), planned once per state; K == 0 a memset.

forward and backward run after the package's checks (gpu_forward_kernel, gpu_backward_kernel,
which run inside their stream). Everything is enqueued on the given stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime import core, cublas, gpu, gpu_paths
from .attrs import OP

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
               ldc: int, stride_c: int, batch: int) -> GemmPlan:
    if m == 0 or n == 0 or batch == 0:
        return GemmPlan("skip")
    if k == 0:
        return GemmPlan("zero")
    return GemmPlan("gemm", transa, transb, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch)


def _plan(state: core.KernelState, direction: str) -> GemmPlan:
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
         tf32: bool) -> None:
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


def forward(stream: Any, handle: Any, state: core.KernelState, lhs: Any, rhs: Any, output: Any) -> None:
    """output = lhs @ rhs through cuBLAS strided batched GEMM, enqueued on the stream."""
    _run(stream, handle, output.dtype, _plan(state, "forward"), rhs, lhs, output, "batch_matmul.cublas.forward",
         state.saved["tf32"])


def backward(stream: Any, handle: Any, state: core.KernelState, output_grad: Any, lhs: Any, lhs_grad: Any, rhs: Any,
             rhs_grad: Any) -> None:
    """lhs_grad = output_grad @ rhs^T, rhs_grad = lhs^T @ output_grad through cuBLAS (None grads skipped), enqueued
    on the stream."""
    if lhs_grad is not None:
        _run(stream, handle, output_grad.dtype, _plan(state, "lhs_grad"), rhs, output_grad, lhs_grad,
             "batch_matmul.cublas.lhs_grad", state.saved["tf32"])
    if rhs_grad is not None:
        _run(stream, handle, output_grad.dtype, _plan(state, "rhs_grad"), output_grad, lhs, rhs_grad,
             "batch_matmul.cublas.rhs_grad", state.saved["tf32"])
