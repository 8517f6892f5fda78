"""split on the CPU (NumPy): concat's cut and join (kernels/concat/cpu.py) on the state's PieceLayout, the
other way round from concat's: the forward cuts, the backward joins.

forward and backward run after the package's checks (cpu_forward_kernel, cpu_backward_kernel).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..concat.cpu import cpu_cut, cpu_join, move_plan

if TYPE_CHECKING:
    from ..runtime import core


def forward_plan(state: core.KernelState, attrs: Any, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, input, outputs) on checked arrays."""
    move = move_plan(state.saved["layout"], state.shapes["input_shape"], threads, False)
    return lambda state, input, outputs: move(input, outputs)


def forward(state: core.KernelState, input: Any, outputs: Sequence[Any]) -> None:
    """outputs[i] = input's i-th slice along the axis."""
    cpu_cut(state.saved["layout"], input, outputs)


def backward(state: core.KernelState, output_grads: Sequence[Any], input_grad: Any) -> None:
    """input_grad = concatenate(output_grads, axis) (None: skipped)."""
    if input_grad is not None:
        cpu_join(state.saved["layout"], output_grads, input_grad)
