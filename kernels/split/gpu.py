"""split on the GPU: concat's cut and join (kernels/concat/gpu.py, whose named paths they take) on the
state's PieceLayout, the other way round from concat's: the forward cuts, the backward joins.

forward and backward run after the package's checks (gpu_forward_kernel, gpu_backward_kernel,
which run inside their stream). Everything is enqueued on the given stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..concat.gpu import gpu_cut, gpu_join

if TYPE_CHECKING:
    from ..runtime import core


def forward(stream: Any, state: core.KernelState, input: Any, outputs: Sequence[Any]) -> None:
    """outputs[i] = input's i-th slice, one launch per 12 outputs, enqueued on the stream."""
    gpu_cut(stream, state.saved["layout"], input, outputs)


def backward(stream: Any, state: core.KernelState, output_grads: Sequence[Any], input_grad: Any) -> None:
    """input_grad = concatenate(output_grads, axis) (None: skipped), enqueued on the stream."""
    if input_grad is not None:
        gpu_join(stream, state.saved["layout"], output_grads, input_grad)
