"""The activations on the GPU: the codes activation.cuh gets as -D options, and the fused activations'
own launches of activation.cu (conv_2d and pool_2d), planned once and kept."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import gpu, gpu_paths
from ..runtime.core import AttrsError, fail
from .attrs import NONE_CODE, Activation
from .plan import plan_paths

# The codes reach activation.cuh (included by every op with a fused activation) as -D options.
gpu.SHARED_DEFINES.update({"KERNELS_ACTIVATION_NONE": NONE_CODE,
                           **{f"KERNELS_ACTIVATION_{a.name}": a.value for a in Activation}})

_CUDA = gpu.CudaModule("activation.cu", [
    f"activation_{direction}_kernel<{cuda_type}, {member.value}>"
    for direction in ("forward", "backward") for cuda_type in gpu.HALF_TYPES + gpu.FLOAT_TYPES for member in Activation
])


def _gpu_function(direction: str, activation: Activation, dtype: np.dtype, device: int | None = None) -> Any:
    if not isinstance(activation, Activation):
        raise fail(AttrsError, "activation", "activation", "an Activation", repr(activation))
    return _CUDA.function(f"activation_{direction}_kernel<{gpu.cuda_type(dtype)}, {activation.value}>", device)


# The fused activations' own launches (conv_2d and pool_2d; batch_norm fuses them into its kernels).
gpu_paths.declare("activation", {
    **{f"{direction}.{activation.name.lower()}": f"activation_{direction}_kernel<T, {activation.name}>"
       for direction in ("forward", "backward") for activation in Activation},
    **{f"{direction}.packs": f"{direction}, every pointer 16-byte aligned: 16-byte packs"
       for direction in ("forward", "backward")},
    **{f"{direction}.scalars": f"{direction}, some pointer not 16-byte aligned: one element at a time"
       for direction in ("forward", "backward")},
})

# Launch plans by (direction, activation, dtype, count, aligned, device, simulated device): (PackedLaunch,
# paths), made once, so that a call only looks one up. Bounded: cleared past
# _PLANS_LIMIT. The simulated device (gpu.simulated_device) is in the key: its grids are not the device's.
_PLANS: dict[tuple, tuple] = {}
_PLANS_LIMIT = 4096


def _plan(stream: Any, direction: str, activation: Activation, dtype: np.dtype, count: int, aligned: bool) -> tuple:
    if not isinstance(activation, Activation):
        raise fail(AttrsError, "activation", "activation", "an Activation", repr(activation))
    key = (direction, activation, dtype, count, aligned, stream.device, gpu.simulated())
    plan = _PLANS.get(key)
    if plan is None:
        # 16-byte aligned arrays: the kernels move 16-byte packs, 16 // itemsize elements a thread.
        function = _gpu_function(direction, activation, dtype, stream.device)
        per_thread = 16 // dtype.itemsize if aligned else 1
        plan = (gpu.packed(function, gpu.grid_for(count, per_thread=per_thread), gpu.BLOCK,
                           2 if direction == "forward" else 3, (np.int64(count), np.int32(aligned))),
                plan_paths(direction, activation, aligned))
        if len(_PLANS) >= _PLANS_LIMIT:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def gpu_forward(stream: Any, activation: Activation, pre: Any, output: Any) -> None:
    """output = f(pre) on contiguous CuPy arrays of one float dtype and shape, enqueued on the stream;
    output may be pre itself."""
    count = pre.size
    if count:
        launch, paths = _plan(stream, "forward", activation, pre.dtype, count, (pre.data.ptr | output.data.ptr) & 15 == 0)
        gpu_paths.reach(paths[0])
        gpu_paths.reach(paths[1])
        launch(stream, pre, output)


def gpu_backward(stream: Any, activation: Activation, pre: Any, output_grad: Any, pre_grad: Any) -> None:
    """pre_grad = output_grad * f'(pre), enqueued on the stream; output_grad is only read."""
    count = pre.size
    if count:
        launch, paths = _plan(stream, "backward", activation, pre.dtype, count,
                              (pre.data.ptr | output_grad.data.ptr | pre_grad.data.ptr) & 15 == 0)
        gpu_paths.reach(paths[0])
        gpu_paths.reach(paths[1])
        launch(stream, pre, output_grad, pre_grad)
