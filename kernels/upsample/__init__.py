"""upsample: NCHW input (N, C, H, W) -> output (N, C, H*s, W*s) for an integer scale s >= 2.

NEAREST (any movable dtype forward) copies input[n, c, h, w] into its s x s
block, as torch.nn.functional.interpolate(mode='nearest') does for an integer
scale; its backward sums each s x s block of output_grad (float and integer
dtypes; integers sum in their own dtype and wrap like it). BILINEAR (float16,
bfloat16, float32, float64) follows interpolate(mode='bilinear', align_corners=False):
source coordinate (o + 0.5) / s - 0.5 clamped at 0, weights r / 2s with r an integer,
each rounded once.

float16 and bfloat16 compute in float32 on both devices (NEAREST's backward sums,
BILINEAR's weights, products and sums): each value widened once when read, each
result rounded once when written.

Both backwards are gathers: each input_grad element sums its sources in one
fixed order, the same on the CPU and the GPU, with no atomics. BILINEAR's
backward also adds the terms of weight 0 that PyTorch's scatter adds (each output
coordinate's gradient goes to both its taps, whatever their weights): 0 times a
finite gradient changes nothing, 0 times inf or NaN is NaN, as in PyTorch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime import core, cpu, gpu, gpu_paths
from ..runtime.core import ALL_FLOAT_DTYPES, HALF_DTYPES, MOVABLE_DTYPES, ShapeError, TensorShape, fail
from ..runtime.spec import UNARY_FORWARD, UNARY_SHAPES, declare_op, unary_backward

OP = "upsample"


class UpsampleMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"


# NEAREST backward sums: float and integer dtypes (bool and complex are forward only).
NEAREST_BACKWARD_DTYPES = ALL_FLOAT_DTYPES + tuple(
    np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64))


@dataclass(frozen=True)
class UpsampleAttrs:
    """scale_factor: an integer >= 2, the same for H and W; mode: NEAREST or BILINEAR (align_corners=False)."""

    scale_factor: int
    mode: UpsampleMode = UpsampleMode.NEAREST

    def __post_init__(self) -> None:
        core.set_attr(self, "scale_factor", core.attr_int(OP, "scale_factor", self.scale_factor, minimum=2))
        core.set_attr(self, "mode", core.attr_enum(OP, "mode", self.mode, UpsampleMode))


def output_dims(attrs: UpsampleAttrs, dims: tuple[int, ...]) -> tuple[int, ...]:
    """(N, C, H * scale, W * scale) of an NCHW input; ShapeError for any other rank."""
    if len(dims) != 4:
        raise fail(ShapeError, OP, "input_shape", "rank 4 (N, C, H, W)", f"rank {len(dims)} {tuple(dims)}")
    n, c, h, w = dims
    return (n, c, h * attrs.scale_factor, w * attrs.scale_factor)


def init_kernel(handle: Any, attrs: UpsampleAttrs, input_shape: TensorShape, output_shape: TensorShape) -> core.KernelState:
    """Check rank 4, the output dims (N, C, H*s, W*s) and the dtype the mode allows."""
    state = core.make_state(OP, handle, attrs, UpsampleAttrs, input_shape=input_shape, output_shape=output_shape)
    allowed = MOVABLE_DTYPES if attrs.mode is UpsampleMode.NEAREST else ALL_FLOAT_DTYPES
    core.check_dtype(OP, "input_shape", input_shape, allowed)
    core.check_rank(OP, "input_shape", input_shape, rank=4)
    core.check_dims(OP, "output_shape", output_shape, output_dims(attrs, input_shape.dims))
    core.check_same_dtype(OP, "output_shape", output_shape, input_shape, "input_shape")
    return state


def _check_forward(stream, handle, state, attrs, input, output) -> None:
    core.check_unary_forward(OP, stream, handle, state, attrs, input, output)


def _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad) -> None:
    core.check_unary_backward(OP, stream, handle, state, attrs, output, output_grad, input, input_grad)
    if attrs.mode is UpsampleMode.NEAREST:
        core.check_dtype(OP, "output_grad", TensorShape.of(output_grad), NEAREST_BACKWARD_DTYPES)


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


# --------------------------------------------------------------------------- CPU


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


@cpu.cpu_kernel
def cpu_forward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: UpsampleAttrs,
                       input: core.Array, output: core.Array) -> None:
    """output = input upsampled by scale_factor (NEAREST or BILINEAR), in parts of whole planes shared out
    to the threads (an output element reads only its own plane)."""
    _check_forward(stream, handle, state, attrs, input, output)
    if attrs.mode is UpsampleMode.NEAREST:  # bits moved, any dtype
        cpu.cpu_planes(lambda x, y: _cpu_nearest_forward(x, y, attrs.scale_factor), input, output)
    else:
        cpu.cpu_planes(_widened(lambda x, y: _cpu_bilinear_forward(x, y, attrs.scale_factor), output.dtype), input, output)


@cpu.cpu_kernel
def cpu_backward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: UpsampleAttrs,
                        output: core.Array | None, output_grad: core.Array, input: core.Array | None,
                        input_grad: core.Array | None) -> None:
    """input_grad = the sum of output_grad over each input element's sources, weighted for BILINEAR."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is None:
        return
    backward = _cpu_nearest_backward if attrs.mode is UpsampleMode.NEAREST else _cpu_bilinear_backward
    cpu.cpu_planes(_widened(lambda dy, dx: backward(dy, dx, attrs.scale_factor), input_grad.dtype), output_grad, input_grad)


