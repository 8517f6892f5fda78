"""element_binary: output = lhs (op) rhs with NumPy broadcasting, for ADD, SUB, MUL, DIV, MAX, MIN.

Broadcasting follows NumPy (and torch): shapes are right-aligned, and a dim of size 1
(or a missing leading dim) stretches to the other side's size. `output_shape` must be
the broadcast shape. float32 and float64 only: integer arithmetic (integer division,
gradients) has no meaning a detector's training needs.

Backward follows torch's autograd formulas (derivatives.yaml) in torch's order of
operations, then sums each gradient over the dims its operand was broadcast along:

- ADD: lhs_grad = g, rhs_grad = g;  SUB: lhs_grad = g, rhs_grad = -g
- MUL: lhs_grad = g * rhs, rhs_grad = g * lhs
- DIV: lhs_grad = g / rhs, rhs_grad = -g * ((lhs / rhs) / rhs)   (torch's exact order, not g*lhs/rhs^2)
- MAX (torch.maximum): where lhs == rhs each side gets g / 2; elsewhere the larger side gets g and the
  other 0. Where either is NaN (the output is NaN), both sides get g, as in torch.
- MIN (torch.minimum): the same with the smaller side.

Forward MAX/MIN propagate NaN and, on a tie of +0 and -0, return lhs (torch's choice).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import core, cpu, gpu
from .core import FLOAT_DTYPES, ShapeError, TensorShape, fail

OP = "element_binary"


class BinaryOpType(enum.Enum):
    """The binary ops; the values are the op codes of element_binary.cu."""

    ADD = 0
    SUB = 1
    MUL = 2
    DIV = 3
    MAX = 4
    MIN = 5


@dataclass(frozen=True)
class ElementBinaryAttrs:
    op_type: BinaryOpType

    def __post_init__(self) -> None:
        core.set_attr(self, "op_type", core.attr_enum(OP, "op_type", self.op_type, BinaryOpType))


def broadcast_dims(lhs_dims: tuple[int, ...], rhs_dims: tuple[int, ...]) -> tuple[int, ...] | None:
    """The NumPy broadcast of two shapes, or None when they do not broadcast."""
    rank = max(len(lhs_dims), len(rhs_dims))
    lhs = (1,) * (rank - len(lhs_dims)) + tuple(lhs_dims)
    rhs = (1,) * (rank - len(rhs_dims)) + tuple(rhs_dims)
    out = []
    for a, b in zip(lhs, rhs):
        if a != b and a != 1 and b != 1:
            return None
        out.append(b if a == 1 else a)
    return tuple(out)


def init_kernel(handle: Any, attrs: ElementBinaryAttrs, lhs_shape: TensorShape, rhs_shape: TensorShape,
                output_shape: TensorShape) -> core.KernelState:
    """Check that lhs and rhs broadcast to output_shape, all of one float dtype, and record the shapes."""
    state = core.make_state(OP, handle, attrs, ElementBinaryAttrs, lhs_shape=lhs_shape, rhs_shape=rhs_shape,
                            output_shape=output_shape)
    core.check_dtype(OP, "lhs_shape", lhs_shape, FLOAT_DTYPES)
    core.check_same_dtype(OP, "rhs_shape", rhs_shape, lhs_shape, "lhs_shape")
    core.check_same_dtype(OP, "output_shape", output_shape, lhs_shape, "lhs_shape")
    dims = broadcast_dims(lhs_shape.dims, rhs_shape.dims)
    if dims is None:
        raise fail(ShapeError, OP, "rhs_shape", f"dims that broadcast with lhs_shape {lhs_shape.dims}", rhs_shape.dims)
    core.check_dims(OP, "output_shape", output_shape, dims)
    return state


def _needs_values(op_type: BinaryOpType) -> bool:
    """Whether backward reads lhs and rhs (ADD and SUB need only output_grad)."""
    return op_type not in (BinaryOpType.ADD, BinaryOpType.SUB)


def _check_forward(stream, handle, state, attrs, lhs, rhs, output) -> None:
    core.check_call(OP, stream, handle, state, attrs, [
        ("lhs", lhs, state.shapes["lhs_shape"], True),
        ("rhs", rhs, state.shapes["rhs_shape"], True),
        ("output", output, state.shapes["output_shape"], True),
    ])


def _check_backward(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad) -> None:
    values = _needs_values(attrs.op_type) if isinstance(attrs, ElementBinaryAttrs) else False
    core.check_call(OP, stream, handle, state, attrs, [
        ("output", output, state.shapes["output_shape"], False),
        ("output_grad", output_grad, state.shapes["output_shape"], True),
        ("lhs", lhs, state.shapes["lhs_shape"], values),
        ("lhs_grad", lhs_grad, state.shapes["lhs_shape"], False),
        ("rhs", rhs, state.shapes["rhs_shape"], values),
        ("rhs_grad", rhs_grad, state.shapes["rhs_shape"], False),
    ])


# --------------------------------------------------------------------------- CPU


_CPU_PARALLEL_MIN = 1 << 16  # outputs below which one thread does the whole call


def _cpu_elementwise(function: Any, output: np.ndarray, *operands: np.ndarray) -> None:
    """function(*operands, out=output) with the operands broadcast to the output, the output cut along
    its first axis at least as long as there are cores and the parts shared out to them
    (cpu.cpu_parallel): elementwise, so every element gets the same arithmetic as in one call."""
    shape = output.shape
    views = [np.broadcast_to(operand, shape) for operand in operands]
    threads = cpu.cpu_threads()
    axis = next((i for i, size in enumerate(shape) if size >= threads), None)

    def run(first: int, last: int) -> None:
        index = (slice(None),) * axis + (slice(first, last),)
        with np.errstate(all="ignore"):  # IEEE results (inf, NaN) as torch gives them, without warnings
            function(*(view[index] for view in views), out=output[index])

    if axis is None or threads < 2 or output.size < _CPU_PARALLEL_MIN:
        with np.errstate(all="ignore"):
            function(*views, out=output)
        return
    cpu.cpu_parallel(run, shape[axis])


def _copy(source: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, source)


def cpu_forward_kernel(stream, handle, state, attrs, lhs, rhs, output) -> None:
    """output = lhs (op) rhs, broadcast by NumPy."""
    _check_forward(stream, handle, state, attrs, lhs, rhs, output)
    op = attrs.op_type
    if op is BinaryOpType.ADD:
        _cpu_elementwise(np.add, output, lhs, rhs)
    elif op is BinaryOpType.SUB:
        _cpu_elementwise(np.subtract, output, lhs, rhs)
    elif op is BinaryOpType.MUL:
        _cpu_elementwise(np.multiply, output, lhs, rhs)
    elif op is BinaryOpType.DIV:
        _cpu_elementwise(np.divide, output, lhs, rhs)
    elif op is BinaryOpType.MAX:
        _cpu_elementwise(np.maximum, output, rhs, lhs)  # NumPy returns its second argument on a tie: lhs, like torch
    else:
        _cpu_elementwise(np.minimum, output, rhs, lhs)


def _sum_to(full: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    """Sum a tensor of the output's dims over the dims an operand of `dims` was broadcast along."""
    lead = full.ndim - len(dims)
    axes = tuple(range(lead)) + tuple(lead + d for d, size in enumerate(dims) if size == 1 and full.shape[lead + d] != 1)
    if not axes:
        return full
    return np.sum(full, axis=axes, keepdims=True).reshape(dims)


