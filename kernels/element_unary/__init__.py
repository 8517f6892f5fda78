"""element_unary: output = f(input) elementwise, for sixteen op types; float16, bfloat16, float32
and float64.

RELU, SIGMOID, TANH, GELU (exact erf form) and SILU with beta 1 are the shared
activations of :mod:`kernels.activation`. The others, with PyTorch's formulas:

| op type         | scalar                      | forward                 | input_grad                            |
|-----------------|-----------------------------|-------------------------|---------------------------------------|
| ELU             | alpha (None: 1.0)           | x > 0 ? x : a expm1(x)  | x <= 0 ? dy a exp(x) : dy (NaN x: dy) |
| SILU            | beta (None: 1.0)            | x sigmoid(b x)          | dy s (1 + b x (1 - s)), s = sigmoid(b x) |
| EXP             | none                        | exp(x)                  | dy exp(x)                             |
| IDENTITY        | none                        | x                       | dy                                    |
| RSQRT           | none                        | 1 / sqrt(x)             | -0.5 dy r^3, r = 1 / sqrt(x)          |
| SIN, COS        | none                        | sin(x), cos(x)          | dy cos(x), -dy sin(x)                 |
| POW             | exponent p (required)       | x^p                     | dy (p x^(p-1)); 0 where p == 0        |
| SCALAR_MULTIPLY | c (required)                | x c                     | dy c                                  |
| SCALAR_ADD      | c (required)                | x + c                   | dy                                    |
| SCALAR_SUB      | c (required)                | x - c                   | dy                                    |
| SCALAR_TRUE_DIV | c (required)                | x / c                   | dy / c                                |

The scalar is rounded to the tensor's dtype and the math is done in that dtype,
as PyTorch does for a Python scalar. Half-precision tensors (float16, bfloat16)
compute in float32 on both devices, as PyTorch's opmath does: each value is
widened when read, the scalar is rounded to float32 (not to the half dtype), and
the result is rounded once to the half dtype when written. POW takes PyTorch's exact shortcuts
(p = 2, 3: products; 0.5: sqrt; -0.5: 1/sqrt; -1, -2: reciprocals), and RSQRT is
1/sqrt(x) with IEEE sqrt and division on both devices, so both are exact where
the math is. An op type that takes no scalar refuses one rather than ignore it.

Backward needs `input` unless the derivative is a constant (IDENTITY and the
SCALAR_* ops); `output` is never read.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import activation
from ..activation import Activation
from ..runtime import core, cpu, gpu, gpu_paths
from ..runtime.core import ALL_FLOAT_DTYPES, AttrsError, TensorShape, fail
from ..runtime.spec import UNARY_FORWARD, UNARY_SHAPES, declare_op, unary_backward

OP = "element_unary"


class UnaryOpType(enum.Enum):
    """The op types; the value is the op code in element_unary.cu."""

    RELU = 0
    SIGMOID = 1
    TANH = 2
    ELU = 3
    GELU = 4
    SILU = 5
    EXP = 6
    IDENTITY = 7
    RSQRT = 8
    SIN = 9
    COS = 10
    POW = 11
    SCALAR_MULTIPLY = 12
    SCALAR_ADD = 13
    SCALAR_SUB = 14
    SCALAR_TRUE_DIV = 15


# Op types that are one of the shared activations (SILU only with beta 1).
_ACTIVATIONS = {
    UnaryOpType.RELU: Activation.RELU,
    UnaryOpType.SIGMOID: Activation.SIGMOID,
    UnaryOpType.TANH: Activation.TANH,
    UnaryOpType.GELU: Activation.GELU,
    UnaryOpType.SILU: Activation.SILU,
}
SCALAR_REQUIRED = frozenset({UnaryOpType.POW, UnaryOpType.SCALAR_MULTIPLY, UnaryOpType.SCALAR_ADD,
                             UnaryOpType.SCALAR_SUB, UnaryOpType.SCALAR_TRUE_DIV})
SCALAR_DEFAULTS = {UnaryOpType.ELU: 1.0, UnaryOpType.SILU: 1.0}  # scalar optional, None means this
# Backward reads `input` except where the derivative is a constant.
_CONSTANT_DERIVATIVE = frozenset({UnaryOpType.IDENTITY, UnaryOpType.SCALAR_MULTIPLY, UnaryOpType.SCALAR_ADD,
                                  UnaryOpType.SCALAR_SUB, UnaryOpType.SCALAR_TRUE_DIV})


@dataclass(frozen=True)
class ElementUnaryAttrs:
    """op_type, and scalar: alpha (ELU), beta (SILU), exponent (POW) or the SCALAR_* operand.

    ELU and SILU store their default 1.0 when scalar is None, so equal math means equal attrs.
    """

    op_type: UnaryOpType
    scalar: float | None = None

    def __post_init__(self) -> None:
        op_type = core.attr_enum(OP, "op_type", self.op_type, UnaryOpType)
        scalar = self.scalar
        if scalar is None:
            if op_type in SCALAR_REQUIRED:
                raise fail(AttrsError, OP, "scalar", f"a number ({op_type.name} needs one)", None)
            scalar = SCALAR_DEFAULTS.get(op_type)
        else:
            if op_type not in SCALAR_REQUIRED and op_type not in SCALAR_DEFAULTS:
                raise fail(AttrsError, OP, "scalar", f"None ({op_type.name} takes no scalar)", repr(scalar))
            if isinstance(scalar, (bool, np.bool_)) or not isinstance(scalar, (int, float, np.integer, np.floating)):
                raise fail(AttrsError, OP, "scalar", "a real number", repr(scalar))
            scalar = float(scalar)
            if not math.isfinite(scalar):
                raise fail(AttrsError, OP, "scalar", "a finite number", scalar)
        core.set_attr(self, "op_type", op_type)
        core.set_attr(self, "scalar", scalar)

    @property
    def activation(self) -> Activation | None:
        """The shared activation this op type is, or None (SILU counts only with beta 1)."""
        if self.op_type is UnaryOpType.SILU and self.scalar != 1.0:
            return None
        return _ACTIVATIONS.get(self.op_type)


def init_kernel(handle: Any, attrs: ElementUnaryAttrs, input_shape: TensorShape, output_shape: TensorShape) -> core.KernelState:
    """Check that input and output have the same dims and one float dtype, and record them."""
    state = core.make_state(OP, handle, attrs, ElementUnaryAttrs, input_shape=input_shape, output_shape=output_shape)
    core.check_dtype(OP, "input_shape", input_shape, ALL_FLOAT_DTYPES)
    core.check_dims(OP, "output_shape", output_shape, input_shape.dims)
    core.check_same_dtype(OP, "output_shape", output_shape, input_shape, "input_shape")
    return state


def _check_forward(stream, handle, state, attrs, input, output) -> None:
    core.check_unary_forward(OP, stream, handle, state, attrs, input, output)


def _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad) -> None:
    core.check_unary_backward(OP, stream, handle, state, attrs, output, output_grad, input, input_grad,
                              input_required=input_grad is not None and attrs.op_type not in _CONSTANT_DERIVATIVE)


# --------------------------------------------------------------------------- CPU


def _pow(x: np.ndarray, exponent: float) -> np.ndarray:
    """x ** exponent with PyTorch's exact shortcuts for the common exponents."""
    if exponent == 0.0:
        return np.ones_like(x)
    if exponent == 1.0:
        return x.copy()
    if exponent == 2.0:
        return x * x
    if exponent == 3.0:
        return x * x * x
    if exponent == 0.5:
        return np.sqrt(x)
    if exponent == -0.5:
        return 1 / np.sqrt(x)
    if exponent == -1.0:
        return 1 / x
    if exponent == -2.0:
        return 1 / (x * x)
    return np.power(x, x.dtype.type(exponent))


