"""softmax along `dim` (any dim of any rank, negative dims count from the end), float16, bfloat16,
float32 and float64. Half-precision tensors are computed in float32 on both devices: each value
widened when read, the max, the exponentials, the sums and the quotients in float32, each result
rounded once to the dtype when written.

Forward is numerically stable: y = exp(x - max) / sum(exp(x - max)) along dim.
Backward is computed from the output alone: input_grad = y * (g - sum(g * y)) along
dim, so `input` may be None.

The package: this module holds init_kernel, the checks and the entry points (each checks, then
calls its device's code); attrs.py the attrs; cpu.py the NumPy code; plan.py the device-free GPU
plan (gpu_plan, plan_path); gpu.py the launches of softmax.cu.
"""

from __future__ import annotations

from typing import Any

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime import gpu as gpu_runtime
from ..runtime.core import ALL_FLOAT_DTYPES, TensorShape
from ..runtime.spec import UNARY_FORWARD, UNARY_SHAPES, declare_op, unary_backward
from . import cpu, gpu, plan  # noqa: F401  (plan: the GPU plans, as tests/test_softmax_gpu_rows.py reads them)
from .attrs import OP, SoftmaxAttrs


def init_kernel(handle: Any, attrs: SoftmaxAttrs, input_shape: TensorShape, output_shape: TensorShape) -> core.KernelState:
    """Check dim against the rank and the shapes against each other; record them."""
    state = core.make_state(OP, handle, attrs, SoftmaxAttrs, input_shape=input_shape, output_shape=output_shape)
    core.check_dtype(OP, "input_shape", input_shape, ALL_FLOAT_DTYPES)
    core.normalize_axis(OP, "dim", attrs.dim, input_shape.rank)
    core.check_dims(OP, "output_shape", output_shape, input_shape.dims)
    core.check_same_dtype(OP, "output_shape", output_shape, input_shape, "input_shape")
    return state


def _check_forward(stream, handle, state, attrs, input, output) -> None:
    core.check_unary_forward(OP, stream, handle, state, attrs, input, output)


def _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad) -> None:
    # Backward reads y, not x: input is accepted, or None.
    core.check_unary_backward(OP, stream, handle, state, attrs, output, output_grad, input, input_grad,
                              output_required=True)


# --------------------------------------------------------------------------- entry points


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                       attrs: SoftmaxAttrs, input: core.Array, output: core.Array) -> None:
    """output = exp(input - max) / sum(exp(input - max)) along dim."""
    _check_forward(stream, handle, state, attrs, input, output)
    cpu.forward(state, input, output)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                        attrs: SoftmaxAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = output * (output_grad - sum(output_grad * output)) along dim."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    cpu.backward(state, output, output_grad, input_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                       attrs: SoftmaxAttrs, input: core.Array, output: core.Array) -> None:
    """output = softmax(input) along dim, enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, output)
    gpu.forward(stream, state, input, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                        attrs: SoftmaxAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = output * (output_grad - sum(output_grad * output)) along dim, enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    gpu.backward(stream, state, output, output_grad, input_grad)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=SoftmaxAttrs,
    shapes=UNARY_SHAPES,
    forward=UNARY_FORWARD,
    backward=unary_backward(output=True, input=False),
    dtypes=ALL_FLOAT_DTYPES,
    forward_doc="Write output = softmax(input) along dim, on the stream's device.",
    backward_doc="Write input_grad from output and output_grad (input is not needed), on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
