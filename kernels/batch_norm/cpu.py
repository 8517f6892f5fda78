"""batch_norm on the CPU: float64 statistics and elements in NumPy. Every pass (the sums of the
statistics, the apply, the backward's sums and its apply) runs over cache-sized blocks of the
(outer, stats, inner) view, shared out to the handle's threads; a block is cast to float64 in the
thread's own scratch, so no float64 copy of the tensor is ever made. Each block's sums per
statistic are kept apart and added in a fixed order (block by block), so the thread count never
changes a bit. The arguments are checked (kernels.batch_norm's entry points) before anything here runs.

Half inputs take the same float64 path (their float32 parameters widened like the data); only a fused
activation differs: it is evaluated in float32 (activation_dtype), as the GPU does for half data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np

from .. import activation as activations
from ..runtime import cpu as cpu_runtime
from ..runtime import cpu_paths
from ..runtime.core import HALF_DTYPES, thread_local
from .attrs import SavedForward
from .plan import Layout

if TYPE_CHECKING:
    from .attrs import BatchNormAttrs, BatchNormState

# Elements of one block: its few float64 buffers (512 KB each) stay in cache, and the calls are long
# enough for two threads not to wait on each other for the GIL (docs/performance.md#batch-norm-blocks).
# A statistic's sums are added part by part along its row, in parts this long: the length is part of
# their bits, and never depends on the threads.
CPU_BLOCK_ELEMENTS = 1 << 16
# Elements of one block of a pass whose parts run beside each other: an apply's blocks are longer (it is
# elementwise: any cut gives the same bits), a sums pass's hold more rows (its parts along a row stay).
# Each block makes about fifteen NumPy calls, each taking the GIL to begin and to end, which the other
# parts wait for: longer blocks, fewer calls, as long as a tensor still has a block for every part.
# One thread alone keeps the cache-sized blocks. The sweep is in docs/performance.md#batch-norm-blocks.
PARALLEL_BLOCK_ELEMENTS = 1 << 18

# The size-gated paths of the passes (kernels.runtime.cpu_paths).
INNER_PARTS_PATH, STAT_GROUPS_PATH, THREADS_PATH = cpu_paths.declare("batch_norm", {
    "inner_parts": "a statistic's row (inner) as long as a block: cut into parts, each part's sums added in turn",
    "stat_groups": "rows shorter than a block, all of them past it: blocks of as many statistics' rows as fit",
    "threads": "a pass's blocks shared out to the threads",
})

_SCRATCH = thread_local(buffers=None)


def _scratch(slot: int, shape: tuple[int, int]) -> np.ndarray:
    """A float64 (stats, inner) buffer of this thread (slot 0, 1 or 2), grown to the longest block it
    has held: blocks allocate nothing."""
    buffers = _SCRATCH.buffers
    if buffers is None:
        buffers = _SCRATCH.buffers = [np.empty(CPU_BLOCK_ELEMENTS, np.float64) for _ in range(3)]
    size = shape[0] * shape[1]
    if buffers[slot].size < size:
        buffers[slot] = np.empty(size, np.float64)
    return cpu_runtime.scratch(buffers[slot][:size].reshape(shape))


def _view(array: np.ndarray, layout: Layout) -> np.ndarray:
    return array.reshape(layout.outer, layout.stats, layout.inner)


Block = tuple[int, slice, slice, int]  # (outer index, stats slice, inner slice, inner part)


def _blocks(layout: Layout, elements: int = CPU_BLOCK_ELEMENTS, row: int | None = None) -> tuple[list[Block], int]:
    """The blocks of the (outer, stats, inner) view, about `elements` long, and the parts inner is cut
    into: whole rows of several statistics where inner is shorter than `row` (default: `elements`),
    else parts `row` long of as many rows as make `elements`."""
    row = elements if row is None else row
    if layout.inner >= row:
        stats_step, inner_step = max(1, elements // row), row
        cpu_paths.reach(INNER_PARTS_PATH)
    else:
        stats_step, inner_step = max(1, elements // layout.inner), layout.inner
        cpu_paths.reach_if(STAT_GROUPS_PATH, stats_step < layout.stats)
    inner_parts = -(-layout.inner // inner_step)
    blocks = [(o, slice(s, s + stats_step), slice(k * inner_step, (k + 1) * inner_step), k)
              for o in range(layout.outer) for s in range(0, layout.stats, stats_step) for k in range(inner_parts)]
    return blocks, inner_parts


def _pass_bytes(layout: Layout) -> int:
    """The bytes a pass is counted at: each element read and written in float64 several times over, 16 bytes."""
    return layout.outer * layout.stats * layout.inner * 16


def _run(layout: Layout, blocks: list[Block], function: Callable[[Block], None]) -> None:
    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(THREADS_PATH, first, last, len(blocks))
        token = cpu_runtime.ignore_fp_errors()  # IEEE results (inf, NaN) are the contract, as torch's
        try:
            for block in blocks[first:last]:
                function(block)
        finally:
            cpu_runtime.restore_fp_errors(token)

    if len(blocks) == 1:  # cpu_parallel's call of one block, without its count of the parts
        run(0, 1)
        return
    cpu_runtime.cpu_parallel(run, len(blocks), _pass_bytes(layout))


def _length(layout: Layout) -> int:
    """The length of a block (cpu.block_length): CPU_BLOCK_ELEMENTS where a pass runs in one part, up to
    PARALLEL_BLOCK_ELEMENTS where its parts run beside each other."""
    return cpu_runtime.block_length(_pass_bytes(layout), layout.outer * layout.stats * layout.inner,
                                    CPU_BLOCK_ELEMENTS, PARALLEL_BLOCK_ELEMENTS)


def _sum_blocks(layout: Layout) -> tuple[list[Block], int]:
    """The blocks of a sums pass, and the parts inner is cut into: inner always in parts of
    CPU_BLOCK_ELEMENTS (each part's sums are added in turn: the cut is part of their bits), a block
    holding as many statistics' rows as make its length. Each row is summed on its own (NumPy's
    pairwise sum along it), so the rows a block holds change no bit."""
    return _blocks(layout, _length(layout), CPU_BLOCK_ELEMENTS)


def _apply_blocks(layout: Layout) -> list[Block]:
    """The blocks of an apply pass (elementwise: the cut changes no bit)."""
    return _blocks(layout, _length(layout))[0]


class _Passes(NamedTuple):
    """The blocks of forward's passes over a layout: a plan's, worked out once (forward_plan)."""

    sums: tuple[list[Block], int]  # _sum_blocks
    apply: list[Block]  # _apply_blocks


def forward_plan(state: BatchNormState, attrs: Any, threads: int) -> Callable[..., None]:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, input, gamma, beta, output, training=...) on checked arrays (and running statistics),
    the passes' blocks worked out once for `threads`, the handle's count."""
    passes = cpu_runtime.with_threads(lambda: _Passes(_sum_blocks(state.layout), _apply_blocks(state.layout)), threads)()
    return cpu_runtime.with_threads(
        lambda state, input, gamma, beta, output, training: forward(state, attrs, input, gamma, beta, output, training,
                                                                    passes), threads)


