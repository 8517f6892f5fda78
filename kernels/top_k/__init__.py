"""top_k along the last dim (any rank >= 1; the dims before it are rows), float16, bfloat16, float32 and
float64: `values` (..., k), the k largest values of each row in descending order, and `indices` (..., k),
int64, their positions in the row.

The order is torch.sort(input, dim=-1, descending=True, stable=True)'s, of which top_k is the first k
columns: NaN counts as larger than every number (+inf included), -0.0 and +0.0 are equal, and equal
values (NaN with NaN too) come lower index first. (torch.topk itself promises no order among ties.)
The values are the input's elements themselves, copied: a -0.0 stays -0.0, a NaN keeps its bits.
The result is the same bits on both devices and on every run.

Backward: input_grad is zero except values_grad[..., j] at indices[..., j]: each element of input_grad
is the sum, in order of j, of the values_grad whose index names it (one term for the distinct indices a
forward writes), in float32 for the half dtypes, rounded once; an index outside [0, n) is skipped.
`indices` is read, `values` and `input` are not (either may be None).

The package: this module holds init_kernel, the checks and the entry points (each checks, then calls
its device's code); attrs.py the attrs and state; cpu.py the NumPy code; plan.py the device-free GPU
plan; gpu.py the launches of top_k.cu.
"""

from __future__ import annotations

from typing import Any

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime import gpu as gpu_runtime
from ..runtime.core import ALL_FLOAT_DTYPES, TensorShape
from ..runtime.spec import Arg, declare_op
from . import cpu, gpu, plan  # noqa: F401  (plan: the GPU plans, as the tests read them)
from .attrs import INDEX_DTYPE, OP, TopKAttrs, TopKState


def output_dims(attrs: TopKAttrs, input_dims: tuple[int, ...]) -> tuple[int, ...]:
    """The dims of values and indices: the input's with the last one k."""
    return tuple(input_dims[:-1]) + (attrs.k,)


def init_kernel(handle: Any, attrs: TopKAttrs, input_shape: TensorShape, values_shape: TensorShape,
                indices_shape: TensorShape) -> TopKState:
    """Check k against the last dim and the shapes against each other; record them."""
    state = core.make_state(OP, handle, attrs, TopKAttrs, TopKState, input_shape=input_shape,
                            values_shape=values_shape, indices_shape=indices_shape)
    core.check_dtype(OP, "input_shape", input_shape, ALL_FLOAT_DTYPES)
    core.check_rank(OP, "input_shape", input_shape, min_rank=1)
    if attrs.k > input_shape.dims[-1]:
        raise core.fail(core.AttrsError, OP, "k", f"at most the last dim of input_shape ({input_shape.dims[-1]})",
                        attrs.k)
    dims = output_dims(attrs, input_shape.dims)
    core.check_dims(OP, "values_shape", values_shape, dims)
    core.check_same_dtype(OP, "values_shape", values_shape, input_shape, "input_shape")
    core.check_dims(OP, "indices_shape", indices_shape, dims)
    core.check_dtype(OP, "indices_shape", indices_shape, (INDEX_DTYPE,))
    return state


def _check_forward(stream, handle, state, attrs, input, values, indices) -> None:
    shapes = core.state_shapes(OP, stream, handle, state, attrs)
    core.check_call(OP, stream, handle, state, attrs, [
        ("input", input, shapes["input_shape"], True),
        ("values", values, shapes["values_shape"], True),
        ("indices", indices, shapes["indices_shape"], True),
    ])


def _check_backward(stream, handle, state, attrs, values, values_grad, indices, input, input_grad) -> None:
    shapes = core.state_shapes(OP, stream, handle, state, attrs)
    core.check_call(OP, stream, handle, state, attrs, [
        ("values", values, shapes["values_shape"], False),
        ("values_grad", values_grad, shapes["values_shape"], True),
        ("indices", indices, shapes["indices_shape"], True),
        ("input", input, shapes["input_shape"], False),
        ("input_grad", input_grad, shapes["input_shape"], False),
    ])


# --------------------------------------------------------------------------- entry points


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: TopKState,
                       attrs: TopKAttrs, input: core.Array, values: core.Array, indices: core.Array) -> None:
    """values, indices = the k largest of each row of input, descending, ties lower index first."""
    _check_forward(stream, handle, state, attrs, input, values, indices)
    cpu.forward(state, input, values, indices)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: TopKState,
                        attrs: TopKAttrs, values: core.Array | None, values_grad: core.Array, indices: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = values_grad at indices, zero elsewhere."""
    _check_backward(stream, handle, state, attrs, values, values_grad, indices, input, input_grad)
    cpu.backward(state, values_grad, indices, input_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: TopKState,
                       attrs: TopKAttrs, input: core.Array, values: core.Array, indices: core.Array) -> None:
    """values, indices = the k largest of each row of input, enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, values, indices)
    gpu.forward(stream, state, input, values, indices)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: TopKState,
                        attrs: TopKAttrs, values: core.Array | None, values_grad: core.Array, indices: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = values_grad at indices, zero elsewhere, enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, values, values_grad, indices, input, input_grad)
    gpu.backward(stream, state, values_grad, indices, input_grad)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=TopKAttrs,
    shapes=("input_shape", "values_shape", "indices_shape"),
    forward=(Arg("input", "input"), Arg("values", "output"), Arg("indices", "output")),
    backward=(Arg("values", "output", required=False), Arg("values_grad", "output_grad"),
              Arg("indices", "output"), Arg("input", "input", required=False),
              Arg("input_grad", "grad", required=False, of="input")),
    dtypes=ALL_FLOAT_DTYPES,
    forward_doc="Write values and indices, the k largest of each row (last dim) in descending order, ties by "
                "the lower index, NaN largest, on the stream's device.",
    backward_doc="Write input_grad: values_grad at indices, zero elsewhere (indices is read; values and input "
                 "are not needed), on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
