"""reshape on the GPU: both tensors are C-contiguous, so each direction is one device-to-device
copy enqueued on the stream.

forward and backward run after the package's checks (gpu_forward_kernel, gpu_backward_kernel,
which run inside their stream).
"""

from __future__ import annotations

from typing import Any

from ..runtime import gpu, gpu_paths
from .attrs import OP

gpu_paths.declare(OP, {"copy": "forward and backward: one cudaMemcpyAsync of the whole tensor on the stream"})


def forward(stream: Any, input: Any, output: Any) -> None:
    """output = input, a device-to-device copy enqueued on the stream."""
    gpu_paths.reach("reshape.copy")
    gpu.copy_async(stream, output, input)


def backward(stream: Any, output_grad: Any, input_grad: Any) -> None:
    """input_grad = output_grad, a device-to-device copy enqueued on the stream (None: skipped)."""
    if input_grad is not None:
        gpu_paths.reach("reshape.copy")
        gpu.copy_async(stream, input_grad, output_grad)