def _sums(layout: Layout, blocks: list[Block], inner_parts: int, terms: int,
          function: Callable[[Block], tuple[np.ndarray, ...]]) -> list[np.ndarray]:
    """`terms` sums per statistic: function(block) gives each term's sums over the block's inner
    part; they are added over the blocks in a fixed order (outer, then inner part)."""
    partial = np.zeros((terms, layout.outer, inner_parts, layout.stats))

    def one(block: Block) -> None:
        o, stats, _, part = block
        for term, sums in enumerate(function(block)):
            partial[term, o, part, stats] = sums

    _run(layout, blocks, one)
    return [partial[term].sum(axis=(0, 1)) for term in range(terms)]


def _wide(array: np.ndarray, block: Block, slot: int) -> np.ndarray:
    """The block of a (outer, stats, inner) view, cast to float64 in this thread's scratch."""
    part = array[block[:3]]
    wide = _scratch(slot, part.shape)
    np.copyto(wide, part)
    return wide


def activation_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a fused activation is evaluated in: float64, or float32 for half data."""
    return np.dtype(np.float32) if dtype in HALF_DTYPES else np.dtype(np.float64)


def forward(state: BatchNormState, attrs: BatchNormAttrs, input: np.ndarray, gamma: np.ndarray | None,
            beta: np.ndarray | None, output: np.ndarray, training: bool, passes: _Passes | None = None) -> None:
    """output = activation((input - mean) * invstd * gamma + beta), with batch statistics (training, which
    updates the running ones) or the running statistics (inference). `passes`: the passes' blocks,
    worked out already (a plan's), else here."""
    layout = state.layout
    if input.size == 0:
        state.forward = SavedForward(training, empty=True)
        return
    x = _view(input, layout)
    if training:
        blocks, inner_parts = _sum_blocks(layout) if passes is None else passes.sums
        def total(block: Block) -> tuple[np.ndarray]:
            return (_wide(x, block, 0).sum(axis=1),)

        mean = _sums(layout, blocks, inner_parts, 1, total)[0] / layout.count

        def squares(block: Block) -> tuple[np.ndarray]:
            centered = _wide(x, block, 0)
            centered -= mean[block[1], None]
            return (np.square(centered, out=centered).sum(axis=1),)

        var_sum = _sums(layout, blocks, inner_parts, 1, squares)[0]
        invstd = 1.0 / np.sqrt(var_sum / layout.count + attrs.eps)
        momentum = state.training_step()
        running_mean = state.running_mean.reshape(-1)
        running_var = state.running_var.reshape(-1)
        running_mean[...] = momentum * mean + (1.0 - momentum) * running_mean.astype(np.float64)
        running_var[...] = momentum * (var_sum / (layout.count - 1)) + (1.0 - momentum) * running_var.astype(np.float64)
    else:
        mean = state.running_mean.reshape(-1).astype(np.float64)
        invstd = 1.0 / np.sqrt(state.running_var.reshape(-1).astype(np.float64) + attrs.eps)
    state.forward = SavedForward(training, mean=mean, invstd=invstd)
    out = _view(output, layout)
    pre = None
    if attrs.activation is not None and not attrs.backward:
        pre = out  # no backward: the output holds the rounded pre-activation, then f of it (the same bits)
    elif attrs.activation is not None:
        if state.pre is None:
            state.pre = np.empty(input.shape, input.dtype)
        pre = _view(state.pre, layout)
    gamma64 = None if not attrs.affine else gamma.reshape(-1).astype(np.float64)
    beta64 = None if not attrs.affine else beta.reshape(-1).astype(np.float64)
    act_dtype = activation_dtype(input.dtype)

    def apply(block: Block) -> None:
        # The same float64 operations, element by element, as over the whole tensor at once.
        stats, where = block[1], block[:3]
        normalized = _wide(x, block, 0)
        normalized -= mean[stats, None]
        normalized *= invstd[stats, None]
        if gamma64 is not None:
            normalized *= gamma64[stats, None]
            normalized += beta64[stats, None]
        if pre is None:
            out[where] = normalized
            return
        pre[where] = normalized
        # f in float64 (float32 for half data) at the kept (rounded) pre-activation, rounded once: as the GPU does.
        wide = _wide(pre, block, 0) if act_dtype == np.float64 else pre[where].astype(act_dtype)
        activations.cpu_forward(attrs.activation, wide, wide)
        out[where] = wide

    _run(layout, _apply_blocks(layout) if passes is None else passes.apply, apply)


def backward(state: BatchNormState, attrs: BatchNormAttrs, saved: SavedForward, output_grad: np.ndarray,
             input: np.ndarray, input_grad: np.ndarray | None, gamma: np.ndarray | None,
             gamma_grad: np.ndarray | None, beta_grad: np.ndarray | None) -> None:
    """Gradients of the forward before (training: through the batch statistics; inference: through the
    fixed running ones); gamma_grad = sum(g * xhat), beta_grad = sum(g), g the pre-activation gradient."""
    layout = state.layout
    if saved.empty:
        for grad in (gamma_grad, beta_grad):  # sums over no elements
            if grad is not None:
                grad[...] = 0
        return
    mean, invstd, training = saved.mean, saved.invstd, saved.training
    x, dy = _view(input, layout), _view(output_grad, layout)
    pre = None if attrs.activation is None else _view(state.pre, layout)
    blocks, inner_parts = _sum_blocks(layout)
    act_dtype = activation_dtype(input.dtype)

    # With an activation, g (f' in float64 at the kept pre-activation, not rounded to the dtype, as the
    # GPU does) is worked out once, by the sums pass, and kept in float64 for the apply: recomputing
    # it costs about 10 float64 passes, keeping it one write and one read.
    kept = None
    if pre is not None and input_grad is not None:
        if state.cpu_grad is None:
            state.cpu_grad = np.empty(input.shape, np.float64)
        kept = _view(cpu_runtime.scratch(state.cpu_grad), layout)  # the state's scratch: this call writes it first

    def grad(block: Block, first: bool) -> np.ndarray:
        """g, the pre-activation gradient of the block in float64."""
        if pre is None:
            return _wide(dy, block, 1)
        if not first and kept is not None:
            return kept[block[:3]]
        if act_dtype == np.float64:
            g = _wide(dy, block, 1)
            activations.cpu_backward(attrs.activation, _wide(pre, block, 2), g, g)
        else:  # half data: f' and its product in float32, widened (exactly) to float64 for the sums
            where = block[:3]
            narrow = dy[where].astype(act_dtype)
            activations.cpu_backward(attrs.activation, pre[where].astype(act_dtype), narrow, narrow)
            g = _scratch(1, narrow.shape)
            np.copyto(g, narrow)
        if kept is not None:
            kept[block[:3]] = g
        return g

    def centered(block: Block) -> np.ndarray:
        """x - mean of the block in float64 (slot 0)."""
        c = _wide(x, block, 0)
        c -= mean[block[1], None]
        return c

    need_sums = gamma_grad is not None or beta_grad is not None or (training and input_grad is not None)
    if need_sums:
        def sums(block: Block) -> tuple[np.ndarray, np.ndarray]:
            g = grad(block, True)
            product = centered(block)
            product *= g
            return g.sum(axis=1), product.sum(axis=1)

        sum_g, dot = _sums(layout, blocks, inner_parts, 2, sums)
        if gamma_grad is not None:
            gamma_grad.reshape(-1)[...] = dot * invstd
        if beta_grad is not None:
            beta_grad.reshape(-1)[...] = sum_g
    if input_grad is None:
        return
    gamma64 = gamma.reshape(-1).astype(np.float64) if attrs.affine else None
    dx = _view(input_grad, layout)
    if training:
        grad_mean = sum_g / layout.count
        k = dot * invstd * invstd / layout.count

    def apply(block: Block) -> None:
        stats = block[1]
        result = grad(block, not need_sums)
        if training:
            scaled = centered(block)
            scaled *= k[stats, None]
            result -= grad_mean[stats, None]
            result -= scaled
        result *= invstd[stats, None]
        if gamma64 is not None:
            result *= gamma64[stats, None]
        dx[block[:3]] = result

    _run(layout, _apply_blocks(layout), apply)
