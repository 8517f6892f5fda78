"""upsample on the CPU (NumPy): NEAREST by rows (scale 2 as integers of twice the width), BILINEAR
by its separable weights, both in parts of whole planes shared out to the threads; the backwards
gather in the GPU's order.

forward and backward run after the package's checks (cpu_forward_kernel, cpu_backward_kernel).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import core, cpu
from ..runtime.core import HALF_DTYPES
from .attrs import UpsampleAttrs, UpsampleMode


def bilinear_source(size: int, scale: int, dtype: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For every output coordinate along an axis of `size` pixels: i0, i1 and their weights l0, l1.

    source = (o + 0.5) / s - 0.5 = (2o + 1 - s) / 2s, clamped at 0; i0 = floor,
    i1 = i0 + 1 clamped at the last pixel, l1 = r / 2s, l0 = (2s - r) / 2s with
    r = (2o + 1 - s) mod 2s: each weight rounded once in `dtype`, as on the GPU.
    """
    dtype = np.dtype(dtype)
    twice = 2 * scale
    numerator = 2 * np.arange(size * scale, dtype=np.int64) + 1 - scale
    positive = numerator > 0
    i0 = np.where(positive, numerator // twice, 0)
    remainder = np.where(positive, numerator - i0 * twice, 0)
    i1 = i0 + (i0 < size - 1)
    l1 = remainder.astype(dtype) / dtype.type(twice)
    l0 = (twice - remainder).astype(dtype) / dtype.type(twice)
    return i0, i1, l0, l1


def bilinear_taps(scale: int) -> range:
    """Offsets t such that output coordinate p*s + t may read input pixel p: 2s of them."""
    return range(-((scale + 1) // 2), scale + scale // 2)


def bilinear_weights(size: int, scale: int, dtype: Any) -> np.ndarray:
    """(taps, size): the weight output coordinate p*s + t gives input pixel p (0 where out of range)."""
    dtype = np.dtype(dtype)
    i0, i1, l0, l1 = bilinear_source(size, scale, dtype)
    pixels = np.arange(size)
    taps = np.array(bilinear_taps(scale))
    coordinate = pixels[None, :] * scale + taps[:, None]
    inside = (coordinate >= 0) & (coordinate < size * scale)
    o = np.where(inside, coordinate, 0)
    zero = dtype.type(0)
    weights = np.where(i0[o] == pixels, l0[o], zero) + np.where(i1[o] == pixels, l1[o], zero)
    return np.where(inside, weights, zero).astype(dtype)


def bilinear_zero_taps(size: int, scale: int) -> np.ndarray:
    """(taps, size): True where output coordinate p*s + t has both its taps on pixel p, the second with
    weight 0 (a coordinate on the last pixel's centre, or any clamped one when size is 1). Its weight
    l0 + 0 has no zero in it, but PyTorch adds the 0 * g term apart, so the kernels add it too."""
    i0, i1, _, l1 = bilinear_source(size, scale, np.float64)
    pixels = np.arange(size)
    coordinate = pixels[None, :] * scale + np.array(bilinear_taps(scale))[:, None]
    inside = (coordinate >= 0) & (coordinate < size * scale)
    o = np.where(inside, coordinate, 0)
    return inside & (i0[o] == pixels) & (i1[o] == pixels) & (l1[o] == 0)


def bilinear_clamped(size: int, scale: int) -> range:
    """Output coordinates before pixel 0's centre (clamped to it) that pixel 1's taps do not reach: their
    second tap is pixel 1 with weight 0, which PyTorch's backward still adds (none when size is 1)."""
    return range(scale // 2 if size > 1 else 0)


def _tap_range(size: int, scale: int, tap: int) -> tuple[int, int]:
    """Input pixels p with 0 <= p*s + tap < size*s, as [low, high)."""
    return max(0, -(tap // scale)), min(size, (size * scale - 1 - tap) // scale + 1)


_DOUBLE_WIDTH = {1: np.uint16, 2: np.uint32, 4: np.uint64}  # itemsize: the unsigned integer holding two elements


def _cpu_nearest_forward(input, output, scale) -> None:
    # Each input row widened once (its elements repeated scale times), then copied to its scale
    # output rows: long rows, where a copy broadcast along a last dim of `scale` moves a few bytes a step.
    n, c, h, w = input.shape
    rows = output.reshape(n, c, h, scale, w * scale)
    pair = _DOUBLE_WIDTH.get(input.dtype.itemsize) if scale == 2 else None
    if pair is not None and input.size:
        # Scale 2: both copies of an element in one integer of twice its width (bits moved, never converted).
        bits = input.view(f"u{input.dtype.itemsize}").astype(pair)
        bits |= bits << (8 * input.dtype.itemsize)
        np.copyto(rows.view(pair), bits[:, :, :, None, :])
    else:
        np.copyto(rows, np.repeat(input, scale, axis=3)[:, :, :, None, :])


def _cpu_nearest_backward(output_grad, input_grad, scale) -> None:
    # Each row of a block left to right, then the row sums top to bottom: the GPU's order.
    n, c, h, w = input_grad.shape
    blocks = output_grad.reshape(n, c, h, scale, w, scale)
    row_sums = np.add(blocks[..., 0], blocks[..., 1])
    for k in range(2, scale):
        np.add(row_sums, blocks[..., k], out=row_sums)
    np.add(row_sums[:, :, :, 0], row_sums[:, :, :, 1], out=input_grad)
    for i in range(2, scale):
        np.add(input_grad, row_sums[:, :, :, i], out=input_grad)


def _cpu_bilinear_forward(input, output, scale) -> None:
    _, _, h, w = input.shape
    y0, y1, ly0, ly1 = bilinear_source(h, scale, input.dtype)
    x0, x1, lx0, lx1 = bilinear_source(w, scale, input.dtype)
    rows0, rows1 = input[:, :, y0, :], input[:, :, y1, :]
    top = lx0 * rows0[..., x0] + lx1 * rows0[..., x1]
    bottom = lx0 * rows1[..., x0] + lx1 * rows1[..., x1]
    np.multiply(ly0[:, None], top, out=output)
    output += ly1[:, None] * bottom


def _cpu_bilinear_backward(output_grad, input_grad, scale) -> None:
    # Separable gather, the GPU's order: along W into rows, then along H; for pixel 1 the clamped
    # coordinates first, then the taps ascending, each followed by its zero-weight term where it has one.
    n, c, h, w = input_grad.shape
    dtype = input_grad.dtype
    weights_y, weights_x = bilinear_weights(h, scale, dtype), bilinear_weights(w, scale, dtype)
    zeros_y, zeros_x = bilinear_zero_taps(h, scale), bilinear_zero_taps(w, scale)
    rows = np.zeros((n, c, h * scale, w), dtype=dtype)
    for o in bilinear_clamped(w, scale):
        rows[..., 1] += output_grad[..., o] * dtype.type(0)
    for j, tap in enumerate(bilinear_taps(scale)):
        low, high = _tap_range(w, scale, tap)
        if low < high:
            sources = output_grad[..., low * scale + tap:(high - 1) * scale + tap + 1:scale]
            rows[..., low:high] += weights_x[j, low:high] * sources
            for p in np.flatnonzero(zeros_x[j, low:high]):
                rows[..., low + p] += sources[..., p] * dtype.type(0)
    input_grad.fill(0)
    for o in bilinear_clamped(h, scale):
        input_grad[:, :, 1, :] += rows[:, :, o, :] * dtype.type(0)
    for j, tap in enumerate(bilinear_taps(scale)):
        low, high = _tap_range(h, scale, tap)
        if low < high:
            sources = rows[:, :, low * scale + tap:(high - 1) * scale + tap + 1:scale, :]
            input_grad[:, :, low:high, :] += weights_y[j, low:high, None] * sources
            for p in np.flatnonzero(zeros_y[j, low:high]):
                input_grad[:, :, low + p, :] += sources[:, :, p, :] * dtype.type(0)



def forward_plan(state: core.KernelState, attrs: UpsampleAttrs, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, input, output) on checked arrays, with `threads` as the handle's thread count."""
    return cpu.with_threads(lambda state, input, output: forward(attrs, input, output), threads)


def forward(attrs: UpsampleAttrs, input: core.Array, output: core.Array) -> None:
    """output = input upsampled by scale_factor (NEAREST or BILINEAR), in parts of whole planes shared out
    to the threads (an output element reads only its own plane)."""
    if attrs.mode is UpsampleMode.NEAREST:  # bits moved, any dtype
        cpu.cpu_planes(lambda x, y: _cpu_nearest_forward(x, y, attrs.scale_factor), input, output)
    else:
        cpu.cpu_planes(_widened(lambda x, y: _cpu_bilinear_forward(x, y, attrs.scale_factor), output.dtype), input, output)


def backward(attrs: UpsampleAttrs, output_grad: core.Array, input_grad: core.Array | None) -> None:
    """input_grad = the sum of output_grad over each input element's sources, weighted for BILINEAR."""
    if input_grad is None:
        return
    backward = _cpu_nearest_backward if attrs.mode is UpsampleMode.NEAREST else _cpu_bilinear_backward
    cpu.cpu_planes(_widened(lambda dy, dx: backward(dy, dx, attrs.scale_factor), input_grad.dtype), output_grad, input_grad)


def _widened(function, dtype):
    """function(source, target), in float32 where the tensors are half (cpu.widened: the source widened
    once, the float32 result rounded once into the target); as it is for every other dtype."""
    return cpu.widened(function) if dtype in HALF_DTYPES else function
