"""element_binary on the CPU: NumPy ufuncs over broadcast views, shared out to the cores.
The arguments are checked (kernels.element_binary's entry points) before anything here runs."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..runtime import core, cpu_paths
from ..runtime import cpu as cpu_runtime
from .attrs import BinaryOpType

_CPU_PARALLEL_MIN = 1 << 16  # outputs below which one thread does the whole call

# The size-gated paths (kernels.runtime.cpu_paths).
ELEMENTWISE_THREADS_PATH, REDUCE_THREADS_PATH = cpu_paths.declare("element_binary", {
    "elementwise.threads": "forward (and a gradient with nothing to sum): the output cut along an axis, the parts "
                           "shared out to the threads",
    "reduce.threads": "a gradient summed over broadcast dims, cut along a dim it keeps, the parts shared out",
})


def elementwise(function: Callable[..., Any], output: np.ndarray, *operands: np.ndarray) -> None:
    """function(*operands, out=output) with the operands broadcast to the output, the output cut along
    its first axis at least as long as the parts (cpu_runtime.parallel_parts) and the parts shared out
    (cpu_runtime.cpu_parallel): elementwise, so every element gets the same arithmetic as in one call."""
    if output.size < _CPU_PARALLEL_MIN:  # one thread, one call: the ufunc broadcasts the operands itself
        with np.errstate(all="ignore"):
            function(*operands, out=output)
        return
    shape = output.shape
    views = [np.broadcast_to(operand, shape) for operand in operands]
    nbytes = output.nbytes * (1 + len(operands))
    parts = cpu_runtime.parallel_parts(nbytes)
    axis = next((i for i, size in enumerate(shape) if size >= parts), None)

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(ELEMENTWISE_THREADS_PATH, first, last, shape[axis])
        index = (slice(None),) * axis + (slice(first, last),)
        with np.errstate(all="ignore"):  # IEEE results (inf, NaN) as torch gives them, without warnings
            function(*(view[index] for view in views), out=output[index])

    if axis is None or parts < 2 or output.size < _CPU_PARALLEL_MIN:
        with np.errstate(all="ignore"):
            function(*views, out=output)
        return
    cpu_runtime.cpu_parallel(run, shape[axis], nbytes)


def _copy(source: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, source)


def _wide(array: np.ndarray | None) -> np.ndarray | None:
    """A half-precision operand widened to float32 (exact)."""
    return None if array is None else array.astype(np.float32)


# Each op's ufunc, and whether it takes (rhs, lhs): NumPy's maximum and minimum return their second
# argument on a tie, so lhs goes second, like torch.
_FORWARD = {
    BinaryOpType.ADD: (np.add, False), BinaryOpType.SUB: (np.subtract, False), BinaryOpType.MUL: (np.multiply, False),
    BinaryOpType.DIV: (np.divide, False), BinaryOpType.MAX: (np.maximum, True), BinaryOpType.MIN: (np.minimum, True),
}


def forward(op: BinaryOpType, lhs: np.ndarray, rhs: np.ndarray, output: np.ndarray) -> None:
    """output = lhs (op) rhs, broadcast by NumPy. Half dtypes: in float32, rounded once into output."""
    if output.dtype in core.HALF_DTYPES:
        wide = np.empty(output.shape, np.float32)
        forward(op, _wide(lhs), _wide(rhs), wide)
        output[...] = wide
        return
    function, swapped = _FORWARD[op]
    if swapped:
        elementwise(function, output, rhs, lhs)
    else:
        elementwise(function, output, lhs, rhs)


def forward_plan(state: core.KernelState, attrs: Any, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, lhs, rhs, output) on checked arrays. An output of one thread's size (elementwise's
    one call) of a dtype the ufunc computes in gets that call itself, its ufunc chosen once."""
    output = state.shapes["output_shape"]
    if output.dtype in core.HALF_DTYPES or output.numel >= _CPU_PARALLEL_MIN:
        return cpu_runtime.with_threads(lambda state, lhs, rhs, out: forward(attrs.op_type, lhs, rhs, out), threads)
    function, swapped = _FORWARD[attrs.op_type]

    def compute(state: Any, lhs: np.ndarray, rhs: np.ndarray, out: np.ndarray) -> None:
        token = cpu_runtime.ignore_fp_errors()  # elementwise's errstate, at a tenth of its cost
        try:
            if swapped:
                function(rhs, lhs, out=out)
            else:
                function(lhs, rhs, out=out)
        finally:
            cpu_runtime.restore_fp_errors(token)

    return compute


