"""element_binary on the GPU: the launches of element_binary.cu, worked out once per state
(and per gradients wanted) from its plan (plan.py). The arguments are checked, and the
call runs inside its stream (core.gpu_kernel), before anything here runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..runtime import core, gpu, gpu_paths
from .attrs import BinaryOpType
from .plan import WARP_SUM_CHUNKS, GpuPlan, GradPlan, gpu_plan

if TYPE_CHECKING:
    from .attrs import ElementBinaryAttrs, ElementBinaryState

# 16-byte loads and stores (`struct Vec` of element_binary.cu) where every pointer is aligned to them.
VECTOR_BYTES = 16

_KERNELS = ("binary_same", "binary_broadcast", "binary_rows", "binary_grad_along_rows", "binary_backward_same",
            "binary_sum_partials", "binary_sum_partials_warps")
# The gradient kernels also take the type they write: the gradient's own (T), or the compute type of
# the partial sums of a split reduction (float for the half types, where it differs from T).
_GRAD_KERNELS = ("binary_grad_rows", "binary_grad_warps")
# binary_grad_along_rows writes a gradient itself, in its own dtype, like the kernels of _KERNELS.
_DESTINATIONS = {t: sorted({t, "float" if t in gpu.HALF_TYPES else t}) for t in gpu.HALF_TYPES + gpu.FLOAT_TYPES}
# The op codes are BinaryOpType's values, reaching the source as -D options; so is the vector width.
DEFINES = {**{f"OP_{op.name}": op.value for op in BinaryOpType}, "EB_VECTOR_BYTES": VECTOR_BYTES}
# One module per index type: tensors of 2**31 elements or more are rare, and their 64-bit
# instantiations (64-bit division throughout) are compiled only when one turns up.
_CUDA = {index: gpu.CudaModule("element_binary.cu", [
    f"{kernel}<{t}, {index}>" for kernel in _KERNELS for t in gpu.HALF_TYPES + gpu.FLOAT_TYPES
] + [
    f"{kernel}<{t}, {d}, {index}>" for kernel in _GRAD_KERNELS for t in gpu.HALF_TYPES + gpu.FLOAT_TYPES
    for d in _DESTINATIONS[t]
], defines=DEFINES) for index in gpu.INDEX_TYPES}

_P = "element_binary"
gpu_paths.declare(_P, {
    "forward.same.vector": "binary_same, no broadcasting, every pointer 16-byte aligned: 16-byte vectors, then a tail",
    "forward.same.scalar": "binary_same, no broadcasting, some pointer not 16-byte aligned: one element at a time",
    "forward.broadcast": "binary_broadcast: a thread per output element, indices through the collapsed dims' strides",
    "forward.rows.vector": "binary_rows: rows of the innermost dim (at least ROWS_MIN_INNER), a row's offsets found "
                           "once, its elements in 16-byte vectors (row length a multiple of them, pointers aligned)",
    "forward.rows.scalar": "binary_rows: rows of the innermost dim, one element at a time (a row length no vector "
                           "divides, or some pointer not 16-byte aligned)",
    "backward.same.vector": "binary_backward_same, no broadcasting, every pointer 16-byte aligned: 16-byte vectors",
    "backward.same.scalar": "binary_backward_same, no broadcasting, some pointer not aligned: one element at a time",
    "backward.empty_sum": "an empty output: a broadcast operand's gradient is zeros (a memset on the stream)",
    "grad.rows": "binary_grad_rows: a thread per gradient element, looping over its broadcast positions",
    "grad.along_rows.vector": "binary_grad_along_rows: the gradient of a side broadcast along nothing, in rows of a "
                              "rows plan's innermost dim, in 16-byte vectors",
    "grad.along_rows.scalar": "binary_grad_along_rows: the same, one element at a time (no vector divides the row "
                              "length, or some pointer is not 16-byte aligned)",
    "grad.warps": "binary_grad_warps: a warp per gradient element (the innermost dim is reduced)",
    "grad.one_chunk": "the reduced positions in one chunk: the gradient written directly, no second pass",
    "grad.chunks": "the reduced positions split into chunks: partial sums, then a second pass",
    "sum_partials.threads": f"binary_sum_partials: a thread per gradient element (at most {WARP_SUM_CHUNKS} chunks)",
    "sum_partials.warps": f"binary_sum_partials_warps: a warp per gradient element (more than {WARP_SUM_CHUNKS} chunks)",
})
_FORWARD_SAME = (_P + ".forward.same.scalar", _P + ".forward.same.vector")  # by the alignment flag
_FORWARD_ROWS = (_P + ".forward.rows.scalar", _P + ".forward.rows.vector")
_BACKWARD_SAME = (_P + ".backward.same.scalar", _P + ".backward.same.vector")
_GRAD_ALONG_ROWS = (_P + ".grad.along_rows.scalar", _P + ".grad.along_rows.vector")

# (flag paths, launches) of a forward. The plain elementwise kernel and binary_rows take as their last argument
# the alignment flag each call picks: their flag paths (scalar, vector) and two PackedLaunches by the flag (a
# rows plan whose row length no vector divides has its flag-0 launch twice). binary_broadcast: (None, its launch).
ForwardLaunch = tuple[tuple[str, str] | None, Any]
# (launch, array slots, flag paths, the step's named GPU paths): a step with flag paths (its scalar and vector
# paths) has as its launch the pair of PackedLaunches by the alignment flag of its arrays, which each call
# takes (a pair whose two launches are one: flag 0 always, its scalar path).
BackwardStep = tuple[Any, tuple[int, ...], tuple[str, str] | None, tuple[str, ...]]


def _function(kernel: str, dtype: np.dtype, index: str, destination: np.dtype | None = None) -> Any:
    """A kernel's instantiation; the gradient kernels also name the dtype they write (destination)."""
    if destination is None:
        return _CUDA[index].function(f"{kernel}<{gpu.cuda_type(dtype)}, {index}>")
    return _CUDA[index].function(f"{kernel}<{gpu.cuda_type(dtype)}, {gpu.cuda_type(destination)}, {index}>")


