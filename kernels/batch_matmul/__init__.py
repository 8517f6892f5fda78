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

The package: attrs.py holds the attrs; this module output_dims, init_kernel, the checks and the entry
points (each checks, then calls its device's code); cpu.py the NumPy matmuls; gpu.py the cuBLAS GEMMs,
planned once per state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime import gpu as gpu_runtime
from ..runtime.core import ALL_FLOAT_DTYPES, ShapeError, TensorShape, fail
from ..runtime.spec import BINARY_FORWARD, BINARY_SHAPES, binary_backward, declare_op
from . import cpu, gpu
from .attrs import OP, BatchMatmulAttrs


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
    shapes = core.state_shapes(OP, stream, handle, state, attrs)
    core.check_call(OP, stream, handle, state, attrs, [
        ("lhs", lhs, shapes["lhs_shape"], True),
        ("rhs", rhs, shapes["rhs_shape"], True),
        ("output", output, shapes["output_shape"], True),
    ])


def _check_backward(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad) -> None:
    # lhs_grad needs rhs and rhs_grad needs lhs; the output itself is never needed.
    shapes = core.state_shapes(OP, stream, handle, state, attrs)
    core.check_call(OP, stream, handle, state, attrs, [
        ("output", output, shapes["output_shape"], False),
        ("output_grad", output_grad, shapes["output_shape"], True),
        ("lhs", lhs, shapes["lhs_shape"], rhs_grad is not None),
        ("lhs_grad", lhs_grad, shapes["lhs_shape"], False),
        ("rhs", rhs, shapes["rhs_shape"], lhs_grad is not None),
        ("rhs_grad", rhs_grad, shapes["rhs_shape"], False),
    ])


# --------------------------------------------------------------------------- entry points


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                       attrs: BatchMatmulAttrs, lhs: core.Array, rhs: core.Array, output: core.Array) -> None:
    """output = lhs @ rhs, batched over the leading dims."""
    _check_forward(stream, handle, state, attrs, lhs, rhs, output)
    cpu.forward(lhs, rhs, output)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                        attrs: BatchMatmulAttrs, output: core.Array | None, output_grad: core.Array,
                        lhs: core.Array | None, lhs_grad: core.Array | None, rhs: core.Array | None,
                        rhs_grad: core.Array | None) -> None:
    """lhs_grad = output_grad @ rhs^T; rhs_grad = lhs^T @ output_grad (None grads skipped)."""
    _check_backward(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad)
    cpu.backward(output_grad, lhs, lhs_grad, rhs, rhs_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                       attrs: BatchMatmulAttrs, lhs: core.Array, rhs: core.Array, output: core.Array) -> None:
    """output = lhs @ rhs through cuBLAS strided batched GEMM, enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, lhs, rhs, output)
    gpu.forward(stream, handle, state, lhs, rhs, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                        attrs: BatchMatmulAttrs, output: core.Array | None, output_grad: core.Array,
                        lhs: core.Array | None, lhs_grad: core.Array | None, rhs: core.Array | None,
                        rhs_grad: core.Array | None) -> None:
    """lhs_grad = output_grad @ rhs^T, rhs_grad = lhs^T @ output_grad through cuBLAS, enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad)
    gpu.backward(stream, handle, state, output_grad, lhs, lhs_grad, rhs, rhs_grad)


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