@cpu.cpu_kernel
def cpu_forward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: ElementUnaryAttrs,
                       input: core.Array, output: core.Array) -> None:
    """output = f(input), over cache-sized blocks."""
    _check_forward(stream, handle, state, attrs, input, output)
    function = lambda x, out: _cpu_forward(attrs, x, out)  # noqa: E731
    activation.blockwise(_in_compute_dtype(function, input.dtype), input, output)


def _in_compute_dtype(function: Any, dtype: np.dtype) -> Any:
    """function itself, or for a half dtype the function run in float32 on widened blocks, rounded once."""
    return cpu.widened(function) if dtype in core.HALF_DTYPES else function


def _cpu_forward(attrs: ElementUnaryAttrs, x: np.ndarray, output: np.ndarray) -> None:
    op = attrs.op_type
    scalar = None if attrs.scalar is None else x.dtype.type(attrs.scalar)
    if attrs.activation is not None:
        activation.cpu_forward(attrs.activation, x, output)
    elif op is UnaryOpType.SILU:
        np.divide(x, 1 + np.exp(-(scalar * x)), out=output)
    elif op is UnaryOpType.ELU:
        np.copyto(output, np.where(x > 0, x, scalar * np.expm1(x)))
    elif op is UnaryOpType.EXP:
        np.exp(x, out=output)
    elif op is UnaryOpType.IDENTITY:
        np.copyto(output, x)
    elif op is UnaryOpType.RSQRT:
        np.divide(1, np.sqrt(x), out=output)
    elif op is UnaryOpType.SIN:
        np.sin(x, out=output)
    elif op is UnaryOpType.COS:
        np.cos(x, out=output)
    elif op is UnaryOpType.POW:
        np.copyto(output, _pow(x, attrs.scalar))
    elif op is UnaryOpType.SCALAR_MULTIPLY:
        np.multiply(x, scalar, out=output)
    elif op is UnaryOpType.SCALAR_ADD:
        np.add(x, scalar, out=output)
    elif op is UnaryOpType.SCALAR_SUB:
        np.subtract(x, scalar, out=output)
    elif op is UnaryOpType.SCALAR_TRUE_DIV:
        np.divide(x, scalar, out=output)
    else:  # pragma: no cover - attrs are validated
        raise AssertionError(op)