def _plan(state: ElementBinaryState) -> GpuPlan:
    if state.plan is None:
        shapes = state.shapes
        state.plan = gpu_plan(shapes["lhs_shape"].dims, shapes["rhs_shape"].dims, shapes["output_shape"].dims)
    return state.plan


def _vector_ok(*arrays: Any) -> int:
    """1 where every array starts on a VECTOR_BYTES boundary, so vector loads and stores are legal; else 0."""
    bits = 0
    for a in arrays:
        bits |= a.data.ptr
    return int(bits & (VECTOR_BYTES - 1) == 0)


def _by_flag(flag_paths: tuple[str, str], launches: tuple[Any, Any], *arrays: Any) -> Any:
    """Of a pair of launches by the alignment flag, the one for `arrays`, its flag path reached (a pair whose
    two launches are one: flag 0, the scalar path, without looking at the addresses)."""
    flag = 0 if launches[1] is launches[0] else _vector_ok(*arrays)
    gpu_paths.reach(flag_paths[flag])
    return launches[flag]


def forward(stream: gpu.GpuStream, state: ElementBinaryState, attrs: ElementBinaryAttrs, lhs: Any, rhs: Any,
            output: Any) -> None:
    """output = lhs (op) rhs, one kernel enqueued on the stream."""
    launch = state.gpu_forward
    if launch is None:
        launch = state.gpu_forward = _forward_launch(state, attrs, output.dtype)
    if launch is None:
        return
    flag_paths, launches = launch
    if flag_paths is None:
        gpu_paths.reach("element_binary.forward.broadcast")
        launches(stream, lhs, rhs, output)
        return
    _by_flag(flag_paths, launches, lhs, rhs, output)(stream, lhs, rhs, output)


def _forward_launch(state: ElementBinaryState, attrs: ElementBinaryAttrs, dtype: np.dtype) -> ForwardLaunch | None:
    """The forward's launch, made once; None for an empty output."""
    plan = _plan(state)
    if plan.count == 0:
        return None
    scalar = np.int32 if plan.index == "int" else np.int64
    op = np.int32(attrs.op_type.value)
    if plan.same:
        per = VECTOR_BYTES // dtype.itemsize
        return _FORWARD_SAME, gpu.packed_by_flag(_function("binary_same", dtype, plan.index),
                                                 gpu.grid_for(plan.count, per_thread=per), gpu.BLOCK, 3,
                                                 (scalar(plan.count), op))
    if plan.rows:
        return _FORWARD_ROWS, _rows_launches("binary_rows", plan, dtype, 3, (
            scalar(plan.outer.count), scalar(plan.inner), op, np.int32(plan.sides_inner[0]),
            np.int32(plan.sides_inner[1])) + plan.outer.args)
    return None, gpu.packed(_function("binary_broadcast", dtype, plan.index), gpu.grid_for(plan.count), gpu.BLOCK, 3,
                            (scalar(plan.count), op) + plan.space.args)


