"""pool_2d: MAX or AVG pooling of an NCHW tensor, then an optional fused activation.

The output is (N, C, floor((H + 2 * padding_h - kernel_h) / stride_h) + 1, likewise W)
(PyTorch with ceil_mode false). Padding is at most half the kernel, so every window
holds at least one input element.

MAX follows PyTorch bit for bit: padding never wins, a NaN in a window makes its
output NaN, and the gradient of each output goes to its window's argmax: the first
maximum in row-major window order, or the window's last NaN. The forward saves each
argmax as a tap index (row * kernel_w + column inside the window) in the state,
like cuDNN's reserve space; a MAX backward without a forward before it raises
StateError. AVG divides by kernel_h * kernel_w (count_include_pad, PyTorch's
default) or by the number of input elements in the window.

Backward is a gather on both devices: every input gradient is the sum, in
row-major output order, of the gradients of the windows that send it one. On the
GPU one thread owns one input element: no atomics, the same bits on every run,
and the same bits as the CPU. Custom kernels rather than cuDNN: cuDNN's
max-pooling backward does not promise PyTorch's tie rule nor determinism with
overlapping windows (SPPF's 5x5 stride 1). The MAX forward is separable on both
devices (window rows, then window columns; on the GPU a shared-memory tile of
outputs a block), which keeps the row-major scan's argmax.

float16 and bfloat16 are stored in the half dtype and computed in float32 on both
devices: each value is widened once when read and the result rounded once when
written. MAX picks one of its inputs (exact); its backward sums the gradients that
land on an element in float32 and rounds once (exact where one lands); AVG sums its
window and divides in float32, its backward sums the float32 shares. A fused
activation is evaluated in float32 at the half pre-activation kept in the state,
and its derivative's product rounded to the dtype before the gather, as the GPU's
activation kernels do.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import activation, core, cpu, gpu, gpu_paths
from .core import ALL_FLOAT_DTYPES, AttrsError, ShapeError, StateError, TensorShape, fail

OP = "pool_2d"


class PoolOp(enum.Enum):
    MAX = "MAX"
    AVG = "AVG"


@dataclass(frozen=True)
class Pool2DAttrs:
    kernel_h: int
    kernel_w: int
    stride_h: int
    stride_w: int
    padding_h: int
    padding_w: int
    pool_type: PoolOp
    count_include_pad: bool = True  # AVG only, PyTorch's default
    activation: activation.Activation | None = None  # applied after the pooling

    def __post_init__(self) -> None:
        for name in ("kernel_h", "kernel_w", "stride_h", "stride_w"):
            core.set_attr(self, name, core.attr_int(OP, name, getattr(self, name), minimum=1))
        for name, kernel_name in (("padding_h", "kernel_h"), ("padding_w", "kernel_w")):
            padding = core.attr_int(OP, name, getattr(self, name), minimum=0)
            half = getattr(self, kernel_name) // 2
            if padding > half:
                raise fail(AttrsError, OP, name, f"at most half of {kernel_name} ({half})", padding)
            core.set_attr(self, name, padding)
        core.set_attr(self, "pool_type", core.attr_enum(OP, "pool_type", self.pool_type, PoolOp))
        core.set_attr(self, "count_include_pad", core.attr_bool(OP, "count_include_pad", self.count_include_pad))
        core.set_attr(self, "activation", activation.attr_activation(OP, self.activation))


def _check_window(attrs: Pool2DAttrs, dims: tuple[int, ...]) -> None:
    """An NCHW input whose padded H and W hold one window (so the output is not empty)."""
    if len(dims) != 4:
        raise fail(ShapeError, OP, "input_shape", "rank 4 (N, C, H, W)", f"rank {len(dims)} {tuple(dims)}")
    for size, kernel, padding, what in ((dims[2], attrs.kernel_h, attrs.padding_h, "H"),
                                        (dims[3], attrs.kernel_w, attrs.padding_w, "W")):
        smallest = max(1, kernel - 2 * padding)
        if size < smallest:
            raise fail(ShapeError, OP, "input_shape", f"{what} >= {smallest} (a window inside the padded input)",
                       tuple(dims))


def output_dims(attrs: Pool2DAttrs, dims: tuple[int, ...]) -> tuple[int, ...]:
    """(N, C, out_h, out_w) of an NCHW input, by floor((size + 2 * padding - kernel) / stride) + 1; ShapeError
    where the input is not rank 4 or a window does not fit in the padded input (out_h or out_w would be < 1)."""
    _check_window(attrs, dims)
    n, c, h, w = dims
    return (n, c, (h + 2 * attrs.padding_h - attrs.kernel_h) // attrs.stride_h + 1,
            (w + 2 * attrs.padding_w - attrs.kernel_w) // attrs.stride_w + 1)


def tap_dtype(attrs: Pool2DAttrs) -> np.dtype:
    """The dtype of the saved argmax taps: one byte while the window has at most 255 taps."""
    return np.dtype(np.uint8 if attrs.kernel_h * attrs.kernel_w <= 255 else np.int32)


def init_kernel(handle: Any, attrs: Pool2DAttrs, input_shape: TensorShape, output_shape: TensorShape) -> core.KernelState:
    """Check the shapes against the attrs (rank 4, the output formula, float dtypes) and record them."""
    state = core.make_state(OP, handle, attrs, Pool2DAttrs, input_shape=input_shape, output_shape=output_shape)
    core.check_dtype(OP, "input_shape", input_shape, ALL_FLOAT_DTYPES)
    core.check_rank(OP, "input_shape", input_shape, rank=4)
    _check_window(attrs, input_shape.dims)
    core.check_rank(OP, "output_shape", output_shape, rank=4)
    core.check_dims(OP, "output_shape", output_shape, output_dims(attrs, input_shape.dims))
    core.check_same_dtype(OP, "output_shape", output_shape, input_shape, "input_shape")
    return state


def _check_forward(stream, handle, state, attrs, input, output) -> None:
    core.check_unary_forward(OP, stream, handle, state, attrs, input, output)


def _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad) -> None:
    core.check_unary_backward(OP, stream, handle, state, attrs, output, output_grad, input, input_grad)
    if attrs.pool_type is PoolOp.MAX and "taps" not in state.saved:
        raise fail(StateError, OP, "state", "a MAX forward before the backward (it saves the argmax)", "none")
    if attrs.activation is not None and "pre" not in state.saved:
        raise fail(StateError, OP, "state", f"a forward before the backward (it saves the pre-{attrs.activation.name} values)",
                   "none")


def _saved(state, name: str, xp: Any, dims: tuple[int, ...], dtype: Any) -> Any:
    """A buffer the state keeps across calls (argmax taps, pre-activation), made on first use
    (on the GPU by gpu.device_empty: outside CuPy's pool, freed only once the device is done)."""
    if name not in state.saved:
        state.saved[name] = np.empty(dims, dtype=dtype) if xp is np else gpu.device_empty(dims, dtype, state.device)
    return state.saved[name]


# --------------------------------------------------------------------------- CPU


def _window_tap(array: np.ndarray, attrs: Pool2DAttrs, out_h: int, out_w: int, row: int, column: int) -> np.ndarray:
    """The strided view of a padded NCHW array that tap (row, column) of every window reads."""
    return array[:, :, row:row + attrs.stride_h * (out_h - 1) + 1:attrs.stride_h,
                 column:column + attrs.stride_w * (out_w - 1) + 1:attrs.stride_w]


def _padded(input: np.ndarray, attrs: Pool2DAttrs, fill: float) -> np.ndarray:
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
    (np.copyto's where=, np.where) branch per element, about 3 ns an element on the argmax masks of
    random data against 0.1 ns here."""
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
    has_nan = bool(np.isnan(input).any())
    # Each padded row's maximum over the window columns of every output column.
    columns = [padded[:, :, :, j:j + stride_w * (out_w - 1) + 1:stride_w] for j in range(kernel_w)]
    row_best = columns[0].copy()
    for column in columns[1:]:
        np.maximum(row_best, column, out=row_best)
    row_column = np.zeros(row_best.shape, dtype=taps.dtype)
    for j in reversed(range(kernel_w)):
        _select(row_column, j, columns[j] == row_best)
    if has_nan:
        for j in range(kernel_w):
            _select(row_column, j, np.isnan(columns[j]))
    # Then the maximum over the window rows.
    rows = [slice(i, i + stride_h * (out_h - 1) + 1, stride_h) for i in range(kernel_h)]
    np.copyto(pooled, row_best[:, :, rows[0]])
    for i in range(1, kernel_h):
        np.maximum(pooled, row_best[:, :, rows[i]], out=pooled)
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
    has_nan = bool(np.isnan(input).any())
    span = flat.size - (kernel_w - 1)
    columns = [flat[j:j + span] for j in range(kernel_w)]
    row_best = columns[0].copy()
    for column in columns[1:]:
        np.maximum(row_best, column, out=row_best)
    row_column = np.zeros(span, dtype=taps.dtype)
    for j in reversed(range(kernel_w)):
        _select(row_column, j, columns[j] == row_best)
    if has_nan:
        for j in range(kernel_w):
            _select(row_column, j, np.isnan(columns[j]))
    # Output (n, c, y, x) is position ((n * C + c) * height + y) * width + x of the flat planes.
    last = span - (kernel_h - 1) * width
    rows = [slice(i * width, i * width + last) for i in range(kernel_h)]
    best = np.empty(flat.size, dtype=pooled.dtype)
    tap = np.empty(flat.size, dtype=taps.dtype)
    np.copyto(best[:last], row_best[rows[0]])
    for i in range(1, kernel_h):
        np.maximum(best[:last], row_best[rows[i]], out=best[:last])
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


_CPU_FORWARD_BLOCK = 1 << 16  # input elements a block of the CPU forward handles at once (whole planes)


def _cpu_forward_planes(input: np.ndarray, attrs: Pool2DAttrs, pooled: np.ndarray, taps: np.ndarray | None) -> None:
    """The forward over blocks of whole (n, c) planes, cache-sized, shared out to the threads: a window
    stays in its plane, so each block gets the same operations as the whole tensor at once."""
    n, c, height, width = input.shape
    planes = n * c
    per_block = max(1, _CPU_FORWARD_BLOCK // max(height * width, 1))
    views = [None if a is None else a.reshape(1, planes, *a.shape[2:]) for a in (input, pooled, taps)]

    def run(first: int, last: int) -> None:
        for start in range(first * per_block, min(last * per_block, planes), per_block):
            part = slice(start, start + per_block)
            x, y, t = (None if v is None else v[:, part] for v in views)
            if attrs.pool_type is PoolOp.MAX and attrs.stride_h == attrs.stride_w == 1:
                _cpu_max_forward_flat(x, attrs, y, t)
            elif attrs.pool_type is PoolOp.MAX:
                _cpu_max_forward(x, attrs, y, t)
            else:
                _cpu_avg_forward(x, attrs, y)

    cpu.cpu_parallel(run, -(-planes // per_block), input.nbytes * (3 if taps is not None else 2))


_CPU_BACKWARD_BLOCK = 1 << 16  # outputs a block of the CPU MAX backward handles at once
# A block of the CPU MAX backward costs about as much as copying 80 bytes an output (2.7 ns an output
# on one core, its add.at most of it): cpu_parallel weighs its parts by that, not by the bytes moved.
_CPU_BACKWARD_BYTES = 80
_TARGETS = threading.local()  # each thread's buffer of a block's target offsets


def _targets(count: int) -> np.ndarray:
    """This thread's intp buffer of `count` elements: a new buffer per block cost its page faults
    (about 60 us over SPPF's 640 planes of 20x20)."""
    buffer = getattr(_TARGETS, "buffer", None)
    if buffer is None or buffer.size < count:
        buffer = _TARGETS.buffer = np.empty(count, np.intp)
    return buffer[:count]


def _cpu_max_backward(attrs: Pool2DAttrs, grad: np.ndarray, taps: np.ndarray, input_grad: np.ndarray) -> None:
    """input_grad = each output's gradient added at its window's argmax, in row-major output
    order and in the dtype (np.add.at adds one by one): the GPU gather's sums, bit for bit."""
    n, c, height, width = input_grad.shape
    out_h, out_w = grad.shape[2:]
    # A window's argmax stays in its (n, c) plane: planes are independent, so blocks of them
    # (cache-sized) are shared out to the cores, each block's sums in the same order as before.
    # Targets are offsets inside the block: plane + window origin (a table) + the tap's offset (a lookup).
    planes = max(1, min(_CPU_BACKWARD_BLOCK // max(out_h * out_w, 1), -(-(n * c) // cpu.cpu_threads())))
    origin = ((np.arange(planes, dtype=np.intp) * height)[:, None, None]
              + (np.arange(out_h, dtype=np.intp) * attrs.stride_h - attrs.padding_h)[None, :, None]) * width \
        + (np.arange(out_w, dtype=np.intp) * attrs.stride_w - attrs.padding_w)[None, None, :]
    tap_offset = (np.arange(attrs.kernel_h, dtype=np.intp)[:, None] * width
                  + np.arange(attrs.kernel_w, dtype=np.intp)[None, :]).reshape(-1)
    taps = taps.reshape(n * c, out_h, out_w)
    grad = grad.reshape(n * c, out_h * out_w)
    input_grad = input_grad.reshape(n * c, height * width)  # a view: input_grad is C-contiguous

    def run(first: int, last: int) -> None:
        for start in range(first * planes, min(last * planes, n * c), planes):
            stop = min(start + planes, n * c)
            target = _targets((stop - start) * out_h * out_w).reshape(stop - start, out_h, out_w)
            np.copyto(target, taps[start:stop], casting="unsafe")  # then take reads intp indices (its fast path)
            # Taps are always < kernel_h * kernel_w, so mode="clip" changes no index; it skips the
            # bounds check of mode="raise" (about 2.5x faster here).
            np.take(tap_offset, target, out=target, mode="clip")
            target += origin[:stop - start]
            block = input_grad[start:stop].reshape(-1)
            block.fill(0)
            np.add.at(block, target.reshape(-1), grad[start:stop].reshape(-1))

    cpu.cpu_parallel(run, -(-(n * c) // planes), grad.size * _CPU_BACKWARD_BYTES)


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


@cpu.cpu_kernel
def cpu_forward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: Pool2DAttrs,
                       input: core.Array, output: core.Array) -> None:
    """output = activation(pool(input)); MAX saves the argmax taps, an activation its input."""
    _check_forward(stream, handle, state, attrs, input, output)
    taps = _saved(state, "taps", np, output.shape, tap_dtype(attrs)) if attrs.pool_type is PoolOp.MAX else None
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


@cpu.cpu_kernel
def cpu_backward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: Pool2DAttrs,
                        output: core.Array | None, output_grad: core.Array, input: core.Array | None,
                        input_grad: core.Array | None) -> None:
    """input_grad = the gather of output_grad (through the activation's derivative) to the windows' elements."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is None or not input_grad.size:
        return
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


# --------------------------------------------------------------------------- GPU


_CUDA = gpu.CudaModule("pool_2d.cu", [
    f"max_pool_{kind}<{value}, {tap}, {index}>"
    for kind in ("forward", "forward_tiled", "backward") for value in gpu.FLOAT_TYPES + gpu.HALF_TYPES
    for tap in ("unsigned char", "int") for index in gpu.INDEX_TYPES
] + [
    f"avg_pool_{direction}<{value}, {index}>"
    for direction in ("forward", "backward") for value in gpu.FLOAT_TYPES + gpu.HALF_TYPES
    for index in gpu.INDEX_TYPES
])

TILE_OUTPUTS = 512  # outputs a block of the tiled MAX forward aims at (two a thread)
TILE_SHARED_LIMIT = 48 * 1024  # static shared-memory limit; a larger tile falls back to the direct kernel


def max_forward_tile(attrs: Pool2DAttrs, out_h: int, out_w: int, itemsize: int) -> tuple[int, int, int, int, int] | None:
    """(tile_h, tile_w, tiles_h, tiles_w, shared bytes) of the tiled MAX forward, or None where the
    tile's shared memory would exceed TILE_SHARED_LIMIT. Tiles split the plane evenly, at most 32 wide."""
    tiles_w = -(-out_w // 32)
    tile_w = -(-out_w // tiles_w)
    tiles_h = -(-out_h // max(1, TILE_OUTPUTS // tile_w))
    tile_h = -(-out_h // tiles_h)
    in_h = (tile_h - 1) * attrs.stride_h + attrs.kernel_h
    in_w = (tile_w - 1) * attrs.stride_w + attrs.kernel_w
    tap_size = tap_dtype(attrs).itemsize
    values = in_h * in_w * itemsize + in_h * tile_w * itemsize
    shared = -(-values // tap_size) * tap_size + in_h * tile_w * tap_size  # the taps aligned to their size
    if shared > TILE_SHARED_LIMIT:
        return None
    return tile_h, tile_w, tiles_h, tiles_w, shared


gpu_paths.declare(OP, {
    "max.forward_tiled": "max_pool_forward_tiled: a block per output tile, its input window staged in shared memory",
    "max.forward_direct": "max_pool_forward: a thread per output (the tile would exceed 48 KB of shared memory)",
    "max.backward": "max_pool_backward: a thread per input element, gathering from the saved argmax taps",
    "max.taps_u8": "argmax taps as unsigned char (a window of at most 255 taps)",
    "max.taps_i32": "argmax taps as int (a window of more than 255 taps)",
    "avg.forward": "avg_pool_forward: a thread per output",
    "avg.backward": "avg_pool_backward: a thread per input element, gathering its windows' shares",
})


def plan_paths(attrs: Pool2DAttrs, direction: str, tiled: bool) -> tuple[str, ...]:
    """The named GPU paths (kernels.gpu_paths) of one pool launch."""
    if attrs.pool_type is not PoolOp.MAX:
        return (f"{OP}.avg.{direction}",)
    kernel = "forward_tiled" if tiled else "forward_direct" if direction == "forward" else "backward"
    return f"{OP}.max.{kernel}", f"{OP}.max.taps_{'u8' if tap_dtype(attrs).itemsize == 1 else 'i32'}"


def _gpu_plan(attrs: Pool2DAttrs, direction: str, dtype: Any, input_dims: tuple[int, ...],
              output_dims: tuple[int, ...]) -> tuple:
    """(kernel, grid, block, scalar arguments, shared bytes, paths) of one pool kernel, made once per state and
    direction. Forward: a block per tile of outputs (MAX, where the tile fits shared memory) or a
    thread per output; backward: a thread per input element."""
    n, c, height, width = input_dims
    out_h, out_w = output_dims[2:]
    count = core.numel(output_dims if direction == "forward" else input_dims)
    index = gpu.index_type(core.numel(input_dims), core.numel(output_dims))
    scalar = np.int32 if index == "int" else np.int64
    geometry = tuple(np.int32(v) for v in (height, width, out_h, out_w, attrs.kernel_h, attrs.kernel_w,
                                           attrs.stride_h, attrs.stride_w, attrs.padding_h, attrs.padding_w))
    value = gpu.cuda_type(dtype)
    if attrs.pool_type is PoolOp.MAX:
        types = f"<{value}, {gpu.cuda_type(tap_dtype(attrs))}, {index}>"
        tile = max_forward_tile(attrs, out_h, out_w, np.dtype(dtype).itemsize) if direction == "forward" else None
        if tile is not None:
            tile_h, tile_w, tiles_h, tiles_w, shared = tile
            scalars = (scalar(n * c),) + geometry + (np.int32(tile_h), np.int32(tile_w), np.int32(tiles_w))
            return (_CUDA.function(f"max_pool_forward_tiled{types}"), (tiles_h * tiles_w, min(n * c, 65535)),
                    gpu.BLOCK, scalars, shared, plan_paths(attrs, direction, True))
        name = f"max_pool_{direction}{types}"
        scalars = (scalar(count),) + geometry
    else:
        name = f"avg_pool_{direction}<{value}, {index}>"
        scalars = (scalar(count),) + geometry + (np.int32(attrs.count_include_pad),)
    return _CUDA.function(name), gpu.grid_for(count), gpu.BLOCK, scalars, 0, plan_paths(attrs, direction, False)


def _gpu_forward_setup(stream, state, attrs, output) -> tuple:  # pragma: no cover - GPU: CuPy buffers
    """The forward's buffers (argmax taps, pre-activation; made on the stream's device, once)
    and launch plan, kept in the state: (kernel, grid, block, scalars, shared, paths, taps, pooled), or
    None for an empty output."""
    taps = _saved(state, "taps", gpu.cupy, output.shape, tap_dtype(attrs)) if attrs.pool_type is PoolOp.MAX else None
    pre = None if attrs.activation is None else _saved(state, "pre", gpu.cupy, output.shape, output.dtype)
    if not output.size:
        return None
    shapes = state.shapes
    return _gpu_plan(attrs, "forward", output.dtype, shapes["input_shape"].dims, shapes["output_shape"].dims) + (taps, pre)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: Pool2DAttrs,
                       input: core.Array, output: core.Array) -> None:
    """output = activation(pool(input)), enqueued on the stream; MAX saves the argmax taps."""
    _check_forward(stream, handle, state, attrs, input, output)
    saved = state.saved
    if "gpu_forward" not in saved:
        saved["gpu_forward"] = _gpu_forward_setup(stream, state, attrs, output)
    plan = saved["gpu_forward"]
    if plan is None:
        return
    kernel, grid, block, scalars, shared, paths, taps, pre = plan
    for path in paths:
        gpu_paths.reach(path)
    pooled = output if pre is None else pre
    arrays = (input, pooled) if taps is None else (input, pooled, taps)
    gpu.launch(stream, kernel, grid, block, arrays + scalars, shared_mem=shared)
    if pre is not None:
        activation.gpu_forward(stream, attrs.activation, pre, output)


def _gpu_backward_setup(stream, state, attrs, output_grad) -> tuple:
    """The backward's buffer (the pre-activation gradient, made once) and launch plan, kept in the
    state: (kernel, grid, block, scalars, shared, paths, pre_grad)."""
    pre_grad = None
    if attrs.activation is not None:
        pre_grad = _saved(state, "pre_grad", gpu.cupy, output_grad.shape, output_grad.dtype)
    shapes = state.shapes
    return _gpu_plan(attrs, "backward", output_grad.dtype, shapes["input_shape"].dims,
                     shapes["output_shape"].dims) + (pre_grad,)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: Pool2DAttrs,
                        output: core.Array | None, output_grad: core.Array, input: core.Array | None,
                        input_grad: core.Array | None) -> None:
    """input_grad = the gather of output_grad to the windows' elements, enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is None or not input_grad.size:
        return
    saved = state.saved
    if "gpu_backward" not in saved:
        saved["gpu_backward"] = _gpu_backward_setup(stream, state, attrs, output_grad)
    kernel, grid, block, scalars, shared, paths, pre_grad = saved["gpu_backward"]
    for path in paths:
        gpu_paths.reach(path)
    grad = output_grad
    if pre_grad is not None:
        activation.gpu_backward(stream, attrs.activation, saved["pre"], output_grad, pre_grad)
        grad = pre_grad
    arrays = (grad, input_grad) if attrs.pool_type is not PoolOp.MAX else (grad, saved["taps"], input_grad)
    gpu.launch(stream, kernel, grid, block, arrays + scalars, shared_mem=shared)


# --------------------------------------------------------------------------- entry points

forward_kernel = core.entry_point(OP, "forward_kernel", cpu_forward_kernel, gpu_forward_kernel,
                                  "Write output = activation(pool(input)) on the stream's device.")
backward_kernel = core.entry_point(OP, "backward_kernel", cpu_backward_kernel, gpu_backward_kernel,
                                   "Write input_grad from output_grad (MAX: to the saved argmax of each window) "
                                   "on the stream's device.")
cleanup_kernel = core.cleanup_entry_point(OP, "Release the state and the buffers it saved.")
cpu_init_kernel = gpu_init_kernel = init_kernel
cpu_cleanup_kernel = gpu_cleanup_kernel = cleanup_kernel