def _cpu_grad(op: BinaryOpType, side: int, lhs, rhs, output_grad) -> np.ndarray:
    """The gradient each output element sends to one side (0 lhs, 1 rhs), at the output's dims."""
    g = output_grad
    if op is BinaryOpType.ADD:
        return g
    if op is BinaryOpType.SUB:
        return g if side == 0 else np.negative(g)
    if op is BinaryOpType.MUL:
        return g * (rhs if side == 0 else lhs)
    if op is BinaryOpType.DIV:
        return g / rhs if side == 0 else np.negative(g) * ((lhs / rhs) / rhs)
    # MAX/MIN: torch's where(lhs == rhs, g / 2, g).masked_fill_(this side loses, 0).
    loses = (lhs < rhs) if (op is BinaryOpType.MAX) == (side == 0) else (lhs > rhs)
    return np.where(lhs == rhs, g * g.dtype.type(0.5), np.where(loses, g.dtype.type(0), g))


_DIRECT_GRADS = {  # op: side, lhs, rhs -> (function(g, *operands, out=...), operands), as _cpu_grad computes it
    BinaryOpType.ADD: lambda side, lhs, rhs: (_copy, ()),
    BinaryOpType.SUB: lambda side, lhs, rhs: ((_copy, ()) if side == 0 else (np.negative, ())),
    BinaryOpType.MUL: lambda side, lhs, rhs: (np.multiply, (rhs if side == 0 else lhs,)),
}