def _partials(state: ElementBinaryState, plan: GpuPlan, dtype: np.dtype) -> Any:
    """The buffer of partial sums, made at first need and kept in the state."""
    if state.partials is None:
        size = max(g.chunks * g.kept.count if g.chunks > 1 else 0 for g in plan.grads)
        # In the compute dtype: a half gradient is rounded once, after the last partial sum.
        state.partials = gpu.device_empty((max(size, 1),), core.compute_dtype(dtype), state.device)
    return state.partials


# Slots of the arrays a backward launch takes, indexes into the call's
# (lhs, rhs, output_grad, lhs_grad, rhs_grad, partials).
_LHS, _RHS, _GRAD, _LHS_GRAD, _RHS_GRAD, _PARTIALS = range(6)


def backward(stream: gpu.GpuStream, state: ElementBinaryState, attrs: ElementBinaryAttrs, output_grad: Any,
             lhs: Any, lhs_grad: Any, rhs: Any, rhs_grad: Any) -> None:
    """Write lhs_grad and rhs_grad (those not None), reduced over broadcast dims without atomics."""
    want = (lhs_grad is not None and lhs_grad.size != 0, rhs_grad is not None and rhs_grad.size != 0)
    if not (want[0] or want[1]):
        return
    steps = state.gpu_backward.get(want)
    if steps is None:
        steps = state.gpu_backward[want] = _backward_steps(state, attrs, output_grad.dtype, want)
    if steps is None:  # an empty sum: the gradient of a broadcast operand is zero
        gpu_paths.reach("element_binary.backward.empty_sum")
        for side_grad in (lhs_grad, rhs_grad):
            if side_grad is not None and side_grad.size:
                gpu.cupy.cuda.runtime.memsetAsync(side_grad.data.ptr, 0, side_grad.nbytes, stream.ptr)
        return
    arrays = (lhs, rhs, output_grad, lhs_grad, rhs_grad, state.partials)
    for launch, slots, flag_paths, paths in steps:
        launched = [arrays[i] for i in slots]
        if flag_paths is not None:
            launch = _by_flag(flag_paths, launch, *launched)
        for path in paths:
            gpu_paths.reach(path)
        launch(stream, *launched)


def grad_paths(grad_plan_: GradPlan) -> tuple[str, ...]:
    """The named GPU paths (kernels.runtime.gpu_paths) of one broadcast operand's gradient: its kernel, whether
    the positions are chunked, and which second pass sums the chunks."""
    paths = [f"{_P}.grad.{grad_plan_.kind}", _P + (".grad.chunks" if grad_plan_.chunks > 1 else ".grad.one_chunk")]
    if grad_plan_.chunks > WARP_SUM_CHUNKS:
        paths.append(_P + ".sum_partials.warps")
    elif grad_plan_.chunks > 1:
        paths.append(_P + ".sum_partials.threads")
    return tuple(paths)


