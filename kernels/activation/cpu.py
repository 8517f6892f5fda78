"""The activations on the CPU (NumPy): erf, the blockwise passes over cache-sized blocks shared out to
the threads, and each activation's forward, derivative and backward."""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any

import numpy as np

from ..runtime import core, cpu, cpu_paths
from ..runtime.core import AttrsError, fail
from .attrs import Activation

# --------------------------------------------------------------------------- erf in NumPy

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_ONE_OVER_SQRT_PI = 1.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT1_2 = math.sqrt(0.5)

# |x| < 1: erf(x) = 2/sqrt(pi) * x * sum_n (-1)^n x^(2n) / (n! (2n + 1)), by Horner in x^2.
# 24 terms leave a remainder below 1e-25; the alternating sum cancels less than one bit.
_TAYLOR = tuple(float(Fraction((-1) ** n, math.factorial(n) * (2 * n + 1))) for n in range(24))

# |x| >= 1: erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), the
# continued fraction evaluated bottom-up with a fixed number of terms per band, each
# band's count about 1.5 times the smallest that reached 1 ulp. At |x| >= 6 erf is 1.0
# in float64 (erfc(6) = 2e-17 is under half an ulp of 1).
_CONTINUED_FRACTION_BANDS = ((1.0, 1.5, 300), (1.5, 2.5, 120), (2.5, 4.0, 50), (4.0, 6.0, 30))


def _exp_minus_square(x: np.ndarray) -> np.ndarray:
    """exp(-x^2) for float64 x >= 0 without the error of rounding x^2 first: x = hi + lo with hi's
    low 27 mantissa bits cleared, so hi*hi is exact, and x^2 = hi^2 + (x - hi)(x + hi)."""
    hi = (x.view(np.int64) & np.int64(~((1 << 27) - 1))).view(np.float64)
    return np.exp(-hi * hi) * np.exp(-(x - hi) * (x + hi))


def erf(x: Any) -> np.ndarray:
    """The error function, elementwise, in float64 (within 2 ulps of math.erf)."""
    x = np.asarray(x, dtype=np.float64)
    magnitude = np.abs(x)
    result = np.ones_like(magnitude)  # |x| >= 6 and +-inf
    result[np.isnan(magnitude)] = np.nan
    small = magnitude < 1.0
    if np.any(small):
        a = magnitude[small]
        square = a * a
        total = np.full_like(a, _TAYLOR[-1])
        for coefficient in _TAYLOR[-2::-1]:
            total = total * square + coefficient
        result[small] = _TWO_OVER_SQRT_PI * (a * total)
    for low, high, terms in _CONTINUED_FRACTION_BANDS:
        band = (magnitude >= low) & (magnitude < high)
        if not np.any(band):
            continue
        a = magnitude[band]
        denominator = a.copy()
        for k in range(terms, 0, -1):
            denominator = a + (k * 0.5) / denominator
        result[band] = 1.0 - _ONE_OVER_SQRT_PI * _exp_minus_square(a) / denominator
    return np.copysign(result, x)


# --------------------------------------------------------------------------- CPU

# Elementwise formulas take several NumPy passes and temporaries; run over blocks this many
# elements long, they stay in cache and a large tensor crosses memory about once. Not shorter:
# with two threads, short ufunc calls spend their time handing the GIL over
# (docs/performance.md#activation-blocks).
BLOCK_ELEMENTS = 1 << 17
# A part that runs beside others (cpu.cpu_parallel with two parts or more) goes in blocks this long
# instead: every ufunc call takes the GIL to begin and to end, and with several threads a short call
# waits for it. One thread alone keeps the cache-sized blocks. Not 2^21, though it ran a little
# faster: a pool thread keeps its scratch (up to two slots of a block), at 2^21 16 MB of float64 a
# slot. The sweep is in docs/performance.md#activation-blocks.
PARALLEL_BLOCK_ELEMENTS = 1 << 20

# The size-gated paths of blockwise (kernels.runtime.cpu_paths).
BLOCKS_PATH, BLOCKS_THREADS_PATH = cpu_paths.declare("activation", {
    "blocks": "blockwise: a contiguous pass past BLOCK_ELEMENTS elements, in blocks of it",
    "blocks.threads": "blockwise: the blocks shared out to the threads, a part's range in PARALLEL_BLOCK_ELEMENTS steps",
})


