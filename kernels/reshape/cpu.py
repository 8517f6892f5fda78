"""reshape on the CPU (NumPy): a copy of the input into the output under the output's dims, shared out
to the threads (cpu.cpu_copy); backward the same from output_grad into input_grad.

forward and backward run after the package's checks (cpu_forward_kernel, cpu_backward_kernel).
"""

from __future__ import annotations

from typing import Any

from ..runtime import cpu as cpu_runtime


def forward_plan(state: Any, attrs: Any, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, input, output) on checked arrays, its copy chosen once (cpu.copy_plan)."""
    output = state.shapes["output_shape"]
    copy, dims = cpu_runtime.copy_plan(output.numel * output.dtype.itemsize, threads), output.dims
    return lambda state, input, output: copy(output, input.reshape(dims))


def forward(input: Any, output: Any) -> None:
    """output = input.reshape(output dims), copied."""
    cpu_runtime.cpu_copy(output, input.reshape(output.shape))


def backward(output_grad: Any, input_grad: Any) -> None:
    """input_grad = output_grad.reshape(input dims), copied (None: skipped)."""
    if input_grad is not None:
        cpu_runtime.cpu_copy(input_grad, output_grad.reshape(input_grad.shape))
