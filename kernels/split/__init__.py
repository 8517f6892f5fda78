"""split: input -> outputs[], consecutive pieces of `splits` sizes along `axis`; any rank, any numeric dtype.

Backward joins the output gradients back into input_grad. Split forward is concat
backward and split backward is concat forward: both use the one implementation in
:mod:`kernels.concat` (attrs.PieceLayout, cpu.cpu_join/cpu_cut and gpu.gpu_join/gpu_cut).

The package: attrs.py holds the attrs; this module output_dims, init_kernel (the state's PieceLayout,
concat.attrs.piece_layout), the checks and the entry points (each checks, then calls its device's code);
cpu.py and gpu.py call concat's cut and join.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..concat.attrs import piece_layout
from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime import gpu as gpu_runtime
from ..runtime.core import MOVABLE_DTYPES, AttrsError, ShapeError, TensorShape, fail
from ..runtime.spec import Arg, declare_op
from . import cpu, gpu
from .attrs import OP, SplitAttrs


def output_dims(attrs: SplitAttrs, dims: tuple[int, ...]) -> list[tuple[int, ...]]:
    axis = core.normalize_axis(OP, "axis", attrs.axis, len(dims))
    return [dims[:axis] + (size,) + dims[axis + 1:] for size in attrs.splits]


def init_kernel(handle: Any, attrs: SplitAttrs, input_shape: TensorShape, output_shapes: list[TensorShape]) -> core.KernelState:
    """Check that the splits add up to the input's axis and that output_shapes are the pieces."""
    output_shapes = core.check_list(OP, "output_shapes", output_shapes)
    state = core.make_state(OP, handle, attrs, SplitAttrs, input_shape=input_shape, output_shapes=output_shapes)
    core.check_list(OP, "output_shapes", output_shapes, len(attrs.splits))
    core.check_dtype(OP, "input_shape", input_shape, MOVABLE_DTYPES)
    if input_shape.rank < 1:
        raise fail(ShapeError, OP, "input_shape", "rank >= 1", f"rank 0 {input_shape.dims}")
    axis = core.normalize_axis(OP, "axis", attrs.axis, input_shape.rank)
    if sum(attrs.splits) != input_shape.dims[axis]:
        raise fail(AttrsError, OP, "splits", f"sizes adding up to the input's dim {axis} ({input_shape.dims[axis]})",
                   f"{attrs.splits} (sum {sum(attrs.splits)})")
    for i, (shape, dims) in enumerate(zip(output_shapes, output_dims(attrs, input_shape.dims))):
        core.check_dims(OP, f"output_shapes[{i}]", shape, dims)
        core.check_same_dtype(OP, f"output_shapes[{i}]", shape, input_shape, "input_shape")
    state.saved["layout"] = piece_layout(input_shape, attrs.splits, axis)
    return state


def _check_forward(stream, handle, state, attrs, input, outputs) -> list[Any]:
    shapes = core.state_list_shapes(OP, stream, handle, state, attrs, "output_shapes")
    outputs = core.check_list(OP, "outputs", outputs, len(shapes))
    core.check_call(OP, stream, handle, state, attrs,
                    [("input", input, state.shapes["input_shape"], True)] + core.list_rows("outputs", outputs, shapes, True))
    return outputs


def _check_backward(stream, handle, state, attrs, outputs, output_grads, input, input_grad) -> list[Any]:
    shapes = core.state_list_shapes(OP, stream, handle, state, attrs, "output_shapes")
    outputs = core.check_list(OP, "outputs", outputs, len(shapes), optional=True)
    output_grads = core.check_list(OP, "output_grads", output_grads, len(shapes))
    core.check_call(OP, stream, handle, state, attrs,
                    core.list_rows("outputs", outputs, shapes, False)
                    + core.list_rows("output_grads", output_grads, shapes, True)
                    + [("input", input, state.shapes["input_shape"], False),
                       ("input_grad", input_grad, state.shapes["input_shape"], False)])
    return output_grads


# --------------------------------------------------------------------------- entry points


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                       attrs: SplitAttrs, input: core.Array, outputs: Sequence[core.Array]) -> None:
    """outputs[i] = input's i-th slice along the axis."""
    outputs = _check_forward(stream, handle, state, attrs, input, outputs)
    cpu.forward(state, input, outputs)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                        attrs: SplitAttrs, outputs: Sequence[core.Array], output_grads: Sequence[core.Array],
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = concatenate(output_grads, axis)."""
    output_grads = _check_backward(stream, handle, state, attrs, outputs, output_grads, input, input_grad)
    cpu.backward(state, output_grads, input_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                       attrs: SplitAttrs, input: core.Array, outputs: Sequence[core.Array]) -> None:
    """outputs[i] = input's i-th slice, one launch per 12 outputs, enqueued on the stream."""
    outputs = _check_forward(stream, handle, state, attrs, input, outputs)
    gpu.forward(stream, state, input, outputs)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                        attrs: SplitAttrs, outputs: Sequence[core.Array], output_grads: Sequence[core.Array],
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = concatenate(output_grads, axis), enqueued on the stream."""
    output_grads = _check_backward(stream, handle, state, attrs, outputs, output_grads, input, input_grad)
    gpu.backward(stream, state, output_grads, input_grad)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=SplitAttrs,
    shapes=("input_shape", "output_shapes"),
    forward=(Arg("input", "input"), Arg("outputs", "output", many=True)),
    backward=(Arg("outputs", "output", many=True, required=False), Arg("output_grads", "output_grad", many=True),
              Arg("input", "input", required=False), Arg("input_grad", "grad", required=False, of="input")),
    dtypes=MOVABLE_DTYPES,
    forward_doc="Write every outputs[i] = the input's i-th piece along the axis, on the stream's device.",
    backward_doc="Write input_grad = the output gradients joined along the axis, on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