def blockwise(function: Any, *arrays: np.ndarray) -> None:
    """Call function(*blocks) on successive flat blocks of same-shaped C-contiguous arrays (any
    may alias another), or once on the whole arrays where one is not contiguous. A loop over
    cache-sized blocks, never over elements; the blocks are shared out to cpu.cpu_parallel's
    threads (NumPy's ufuncs release the GIL), each part running its range in longer blocks when
    it runs beside others (PARALLEL_BLOCK_ELEMENTS). The function is elementwise, so no block size
    changes a bit."""
    count = arrays[0].size
    if count <= BLOCK_ELEMENTS or not all(a.flags.c_contiguous for a in arrays):
        with np.errstate(all="ignore"):
            function(*arrays)
        return
    flat = [a.reshape(-1) for a in arrays]  # views of contiguous arrays
    blocks = -(-count // BLOCK_ELEMENTS)
    cpu_paths.reach(BLOCKS_PATH)

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(BLOCKS_THREADS_PATH, first, last, blocks)
        step = BLOCK_ELEMENTS if last - first == blocks else PARALLEL_BLOCK_ELEMENTS  # one part, or one of several
        end = min(last * BLOCK_ELEMENTS, count)
        # The IEEE results are the contract (exp overflowing to inf, 1/0 = inf, sqrt(-1) = NaN, as torch):
        # NumPy's warnings about them are noise here.
        with np.errstate(all="ignore"):
            for start in range(first * BLOCK_ELEMENTS, end, step):
                block = slice(start, min(start + step, end))
                function(*(a[block] for a in flat))

    cpu.cpu_parallel(run, blocks, sum(a.nbytes for a in arrays))


def blockwise_plan(function: Any, count: int, threads: int) -> Any:
    """A functional plan's compute(state, *arrays) (kernels/functional.py, _Plan) that runs
    blockwise(function, *arrays) on C-contiguous arrays of `count` elements with `threads` as the handle's
    thread count: its test of the size made once, the call of one block (up to BLOCK_ELEMENTS) left with
    its errstate alone, on this thread."""
    if count > BLOCK_ELEMENTS:
        return cpu.with_threads(lambda state, *arrays: blockwise(function, *arrays), threads)

    def one_block(state: Any, *arrays: np.ndarray) -> None:
        token = cpu.ignore_fp_errors()  # blockwise's errstate, at a tenth of its cost
        try:
            function(*arrays)
        finally:
            cpu.restore_fp_errors(token)

    return one_block


_SCRATCH = core.thread_local(buffers=None)


def _scratch(like: np.ndarray, slot: int) -> np.ndarray:
    """A buffer shaped like `like` (a block: at most BLOCK_ELEMENTS, or PARALLEL_BLOCK_ELEMENTS in a part
    beside others, unless blockwise ran on a whole non-contiguous array), kept per thread and slot so
    that blocks allocate nothing."""
    buffers = _SCRATCH.buffers
    if buffers is None:
        buffers = _SCRATCH.buffers = {}
    key = (slot, like.dtype)
    buffer = buffers.get(key)
    if buffer is None or buffer.size < like.size:
        if like.size > PARALLEL_BLOCK_ELEMENTS:
            return cpu.scratch(np.empty_like(like))
        size = BLOCK_ELEMENTS if like.size <= BLOCK_ELEMENTS else PARALLEL_BLOCK_ELEMENTS
        buffer = buffers[key] = np.empty(size, like.dtype)
    return cpu.scratch(buffer[:like.size].reshape(like.shape))


def cpu_forward(activation: Activation, pre: np.ndarray, output: np.ndarray) -> None:
    """output = f(pre) on NumPy arrays of one float dtype and shape; output may be pre itself.
    Half dtypes compute in float32 and round once."""
    if not isinstance(activation, Activation):
        raise fail(AttrsError, "activation", "activation", "an Activation", repr(activation))
    function = lambda p, o: _forward_block(activation, p, o)  # noqa: E731
    blockwise(cpu.widened(function) if pre.dtype in core.HALF_DTYPES else function, pre, output)


def _forward_block(activation: Activation, pre: np.ndarray, output: np.ndarray) -> None:
    if activation is Activation.RELU:
        _relu(pre, output, pre.dtype.type(0))
    elif activation is Activation.SIGMOID:
        _sigmoid(pre, output if not np.may_share_memory(pre, output) or pre is output else _scratch(pre, 0), output, 1)
    elif activation is Activation.TANH:
        np.tanh(pre, out=output)
    elif activation is Activation.GELU:
        # torch: x * 0.5 * (1 + erf(x * M_SQRT1_2)), in float64 for both dtypes (erf is float64).
        wide = pre.astype(np.float64)
        cdf = erf(wide * _SQRT1_2)
        cdf += 1.0
        np.copyto(output, wide * 0.5 * cdf)
    elif activation is Activation.SILU:
        # output is the scratch unless it overlaps pre (then it is written last, from a thread's own buffer)
        _silu(pre, output if not np.may_share_memory(pre, output) else _scratch(pre, 0), output, 1)
    else:
        raise fail(AttrsError, "activation", "activation", "an Activation", repr(activation))


# The formulas of _forward_block with their constant (0 or 1) given: a number there, a 0-d array of the
# block's dtype in a plan's (forward_block_plan), which a ufunc takes at half a number's cost; either is
# the same value of the dtype, so the bits are the same.
def _relu(pre: np.ndarray, output: np.ndarray, zero: Any) -> None:
    np.maximum(pre, zero, out=output)  # NaN propagates, as torch.relu


def _sigmoid(pre: np.ndarray, scratch: np.ndarray, output: np.ndarray, one: Any) -> None:
    np.negative(pre, out=scratch)
    np.exp(scratch, out=scratch)
    np.add(scratch, one, out=scratch)
    np.reciprocal(scratch, out=output)


def _silu(pre: np.ndarray, scratch: np.ndarray, output: np.ndarray, one: Any) -> None:
    np.negative(pre, out=scratch)
    np.exp(scratch, out=scratch)
    np.add(scratch, one, out=scratch)
    np.divide(pre, scratch, out=output)


def forward_block_plan(activation: Activation, dtype: Any) -> Any:
    """cpu_forward_block(activation, ·) for the calls of a functional plan (kernels/functional.py): on
    blocks of `dtype` and an output apart from them (a new array, so it is the scratch), its branch
    chosen and its constant made once."""
    if activation is Activation.RELU:
        return functools.partial(_relu, zero=np.zeros((), dtype))
    if activation in (Activation.SIGMOID, Activation.SILU):
        formula, one = _sigmoid if activation is Activation.SIGMOID else _silu, np.ones((), dtype)
        return lambda pre, output: formula(pre, output, output, one)
    return functools.partial(_forward_block, activation)


# cpu_forward and cpu_backward on one block, for a caller inside blockwise already (element_unary's
# formulas): a second blockwise would cost a second errstate and its checks, a microsecond a call on a
# tiny tensor, for the same blocks (docs/performance.md#the-functional-layers-cost-per-call).
cpu_forward_block = _forward_block


def cpu_derivative(activation: Activation, pre: np.ndarray) -> np.ndarray:
    """f'(pre) as a new array (relu: a boolean mask of pre > 0; gelu: float64 for both dtypes)."""
    if activation is Activation.RELU:
        return pre > 0
    if activation is Activation.SIGMOID:
        sigmoid = np.empty_like(pre)
        _forward_block(Activation.SIGMOID, pre, sigmoid)
        return (1 - sigmoid) * sigmoid
    if activation is Activation.TANH:
        tanh = np.tanh(pre)
        return 1 - tanh * tanh
    if activation is Activation.GELU:
        # torch: cdf + x * pdf, cdf = 0.5 (1 + erf(x / sqrt 2)), pdf = exp(-x^2 / 2) / sqrt(2 pi); in float64.
        wide = pre.astype(np.float64)
        cdf = 0.5 * (1.0 + erf(wide * _SQRT1_2))
        pdf = _INV_SQRT_2PI * np.exp(-0.5 * wide * wide)
        return cdf + wide * pdf
    if activation is Activation.SILU:
        sigmoid = np.empty_like(pre)
        _forward_block(Activation.SIGMOID, pre, sigmoid)
        return sigmoid * (1 + pre * (1 - sigmoid))
    raise fail(AttrsError, "activation", "activation", "an Activation", repr(activation))


def cpu_backward(activation: Activation, pre: np.ndarray, output_grad: np.ndarray, pre_grad: np.ndarray) -> None:
    """pre_grad = output_grad * f'(pre); output_grad is only read. pre_grad may alias pre or output_grad.
    Half dtypes compute in float32 and round once."""
    if not isinstance(activation, Activation):
        raise fail(AttrsError, "activation", "activation", "an Activation", repr(activation))
    function = lambda p, g, pg: _backward_block(activation, p, g, pg)  # noqa: E731
    blockwise(cpu.widened(function) if pre.dtype in core.HALF_DTYPES else function, pre, output_grad, pre_grad)


def _backward_block(activation: Activation, pre: np.ndarray, output_grad: np.ndarray, pre_grad: np.ndarray) -> None:
    if activation is Activation.RELU:
        # torch's threshold_backward: 0 where pre <= 0, output_grad elsewhere (NaN pre passes it).
        np.copyto(pre_grad, np.where(pre <= 0, pre.dtype.type(0), output_grad))
        return
    if activation is Activation.SILU:
        # torch: grad * sigmoid * (1 + x * (1 - sigmoid)), in that order. sigmoid is built in pre_grad
        # itself unless pre_grad overlaps an input (else in this thread's own buffer): one block fewer
        # in cache, which made the backward faster (docs/performance.md#activation-blocks).
        overlaps = np.may_share_memory(pre_grad, pre) or np.may_share_memory(pre_grad, output_grad)
        sigmoid = _scratch(pre, 0) if overlaps else pre_grad
        _forward_block(Activation.SIGMOID, pre, sigmoid)
        factor = np.subtract(pre.dtype.type(1), sigmoid, out=_scratch(pre, 1))
        factor *= pre
        factor += 1
        sigmoid *= output_grad
        np.multiply(sigmoid, factor, out=pre_grad)
        return
    derivative = cpu_derivative(activation, pre)
    if derivative.dtype == pre_grad.dtype:
        np.multiply(output_grad, derivative, out=pre_grad)
    else:  # gelu on float32: multiply in float64, round once
        np.copyto(pre_grad, output_grad * derivative)


cpu_backward_block = _backward_block  # see cpu_forward_block