def _backward_steps(state: ElementBinaryState, attrs: ElementBinaryAttrs, dtype: np.dtype,
                    want: tuple[bool, bool]) -> list[BackwardStep] | None:
    """The backward's launches for the gradients wanted, made once. None where the output is empty."""
    plan = _plan(state)
    if plan.count == 0:
        return None
    op = attrs.op_type
    scalar = np.int32 if plan.index == "int" else np.int64
    # Which operand values the formulas read (ADD and SUB read none, MUL's lhs_grad only rhs, ...).
    need_lhs = op in (BinaryOpType.MAX, BinaryOpType.MIN) or (op in (BinaryOpType.MUL, BinaryOpType.DIV) and want[1])
    need_rhs = op in (BinaryOpType.MAX, BinaryOpType.MIN, BinaryOpType.DIV) or (op is BinaryOpType.MUL and want[0])
    lhs_slot = _LHS if need_lhs else _GRAD  # never read: any device array will do
    rhs_slot = _RHS if need_rhs else _GRAD
    if plan.same:
        per = VECTOR_BYTES // dtype.itemsize
        lhs_out = _LHS_GRAD if want[0] else _GRAD  # never written when not wanted
        rhs_out = _RHS_GRAD if want[1] else _GRAD
        slots = (lhs_slot, rhs_slot, _GRAD, lhs_out, rhs_out)
        return [(gpu.packed_by_flag(_function("binary_backward_same", dtype, plan.index),
                                    gpu.grid_for(plan.count, per_thread=per), gpu.BLOCK, len(slots),
                                    (scalar(plan.count), np.int32(op.value), np.int32(want[0]), np.int32(want[1]),
                                     np.int32(need_lhs), np.int32(need_rhs))), slots, _BACKWARD_SAME, ())]
    steps: list[BackwardStep] = []
    for side in (0, 1):
        if not want[side]:
            continue
        grad = _LHS_GRAD if side == 0 else _RHS_GRAD
        grad_plan_ = plan.grads[side]
        if plan.rows and not grad_plan_.reduced.sizes:  # broadcast along nothing: along rows, as the forward
            steps.append(_grad_along_rows(plan, dtype, scalar, op, side, need_lhs, need_rhs,
                                          (lhs_slot, rhs_slot, _GRAD, grad)))
            continue
        destination, written = grad, dtype
        if grad_plan_.chunks > 1:
            _partials(state, plan, dtype)
            destination, written = _PARTIALS, core.compute_dtype(dtype)
        kept_count = grad_plan_.kept.count
        tail = (np.int32(op.value), np.int32(side), np.int32(need_lhs), np.int32(need_rhs), scalar(kept_count),
                scalar(grad_plan_.reduced.count), scalar(grad_plan_.chunks),
                scalar(grad_plan_.chunk)) + grad_plan_.kept.args + grad_plan_.reduced.args
        slots = (lhs_slot, rhs_slot, _GRAD, destination)
        paths = grad_paths(grad_plan_)
        if grad_plan_.kind == "warps":
            warps = kept_count * grad_plan_.chunks
            grid = gpu.capped(-(-warps // (gpu.BLOCK // 32)), 65535)
            steps.append((gpu.packed(_function("binary_grad_warps", dtype, plan.index, written), grid, gpu.BLOCK,
                                     len(slots), tail), slots, None, paths))
        else:
            grid = (gpu.grid_for(kept_count), gpu.capped(grad_plan_.chunks, 65535))  # the kernel strides over chunks
            steps.append((gpu.packed(_function("binary_grad_rows", dtype, plan.index, written), grid, gpu.BLOCK,
                                     len(slots), tail), slots, None, paths))
        sum_tail = (scalar(kept_count), scalar(grad_plan_.chunks))
        if grad_plan_.chunks > WARP_SUM_CHUNKS:
            grid = gpu.capped(-(-kept_count // (gpu.BLOCK // 32)), 65535)
            steps.append((gpu.packed(_function("binary_sum_partials_warps", dtype, plan.index), grid, gpu.BLOCK, 2,
                                     sum_tail), (destination, grad), None, ()))
        elif grad_plan_.chunks > 1:
            steps.append((gpu.packed(_function("binary_sum_partials", dtype, plan.index), gpu.grid_for(kept_count),
                                     gpu.BLOCK, 2, sum_tail), (destination, grad), None, ()))
    return steps


def _rows_launches(kernel: str, plan: GpuPlan, dtype: np.dtype, arrays: int, scalars: tuple) -> tuple[Any, Any]:
    """The pair of PackedLaunches by the alignment flag of a kernel along a rows plan's rows (grid x over a
    row's elements, or its vectors where the row length is a multiple of them; y over the rows). Where no
    vector divides the row length, every row's vectors would start misaligned: the flag-0 launch twice."""
    per = VECTOR_BYTES // dtype.itemsize
    vectors = plan.inner % per == 0
    grid = (gpu.grid_for(plan.inner, per_thread=per if vectors else 1), gpu.capped(plan.outer.count, gpu.MAX_GRID_YZ))
    launches = gpu.packed_by_flag(_function(kernel, dtype, plan.index), grid, gpu.BLOCK, arrays, scalars)
    return launches if vectors else (launches[0], launches[0])


def _grad_along_rows(plan: GpuPlan, dtype: np.dtype, scalar: Any, op: BinaryOpType, side: int, need_lhs: bool,
                     need_rhs: bool, slots: tuple[int, ...]) -> BackwardStep:
    """The step of binary_grad_along_rows: the gradient of a side broadcast along nothing, in a rows plan."""
    tail = (scalar(plan.outer.count), scalar(plan.inner), np.int32(op.value), np.int32(side), np.int32(need_lhs),
            np.int32(need_rhs), np.int32(plan.sides_inner[0]), np.int32(plan.sides_inner[1])) + plan.outer.args
    return _rows_launches("binary_grad_along_rows", plan, dtype, len(slots), tail), slots, _GRAD_ALONG_ROWS, ()
