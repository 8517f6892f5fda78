"""element_unary on the CPU (NumPy): the formulas, over the cache-sized blocks of activation.blockwise.

forward and backward run after the package's checks (cpu_forward_kernel, cpu_backward_kernel).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import activation
from ..runtime import core, cpu
from .attrs import ElementUnaryAttrs, UnaryOpType


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


def forward(attrs: ElementUnaryAttrs, input: core.Array, output: core.Array) -> None:
    """output = f(input), over cache-sized blocks."""
    function = lambda x, out: _cpu_forward(attrs, x, out)  # noqa: E731
    activation.blockwise(_in_compute_dtype(function, input.dtype), input, output)


def forward_plan(state: core.KernelState, attrs: ElementUnaryAttrs, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, input, output) on checked arrays, the formula and its blocks chosen once."""
    shape = state.shapes["input_shape"]
    if attrs.activation is not None:
        function = activation.forward_block_plan(attrs.activation, core.compute_dtype(shape.dtype))
    else:
        function = functools.partial(_cpu_forward, attrs)
    return activation.blockwise_plan(_in_compute_dtype(function, shape.dtype), shape.numel, threads)


def _in_compute_dtype(function: Any, dtype: np.dtype) -> Any:
    """function itself, or for a half dtype the function run in float32 on widened blocks, rounded once."""
    return cpu.widened(function) if dtype in core.HALF_DTYPES else function


def _cpu_forward(attrs: ElementUnaryAttrs, x: np.ndarray, output: np.ndarray) -> None:
    op = attrs.op_type
    scalar = None if attrs.scalar is None else x.dtype.type(attrs.scalar)
    shared = attrs.activation
    if shared is not None:
        activation.cpu_forward_block(shared, x, output)  # x is a block of forward's blockwise, widened for half
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


def backward(attrs: ElementUnaryAttrs, output_grad: core.Array, input: core.Array | None,
             input_grad: core.Array | None) -> None:
    """input_grad = output_grad * f'(input), over cache-sized blocks; output_grad and input are only read."""
    if input_grad is None:
        return
    # Constant derivatives never read input; output_grad stands in for it when it is None.
    source = output_grad if input is None else input
    function = lambda x, dy, dx: _cpu_backward(attrs, x, dy, dx)  # noqa: E731
    activation.blockwise(_in_compute_dtype(function, input_grad.dtype), source, output_grad, input_grad)


def _cpu_backward(attrs: ElementUnaryAttrs, x: np.ndarray, dy: np.ndarray, input_grad: np.ndarray) -> None:
    op = attrs.op_type
    scalar = None if attrs.scalar is None else dy.dtype.type(attrs.scalar)
    shared = attrs.activation
    if shared is not None:
        activation.cpu_backward_block(shared, x, dy, input_grad)  # blocks of backward's blockwise, widened for half
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