@cpu.cpu_kernel
def cpu_backward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: ElementUnaryAttrs,
                        output: core.Array | None, output_grad: core.Array, input: core.Array | None,
                        input_grad: core.Array | None) -> None:
    """input_grad = output_grad * f'(input), over cache-sized blocks; output_grad and input are only read."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is None:
        return
    # Constant derivatives never read input; output_grad stands in for it when it is None.
    source = output_grad if input is None else input
    function = lambda x, dy, dx: _cpu_backward(attrs, x, dy, dx)  # noqa: E731
    activation.blockwise(_in_compute_dtype(function, input_grad.dtype), source, output_grad, input_grad)


def _cpu_backward(attrs: ElementUnaryAttrs, x: np.ndarray, dy: np.ndarray, input_grad: np.ndarray) -> None:
    op = attrs.op_type
    scalar = None if attrs.scalar is None else dy.dtype.type(attrs.scalar)
    if attrs.activation is not None:
        activation.cpu_backward(attrs.activation, x, dy, input_grad)
    elif op is UnaryOpType.SILU:
        sigmoid = 1 / (1 + np.exp(-(scalar * x)))
        np.multiply(dy * sigmoid, 1 + scalar * x * (1 - sigmoid), out=input_grad)
    elif op is UnaryOpType.ELU:
        # torch tests x <= 0 for the negative branch, so a NaN input passes dy through
        np.copyto(input_grad, np.where(x <= 0, dy * scalar * np.exp(x), dy))
    elif op is UnaryOpType.EXP:
        np.multiply(dy, np.exp(x), out=input_grad)
    elif op is UnaryOpType.RSQRT:
        r = 1 / np.sqrt(x)
        np.multiply(dy.dtype.type(-0.5) * dy, r * r * r, out=input_grad)
    elif op is UnaryOpType.SIN:
        np.multiply(dy, np.cos(x), out=input_grad)
    elif op is UnaryOpType.COS:
        np.multiply(dy, -np.sin(x), out=input_grad)
    elif op is UnaryOpType.POW:
        if attrs.scalar == 0.0:
            input_grad.fill(0)  # torch: zeros, whatever dy holds
        else:
            np.multiply(dy, scalar * _pow(x, attrs.scalar - 1.0), out=input_grad)
    elif op is UnaryOpType.SCALAR_MULTIPLY:
        np.multiply(dy, scalar, out=input_grad)
    elif op is UnaryOpType.SCALAR_TRUE_DIV:
        np.divide(dy, scalar, out=input_grad)
    elif op in (UnaryOpType.IDENTITY, UnaryOpType.SCALAR_ADD, UnaryOpType.SCALAR_SUB):
        np.copyto(input_grad, dy)
    else:  # pragma: no cover - attrs are validated
        raise AssertionError(op)


# --------------------------------------------------------------------------- GPU

_CUDA = gpu.CudaModule("element_unary.cu", [
    f"element_unary_{direction}<{cuda_type}, {op_type.value}>"
    for direction in ("forward", "backward") for cuda_type in gpu.HALF_TYPES + gpu.FLOAT_TYPES for op_type in UnaryOpType
], defines={f"OP_{op_type.name}": op_type.value for op_type in UnaryOpType})

_PACK_BYTES = 16  # each thread moves 16-byte packs where every pointer allows it

gpu_paths.declare(OP, {
    "copy": "IDENTITY forward, and the backward of IDENTITY, SCALAR_ADD and SCALAR_SUB: one device copy",
    **{f"{direction}.{op_type.name.lower()}": f"element_unary_{direction}<T, {op_type.name}>"
       for direction in ("forward", "backward") for op_type in UnaryOpType
       if not (op_type is UnaryOpType.IDENTITY or (direction == "backward" and op_type.name in ("SCALAR_ADD", "SCALAR_SUB")))},
    **{f"{direction}.packs": f"{direction}, every pointer 16-byte aligned: 16-byte packs, then the elements after them"
       for direction in ("forward", "backward")},
    **{f"{direction}.scalars": f"{direction}, some pointer not 16-byte aligned: one element at a time"
       for direction in ("forward", "backward")},
})


def plan_paths(direction: str, op_type: UnaryOpType, aligned: bool) -> tuple[str, str]:
    """The named GPU paths (kernels.runtime.gpu_paths) of a launch: the instantiation and the pack form."""
    return f"{OP}.{direction}.{op_type.name.lower()}", f"{OP}.{direction}.{'packs' if aligned else 'scalars'}"


def _gpu_plan(state, direction: str, attrs: ElementUnaryAttrs, dtype: np.dtype, count: int, aligned: bool) -> tuple:
    """(kernel, grid, count argument, scalar argument, aligned flag, paths) of one direction and alignment,
    made on first use and kept in the state."""
    key = ("gpu", direction, aligned)
    plan = state.saved.get(key)
    if plan is None:
        kernel = _CUDA.function(f"element_unary_{direction}<{gpu.cuda_type(dtype)}, {attrs.op_type.value}>")
        scalar = core.compute_dtype(dtype).type(0.0 if attrs.scalar is None else attrs.scalar)  # float32 for halves
        per_thread = _PACK_BYTES // dtype.itemsize if aligned else 1
        plan = state.saved[key] = (kernel, gpu.grid_for(count, per_thread=per_thread), np.int64(count), scalar,
                                   np.int32(aligned), plan_paths(direction, attrs.op_type, aligned))
    return plan


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: ElementUnaryAttrs,
                       input: core.Array, output: core.Array) -> None:
    """output = f(input), enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, output)
    count = input.size
    if not count:
        return
    if attrs.op_type is UnaryOpType.IDENTITY:
        gpu_paths.reach("element_unary.copy")
        gpu.copy_async(stream, output, input)
        return
    kernel, grid, count_arg, scalar, aligned, paths = _gpu_plan(state, "forward", attrs, output.dtype, count,
                                                                (input.data.ptr | output.data.ptr) % _PACK_BYTES == 0)
    gpu_paths.reach(paths[0])
    gpu_paths.reach(paths[1])
    gpu.launch(stream, kernel, grid, gpu.BLOCK, (input, output, count_arg, scalar, aligned))


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: ElementUnaryAttrs,
                        output: core.Array | None, output_grad: core.Array, input: core.Array | None,
                        input_grad: core.Array | None) -> None:
    """input_grad = output_grad * f'(input), enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is None:
        return
    count = input_grad.size
    if not count:
        return
    if attrs.op_type in _COPY_BACKWARD:
        gpu_paths.reach("element_unary.copy")
        gpu.copy_async(stream, input_grad, output_grad)
        return
    # Constant derivatives never read input; output_grad stands in for it when it is None.
    source = output_grad if input is None else input
    kernel, grid, count_arg, scalar, aligned, paths = _gpu_plan(
        state, "backward", attrs, input_grad.dtype, count,
        (source.data.ptr | output_grad.data.ptr | input_grad.data.ptr) % _PACK_BYTES == 0)
    gpu_paths.reach(paths[0])
    gpu_paths.reach(paths[1])
    gpu.launch(stream, kernel, grid, gpu.BLOCK, (source, output_grad, input_grad, count_arg, scalar, aligned))


_COPY_BACKWARD = frozenset({UnaryOpType.IDENTITY, UnaryOpType.SCALAR_ADD, UnaryOpType.SCALAR_SUB})


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=ElementUnaryAttrs,
    shapes=UNARY_SHAPES,
    forward=UNARY_FORWARD,
    backward=unary_backward(output=False, input=False),
    dtypes=ALL_FLOAT_DTYPES,
    exports=(UnaryOpType,),
    forward_doc="Write output = f(input), on the stream's device.",
    backward_doc="Write input_grad = output_grad * f'(input), on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
