"""element_binary: output = lhs (op) rhs with NumPy broadcasting, for ADD, SUB, MUL, DIV, MAX, MIN.

Broadcasting follows NumPy (and torch): shapes are right-aligned, and a dim of size 1
(or a missing leading dim) stretches to the other side's size. `output_shape` must be
the broadcast shape. float16, bfloat16, float32 and float64: integer arithmetic (integer
division, gradients) has no meaning a detector's training needs. Half-precision tensors are
computed in float32 on both devices (widened when read, rounded once when written), and a
gradient summed over broadcast dims is summed in float32 and rounded once.

Backward follows torch's autograd formulas (derivatives.yaml) in torch's order of
operations, then sums each gradient over the dims its operand was broadcast along:

- ADD: lhs_grad = g, rhs_grad = g;  SUB: lhs_grad = g, rhs_grad = -g
- MUL: lhs_grad = g * rhs, rhs_grad = g * lhs
- DIV: lhs_grad = g / rhs, rhs_grad = -g * ((lhs / rhs) / rhs)   (torch's exact order, not g*lhs/rhs^2)
- MAX (torch.maximum): where lhs == rhs each side gets g / 2; elsewhere the larger side gets g and the
  other 0. Where either is NaN (the output is NaN), both sides get g, as in torch.
- MIN (torch.minimum): the same with the smaller side.

Forward MAX/MIN propagate NaN and, on a tie of +0 and -0, return lhs (torch's choice).

A package: this module holds the checks and the entry points; attrs.py the attrs,
BinaryOpType and the state; cpu.py the NumPy code, plan.py the GPU plans (pure Python,
no device), gpu.py the launches of element_binary.cu.
"""

from __future__ import annotations

from typing import Any

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime.core import ALL_FLOAT_DTYPES, ShapeError, TensorShape, fail
from ..runtime.spec import BINARY_FORWARD, BINARY_SHAPES, binary_backward, declare_op
from . import cpu, gpu
from .attrs import OP, BinaryOpType, ElementBinaryAttrs, ElementBinaryState


def broadcast_dims(lhs_dims: tuple[int, ...], rhs_dims: tuple[int, ...]) -> tuple[int, ...] | None:
    """The NumPy broadcast of two shapes, or None when they do not broadcast."""
    rank = max(len(lhs_dims), len(rhs_dims))
    lhs = (1,) * (rank - len(lhs_dims)) + tuple(lhs_dims)
    rhs = (1,) * (rank - len(rhs_dims)) + tuple(rhs_dims)
    out = []
    for a, b in zip(lhs, rhs):
        if a != b and a != 1 and b != 1:
            return None
        out.append(b if a == 1 else a)
    return tuple(out)


def init_kernel(handle: Any, attrs: ElementBinaryAttrs, lhs_shape: TensorShape, rhs_shape: TensorShape,
                output_shape: TensorShape) -> ElementBinaryState:
    """Check that lhs and rhs broadcast to output_shape, all of one float dtype, and record the shapes."""
    state = core.make_state(OP, handle, attrs, ElementBinaryAttrs, ElementBinaryState, lhs_shape=lhs_shape,
                            rhs_shape=rhs_shape, output_shape=output_shape)
    core.check_dtype(OP, "lhs_shape", lhs_shape, ALL_FLOAT_DTYPES)
    core.check_same_dtype(OP, "rhs_shape", rhs_shape, lhs_shape, "lhs_shape")
    core.check_same_dtype(OP, "output_shape", output_shape, lhs_shape, "lhs_shape")
    dims = broadcast_dims(lhs_shape.dims, rhs_shape.dims)
    if dims is None:
        raise fail(ShapeError, OP, "rhs_shape", f"dims that broadcast with lhs_shape {lhs_shape.dims}", rhs_shape.dims)
    core.check_dims(OP, "output_shape", output_shape, dims)
    return state


def _needs_values(op_type: BinaryOpType) -> bool:
    """Whether backward reads lhs and rhs (ADD and SUB need only output_grad)."""
    return op_type not in (BinaryOpType.ADD, BinaryOpType.SUB)


def _check_forward(stream: Any, handle: Any, state: Any, attrs: Any, lhs: Any, rhs: Any, output: Any) -> None:
    shapes = core.state_shapes(OP, stream, handle, state, attrs)
    core.check_call(OP, stream, handle, state, attrs, [
        ("lhs", lhs, shapes["lhs_shape"], True),
        ("rhs", rhs, shapes["rhs_shape"], True),
        ("output", output, shapes["output_shape"], True),
    ])


def _check_backward(stream: Any, handle: Any, state: Any, attrs: Any, output: Any, output_grad: Any, lhs: Any,
                    lhs_grad: Any, rhs: Any, rhs_grad: Any) -> None:
    shapes = core.state_shapes(OP, stream, handle, state, attrs)
    values = _needs_values(state.attrs.op_type)  # check_call refuses attrs other than the state's
    core.check_call(OP, stream, handle, state, attrs, [
        ("output", output, shapes["output_shape"], False),
        ("output_grad", output_grad, shapes["output_shape"], True),
        ("lhs", lhs, shapes["lhs_shape"], values),
        ("lhs_grad", lhs_grad, shapes["lhs_shape"], False),
        ("rhs", rhs, shapes["rhs_shape"], values),
        ("rhs_grad", rhs_grad, shapes["rhs_shape"], False),
    ])


# --------------------------------------------------------------------------- entry points


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: Any, handle: Any, state: ElementBinaryState, attrs: ElementBinaryAttrs, lhs: Any,
                       rhs: Any, output: Any) -> None:
    """output = lhs (op) rhs, broadcast by NumPy."""
    _check_forward(stream, handle, state, attrs, lhs, rhs, output)
    cpu.forward(attrs.op_type, lhs, rhs, output)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: Any, handle: Any, state: ElementBinaryState, attrs: ElementBinaryAttrs, output: Any,
                        output_grad: Any, lhs: Any, lhs_grad: Any, rhs: Any, rhs_grad: Any) -> None:
    """Write lhs_grad and rhs_grad (those not None), each summed over its broadcast dims."""
    _check_backward(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad)
    cpu.backward(attrs.op_type, output_grad, lhs, lhs_grad, rhs, rhs_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: Any, handle: Any, state: ElementBinaryState, attrs: ElementBinaryAttrs, lhs: Any,
                       rhs: Any, output: Any) -> None:
    """output = lhs (op) rhs, one kernel enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, lhs, rhs, output)
    gpu.forward(stream, state, attrs, lhs, rhs, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: Any, handle: Any, state: ElementBinaryState, attrs: ElementBinaryAttrs, output: Any,
                        output_grad: Any, lhs: Any, lhs_grad: Any, rhs: Any, rhs_grad: Any) -> None:
    """Write lhs_grad and rhs_grad (those not None), reduced over broadcast dims without atomics."""
    _check_backward(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad)
    gpu.backward(stream, state, attrs, output_grad, lhs, lhs_grad, rhs, rhs_grad)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=ElementBinaryAttrs,
    shapes=BINARY_SHAPES,
    forward=BINARY_FORWARD,
    backward=binary_backward(output=False, lhs=False, rhs=False),
    dtypes=ALL_FLOAT_DTYPES,
    exports=(BinaryOpType,),
    forward_doc="Write output = lhs (op) rhs with broadcasting, on the stream's device.",
    backward_doc='Write lhs_grad and rhs_grad (None skips one), each summed over its broadcast dims.',
    cleanup_doc='Release the state (and the GPU buffer of partial sums, if one was made).',
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