def _widened(function, dtype):
    """function(source, target), in float32 where the tensors are half (cpu.widened: the source widened
    once, the float32 result rounded once into the target); as it is for every other dtype."""
    return cpu.widened(function) if dtype in HALF_DTYPES else function


# --------------------------------------------------------------------------- GPU


_VEC2_BITS = tuple(t for t in gpu.BITS_TYPES if t != "ulonglong2")  # 16-byte elements have no pair type
_ARITHMETIC = tuple(gpu.cuda_type(d) for d in NEAREST_BACKWARD_DTYPES)

_CUDA = gpu.CudaModule("upsample.cu", [
    *(f"upsample_nearest_forward<{t}, {i}>" for t in gpu.BITS_TYPES for i in gpu.INDEX_TYPES),
    *(f"upsample_nearest_forward_x2<{t}, {i}>" for t in _VEC2_BITS for i in gpu.INDEX_TYPES),
    *(f"upsample_nearest_backward{x2}<{t}, {i}>" for x2 in ("", "_x2") for t in _ARITHMETIC for i in gpu.INDEX_TYPES),
    *(f"upsample_bilinear_{d}<{t}, {i}>" for d in ("forward", "backward") for t in gpu.FLOAT_TYPES + gpu.HALF_TYPES
      for i in gpu.INDEX_TYPES),
], options=("--fmad=false",))  # no contraction: bilinear rounds exactly as the NumPy twin does


gpu_paths.declare(OP, {
    "nearest.forward": "upsample_nearest_forward: a thread per input element, writing its scale x scale block",
    "nearest.forward_x2": "upsample_nearest_forward_x2: scale 2 and the output pair-aligned, two elements a store",
    "nearest.backward": "upsample_nearest_backward: a thread per input element, summing its block",
    "nearest.backward_x2": "upsample_nearest_backward_x2: scale 2 and output_grad pair-aligned, two elements a load",
    "bilinear.forward": "upsample_bilinear_forward: a thread per output element",
    "bilinear.backward": "upsample_bilinear_backward: a thread per input element, gathering its weighted sources",
})


def plan_path(attrs: UpsampleAttrs, direction: str, vector: bool) -> str:
    """The named GPU path (kernels.runtime.gpu_paths) of a launch."""
    return f"{OP}.{attrs.mode.name.lower()}.{direction}" + ("_x2" if vector else "")


