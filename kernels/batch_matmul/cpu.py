"""batch_matmul on the CPU (NumPy): np.matmul over the leading (batch) dims, inside the handle's BLAS
threads; half dtypes widened to float32 and each result rounded once (as the GPU's float32-compute GEMM).

forward and backward run after the package's checks (cpu_forward_kernel, cpu_backward_kernel).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import core
from ..runtime import cpu as cpu_runtime


def _matmul(left: np.ndarray, right: np.ndarray, out: np.ndarray) -> None:
    """out = left @ right; half dtypes widened to float32, multiplied and summed in float32, and the
    result rounded once to out's dtype (as the GPU's float32-compute GEMM)."""
    if out.dtype in core.HALF_DTYPES:
        compute = core.compute_dtype(out.dtype)
        np.copyto(out, np.matmul(left.astype(compute), right.astype(compute)).astype(out.dtype))
    else:
        np.matmul(left, right, out=out)


def forward_plan(state: core.KernelState, attrs: Any, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, lhs, rhs, output) on checked arrays, the GEMM on `threads` BLAS threads (the handle's)."""
    if not state.shapes["output_shape"].numel:
        return lambda state, lhs, rhs, output: None

    def compute(state: core.KernelState, lhs: Any, rhs: Any, output: Any) -> None:
        with cpu_runtime.blas_threads(threads):
            _matmul(lhs, rhs, output)

    return compute


def forward(lhs: Any, rhs: Any, output: Any) -> None:
    """output = lhs @ rhs, batched over the leading dims."""
    if output.size:
        with cpu_runtime.blas_threads():
            _matmul(lhs, rhs, output)


def backward(output_grad: Any, lhs: Any, lhs_grad: Any, rhs: Any, rhs_grad: Any) -> None:
    """lhs_grad = output_grad @ rhs^T; rhs_grad = lhs^T @ output_grad (None grads skipped)."""
    with cpu_runtime.blas_threads():
        if lhs_grad is not None and lhs_grad.size:
            _matmul(output_grad, np.swapaxes(rhs, -1, -2), lhs_grad)
        if rhs_grad is not None and rhs_grad.size:
            _matmul(np.swapaxes(lhs, -1, -2), output_grad, rhs_grad)
