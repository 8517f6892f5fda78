"""gradient_reduction on the GPU (gradient_reduction.cu): the sum left to right, up to 12 terms a
launch (the output the next launch's first term; half dtypes through a float32 carry), in 16-byte packs
where every address allows; backward one read of output_grad and up to 12 writes a launch. The launch
plans are kept in the state's "gpu_plans", by the addresses' alignment.

forward and backward run after the package's checks (gpu_forward_kernel, gpu_backward_kernel,
which run inside their stream). Everything is enqueued on the given stream.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..runtime import core, gpu, gpu_paths
from .attrs import OP

MAX_POINTERS = gpu.MAX_RANK  # pointers per launch: as many as one `struct Ints` holds
_GRID_SPAN = 65536 * gpu.BLOCK  # the most threads gpu.grid_for gives: index arithmetic must hold it too
# Integers are summed in the unsigned type of their width (same bits, defined wrap-around).
_SUM_TYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


def _sum_type(dtype: np.dtype) -> str:
    return gpu.cuda_type(dtype) if dtype.kind == "f" else _SUM_TYPES[dtype.itemsize]


_CUDA = gpu.CudaModule("gradient_reduction.cu", [
    f"gradient_reduction_sum_wide<{type_name}, {index}, {pack}>"
    for type_name in gpu.HALF_TYPES for index in gpu.INDEX_TYPES for pack in (1, 8)
] + [
    f"gradient_reduction_sum<{type_name}, {index}, {pack}>"
    for type_name, size in [("float", 4), ("double", 8)] + [(name, size) for size, name in _SUM_TYPES.items()]
    for index in gpu.INDEX_TYPES for pack in sorted({1, 16 // size})
] + [
    f"gradient_reduction_fanout<{bits}, {index}>" for bits in gpu.BITS_TYPES for index in gpu.INDEX_TYPES
])


gpu_paths.declare(OP, {
    "sum.packs": "gradient_reduction_sum<T, I, 16 / sizeof(T)>: every pointer 16-byte aligned, 16-byte packs",
    "sum.scalars": "gradient_reduction_sum<T, I, 1>: some pointer not 16-byte aligned, one element at a time",
    "sum.float": "the sum in the float type itself (float32, float64)",
    "sum.integer": "an integer sum in the unsigned type of its width (wrap-around defined)",
    "sum.half": "gradient_reduction_sum_wide<T, I, V>: float16/bfloat16 summed in float32, rounded once",
    "sum.half_carry": "a half sum of more than 12 terms: a float32 carry between the launches",
    "sum.batches": "more than 12 terms: one launch per 12, the output the next launch's first term",
    "fanout.batches": "more than 12 gradients wanted: one launch per 12",
    **{f"fanout.unit{unit}": f"gradient_reduction_fanout moving {unit}-byte units" for unit in (16, 8, 4, 2, 1)},
})


def gpu_sum(stream, inputs: list[Any], output: Any, plans: dict | None = None) -> None:
    """output = inputs[0] + inputs[1] + ..., left to right, one launch per 12 inputs (checked arrays of one shape).

    `plans` (a state's) keeps the launch plan, by the addresses' alignment, across calls."""
    bits = output.data.ptr
    for x in inputs:
        bits |= x.data.ptr
    key = ("sum", len(inputs), bits & 15 == 0)
    plan = None if plans is None else plans.get(key)
    if plan is None:
        plan = _sum_plan(output, len(inputs), key[2])
        if plans is not None:
            plans[key] = plan
    if plan is None:  # nothing to sum
        return
    kernel, grid, count, paths = plan
    for path in paths:
        gpu_paths.reach(path)
    if len(inputs) > MAX_POINTERS:
        gpu_paths.reach("gradient_reduction.sum.batches")
    if output.dtype in core.HALF_DTYPES:
        _gpu_sum_wide(stream, inputs, output, plan, plans)
        return
    pointers = [x.data.ptr for x in inputs]
    while pointers:
        # After the first launch the output holds the sum so far: it is the next launch's first term.
        batch, pointers = pointers[:MAX_POINTERS], pointers[MAX_POINTERS:]
        gpu.launch(stream, kernel, grid, gpu.BLOCK, (output, count, _INT32[len(batch)], gpu.ints_arg(batch)))
        if pointers:
            pointers = [output.data.ptr] + pointers


def _gpu_sum_wide(stream, inputs: list[Any], output: Any, plan: tuple, plans: dict | None) -> None:
    """The half-precision sum: float32 throughout, one launch per 12 inputs chained through a float32
    carry (made on first need, kept in `plans`), the output rounded once by the last launch."""
    kernel, grid, count, _ = plan
    batches = [inputs[i:i + MAX_POINTERS] for i in range(0, len(inputs), MAX_POINTERS)]
    carry = output  # never read nor written with a single launch
    if len(batches) > 1:
        gpu_paths.reach("gradient_reduction.sum.half_carry")
        carry = None if plans is None else plans.get("carry")
        if carry is None or carry.size < output.size:
            carry = gpu.device_empty((output.size,), np.float32, output.device.id)
            if plans is not None:
                plans["carry"] = carry
    for i, batch in enumerate(batches):
        gpu.launch(stream, kernel, grid, gpu.BLOCK,
                   (output, carry, count, _INT32[len(batch)], _INT32[int(i > 0)], _INT32[int(i < len(batches) - 1)],
                    gpu.ints_arg([x.data.ptr for x in batch])))


def _sum_plan(output: Any, terms: int, aligned: bool) -> tuple | None:
    """(kernel, grid, count argument, paths) of the sum, or None for an empty tensor."""
    count = output.size
    if not count:
        return None
    dtype = output.dtype
    pack = 16 // dtype.itemsize if aligned else 1
    index = gpu.index_type(count + _GRID_SPAN)
    scalar = np.int32 if index == "int" else np.int64
    if dtype in core.HALF_DTYPES:
        kernel = _CUDA.function(f"gradient_reduction_sum_wide<{gpu.cuda_type(dtype)}, {index}, {pack}>")
        kind = "half"
    else:
        kernel = _CUDA.function(f"gradient_reduction_sum<{_sum_type(dtype)}, {index}, {pack}>")
        kind = "float" if dtype.kind == "f" else "integer"
    paths = (f"{OP}.sum.{'packs' if aligned else 'scalars'}", f"{OP}.sum.{kind}")
    return kernel, gpu.grid_for(count // pack), scalar(count), paths


# np.int32(k) for the pointer counts of a launch (1 to MAX_POINTERS), made once.
_INT32 = tuple(np.int32(k) for k in range(MAX_POINTERS + 1))


def gpu_fanout(stream, source: Any, targets: list[Any], plans: dict | None = None) -> None:
    """Each target = source: one read, up to 12 writes a launch, in the widest unit sizes and addresses allow.

    `plans` (a state's) keeps the launch plan, by target count and address alignment, across calls."""
    if not targets:
        return
    bits = source.data.ptr
    for t in targets:
        bits |= t.data.ptr
    key = ("fanout", len(targets), bits & 15)
    plan = None if plans is None else plans.get(key)
    if plan is None:
        plan = _fanout_plan(source, key[2])
        if plans is not None:
            plans[key] = plan
    if plan is None:  # an empty tensor
        return
    kernel, grid, count, path = plan
    gpu_paths.reach(path)
    if len(targets) > MAX_POINTERS:
        gpu_paths.reach("gradient_reduction.fanout.batches")
    for start in range(0, len(targets), MAX_POINTERS):
        batch = targets[start:start + MAX_POINTERS]
        gpu.launch(stream, kernel, grid, gpu.BLOCK,
                   (source, count, _INT32[len(batch)], gpu.ints_arg([t.data.ptr for t in batch])))


def _fanout_plan(source: Any, misalignment: int) -> tuple | None:
    """(kernel, grid, count argument, path) of the fanout, or None for an empty tensor. A unit divides
    every address iff it divides their OR (units are powers of two up to 16)."""
    if not source.size:
        return None
    unit = gpu.widest_unit(source.nbytes, misalignment)
    count = source.nbytes // unit
    index = gpu.index_type(count + _GRID_SPAN)
    scalar = np.int32 if index == "int" else np.int64
    kernel = _CUDA.function(f"gradient_reduction_fanout<{gpu.unit_type(unit)}, {index}>")
    return kernel, gpu.grid_for(count), scalar(count), f"{OP}.fanout.unit{unit}"


def forward(stream: Any, state: core.KernelState, inputs: list[Any], output: Any) -> None:
    """output = inputs[0] + inputs[1] + ..., left to right, one launch per 12 inputs, enqueued on the stream."""
    gpu_sum(stream, inputs, output, state.saved["gpu_plans"])


def backward(stream: Any, state: core.KernelState, output_grad: Any, input_grads: Sequence[Any]) -> None:
    """input_grads[i] = output_grad for each one that is not None: one read, up to 12 writes a launch."""
    gpu_fanout(stream, output_grad, [g for g in input_grads if g is not None], state.saved["gpu_plans"])
