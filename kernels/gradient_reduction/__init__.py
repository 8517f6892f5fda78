"""gradient_reduction: inputs[] -> output, their elementwise sum: the gradients of a
tensor read more than once, each use having written its own buffer.

The sum runs left to right, ((inputs[0] + inputs[1]) + inputs[2]) + ..., on both
devices, so float results are bitwise the same on CPU and GPU. Integer sums wrap
like NumPy. float16 and bfloat16 are summed in float32 (each term widened, left to
right) and rounded once to the dtype, on both devices. Backward writes output_grad into every input_grads[i] that is not None.

The package: attrs.py holds the attrs and the summable dtypes; this module init_kernel, the checks and
the entry points (each checks, then calls its device's code); cpu.py the NumPy sum and copies; gpu.py
the launches (gpu_sum, gpu_fanout) and their plans; gradient_reduction.cu the CUDA kernels.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime import gpu as gpu_runtime
from ..runtime.core import TensorShape
from ..runtime.spec import Arg, declare_op
from . import cpu, gpu
from .attrs import OP, SUMMABLE_DTYPES, GradientReductionAttrs


def init_kernel(handle: Any, attrs: GradientReductionAttrs, input_shapes: list[TensorShape],
                output_shape: TensorShape) -> core.KernelState:
    """Check that every input and the output have one dims and one summable dtype."""
    input_shapes = core.check_list(OP, "input_shapes", input_shapes)
    state = core.make_state(OP, handle, attrs, GradientReductionAttrs, input_shapes=input_shapes,
                            output_shape=output_shape)
    first = input_shapes[0]
    core.check_dtype(OP, "input_shapes[0]", first, SUMMABLE_DTYPES)
    for i, shape in enumerate(input_shapes[1:], start=1):
        core.check_dims(OP, f"input_shapes[{i}]", shape, first.dims)
        core.check_same_dtype(OP, f"input_shapes[{i}]", shape, first, "input_shapes[0]")
    core.check_dims(OP, "output_shape", output_shape, first.dims)
    core.check_same_dtype(OP, "output_shape", output_shape, first, "input_shapes[0]")
    state.saved["gpu_plans"] = {}  # GPU launch plans, made on first use (gpu_sum, gpu_fanout)
    return state


def _check_forward(stream, handle, state, attrs, inputs, output) -> list[Any]:
    return core.check_many_to_one_forward(OP, stream, handle, state, attrs, inputs, output)


def _check_backward(stream, handle, state, attrs, output, output_grad, inputs, input_grads) -> list[Any]:
    return core.check_many_to_one_backward(OP, stream, handle, state, attrs, output, output_grad, inputs, input_grads)


# --------------------------------------------------------------------------- entry points


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                       attrs: GradientReductionAttrs, inputs: Sequence[core.Array], output: core.Array) -> None:
    """output = inputs[0] + inputs[1] + ..., left to right."""
    inputs = _check_forward(stream, handle, state, attrs, inputs, output)
    cpu.forward(inputs, output)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                        attrs: GradientReductionAttrs, output: core.Array | None, output_grad: core.Array,
                        inputs: Sequence[core.Array] | None, input_grads: Sequence[core.Array | None]) -> None:
    """input_grads[i] = output_grad for each one that is not None."""
    input_grads = _check_backward(stream, handle, state, attrs, output, output_grad, inputs, input_grads)
    cpu.backward(output_grad, input_grads)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                       attrs: GradientReductionAttrs, inputs: Sequence[core.Array], output: core.Array) -> None:
    """output = inputs[0] + inputs[1] + ..., left to right, one launch per 12 inputs, enqueued on the stream."""
    inputs = _check_forward(stream, handle, state, attrs, inputs, output)
    gpu.forward(stream, state, inputs, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                        attrs: GradientReductionAttrs, output: core.Array | None, output_grad: core.Array,
                        inputs: Sequence[core.Array] | None, input_grads: Sequence[core.Array | None]) -> None:
    """input_grads[i] = output_grad for each one that is not None: one read, up to 12 writes a launch."""
    input_grads = _check_backward(stream, handle, state, attrs, output, output_grad, inputs, input_grads)
    gpu.backward(stream, state, output_grad, input_grads)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=GradientReductionAttrs,
    shapes=("input_shapes", "output_shape"),
    forward=(Arg("inputs", "input", many=True), Arg("output", "output")),
    backward=(Arg("output", "output", required=False), Arg("output_grad", "output_grad"),
              Arg("inputs", "input", many=True, required=False),
              Arg("input_grads", "grad", many=True, required=False, of="inputs")),
    dtypes=SUMMABLE_DTYPES,
    forward_doc="Write output = the sum of the inputs, on the stream's device.",
    backward_doc="Write output_grad into each input_grads[i] that is not None, on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