def cpu_backward_kernel(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad) -> None:
    """Write lhs_grad and rhs_grad (those not None), each summed over its broadcast dims."""
    _check_backward(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad)
    op = attrs.op_type
    with np.errstate(all="ignore"):
        for side, grad in ((0, lhs_grad), (1, rhs_grad)):
            if grad is None:
                continue
            if grad.shape == output_grad.shape and op in _DIRECT_GRADS:
                # Nothing to sum: _cpu_grad's one operation, written straight into grad.
                function, operands = _DIRECT_GRADS[op](side, lhs, rhs)
                _cpu_elementwise(function, grad, output_grad, *operands)
                continue
            full = _cpu_grad(attrs.op_type, side, lhs, rhs, output_grad)
            np.copyto(grad, _sum_to(np.broadcast_to(full, output_grad.shape), grad.shape))


# --------------------------------------------------------------------------- GPU plans (pure Python, no device)

# Reductions are split into chunks summed in a second pass, so that a gradient with
# few elements and many broadcast positions still fills the device. The split depends
# on the shapes only (never on the device), so every GPU gives the same bits.
TARGET_THREADS = 262144   # about 132 SMs x 2048 resident threads
TARGET_WARPS = TARGET_THREADS // 32
MIN_PER_THREAD = 32       # reduced positions one thread sums at least, per chunk ('rows')
MIN_PER_WARP = 32 * 16    # reduced positions one warp sums at least, per chunk ('warps')
MAX_CHUNKS = 1024
WARP_SUM_CHUNKS = 8       # more chunks than this: the second pass takes a warp per gradient element


