"""Activations shared by every op that applies one: conv_2d, batch_norm and
pool_2d fuse them (``activation`` attrs), element_unary exposes them.

Forward ``output = f(pre)`` and backward ``pre_grad = output_grad * f'(pre)``,
on NumPy arrays (``cpu_*``) or CuPy arrays on a stream (``gpu_*``), float16,
bfloat16, float32 and float64. A half-precision tensor is widened to float32 as it
is read, the activation runs in float32, and the result is rounded once to the
half dtype as it is written, on both devices (the GPU kernels use activation.cuh's
functions on compute_t values between widen and narrow). Formulas follow PyTorch (ATen): GELU is the exact erf form, SiLU is
``x * sigmoid(x)``, relu'(0) = 0. The CUDA device functions are in
``activation.cuh`` for other ops' kernels to ``#include``; :func:`code` gives
the integer an activation (or None) has there.

NumPy has no erf and SciPy is not a dependency, so cpu.py writes one (:func:`cpu.erf`):
measured against ``math.erf`` on 4.2 million points in [-7, 7] (dense around the
branch points 1, 1.5, 2.5, 4 and 6, and tiny and subnormal magnitudes) it is
within 2 ulps in float64 (1 ulp for |x| >= 1); ``tests/test_activation.py``
keeps that measurement.

The package: this module holds forward and backward (by the stream's device) and names what the ops
call; attrs.py the Activation enum, attr_activation and code; cpu.py erf and the NumPy passes
(blockwise, cpu_forward, cpu_derivative, cpu_backward); plan.py the device-free GPU path names;
gpu.py the launches of activation.cu (gpu_forward, gpu_backward).
"""

from __future__ import annotations

from typing import Any

# What the ops and tools call, where they call it (kernels.activation.X); plan: the GPU path names.
from . import plan  # noqa: F401
from .attrs import NONE_CODE, Activation, attr_activation, code  # noqa: F401
from .cpu import (  # noqa: F401
    blockwise,
    blockwise_plan,
    cpu_backward,
    cpu_backward_block,
    cpu_forward,
    cpu_forward_block,
    forward_block_plan,
)
from .gpu import gpu_backward, gpu_forward


def forward(stream: Any, activation: Activation, pre: Any, output: Any) -> None:
    """cpu_forward or gpu_forward, by the stream's device."""
    if stream.device == "cpu":
        cpu_forward(activation, pre, output)
    else:  # pragma: no cover - GPU: a GPU stream
        gpu_forward(stream, activation, pre, output)


def backward(stream: Any, activation: Activation, pre: Any, output_grad: Any, pre_grad: Any) -> None:
    """cpu_backward or gpu_backward, by the stream's device."""
    if stream.device == "cpu":
        cpu_backward(activation, pre, output_grad, pre_grad)
    else:  # pragma: no cover - GPU: a GPU stream
        gpu_backward(stream, activation, pre, output_grad, pre_grad)
