"""gradient_reduction on the GPU (gradient_reduction.cu): the sum left to right, up to 12 terms a
launch (the output the next launch's first term; half dtypes through a float32 carry), in 16-byte packs
where every address allows; backward one read of output_grad and up to 12 writes a launch. The launches
(gpu.PackedLaunch, the addresses given at each call) are kept in the state's "gpu_plans", by the term
count and the addresses' alignment.

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


def gpu_sum(stream, inputs: list[Any], output: Any, plans: dict) -> None:
    """output = inputs[0] + inputs[1] + ..., left to right, one launch per 12 inputs (checked arrays of one shape).

    `plans` (a state's) keeps the launches, by term count and the addresses' alignment, across calls."""
    bits = output.data.ptr
    for x in inputs:
        bits |= x.data.ptr
    key = ("sum", len(inputs), bits & 15 == 0)
    plan = plans.get(key)
    if plan is None:
        plan = plans[key] = _sum_plan(output, len(inputs), key[2])
    if plan is None:  # nothing to sum
        return
    launches, paths = plan
    for path in paths:
        gpu_paths.reach(path)
    if output.dtype in core.HALF_DTYPES:
        _gpu_sum_wide(stream, inputs, output, launches, plans)
        return
    pointers = [x.data.ptr for x in inputs]
    for launch, count in launches:
        # After the first launch the output holds the sum so far: it is the next launch's first term.
        batch, pointers = pointers[:count], pointers[count:]
        launch(stream, output, batch)
        if pointers:
            pointers = [output.data.ptr] + pointers


def _gpu_sum_wide(stream, inputs: list[Any], output: Any, launches: list, plans: dict) -> None:
    """The half-precision sum: float32 throughout, one launch per 12 inputs chained through a float32
    carry (made on first need, kept in `plans`), the output rounded once by the last launch."""
    carry = output  # never read nor written with a single launch
    if len(launches) > 1:
        gpu_paths.reach("gradient_reduction.sum.half_carry")
        carry = plans.get("carry")
        if carry is None or carry.size < output.size:
            carry = plans["carry"] = gpu.device_empty((output.size,), np.float32, output.device.id)
    for i, (launch, count) in enumerate(launches):
        launch(stream, output, carry, [x.data.ptr for x in inputs[i * MAX_POINTERS:i * MAX_POINTERS + count]])


def _sum_plan(output: Any, terms: int, aligned: bool) -> tuple | None:
    """(launches, paths) of the sum, or None for an empty tensor: each launch a gpu.PackedLaunch with the
    number of terms it takes. A float or integer sum's launches after the first take the output as their
    first term; a half sum's take 12 inputs each and chain through a float32 carry."""
    count = output.size
    if not count:
        return None
    dtype = output.dtype
    pack = 16 // dtype.itemsize if aligned else 1
    index = gpu.index_type(count + _GRID_SPAN)
    scalar = np.int32 if index == "int" else np.int64
    grid = gpu.grid_for(count // pack)
    paths = (f"{OP}.sum.{'packs' if aligned else 'scalars'}",)
    if terms > MAX_POINTERS:
        paths += (f"{OP}.sum.batches",)
    if dtype in core.HALF_DTYPES:
        kernel = _CUDA.function(f"gradient_reduction_sum_wide<{gpu.cuda_type(dtype)}, {index}, {pack}>")
        counts = [min(MAX_POINTERS, terms - start) for start in range(0, terms, MAX_POINTERS)]
        launches = [(gpu.PackedLaunch(kernel, grid, gpu.BLOCK, (
            gpu.ARRAY, gpu.ARRAY, scalar(count), _INT32[k], _INT32[int(i > 0)], _INT32[int(i < len(counts) - 1)],
            gpu.Addresses(k))), k) for i, k in enumerate(counts)]
        return launches, paths + (f"{OP}.sum.half",)
    kernel = _CUDA.function(f"gradient_reduction_sum<{_sum_type(dtype)}, {index}, {pack}>")
    counts, left = [], terms
    while left:  # as gpu_sum takes them: the output is one more term of every launch after the first
        counts.append(min(MAX_POINTERS, left))
        left -= counts[-1]
        left += 1 if left else 0
    launches = [(gpu.PackedLaunch(kernel, grid, gpu.BLOCK, (gpu.ARRAY, scalar(count), _INT32[k], gpu.Addresses(k))), k)
                for k in counts]
    return launches, paths + (f"{OP}.sum.{'float' if dtype.kind == 'f' else 'integer'}",)


# np.int32(k) for the pointer counts of a launch (0 to MAX_POINTERS), made once.
_INT32 = tuple(np.int32(k) for k in range(MAX_POINTERS + 1))


def gpu_fanout(stream, source: Any, targets: list[Any], plans: dict) -> None:
    """Each target = source: one read, up to 12 writes a launch, in the widest unit sizes and addresses allow.

    `plans` (a state's) keeps the launches, by target count and address alignment, across calls."""
    if not targets:
        return
    bits = source.data.ptr
    for t in targets:
        bits |= t.data.ptr
    key = ("fanout", len(targets), bits & 15)
    plan = plans.get(key)
    if plan is None:
        plan = plans[key] = _fanout_plan(source, len(targets), key[2])
    if plan is None:  # an empty tensor
        return
    launches, paths = plan
    for path in paths:
        gpu_paths.reach(path)
    for i, launch in enumerate(launches):
        launch(stream, source, [t.data.ptr for t in targets[i * MAX_POINTERS:(i + 1) * MAX_POINTERS]])


def _fanout_plan(source: Any, targets: int, misalignment: int) -> tuple | None:
    """(launches, paths) of the fanout to `targets` arrays, one gpu.PackedLaunch per 12, or None for an empty
    tensor. A unit divides every address iff it divides their OR (units are powers of two up to 16)."""
    if not source.size:
        return None
    unit = gpu.widest_unit(source.nbytes, misalignment)
    count = source.nbytes // unit
    index = gpu.index_type(count + _GRID_SPAN)
    scalar = np.int32 if index == "int" else np.int64
    kernel = _CUDA.function(f"gradient_reduction_fanout<{gpu.unit_type(unit)}, {index}>")
    launches = [gpu.PackedLaunch(kernel, gpu.grid_for(count), gpu.BLOCK, (
        gpu.ARRAY, scalar(count), _INT32[k], gpu.Addresses(k)))
        for k in (min(MAX_POINTERS, targets - start) for start in range(0, targets, MAX_POINTERS))]
    paths = (f"{OP}.fanout.unit{unit}",) + ((f"{OP}.fanout.batches",) if targets > MAX_POINTERS else ())
    return launches, paths


def forward(stream: Any, state: core.KernelState, inputs: list[Any], output: Any) -> None:
    """output = inputs[0] + inputs[1] + ..., left to right, one launch per 12 inputs, enqueued on the stream."""
    gpu_sum(stream, inputs, output, state.saved["gpu_plans"])


def backward(stream: Any, state: core.KernelState, output_grad: Any, input_grads: Sequence[Any]) -> None:
    """input_grads[i] = output_grad for each one that is not None: one read, up to 12 writes a launch."""
    gpu_fanout(stream, output_grad, [g for g in input_grads if g is not None], state.saved["gpu_plans"])
