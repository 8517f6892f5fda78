"""pool_2d on the CPU: NumPy over strided window views, blocks of whole planes shared out to the
handle's threads (kernels.runtime.cpu); the half dtypes computed in float32."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import activation
from ..runtime import core, cpu, cpu_paths
from .attrs import Pool2DAttrs, PoolOp, _saved, tap_dtype


def _window_tap(array: np.ndarray, attrs: Pool2DAttrs, out_h: int, out_w: int, row: int, column: int) -> np.ndarray:
    """The strided view of a padded NCHW array that tap (row, column) of every window reads."""
    return array[:, :, row:row + attrs.stride_h * (out_h - 1) + 1:attrs.stride_h,
                 column:column + attrs.stride_w * (out_w - 1) + 1:attrs.stride_w]


def _padded(input: np.ndarray, attrs: Pool2DAttrs, fill: float) -> np.ndarray:
    """input within a border of `fill`, padding wide, for the forwards to read (input itself where there is no padding)."""
    if not attrs.padding_h and not attrs.padding_w:
        return input
    n, c, h, w = input.shape
    padded = np.full((n, c, h + 2 * attrs.padding_h, w + 2 * attrs.padding_w), fill, dtype=input.dtype)
    padded[:, :, attrs.padding_h:attrs.padding_h + h, attrs.padding_w:attrs.padding_w + w] = input
    return padded


def _first_inside(padding: int, stride: int, out_size: int) -> np.ndarray:
    """For each output row (column), the first window row (column) inside the input."""
    return np.maximum(padding - stride * np.arange(out_size), 0)


def _average_divisor(attrs: Pool2DAttrs, height: int, width: int, out_h: int, out_w: int, dtype: Any) -> Any:
    """kernel_h * kernel_w, or per window the number of its elements inside the input."""
    if attrs.count_include_pad:
        return np.asarray(attrs.kernel_h * attrs.kernel_w, dtype=dtype)
    counts = []
    for size, kernel, stride, padding, out_size in ((height, attrs.kernel_h, attrs.stride_h, attrs.padding_h, out_h),
                                                   (width, attrs.kernel_w, attrs.stride_w, attrs.padding_w, out_w)):
        start = stride * np.arange(out_size) - padding
        counts.append(np.minimum(start + kernel, size) - np.maximum(start, 0))
    return (counts[0][:, None] * counts[1][None, :]).astype(dtype)


def _select(target: np.ndarray, value: Any, mask: np.ndarray) -> None:
    """target = value where mask, else unchanged, for integer targets: target += (value - target) * mask,
    in the target's type (its wrap-around makes the sum exact). Branch-free: NumPy's masked copies
    (np.copyto's where=, np.where) branch per element, far slower than this sum on the argmax masks
    of random data (docs/performance.md#pool-2d-max-backward)."""
    step = np.subtract(value, target, dtype=target.dtype, casting="unsafe")
    step *= mask
    target += step


def _cpu_max_forward(input: np.ndarray, attrs: Pool2DAttrs, pooled: np.ndarray, taps: np.ndarray) -> None:
    """Separable: the maximum along window rows, then down window columns (np.maximum propagates NaN).

    The argmax follows PyTorch's row-major scan (take a value if greater, or NaN):
    within a row, and then among rows, the first maximum, or else the last NaN.
    Scanning taps in reverse and overwriting on equality leaves the first one.
    """
    out_h, out_w = pooled.shape[2:]
    kernel_h, kernel_w, stride_h, stride_w = attrs.kernel_h, attrs.kernel_w, attrs.stride_h, attrs.stride_w
    padded = _padded(input, attrs, -np.inf)  # padding is never greater, never NaN: it never wins
    # Each padded row's maximum over the window columns of every output column.
    columns = [padded[:, :, :, j:j + stride_w * (out_w - 1) + 1:stride_w] for j in range(kernel_w)]
    row_best = columns[0].copy()
    for column in columns[1:]:
        np.maximum(row_best, column, out=row_best)
    # Then the maximum over the window rows.
    rows = [slice(i, i + stride_h * (out_h - 1) + 1, stride_h) for i in range(kernel_h)]
    np.copyto(pooled, row_best[:, :, rows[0]])
    for i in range(1, kernel_h):
        np.maximum(pooled, row_best[:, :, rows[i]], out=pooled)
    if taps is None:  # no argmax asked for (forward's argmax=False)
        return
    has_nan = bool(np.isnan(input).any())
    row_column = np.zeros(row_best.shape, dtype=taps.dtype)
    for j in reversed(range(kernel_w)):
        _select(row_column, j, columns[j] == row_best)
    if has_nan:
        for j in range(kernel_w):
            _select(row_column, j, np.isnan(columns[j]))
    for i in reversed(range(kernel_h)):
        _select(taps, i * kernel_w + row_column[:, :, rows[i]], row_best[:, :, rows[i]] == pooled)
    if has_nan:
        for i in range(kernel_h):
            _select(taps, i * kernel_w + row_column[:, :, rows[i]], np.isnan(row_best[:, :, rows[i]]))
    # A window whose elements are all -inf (where padding compared equal too) takes its
    # first element inside the input, as PyTorch.
    first = (_first_inside(attrs.padding_h, stride_h, out_h)[:, None] * kernel_w
             + _first_inside(attrs.padding_w, stride_w, out_w)[None, :])
    np.copyto(taps, first, where=pooled == -np.inf, casting="unsafe")  # taps < kernel_h * kernel_w fit


def _cpu_max_forward_flat(input: np.ndarray, attrs: Pool2DAttrs, pooled: np.ndarray, taps: np.ndarray) -> None:
    """_cpu_max_forward at stride 1, on the padded planes flattened into one row: a window row's tap j
    of every output is then one contiguous span of it (and a window column's tap i of the row maxima
    another), so every NumPy pass runs over one long row instead of rows as short as the planes
    (SPPF's 20 wide). The positions whose window runs over a row's or a plane's end are computed
    too and dropped. Per output, the same comparisons in the same order as _cpu_max_forward."""
    n, c = input.shape[:2]
    out_h, out_w = pooled.shape[2:]
    kernel_h, kernel_w = attrs.kernel_h, attrs.kernel_w
    padded = _padded(input, attrs, -np.inf)  # padding is never greater, never NaN: it never wins
    height, width = padded.shape[2:]
    flat = padded.reshape(-1)
    span = flat.size - (kernel_w - 1)
    columns = [flat[j:j + span] for j in range(kernel_w)]
    row_best = columns[0].copy()
    for column in columns[1:]:
        np.maximum(row_best, column, out=row_best)
    # Output (n, c, y, x) is position ((n * C + c) * height + y) * width + x of the flat planes.
    last = span - (kernel_h - 1) * width
    rows = [slice(i * width, i * width + last) for i in range(kernel_h)]
    best = np.empty(flat.size, dtype=pooled.dtype)
    np.copyto(best[:last], row_best[rows[0]])
    for i in range(1, kernel_h):
        np.maximum(best[:last], row_best[rows[i]], out=best[:last])
    if taps is None:  # no argmax asked for (forward's argmax=False)
        np.copyto(pooled, best.reshape(n, c, height, width)[:, :, :out_h, :out_w])
        return
    has_nan = bool(np.isnan(input).any())
    row_column = np.zeros(span, dtype=taps.dtype)
    for j in reversed(range(kernel_w)):
        _select(row_column, j, columns[j] == row_best)
    if has_nan:
        for j in range(kernel_w):
            _select(row_column, j, np.isnan(columns[j]))
    tap = np.empty(flat.size, dtype=taps.dtype)
    for i in reversed(range(kernel_h)):
        _select(tap[:last], i * kernel_w + row_column[rows[i]], row_best[rows[i]] == best[:last])
    if has_nan:
        for i in range(kernel_h):
            _select(tap[:last], i * kernel_w + row_column[rows[i]], np.isnan(row_best[rows[i]]))
    np.copyto(pooled, best.reshape(n, c, height, width)[:, :, :out_h, :out_w])
    np.copyto(taps, tap.reshape(n, c, height, width)[:, :, :out_h, :out_w])
    first = (_first_inside(attrs.padding_h, 1, out_h)[:, None] * kernel_w + _first_inside(attrs.padding_w, 1, out_w)[None, :])
    np.copyto(taps, first, where=pooled == -np.inf, casting="unsafe")  # taps < kernel_h * kernel_w fit


def _cpu_avg_forward(input: np.ndarray, attrs: Pool2DAttrs, pooled: np.ndarray) -> None:
    """The window sum in row-major order (padding adds exact zeros), divided once."""
    out_h, out_w = pooled.shape[2:]
    padded = _padded(input, attrs, 0.0)
    total = np.zeros(pooled.shape, dtype=pooled.dtype)
    for row in range(attrs.kernel_h):
        for column in range(attrs.kernel_w):
            total += _window_tap(padded, attrs, out_h, out_w, row, column)
    np.divide(total, _average_divisor(attrs, *input.shape[2:], out_h, out_w, pooled.dtype), out=pooled)


CPU_FORWARD_BLOCK = 1 << 16  # input elements a block of the CPU forward handles at once (whole planes)

# The size-gated paths of the forward and the MAX backward (kernels.runtime.cpu_paths).
(FORWARD_PLANES_PATH, FORWARD_ONE_PLANE_PATH, FORWARD_THREADS_PATH, BACKWARD_PLANES_PATH, BACKWARD_ONE_PLANE_PATH,
 BACKWARD_THREADS_PATH) = cpu_paths.declare("pool_2d", {
    "forward.planes": "forward: planes past CPU_FORWARD_BLOCK input elements in blocks of several whole planes",
    "forward.one_plane": "forward: planes over half of CPU_FORWARD_BLOCK each, a block a plane",
    "forward.threads": "forward: the blocks of planes shared out to the threads",
    "max_backward.planes": "MAX backward: blocks of several whole planes, more than one block",
    "max_backward.one_plane": "MAX backward: a plane with more outputs than CPU_BACKWARD_BLOCK, a block a plane",
    "max_backward.threads": "MAX backward: the blocks of planes shared out to the threads",
})


def _cpu_forward_planes(input: np.ndarray, attrs: Pool2DAttrs, pooled: np.ndarray, taps: np.ndarray | None) -> None:
    """The forward over blocks of whole (n, c) planes, cache-sized, shared out to the threads: a window
    stays in its plane, so each block gets the same operations as the whole tensor at once."""
    n, c, height, width = input.shape
    planes = n * c
    per_block = max(1, CPU_FORWARD_BLOCK // max(height * width, 1))
    views = [None if a is None else a.reshape(1, planes, *a.shape[2:]) for a in (input, pooled, taps)]
    blocks = -(-planes // per_block)
    cpu_paths.reach_if(FORWARD_PLANES_PATH, per_block > 1 and blocks > 1)
    cpu_paths.reach_if(FORWARD_ONE_PLANE_PATH, per_block == 1 and blocks > 1)

    function = _block_forward(attrs)

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(FORWARD_THREADS_PATH, first, last, blocks)
        for start in range(first * per_block, min(last * per_block, planes), per_block):
            part = slice(start, start + per_block)
            function(*(None if v is None else v[:, part] for v in views))

    cpu.cpu_parallel(run, blocks, input.nbytes * (3 if taps is not None else 2))


def _block_forward(attrs: Pool2DAttrs) -> Any:
    """The forward of a block of planes: function(input, pooled, taps or None), by the pooling and its stride."""
    if attrs.pool_type is PoolOp.MAX and attrs.stride_h == attrs.stride_w == 1:
        return lambda x, y, t: _cpu_max_forward_flat(x, attrs, y, t)
    if attrs.pool_type is PoolOp.MAX:
        return lambda x, y, t: _cpu_max_forward(x, attrs, y, t)
    return lambda x, y, t: _cpu_avg_forward(x, attrs, y)


def forward_plan(state: core.KernelState, attrs: Pool2DAttrs, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, input, output) on checked arrays, MAX without its argmax (a plan's call has no ctx,
    so no backward reads it), with `threads` as the handle's thread count. A form of one block of planes,
    in a dtype the pooling computes in and without an activation, gets the block's forward alone, on the
    views _cpu_forward_planes makes."""
    shape = state.shapes["input_shape"]
    n, c, height, width = shape.dims
    planes = n * c
    if (-(-planes // max(1, CPU_FORWARD_BLOCK // max(height * width, 1))) != 1 or attrs.activation is not None
            or core.compute_dtype(shape.dtype) != shape.dtype or not core.numel(state.shapes["output_shape"].dims)):
        return cpu.with_threads(lambda state, input, output: forward(state, attrs, input, output, argmax=False), threads)
    function = _block_forward(attrs)
    into = (1, planes, height, width), (1, planes, *state.shapes["output_shape"].dims[2:])
    return lambda state, input, output: function(input.reshape(into[0]), output.reshape(into[1]), None)


CPU_BACKWARD_BLOCK = 1 << 16  # outputs a block of the CPU MAX backward handles at once
# A block of the CPU MAX backward costs about as much as copying 80 bytes an output, its add.at most of
# it (docs/performance.md#pool-2d-max-backward): cpu_parallel weighs its parts by that, not by the bytes moved.
CPU_BACKWARD_BYTES = 80
_TARGETS = core.thread_local(buffer=None)  # each thread's buffer of a block's target offsets


def _targets(count: int) -> np.ndarray:
    """This thread's intp buffer of `count` elements: a new buffer per block cost its page faults
    (docs/performance.md#pool-2d-max-backward)."""
    buffer = _TARGETS.buffer
    if buffer is None or buffer.size < count:
        buffer = _TARGETS.buffer = np.empty(count, np.intp)
    return cpu.scratch(buffer[:count])


def _cpu_max_backward(attrs: Pool2DAttrs, grad: np.ndarray, taps: np.ndarray, input_grad: np.ndarray) -> None:
    """input_grad = each output's gradient added at its window's argmax, in row-major output
    order and in the dtype (np.add.at adds one by one): the GPU gather's sums, bit for bit."""
    n, c, height, width = input_grad.shape
    out_h, out_w = grad.shape[2:]
    # A window's argmax stays in its (n, c) plane: planes are independent, so blocks of them
    # (cache-sized) are shared out to the cores, each block's sums in the same order as before.
    # Targets are offsets inside the block: plane + window origin (a table) + the tap's offset (a lookup).
    nbytes = grad.size * CPU_BACKWARD_BYTES  # the work, weighed as bytes: the parts it is worth
    planes = max(1, min(CPU_BACKWARD_BLOCK // max(out_h * out_w, 1), -(-(n * c) // cpu.parallel_parts(nbytes))))
    origin = ((np.arange(planes, dtype=np.intp) * height)[:, None, None]
              + (np.arange(out_h, dtype=np.intp) * attrs.stride_h - attrs.padding_h)[None, :, None]) * width \
        + (np.arange(out_w, dtype=np.intp) * attrs.stride_w - attrs.padding_w)[None, None, :]
    tap_offset = (np.arange(attrs.kernel_h, dtype=np.intp)[:, None] * width
                  + np.arange(attrs.kernel_w, dtype=np.intp)[None, :]).reshape(-1)
    taps = taps.reshape(n * c, out_h, out_w)
    grad = grad.reshape(n * c, out_h * out_w)
    input_grad = input_grad.reshape(n * c, height * width)  # a view: input_grad is C-contiguous
    blocks = -(-(n * c) // planes)
    cpu_paths.reach_if(BACKWARD_PLANES_PATH, planes > 1 and blocks > 1)
    cpu_paths.reach_if(BACKWARD_ONE_PLANE_PATH, out_h * out_w > CPU_BACKWARD_BLOCK and blocks > 1)

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(BACKWARD_THREADS_PATH, first, last, blocks)
        for start in range(first * planes, min(last * planes, n * c), planes):
            stop = min(start + planes, n * c)
            target = _targets((stop - start) * out_h * out_w).reshape(stop - start, out_h, out_w)
            np.copyto(target, taps[start:stop], casting="unsafe")  # then take reads intp indices (its fast path)
            # Taps are always < kernel_h * kernel_w, so mode="clip" changes no index; it skips the
            # bounds check of mode="raise", which is much slower (docs/performance.md#pool-2d-max-backward).
            np.take(tap_offset, target, out=target, mode="clip")
            target += origin[:stop - start]
            block = input_grad[start:stop].reshape(-1)
            block.fill(0)
            np.add.at(block, target.reshape(-1), grad[start:stop].reshape(-1))

    cpu.cpu_parallel(run, blocks, nbytes)


def _cpu_avg_backward(attrs: Pool2DAttrs, grad: np.ndarray, input_grad: np.ndarray) -> None:
    """input_grad = the sum of output_grad / divisor over the windows holding each element.

    Taps are visited in reverse: a later tap of a window is an earlier window of the
    same input element, so the sums run in row-major output order, as the GPU gather's.
    """
    height, width = input_grad.shape[2:]
    out_h, out_w = grad.shape[2:]
    share = grad / _average_divisor(attrs, height, width, out_h, out_w, grad.dtype)
    padded = np.zeros((*input_grad.shape[:2], height + 2 * attrs.padding_h, width + 2 * attrs.padding_w),
                      dtype=input_grad.dtype)
    for row in reversed(range(attrs.kernel_h)):
        for column in reversed(range(attrs.kernel_w)):
            _window_tap(padded, attrs, out_h, out_w, row, column)[...] += share
    np.copyto(input_grad, padded[:, :, attrs.padding_h:attrs.padding_h + height, attrs.padding_w:attrs.padding_w + width])


def forward(state: core.KernelState, attrs: Pool2DAttrs, input: np.ndarray, output: np.ndarray,
            argmax: bool = True) -> None:
    """output = activation(pool(input)); MAX saves the argmax taps (unless argmax is False: a forward no
    backward follows, a functional plan's; the output is the same), an activation its input."""
    taps = _saved(state, "taps", np, output.shape, tap_dtype(attrs)) if attrs.pool_type is PoolOp.MAX and argmax \
        else None
    pooled = output if attrs.activation is None else _saved(state, "pre", np, output.shape, output.dtype)
    if not output.size:
        return
    compute = core.compute_dtype(input.dtype)
    if compute == input.dtype:
        _cpu_forward_planes(input, attrs, pooled, taps)
        if attrs.activation is not None:
            activation.cpu_forward(attrs.activation, pooled, output)
        return
    # Half: the float32 pooling of the widened input, rounded once (MAX: exact).
    wide = np.empty(output.shape, compute)
    _cpu_forward_planes(input.astype(compute), attrs, wide, taps)
    np.copyto(pooled, wide, casting="unsafe")
    if attrs.activation is not None:  # f in float32 at the rounded pre-activation, rounded once
        np.copyto(wide, pooled)
        activation.cpu_forward(attrs.activation, wide, wide)
        np.copyto(output, wide, casting="unsafe")


def backward(state: core.KernelState, attrs: Pool2DAttrs, output_grad: np.ndarray, input_grad: np.ndarray) -> None:
    """input_grad = the gather of output_grad (through the activation's derivative) to the windows' elements."""
    compute = core.compute_dtype(input_grad.dtype)
    grad = output_grad
    if attrs.activation is not None:
        grad = np.empty(output_grad.shape, compute)
        if compute == output_grad.dtype:
            activation.cpu_backward(attrs.activation, state.saved["pre"], output_grad, grad)
        else:  # half: f' in float32, the product rounded to the dtype (the GPU's activation kernel writes it so)
            activation.cpu_backward(attrs.activation, state.saved["pre"].astype(compute), output_grad.astype(compute),
                                    grad)
            grad = grad.astype(output_grad.dtype)
    target = input_grad if compute == input_grad.dtype else np.empty(input_grad.shape, compute)
    grad = grad.astype(compute, copy=False)  # half: widened once; the sums in float32
    if attrs.pool_type is PoolOp.MAX:
        _cpu_max_backward(attrs, grad, state.saved["taps"], target)
    else:
        _cpu_avg_backward(attrs, grad, target)
    if target is not input_grad:
        np.copyto(input_grad, target, casting="unsafe")  # rounded once

