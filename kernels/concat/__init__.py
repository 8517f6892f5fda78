"""concat: inputs[] -> output, side by side along `axis`; any rank, any numeric dtype.

Backward cuts output_grad back into the inputs' gradients (a None one is skipped).
Concat forward is split backward and concat backward is split forward: the one
implementation of both directions lives here (`attrs.PieceLayout`, `cpu.cpu_join`/`cpu.cpu_cut`,
`gpu.gpu_join`/`gpu.gpu_cut`) and :mod:`kernels.split` uses it.

The package: attrs.py holds the attrs and the pieces' layout (PieceLayout, piece_layout); this module
output_dims, init_kernel, the checks and the entry points (each checks, then calls its device's code);
cpu.py the NumPy join and cut; plan.py the kernel's device-free launch geometry and named paths
(kernel_paths); gpu.py the launches, 2D copies and their plans; concat.cu the CUDA kernel.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime import gpu as gpu_runtime
from ..runtime.core import MOVABLE_DTYPES, ShapeError, TensorShape, fail
from ..runtime.spec import Arg, declare_op
from . import cpu, gpu, plan  # noqa: F401 - plan: the kernel's launch geometry, which tests read as concat.plan
from .attrs import OP, ConcatAttrs, piece_layout


def output_dims(attrs: ConcatAttrs, input_dims: Sequence[Sequence[int]]) -> tuple[int, ...]:
    axis = core.normalize_axis(OP, "axis", attrs.axis, len(input_dims[0]))
    dims = list(input_dims[0])
    dims[axis] = sum(d[axis] for d in input_dims)
    return tuple(dims)


def init_kernel(handle: Any, attrs: ConcatAttrs, input_shapes: list[TensorShape], output_shape: TensorShape) -> core.KernelState:
    """Check that the inputs differ only along the axis and that output_shape is their concat."""
    input_shapes = core.check_list(OP, "input_shapes", input_shapes)
    state = core.make_state(OP, handle, attrs, ConcatAttrs, input_shapes=input_shapes, output_shape=output_shape)
    core.check_list(OP, "input_shapes", input_shapes, attrs.num_inputs)
    first = input_shapes[0]
    core.check_dtype(OP, "input_shapes[0]", first, MOVABLE_DTYPES)
    if first.rank < 1:
        raise fail(ShapeError, OP, "input_shapes[0]", "rank >= 1", f"rank 0 {first.dims}")
    axis = core.normalize_axis(OP, "axis", attrs.axis, first.rank)
    for i, shape in enumerate(input_shapes[1:], start=1):
        core.check_same_dtype(OP, f"input_shapes[{i}]", shape, first, "input_shapes[0]")
        others = first.dims[:axis] + ("any",) + first.dims[axis + 1:]
        if shape.rank != first.rank or shape.dims[:axis] + shape.dims[axis + 1:] != first.dims[:axis] + first.dims[axis + 1:]:
            raise fail(ShapeError, OP, f"input_shapes[{i}]", f"dims {others} (as input_shapes[0] but along axis {axis})",
                       shape.dims)
    core.check_dims(OP, "output_shape", output_shape, output_dims(attrs, [s.dims for s in input_shapes]))
    core.check_same_dtype(OP, "output_shape", output_shape, first, "input_shapes[0]")
    state.saved["layout"] = piece_layout(output_shape, [s.dims[axis] for s in input_shapes], axis)
    return state


def _check_forward(stream, handle, state, attrs, inputs, output) -> list[Any]:
    return core.check_many_to_one_forward(OP, stream, handle, state, attrs, inputs, output)


def _check_backward(stream, handle, state, attrs, output, output_grad, inputs, input_grads) -> list[Any]:
    return core.check_many_to_one_backward(OP, stream, handle, state, attrs, output, output_grad, inputs, input_grads)


# --------------------------------------------------------------------------- entry points


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                       attrs: ConcatAttrs, inputs: Sequence[core.Array], output: core.Array) -> None:
    """output = concatenate(inputs, axis)."""
    inputs = _check_forward(stream, handle, state, attrs, inputs, output)
    cpu.forward(state, inputs, output)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                        attrs: ConcatAttrs, output: core.Array | None, output_grad: core.Array,
                        inputs: Sequence[core.Array] | None, input_grads: Sequence[core.Array | None]) -> None:
    """input_grads[i] = output_grad's slice of input i along the axis (None ones skipped)."""
    input_grads = _check_backward(stream, handle, state, attrs, output, output_grad, inputs, input_grads)
    cpu.backward(state, output_grad, input_grads)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                       attrs: ConcatAttrs, inputs: Sequence[core.Array], output: core.Array) -> None:
    """output = concatenate(inputs, axis), one launch per 12 inputs, enqueued on the stream."""
    inputs = _check_forward(stream, handle, state, attrs, inputs, output)
    gpu.forward(stream, state, inputs, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                        attrs: ConcatAttrs, output: core.Array | None, output_grad: core.Array,
                        inputs: Sequence[core.Array] | None, input_grads: Sequence[core.Array | None]) -> None:
    """input_grads[i] = output_grad's slice of input i (None ones skipped), enqueued on the stream."""
    input_grads = _check_backward(stream, handle, state, attrs, output, output_grad, inputs, input_grads)
    gpu.backward(stream, state, output_grad, input_grads)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=ConcatAttrs,
    shapes=("input_shapes", "output_shape"),
    forward=(Arg("inputs", "input", many=True), Arg("output", "output")),
    backward=(Arg("output", "output", required=False), Arg("output_grad", "output_grad"),
              Arg("inputs", "input", many=True, required=False),
              Arg("input_grads", "grad", many=True, required=False, of="inputs")),
    dtypes=MOVABLE_DTYPES,
    forward_doc="Write output = the inputs concatenated along the axis, on the stream's device.",
    backward_doc="Write each input_grads[i] that is not None from output_grad, on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
