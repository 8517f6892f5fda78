"""reshape: the same elements in row-major order under new dims (torch.reshape), any dtype.

Both tensors are C-contiguous, so forward is a plain copy of the input into the
output (a device-to-device copy on the stream on the GPU) and backward a copy of
output_grad into input_grad. `shape` may hold one -1, the size inferred from the
element count, as in torch.reshape.

The package: attrs.py holds the attrs; this module output_dims, init_kernel, the checks and the entry
points (each checks, then calls its device's code); cpu.py the NumPy copy; gpu.py the device copy.
"""

from __future__ import annotations

from typing import Any

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime import gpu as gpu_runtime
from ..runtime.core import MOVABLE_DTYPES, ShapeError, TensorShape, fail
from ..runtime.spec import UNARY_FORWARD, UNARY_SHAPES, declare_op, unary_backward
from . import cpu, gpu
from .attrs import OP, ReshapeAttrs


def output_dims(attrs: ReshapeAttrs, input_dims: tuple[int, ...]) -> tuple[int, ...]:
    """attrs.shape with its -1 resolved from the element count of `input_dims`.

    Raises ShapeError when the counts cannot match, and when a -1 is ambiguous
    (the other sizes multiply to 0), as torch.reshape does.
    """
    count = core.numel(input_dims)
    if -1 not in attrs.shape:
        if core.numel(attrs.shape) != count:
            raise fail(ShapeError, OP, "input_shape", f"{core.numel(attrs.shape)} elements (shape {attrs.shape})",
                       f"{count} elements {input_dims}")
        return attrs.shape
    known = core.numel([d for d in attrs.shape if d != -1])
    if known == 0:
        raise fail(ShapeError, OP, "input_shape", f"a shape whose -1 is defined (the other sizes of {attrs.shape} "
                   "multiply to 0, so any size would fit)", input_dims)
    if count % known:
        raise fail(ShapeError, OP, "input_shape", f"an element count divisible by {known} (shape {attrs.shape})",
                   f"{count} elements {input_dims}")
    return tuple(count // known if d == -1 else d for d in attrs.shape)


def init_kernel(handle: Any, attrs: ReshapeAttrs, input_shape: TensorShape, output_shape: TensorShape) -> core.KernelState:
    """Check that the output dims are attrs.shape (with -1 resolved) for the input's element count."""
    state = core.make_state(OP, handle, attrs, ReshapeAttrs, input_shape=input_shape, output_shape=output_shape)
    core.check_dtype(OP, "input_shape", input_shape, MOVABLE_DTYPES)
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
                       attrs: ReshapeAttrs, input: core.Array, output: core.Array) -> None:
    """output = input.reshape(output dims), copied."""
    _check_forward(stream, handle, state, attrs, input, output)
    cpu.forward(input, output)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                        attrs: ReshapeAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = output_grad.reshape(input dims), copied."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    cpu.backward(output_grad, input_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                       attrs: ReshapeAttrs, input: core.Array, output: core.Array) -> None:
    """output = input, a device-to-device copy enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, output)
    gpu.forward(stream, input, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                        attrs: ReshapeAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = output_grad, a device-to-device copy enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    gpu.backward(stream, output_grad, input_grad)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=ReshapeAttrs,
    shapes=UNARY_SHAPES,
    forward=UNARY_FORWARD,
    backward=unary_backward(output=False, input=False),
    dtypes=MOVABLE_DTYPES,
    forward_doc="Write output = input under the new dims, on the stream's device.",
    backward_doc="Write input_grad = output_grad under the input's dims, on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
