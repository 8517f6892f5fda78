"""gradient_reduction on the CPU (NumPy): the sum left to right over parts of the output shared out to
the threads (cpu.cpu_parts), half dtypes in float32 rounded once; backward copies output_grad into each
gradient wanted (cpu.cpu_copy).

forward and backward run after the package's checks (cpu_forward_kernel, cpu_backward_kernel).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..runtime import core
from ..runtime import cpu as cpu_runtime


def _sum(output: np.ndarray, first: np.ndarray, *rest: np.ndarray) -> None:
    """output = first + rest[0] + ..., left to right; half dtypes in float32, rounded once."""
    if output.dtype in core.HALF_DTYPES:
        total = first.astype(np.float32)
        for term in rest:
            np.add(total, term, out=total)  # the term widened exactly, the sum rounded to float32
        output[...] = total
        return
    np.copyto(output, first)
    for term in rest:
        np.add(output, term, out=output)


def forward_plan(state: core.KernelState, attrs: Any, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, inputs, output) on checked arrays; cpu_parts' one call where the output is small."""
    output = state.shapes["output_shape"]
    if output.numel * output.dtype.itemsize < cpu_runtime.PARALLEL_MIN_BYTES:
        return lambda state, inputs, output: _sum(output, *inputs)
    return cpu_runtime.with_threads(lambda state, inputs, output: forward(inputs, output), threads)


def forward(inputs: Sequence[Any], output: Any) -> None:
    """output = inputs[0] + inputs[1] + ..., left to right."""
    cpu_runtime.cpu_parts(_sum, output, *inputs)


def backward(output_grad: Any, input_grads: Sequence[Any]) -> None:
    """input_grads[i] = output_grad for each one that is not None."""
    for input_grad in input_grads:
        if input_grad is not None:
            cpu_runtime.cpu_copy(input_grad, output_grad)
