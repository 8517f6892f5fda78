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

The package: this module holds init_kernel, the checks and the entry points (each checks, then
calls its device's code); attrs.py the attrs and op types; cpu.py the NumPy code; plan.py the
device-free GPU path names; gpu.py the launches of element_unary.cu.
"""

from __future__ import annotations

from typing import Any

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime import gpu as gpu_runtime
from ..runtime.core import ALL_FLOAT_DTYPES, TensorShape
from ..runtime.spec import UNARY_FORWARD, UNARY_SHAPES, declare_op, unary_backward
from . import cpu, gpu, plan  # noqa: F401  (plan: the GPU path names, as tests/test_gpu_paths.py reads them)
from .attrs import (  # noqa: F401  (the attrs' constants, where callers found them)
    _CONSTANT_DERIVATIVE,
    OP,
    SCALAR_DEFAULTS,
    SCALAR_REQUIRED,
    ElementUnaryAttrs,
    UnaryOpType,
)


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
    core.state_shapes(OP, stream, handle, state, attrs)  # state.attrs below: a state of this op, else refused
    reads_input = input_grad is not None and state.attrs.op_type not in _CONSTANT_DERIVATIVE
    core.check_unary_backward(OP, stream, handle, state, attrs, output, output_grad, input, input_grad,
                              input_required=reads_input)


# --------------------------------------------------------------------------- entry points


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                       attrs: ElementUnaryAttrs, input: core.Array, output: core.Array) -> None:
    """output = f(input), over cache-sized blocks."""
    _check_forward(stream, handle, state, attrs, input, output)
    cpu.forward(attrs, input, output)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                        attrs: ElementUnaryAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = output_grad * f'(input), over cache-sized blocks; output_grad and input are only read."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    cpu.backward(attrs, output_grad, input, input_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                       attrs: ElementUnaryAttrs, input: core.Array, output: core.Array) -> None:
    """output = f(input), enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, output)
    gpu.forward(stream, state, attrs, input, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                        attrs: ElementUnaryAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = output_grad * f'(input), enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    gpu.backward(stream, state, attrs, output_grad, input, input_grad)


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
