"""transpose: output dim d is input dim permutation[d] (torch.permute), any rank, any dtype.

Backward writes input_grad as output_grad permuted by the inverse permutation.

The package: attrs.py holds the attrs; this module output_dims, init_kernel, the checks and the entry
points (each checks, then calls its device's code); cpu.py the NumPy copies; plan.py the device-free
GPU plans (gpu_plan, plan_path); gpu.py their launches; transpose.cu the CUDA kernels.
"""

from __future__ import annotations

from typing import Any

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime import gpu as gpu_runtime
from ..runtime.core import MOVABLE_DTYPES, TensorShape, fail
from ..runtime.spec import UNARY_FORWARD, UNARY_SHAPES, declare_op, unary_backward
from . import cpu, gpu, plan  # noqa: F401 - plan: the device-free GPU plans, which tests read as transpose.plan
from .attrs import OP, TransposeAttrs


def output_dims(attrs: TransposeAttrs, dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(dims[p] for p in attrs.permutation)


def init_kernel(handle: Any, attrs: TransposeAttrs, input_shape: TensorShape, output_shape: TensorShape) -> core.KernelState:
    """Check the shapes against the permutation and record them."""
    state = core.make_state(OP, handle, attrs, TransposeAttrs, input_shape=input_shape, output_shape=output_shape)
    core.check_dtype(OP, "input_shape", input_shape, MOVABLE_DTYPES)
    if input_shape.rank != len(attrs.permutation):
        raise fail(core.ShapeError, OP, "input_shape", f"rank {len(attrs.permutation)} (the permutation's length)",
                   input_shape.rank)
    core.check_dims(OP, "output_shape", output_shape, output_dims(attrs, input_shape.dims))
    core.check_same_dtype(OP, "output_shape", output_shape, input_shape, "input_shape")
    return state


def _check_forward(stream, handle, state, attrs, input, output) -> None:
    core.check_unary_forward(OP, stream, handle, state, attrs, input, output)


def _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad) -> None:
    core.check_unary_backward(OP, stream, handle, state, attrs, output, output_grad, input, input_grad)


# --------------------------------------------------------------------------- entry points


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                       attrs: TransposeAttrs, input: core.Array, output: core.Array) -> None:
    """output = input.transpose(permutation)."""
    _check_forward(stream, handle, state, attrs, input, output)
    cpu.forward(attrs, input, output)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                        attrs: TransposeAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = output_grad.transpose(inverse permutation)."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    cpu.backward(attrs, output_grad, input_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                       attrs: TransposeAttrs, input: core.Array, output: core.Array) -> None:
    """output = input permuted, enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, output)
    gpu.forward(stream, state, input, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                        attrs: TransposeAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = output_grad permuted by the inverse permutation, enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    gpu.backward(stream, state, output_grad, input_grad)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=TransposeAttrs,
    shapes=UNARY_SHAPES,
    forward=UNARY_FORWARD,
    backward=unary_backward(output=False, input=False),
    dtypes=MOVABLE_DTYPES,
    forward_doc="Write output = input permuted, on the stream's device.",
    backward_doc="Write input_grad from output_grad (inverse permutation), on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