def _c_strides(dims: list[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(dims):
        strides.append(step)
        step *= size
    return strides[::-1]


def collapse(out_dims: tuple[int, ...], lhs_dims: tuple[int, ...], rhs_dims: tuple[int, ...]
             ) -> tuple[list[int], list[int], list[int]]:
    """The output's dims without size-1 dims, adjacent dims merged where lhs, rhs and output all
    allow it, and the lhs and rhs strides of each (0 where that side is broadcast)."""
    rank = len(out_dims)
    padded = []
    for dims in (lhs_dims, rhs_dims):
        full = [1] * (rank - len(dims)) + list(dims)
        padded.append([0 if size == 1 else stride for size, stride in zip(full, _c_strides(full))])
    sizes: list[int] = []
    lhs_strides: list[int] = []
    rhs_strides: list[int] = []
    for d in range(rank):
        size, ls, rs = out_dims[d], padded[0][d], padded[1][d]
        if size == 1:
            continue
        if sizes and lhs_strides[-1] == ls * size and rhs_strides[-1] == rs * size:
            sizes[-1] *= size  # the output is contiguous, so its strides always merge
            lhs_strides[-1], rhs_strides[-1] = ls, rs
        else:
            sizes.append(size)
            lhs_strides.append(ls)
            rhs_strides.append(rs)
    if not sizes:  # one element: both sides have it
        return [1], [1], [1]
    return sizes, lhs_strides, rhs_strides


def divider(size: int) -> int:
    """Constants of 32-bit division by `size` (PyTorch's IntDivider): magic | shift << 32.

    n / size == (umulhi(n, magic) + n) >> shift for 0 <= n < 2**31 and 1 <= size < 2**31.
    """
    if size < 1:  # a zero-size dim: nothing is ever divided by it
        return 1
    shift = 0
    while (1 << shift) < size:
        shift += 1
    magic = ((1 << 32) * ((1 << shift) - size)) // size + 1
    return magic | (shift << 32)


@dataclass(frozen=True)
class Space:
    """An index space over some of the collapsed output dims, outermost first, with the
    output, lhs and rhs strides of each dim."""

    sizes: tuple[int, ...]
    out_strides: tuple[int, ...]
    lhs_strides: tuple[int, ...]
    rhs_strides: tuple[int, ...]

    @property
    def count(self) -> int:
        return int(np.prod(self.sizes, dtype=np.int64))

    @functools.cached_property
    def args(self) -> tuple:
        """(rank, sizes, dividers, out, lhs, rhs strides) as kernel arguments, innermost dim first, packed once."""
        return (np.int32(len(self.sizes)), gpu.ints_arg(self.sizes[::-1]),
                gpu.ints_arg([divider(s) for s in self.sizes[::-1]]), gpu.ints_arg(self.out_strides[::-1]),
                gpu.ints_arg(self.lhs_strides[::-1]), gpu.ints_arg(self.rhs_strides[::-1]))


@dataclass(frozen=True)
class GradPlan:
    """How one side's gradient is computed: `kind` 'rows' (a thread per gradient element,
    looping over its broadcast positions) or 'warps' (a warp per gradient element, when the
    innermost dim is reduced); `chunks` > 1 splits the positions, and a second pass sums the
    chunks' partial sums (a thread per element, or a warp for more than WARP_SUM_CHUNKS)."""

    kind: str
    kept: Space
    reduced: Space
    chunks: int
    chunk: int


@dataclass(frozen=True)
class GpuPlan:
    same: bool                      # no broadcasting after collapsing: plain elementwise kernels
    count: int                      # output elements
    index: str                      # 'int' or 'long long'
    space: Space                    # the whole output (forward)
    grads: tuple[GradPlan, GradPlan]


def grad_plan(space: Space, side: int) -> GradPlan:
    """Split the output dims into those this side has (kept) and those it was broadcast along (reduced)."""
    strides = space.lhs_strides if side == 0 else space.rhs_strides
    parts: dict[bool, list[int]] = {True: [], False: []}
    for d, stride in enumerate(strides):
        parts[stride != 0].append(d)

    def sub(dims: list[int]) -> Space:
        return Space(tuple(space.sizes[d] for d in dims), tuple(space.out_strides[d] for d in dims),
                     tuple(space.lhs_strides[d] for d in dims), tuple(space.rhs_strides[d] for d in dims))

    kept, reduced = sub(parts[True]), sub(parts[False])
    kept_count, reduced_count = kept.count, reduced.count
    innermost_reduced = strides[-1] == 0 and space.sizes[-1] >= 32
    kind = "warps" if innermost_reduced else "rows"
    if kind == "warps":
        chunks = min(-(-TARGET_WARPS // max(kept_count, 1)), -(-reduced_count // MIN_PER_WARP), MAX_CHUNKS)
        chunks = max(chunks, 1)
        chunk = -(-reduced_count // chunks)
        chunk = -(-chunk // 32) * 32
    else:
        chunks = min(-(-TARGET_THREADS // max(kept_count, 1)), -(-reduced_count // MIN_PER_THREAD), MAX_CHUNKS)
        chunks = max(chunks, 1)
        chunk = -(-reduced_count // chunks)
    chunk = max(chunk, 1)  # zero-size outputs never launch; keep the plan well formed
    chunks = max(1, -(-reduced_count // chunk))
    return GradPlan(kind, kept, reduced, chunks, chunk)


def gpu_plan(lhs_dims: tuple[int, ...], rhs_dims: tuple[int, ...], out_dims: tuple[int, ...]) -> GpuPlan:
    """Collapse the dims, choose the kernels and the reduction split; depends on the shapes only."""
    sizes, lhs_strides, rhs_strides = collapse(out_dims, lhs_dims, rhs_dims)
    space = Space(tuple(sizes), tuple(_c_strides(sizes)), tuple(lhs_strides), tuple(rhs_strides))
    count = core.numel(out_dims)
    same = space.lhs_strides == space.out_strides and space.rhs_strides == space.out_strides
    # The partial sums index chunks * kept elements: bounded by the output count plus TARGET_THREADS.
    index = gpu.index_type(count + TARGET_THREADS)
    return GpuPlan(same, count, index, space, (grad_plan(space, 0), grad_plan(space, 1)))


# --------------------------------------------------------------------------- GPU


_KERNELS = ("binary_same", "binary_broadcast", "binary_backward_same", "binary_grad_rows", "binary_grad_warps",
            "binary_sum_partials", "binary_sum_partials_warps")
# One module per index type: tensors of 2**31 elements or more are rare, and their 64-bit
# instantiations (64-bit division throughout) are compiled only when one turns up.
_CUDA = {index: gpu.CudaModule("element_binary.cu", [f"{kernel}<{t}, {index}>" for kernel in _KERNELS
                                                     for t in gpu.FLOAT_TYPES])
         for index in gpu.INDEX_TYPES}


def _function(kernel: str, dtype: np.dtype, index: str) -> Any:
    return _CUDA[index].function(f"{kernel}<{gpu.cuda_type(dtype)}, {index}>")


def _gpu_plan(state: core.KernelState) -> GpuPlan:
    if "plan" not in state.saved:
        shapes = state.shapes
        state.saved["plan"] = gpu_plan(shapes["lhs_shape"].dims, shapes["rhs_shape"].dims, shapes["output_shape"].dims)
    return state.saved["plan"]


_FLAGS = (np.int32(0), np.int32(1))


def _vector_ok(*arrays: Any) -> np.int32:
    """Whether every array starts on a 16-byte boundary, so 16-byte loads and stores are legal."""
    bits = 0
    for a in arrays:
        bits |= a.data.ptr
    return _FLAGS[bits & 15 == 0]


@core.gpu_kernel
def gpu_forward_kernel(stream, handle, state, attrs, lhs, rhs, output) -> None:
    """output = lhs (op) rhs, one kernel enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, lhs, rhs, output)
    launch = state.saved.get("gpu_forward")
    if launch is None:
        launch = state.saved["gpu_forward"] = _forward_launch(state, attrs, output.dtype)
    if launch is None:
        return
    kernel, grid, tail, same = launch
    if same:
        tail = tail + (_vector_ok(lhs, rhs, output),)
    gpu.launch(stream, kernel, grid, gpu.BLOCK, (lhs, rhs, output) + tail)


def _forward_launch(state, attrs, dtype: np.dtype) -> tuple | None:
    """(kernel, grid, scalar arguments, same) of the forward, made once; None for an empty output.
    `same`: the plain elementwise kernel, whose last argument (the alignment flag) each call adds."""
    plan = _gpu_plan(state)
    if plan.count == 0:
        return None
    scalar = np.int32 if plan.index == "int" else np.int64
    op = np.int32(attrs.op_type.value)
    if plan.same:
        per = 16 // dtype.itemsize
        return (_function("binary_same", dtype, plan.index), gpu.grid_for(plan.count, per_thread=per),
                (scalar(plan.count), op), True)
    return (_function("binary_broadcast", dtype, plan.index), gpu.grid_for(plan.count),
            (scalar(plan.count), op) + plan.space.args, False)


def _partials(stream, state, plan: GpuPlan, dtype: np.dtype) -> Any:
    """The buffer of partial sums, made on the stream at first need and kept in the state."""
    if "partials" not in state.saved:
        size = max(g.chunks * g.kept.count if g.chunks > 1 else 0 for g in plan.grads)
        state.saved["partials"] = gpu.device_empty((max(size, 1),), dtype, state.device)
    return state.saved["partials"]


# Slots of the arrays a backward launch takes, indexes into the call's
# (lhs, rhs, output_grad, lhs_grad, rhs_grad, partials).
_LHS, _RHS, _GRAD, _LHS_GRAD, _RHS_GRAD, _PARTIALS = range(6)


@core.gpu_kernel
def gpu_backward_kernel(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad) -> None:
    """Write lhs_grad and rhs_grad (those not None), reduced over broadcast dims without atomics."""
    _check_backward(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad)
    want = (lhs_grad is not None and lhs_grad.size != 0, rhs_grad is not None and rhs_grad.size != 0)
    if not (want[0] or want[1]):
        return
    key = ("gpu_backward", want)
    steps = state.saved.get(key)
    if steps is None:
        steps = state.saved[key] = _backward_steps(stream, state, attrs, output_grad.dtype, want)
    if steps is None:  # an empty sum: the gradient of a broadcast operand is zero
        for grad in (lhs_grad, rhs_grad):
            if grad is not None and grad.size:
                gpu.cupy.cuda.runtime.memsetAsync(grad.data.ptr, 0, grad.nbytes, stream.ptr)
        return
    arrays = (lhs, rhs, output_grad, lhs_grad, rhs_grad, state.saved.get("partials"))
    for kernel, grid, slots, tail, aligned in steps:
        launched = tuple([arrays[i] for i in slots])
        flag = (_vector_ok(*launched),) if aligned else ()
        gpu.launch(stream, kernel, grid, gpu.BLOCK, launched + tail + flag)


def _backward_steps(stream, state, attrs, dtype: np.dtype, want: tuple[bool, bool]) -> list | None:
    """The backward's launches for the gradients wanted, made once: (kernel, grid, array slots, scalar
    arguments, whether the alignment flag of the arrays is added last). None where the output is empty."""
    plan = _gpu_plan(state)
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
        per = 16 // dtype.itemsize
        lhs_out = _LHS_GRAD if want[0] else _GRAD  # never written when not wanted
        rhs_out = _RHS_GRAD if want[1] else _GRAD
        return [(_function("binary_backward_same", dtype, plan.index), gpu.grid_for(plan.count, per_thread=per),
                 (lhs_slot, rhs_slot, _GRAD, lhs_out, rhs_out),
                 (scalar(plan.count), np.int32(op.value), np.int32(want[0]), np.int32(want[1]),
                  np.int32(need_lhs), np.int32(need_rhs)), True)]
    steps = []
    for side in (0, 1):
        if not want[side]:
            continue
        grad = _LHS_GRAD if side == 0 else _RHS_GRAD
        grad_plan_ = plan.grads[side]
        destination = grad
        if grad_plan_.chunks > 1:
            _partials(stream, state, plan, dtype)
            destination = _PARTIALS
        kept_count = grad_plan_.kept.count
        tail = (np.int32(op.value), np.int32(side), np.int32(need_lhs), np.int32(need_rhs), scalar(kept_count),
                scalar(grad_plan_.reduced.count), scalar(grad_plan_.chunks),
                scalar(grad_plan_.chunk)) + grad_plan_.kept.args + grad_plan_.reduced.args
        slots = (lhs_slot, rhs_slot, _GRAD, destination)
        if grad_plan_.kind == "warps":
            warps = kept_count * grad_plan_.chunks
            grid = max(1, min(-(-warps // (gpu.BLOCK // 32)), 65535))
            steps.append((_function("binary_grad_warps", dtype, plan.index), grid, slots, tail, False))
        else:
            grid = (gpu.grid_for(kept_count), grad_plan_.chunks)
            steps.append((_function("binary_grad_rows", dtype, plan.index), grid, slots, tail, False))
        sum_tail = (scalar(kept_count), scalar(grad_plan_.chunks))
        if grad_plan_.chunks > WARP_SUM_CHUNKS:
            grid = max(1, min(-(-kept_count // (gpu.BLOCK // 32)), 65535))
            steps.append((_function("binary_sum_partials_warps", dtype, plan.index), grid, (destination, grad),
                          sum_tail, False))
        elif grad_plan_.chunks > 1:
            steps.append((_function("binary_sum_partials", dtype, plan.index), gpu.grid_for(kept_count),
                          (destination, grad), sum_tail, False))
    return steps


# --------------------------------------------------------------------------- dispatch


def forward_kernel(stream, handle, state, attrs, lhs, rhs, output) -> None:
    """Write output = lhs (op) rhs with broadcasting, on the stream's device."""
    core.dispatch(OP, cpu_forward_kernel, gpu_forward_kernel, stream, handle, state, attrs, lhs, rhs, output)


def backward_kernel(stream, handle, state, attrs, output, output_grad, lhs, lhs_grad, rhs, rhs_grad) -> None:
    """Write lhs_grad and rhs_grad (None skips one), each summed over its broadcast dims."""
    core.dispatch(OP, cpu_backward_kernel, gpu_backward_kernel, stream, handle, state, attrs,
                  output, output_grad, lhs, lhs_grad, rhs, rhs_grad)


def cleanup_kernel(handle, state) -> None:
    """Release the state (and the GPU buffer of partial sums, if one was made)."""
    core.cleanup_state(OP, handle, state)


cpu_init_kernel = gpu_init_kernel = init_kernel
cpu_cleanup_kernel = gpu_cleanup_kernel = cleanup_kernel
