"""top_k on the GPU: the launches of top_k.cu, planned once per state (plan.gpu_plan) and kept in it,
with the candidates' scratch (where k is past shared memory) made on the state's first call, so that
a later call allocates nothing and can be captured in a CUDA graph. The arguments are checked, and
the call runs inside its stream (core.gpu_kernel), before anything here runs."""

from __future__ import annotations

import numpy as np

from ..runtime import core, gpu, gpu_paths
from .attrs import OP, TopKState
from .plan import DEFINES, GpuPlan, gpu_plan

_TYPES = gpu.HALF_TYPES + gpu.FLOAT_TYPES
_CUDA = gpu.CudaModule("top_k.cu", [
    f"top_k_forward<{t}, {shared}>" for t in _TYPES for shared in ("true", "false")
] + [f"top_k_backward{sorted_}<{t}>" for t in _TYPES for sorted_ in ("", "_sorted")], defines=DEFINES)

gpu_paths.declare(OP, {
    "forward.shared": "top_k_forward<T, true>: a block a row, its k candidates in shared memory (k <= 1024)",
    "forward.scratch": ("top_k_forward<T, false>: a block a row, its k candidates in the state's global scratch, "
                        "ranked by a stable radix sort"),
    "forward.keys_cached": "top_k_forward: a row's keys read once into dynamic shared memory (plan.TOP_K_CACHE_BYTES)",
    "forward.keys_global": "top_k_forward: a row too long for the keys' cache, read from global memory on each pass",
    "forward.sort_shared": "top_k_forward<T, false>: the radix sort's two buffers in the launch's dynamic shared memory",
    "forward.sort_global": "top_k_forward<T, false>: a k too large for shared memory, the radix sort in the scratch",
    "backward.gather": "top_k_backward<T>: a block a chunk of a row, each element gathering its gradients in order",
    "backward.sorted": ("top_k_backward_sorted<T>: a block a row, its (index, j) pairs sorted by index in shared "
                        "memory, each run summed in order (k past the shared candidates)"),
})

_NULL = np.uint64(0)  # a null pointer argument (no scratch)


def _plan(state: TopKState) -> GpuPlan:
    if state.plan is None:
        shape = state.shapes["input_shape"]
        state.plan = gpu_plan(shape.dims, state.attrs.k, shape.dtype, gpu.shared_memory_optin(state.device))
    return state.plan


def forward(stream: gpu.GpuStream, state: TopKState, input: core.Array, values: core.Array,
            indices: core.Array) -> None:
    """values, indices = the k largest of each row, enqueued on the stream."""
    plan = _plan(state)
    if plan.rows == 0:
        return
    keys, index = _NULL, _NULL
    if not plan.shared:
        if state.scratch_keys is None:  # the state's first call: never again, so a captured call allocates nothing
            state.scratch_keys = gpu.device_empty((plan.scratch,), plan.key_dtype, state.device)
            state.scratch_index = gpu.device_empty((plan.scratch,), np.int32, state.device)
        keys, index = state.scratch_keys, state.scratch_index
    for path in plan.paths:
        gpu_paths.reach(path)
    gpu.launch(stream, _CUDA.function(plan.forward), plan.grid, plan.block, (
        input, values, indices, keys, index, np.int64(plan.rows), np.int32(plan.n), np.int32(plan.k),
        np.int32(plan.cache_bytes > 0), np.int32(plan.sort_bytes > 0)), shared_mem=plan.shared_mem)


def backward(stream: gpu.GpuStream, state: TopKState, values_grad: core.Array, indices: core.Array,
             input_grad: core.Array | None) -> None:
    """input_grad = values_grad gathered back to the selected positions (0 elsewhere), enqueued on the stream."""
    if input_grad is None or input_grad.size == 0:
        return
    plan = _plan(state)
    gpu_paths.reach(plan.backward_path)
    gpu.launch(stream, _CUDA.function(plan.backward), plan.backward_grid, plan.block, (
        values_grad, indices, input_grad, np.int64(plan.rows), np.int32(plan.n), np.int32(plan.k)),
        shared_mem=plan.backward_shared_mem)