def _aligned_pair(array: Any) -> bool:
    """Whether `array` may be read or written two elements at a time (the s = 2 vector paths)."""
    return array.dtype.itemsize <= 8 and array.data.ptr % (2 * array.dtype.itemsize) == 0


def _gpu_plan(kind: str, type_name: str, count: int, total: int, args: tuple, scale: int, vector: bool) -> tuple:
    """(kernel, grid, scalar arguments) of one launch."""
    index = gpu.index_type(total)
    scalar = np.int32 if index == "int" else np.int64
    suffix = "_x2" if vector else ""
    name = f"upsample_{kind}{suffix}<{type_name}, {index}>"
    scale_args = () if vector else (np.int32(scale),)
    return _CUDA.function(name), gpu.grid_for(count), (scalar(count),) + tuple(scalar(a) for a in args) + scale_args


def _forward_plan(attrs, input, output, vector: bool) -> tuple:
    _, _, h, w = input.shape
    if attrs.mode is UpsampleMode.NEAREST:
        return _gpu_plan("nearest_forward", gpu.bits_type(input.dtype), input.size, output.size, (w,),
                         attrs.scale_factor, vector)
    return _gpu_plan("bilinear_forward", gpu.cuda_type(input.dtype), output.size, output.size, (h, w),
                     attrs.scale_factor, False)


def _backward_plan(attrs, output_grad, input_grad, vector: bool) -> tuple:
    _, _, h, w = input_grad.shape
    type_name = gpu.cuda_type(input_grad.dtype)
    if attrs.mode is UpsampleMode.NEAREST:
        return _gpu_plan("nearest_backward", type_name, input_grad.size, output_grad.size, (w,),
                         attrs.scale_factor, vector)
    return _gpu_plan("bilinear_backward", type_name, input_grad.size, output_grad.size, (h, w),
                     attrs.scale_factor, False)


def _pairs(attrs: UpsampleAttrs, array: Any) -> bool:
    """Whether the nearest x2 kernels' vector path applies: scale 2 and `array` pair-aligned."""
    return attrs.mode is UpsampleMode.NEAREST and attrs.scale_factor == 2 and _aligned_pair(array)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: UpsampleAttrs,
                       input: core.Array, output: core.Array) -> None:
    """output = input upsampled, enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, output)
    if output.size == 0:
        return
    vector = _pairs(attrs, output)
    key = ("gpu_forward", vector)
    plan = state.saved.get(key)
    if plan is None:
        plan = state.saved[key] = _forward_plan(attrs, input, output, vector) + (plan_path(attrs, "forward", vector),)
    kernel, grid, scalars, path = plan
    gpu_paths.reach(path)
    gpu.launch(stream, kernel, grid, gpu.BLOCK, (input, output) + scalars)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: UpsampleAttrs,
                        output: core.Array | None, output_grad: core.Array, input: core.Array | None,
                        input_grad: core.Array | None) -> None:
    """input_grad = the gathered sum of output_grad over each input element's sources, enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is None or input_grad.size == 0:
        return
    vector = _pairs(attrs, output_grad)
    key = ("gpu_backward", vector)
    plan = state.saved.get(key)
    if plan is None:
        plan = state.saved[key] = _backward_plan(attrs, output_grad, input_grad, vector) + (plan_path(attrs, "backward", vector),)
    kernel, grid, scalars, path = plan
    gpu_paths.reach(path)
    gpu.launch(stream, kernel, grid, gpu.BLOCK, (output_grad, input_grad) + scalars)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=UpsampleAttrs,
    shapes=UNARY_SHAPES,
    forward=UNARY_FORWARD,
    backward=unary_backward(output=False, input=False),
    dtypes=MOVABLE_DTYPES,
    exports=(UpsampleMode,),
    forward_doc="Write output = input upsampled by scale_factor, on the stream's device.",
    backward_doc="Write input_grad from output_grad (block sums for NEAREST, weighted for BILINEAR), on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
