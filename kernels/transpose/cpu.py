"""transpose on the CPU (NumPy): a copy of the input's permuted view into the output, shared out to
the threads (cpu.cpu_copy); backward the same from output_grad through the inverse permutation.

forward and backward run after the package's checks (cpu_forward_kernel, cpu_backward_kernel).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..runtime import cpu as cpu_runtime

if TYPE_CHECKING:
    from .attrs import TransposeAttrs


def forward_plan(state: Any, attrs: TransposeAttrs, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, input, output) on checked arrays, its copy chosen once (cpu.copy_plan)."""
    output = state.shapes["output_shape"]
    copy, permutation = cpu_runtime.copy_plan(output.numel * output.dtype.itemsize, threads), attrs.permutation
    return lambda state, input, output: copy(output, input.transpose(permutation))


def forward(attrs: TransposeAttrs, input: Any, output: Any) -> None:
    """output = input.transpose(permutation)."""
    cpu_runtime.cpu_copy(output, input.transpose(attrs.permutation))


def backward(attrs: TransposeAttrs, output_grad: Any, input_grad: Any) -> None:
    """input_grad = output_grad.transpose(inverse permutation) (None: skipped)."""
    if input_grad is not None:
        cpu_runtime.cpu_copy(input_grad, output_grad.transpose(attrs.inverse))