def sum_to(full: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    """Sum a tensor of the output's dims over the dims an operand of `dims` was broadcast along."""
    lead = full.ndim - len(dims)
    axes = tuple(range(lead)) + tuple(lead + d for d, size in enumerate(dims) if size == 1 and full.shape[lead + d] != 1)
    if not axes:
        return full
    return np.sum(full, axis=axes, keepdims=True).reshape(dims)


def grad(op: BinaryOpType, side: int, lhs: Any, rhs: Any, output_grad: np.ndarray) -> np.ndarray:
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


_DIRECT_GRADS = {  # op: side, lhs, rhs -> (function(g, *operands, out=...), operands), as grad computes it
    BinaryOpType.ADD: lambda side, lhs, rhs: (_copy, ()),
    BinaryOpType.SUB: lambda side, lhs, rhs: ((_copy, ()) if side == 0 else (np.negative, ())),
    BinaryOpType.MUL: lambda side, lhs, rhs: (np.multiply, (rhs if side == 0 else lhs,)),
}


def backward(op: BinaryOpType, output_grad: np.ndarray, lhs: np.ndarray | None, lhs_grad: np.ndarray | None,
             rhs: np.ndarray | None, rhs_grad: np.ndarray | None) -> None:
    """Write lhs_grad and rhs_grad (those not None), each summed over its broadcast dims. Half dtypes:
    the formulas and the sums in float32, each gradient rounded once."""
    if output_grad.dtype in core.HALF_DTYPES:
        wide = [None if g is None else np.empty(g.shape, np.float32) for g in (lhs_grad, rhs_grad)]
        backward(op, _wide(output_grad), _wide(lhs), wide[0], _wide(rhs), wide[1])
        for side_grad, computed in zip((lhs_grad, rhs_grad), wide):
            if side_grad is not None:
                side_grad[...] = computed
        return
    with np.errstate(all="ignore"):
        for side, side_grad in ((0, lhs_grad), (1, rhs_grad)):
            if side_grad is None:
                continue
            if side_grad.shape == output_grad.shape and op in _DIRECT_GRADS:
                # Nothing to sum: grad's one operation, written straight into the gradient.
                function, operands = _DIRECT_GRADS[op](side, lhs, rhs)
                elementwise(function, side_grad, output_grad, *operands)
                continue
            _reduced_grad(op, side, lhs, rhs, output_grad, side_grad)


def _reduced_grad(op: BinaryOpType, side: int, lhs: np.ndarray, rhs: np.ndarray, output_grad: np.ndarray,
                  side_grad: np.ndarray) -> None:
    """side_grad = grad summed over side's broadcast dims: in parts along a dim that side keeps (at
    least as long as the threads), shared out to them; each part's sums are the same NumPy reduction,
    over the same dims of the same elements, as over the whole (a kept index's sum never crosses parts)."""
    shape = output_grad.shape
    dims = (1,) * (len(shape) - side_grad.ndim) + side_grad.shape  # side_grad at the output's rank
    nbytes = output_grad.nbytes * 4
    parts = cpu_runtime.parallel_parts(nbytes)
    axis = next((d for d, size in enumerate(dims) if size == shape[d] >= parts), None)
    if parts < 2 or axis is None or output_grad.nbytes < cpu_runtime.PARALLEL_MIN_BYTES:
        full = grad(op, side, lhs, rhs, output_grad)
        np.copyto(side_grad, sum_to(np.broadcast_to(full, shape), side_grad.shape))
        return
    operands = [None if a is None else np.broadcast_to(a, shape) for a in (lhs, rhs)]
    target = side_grad.reshape(dims)

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(REDUCE_THREADS_PATH, first, last, shape[axis])
        index = (slice(None),) * axis + (slice(first, last),)
        part = output_grad[index]
        with np.errstate(all="ignore"):  # per thread: IEEE results as torch gives them, without warnings
            full = grad(op, side, *(None if a is None else a[index] for a in operands), part)
            np.copyto(target[index], sum_to(np.broadcast_to(full, part.shape), target[index].shape))

    cpu_runtime.cpu_parallel(run, shape[axis], nbytes)
