"""conv_2d's GPU paths worked out as data, pure and device-free: which path each direction takes
(choose_paths), the workspace the GEMM paths need (workspace_elements) and their cuBLAS GEMM and
fold steps (plan_*), and what cuDNN may be asked for (forward_flops, workspace_limit). gpu.py runs
the plans; tests/test_conv_2d_gemm_plan.py runs them in NumPy.

cuBLAS is column-major: a row-major (r, c) matrix is, to cuBLAS, its (c, r) transpose with
leading dimension c. With P = Ho * Wo and K = C * kh * kw (K = C for a 1x1 kernel), in
row-major terms per image n:
  forward       Y[n] (O x P) = W (O x K) @ cols[n] (K x P)      -> Y^T = cols^T @ W^T: gemm(N, N, P, O, K)
  input grad    dcols[n] (K x P) = W^T (K x O) @ dY[n] (O x P)  -> dcols^T = dY^T @ W: gemm(N, T, P, K, O)
  filter grad   dW (O x K) = sum_n dY[n] (O x P) @ cols[n]^T    -> dW^T = cols @ dY^T: gemm(T, N, K, O, P)
where cols[n] is the input image itself for a pointwise conv. A plan is a list of steps over named
buffers, offsets in elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..runtime import gpu
from ..runtime.core import HALF_DTYPES

if TYPE_CHECKING:
    from .attrs import Conv2DAttrs, Conv2DState

# The most bytes of im2col columns held at once (a chunk of whole images); an image needing more
# takes cuDNN's backward algorithms instead.
COLUMN_LIMIT = 256 * 2**20

# cuDNN's workspace: an algorithm may use WORKSPACE_LIMIT bytes, or twice the bytes of the convolution's
# own tensors (input, filter, output) where that is more. Half-precision tensor-core algorithms on NCHW
# data use about one copy of input and output (their NHWC transposes), so a large layer's fastest
# algorithm needs more than a fixed limit (docs/performance.md#convolution-workspace).
WORKSPACE_LIMIT = 256 * 2**20
# A float32 or float64 forward (FMA math) of fewer flops (forward_flops) keeps cuDNN's IMPLICIT_GEMM,
# the cheapest per call on the host; from it, cuDNN's heuristics choose (IMPLICIT_PRECOMP_GEMM on the
# H200), which costs more host time a call and less device time, even on small forwards. Where the host
# no longer matters (a CUDA graph replay), the device time is all there is, so the bound is low. It
# stays above every conformance case (at most 0.2 MFLOP: their algorithms and bits are unchanged), where
# a few microseconds of device time are not worth 20 more of host time. Eager at batch 1 pays that host
# time (docs/models.md); the timings are in docs/performance.md#implicit_gemm-bound.
IMPLICIT_GEMM_BELOW_FLOPS = 2 * 10**7


def forward_flops(state: "Conv2DState") -> int:
    """2 x the multiply-adds of the forward: 2 N O Ho Wo (C / groups) kh kw."""
    attrs = state.attrs
    channels = state.shapes["input_shape"].dims[1]
    return 2 * state.shapes["output_shape"].numel * (channels // attrs.groups) * attrs.kernel_h * attrs.kernel_w


def workspace_limit(state: "Conv2DState") -> int:
    """The most workspace a cuDNN algorithm of this convolution may ask for (see WORKSPACE_LIMIT)."""
    tensors = sum(state.shapes[name].numel for name in ("input_shape", "filter_shape", "output_shape"))
    return max(WORKSPACE_LIMIT, 2 * tensors * state.shapes["input_shape"].dtype.itemsize)


# The three directions of a convolution; the state keeps a path (and on the GPU a cuDNN algorithm) for each.
Direction = Literal["forward", "backward_data", "backward_filter"]
DIRECTIONS: tuple[Direction, ...] = ("forward", "backward_data", "backward_filter")
# "gemm": cuBLAS, no columns; "columns": im2col/col2im (conv_2d.cu) and cuBLAS; "depthwise": conv_2d.cu's
# depthwise kernels; "cudnn": cuDNN's legacy convolution API.
Path = Literal["gemm", "columns", "depthwise", "cudnn"]


@dataclass(frozen=True)
class Gemm:
    """Column-major C = op(A) @ op(B) + beta * C, `batch` times, each matrix `stride_*` elements on."""

    trans_a: bool
    trans_b: bool
    m: int
    n: int
    k: int
    a: tuple[str, int]  # (buffer, element offset)
    lda: int
    stride_a: int
    b: tuple[str, int]
    ldb: int
    stride_b: int
    beta: float
    c: tuple[str, int]
    ldc: int
    stride_c: int
    batch: int


@dataclass(frozen=True)
class Fold:
    """im2col of images [first, stop) of "input" into the workspace's start; col2im of the workspace's
    start into those images of "input_grad"; or "sum": filter_grad = (filter_grad if first > 0, else 0)
    + the per-image filter gradients of those images (at state.partials_at), added in image order."""

    kind: Literal["im2col", "col2im", "sum"]
    first: int
    stop: int


def _sizes(state: Conv2DState) -> tuple[int, int, int, int, int]:
    """(N, C, O, P = Ho * Wo, K = C * kh * kw) of a groups == 1 convolution."""
    n, c = state.shapes["input_shape"].dims[:2]
    _, o, out_h, out_w = state.shapes["output_shape"].dims
    return n, c, o, out_h * out_w, c * state.attrs.kernel_h * state.attrs.kernel_w


def pointwise(attrs: Conv2DAttrs) -> bool:
    """A plain channel-mixing matrix product: groups 1, a 1x1 kernel, stride 1, no padding."""
    return (attrs.groups == 1 and attrs.kernel_h == attrs.kernel_w == 1 and attrs.stride_h == attrs.stride_w == 1
            and attrs.padding_h == attrs.padding_w == 0)


def depthwise(attrs: Conv2DAttrs, channels: int) -> bool:
    """One input channel per group (groups == C > 1), any number of filters per channel."""
    return 1 < attrs.groups == channels


# The depthwise forward's tiles (conv_depthwise_forward_tiled): the shared memory a block may use
# without opting in to more (gpu.SHARED_MEMORY_LIMIT), the threads of a block, and a tile's
# most outputs (8 a thread) and columns. A block does one tile's loads, then its sums: small tiles
# leave the loads of too few blocks in flight, slower than no tiles (docs/performance.md#depthwise-tiles).
DEPTHWISE_SHARED_LIMIT = gpu.SHARED_MEMORY_LIMIT
DEPTHWISE_BLOCK = 256
DEPTHWISE_TILE_OUTPUTS = 2048
DEPTHWISE_TILE_WIDTH = 128


# The depthwise forwards with a kernel of their own (conv_depthwise_forward_rows), as (kernel_h, kernel_w,
# stride), with one filter a channel, dilation 1 and the same stride both ways: YOLOv10's 3x3 (C2fCIB,
# PSA's positional conv, the head), SCDown's stride-2 3x3 and the n and s variants' 7x7 (RepVGGDW, folded
# or not).
DEPTHWISE_ROWS_SHAPES = ((3, 3, 1), (3, 3, 2), (7, 7, 1))

# A thread of the rows kernel computes R rows of Q consecutive outputs: (R, Q) by (element size, kernel
# size). Every share gives the same bits (a GPU test compiles several); each is chosen from
# tools/depthwise_times.py's times on YOLOv10's batch-16 shapes on an H100 (docs/performance.md#depthwise-rows):
# two columns for the two-byte types, whose kernel is bound by its instructions, not its bytes (4x2 took 13%
# off float16's 3x3 forward and 30% off its input gradient at 16x640x40x40), and for float32's 7x7 (23-26%
# off); one for float32's 3x3, where two were 6% faster at 640 channels but 11% slower in the forward at 1280,
# and for float64.
DEPTHWISE_SHARES = {(2, 3): (4, 2), (2, 7): (4, 2), (4, 3): (4, 1), (4, 7): (4, 2), (8, 3): (4, 1), (8, 7): (4, 1)}


def depthwise_rows(state: Conv2DState) -> tuple[int, int, int] | None:
    """(kernel_h, kernel_w, stride) of conv_depthwise_forward_rows where it computes this depthwise
    forward (one of DEPTHWISE_ROWS_SHAPES, one filter a channel, dilation 1), else None (the tiles)."""
    attrs = state.attrs
    shape = (attrs.kernel_h, attrs.kernel_w, attrs.stride_h)
    if (attrs.out_channels == state.shapes["input_shape"].dims[1] and attrs.dilation_h == attrs.dilation_w == 1
            and attrs.stride_h == attrs.stride_w and shape in DEPTHWISE_ROWS_SHAPES):
        return shape
    return None


# The filter gradient of a depthwise convolution with rows (above) takes a block a channel for all its taps
# (conv_depthwise_filter_grad_taps), which reads each output gradient once rather than once a tap, where
# there is a channel for every DEPTHWISE_FILTER_TAPS_SMS_PER_CHANNEL streaming multiprocessors; with fewer
# channels, blocks a channel leave SMs idle, and a block a tap (conv_depthwise_filter_grad) is faster
# (on the H200: 128 channels faster a channel, 64 at batch 1 a tap; docs/performance.md#depthwise-rows).
DEPTHWISE_FILTER_TAPS_SMS_PER_CHANNEL = 2


def depthwise_filter_taps(state: Conv2DState, sm_count: int) -> bool:
    """Whether the depthwise filter gradient runs a block a channel (conv_depthwise_filter_grad_taps): a
    state with rows, and a channel for every DEPTHWISE_FILTER_TAPS_SMS_PER_CHANNEL of the device's SMs."""
    channels = state.shapes["input_shape"].dims[1]
    return state.rows is not None and channels * DEPTHWISE_FILTER_TAPS_SMS_PER_CHANNEL >= sm_count


# conv_depthwise_filter_grad_taps comes in two forms, compiled for the blocks an SM must hold at once (its
# launch bounds; the same bits either way): a 3x3 filter gradient with more channels than
# DEPTHWISE_FILTER_TAPS_SPARSE_BLOCKS blocks on every SM (the uncapped form's 62-63 registers a thread, sm_90,
# leave room for four blocks of 256 threads) takes the form capped at 48 registers,
# DEPTHWISE_FILTER_TAPS_DENSE_BLOCKS blocks an SM, so that 640 channels run in one wave on 132 SMs (H100,
# float16 at 16x640x40x40: 110.9 against 176.1 us); fewer channels take the uncapped form, whose registers keep
# more loads in flight (96.6 against 115.9 us at SCDown's 16x320x80x80, 36.7 against 62.6 at 4x128x80x80), as
# does the 7x7 (217 registers a thread uncapped: a cap of 5 blocks would spill; docs/performance.md#depthwise-rows).
DEPTHWISE_FILTER_TAPS_DENSE_BLOCKS = 5
DEPTHWISE_FILTER_TAPS_SPARSE_BLOCKS = 4


def depthwise_filter_taps_blocks(state: Conv2DState, sm_count: int) -> int:
    """The blocks an SM must hold at once that a state's conv_depthwise_filter_grad_taps is compiled for:
    DEPTHWISE_FILTER_TAPS_DENSE_BLOCKS for a 3x3 kernel with more channels than DEPTHWISE_FILTER_TAPS_SPARSE_BLOCKS
    on every SM, else 1 (no cap but the block's size)."""
    channels = state.shapes["input_shape"].dims[1]
    if state.rows[0] == 3 and channels > DEPTHWISE_FILTER_TAPS_SPARSE_BLOCKS * sm_count:
        return DEPTHWISE_FILTER_TAPS_DENSE_BLOCKS
    return 1


def plan_depthwise(state: Conv2DState, sm_count: int) -> None:
    """A depthwise state's own kernels, from its shapes and the device's SM count: the forward's rows
    (depthwise_rows), the filter gradient's kernel and register cap (depthwise_filter_taps,
    depthwise_filter_taps_blocks), and the forward's tile (depthwise_tile). gpu.init plans with it, and so do
    the tests that plan launches without a device."""
    state.rows = depthwise_rows(state)
    state.filter_taps = depthwise_filter_taps(state, sm_count)
    if state.rows is not None:
        state.filter_taps_blocks = depthwise_filter_taps_blocks(state, sm_count)
    state.tile = depthwise_tile(state)


def _balanced(extent: int, most: int) -> int:
    """The size of the fewest equal parts, of at most `most`, that cover `extent`."""
    parts = -(-extent // most)
    return -(-extent // parts)


def depthwise_tile(state: Conv2DState) -> tuple[int, int, int] | None:
    """(tile_h, tile_w, shared bytes) of the tiled depthwise forward, or None where the untiled kernel
    runs (a tile of one output whose input region does not fit DEPTHWISE_SHARED_LIMIT: a large
    dilation; more tiles in a column or row than a grid's y and z take). The tile is the whole
    output row where it has at most DEPTHWISE_TILE_WIDTH columns (else equal parts of it), and as
    many rows as keep it within DEPTHWISE_TILE_OUTPUTS outputs (in equal parts of the plane's
    rows); it shrinks, halving its longer side, until the input region its taps reach and the
    filter's taps, in the compute type (float for the half types), fit."""
    attrs = state.attrs
    out_h, out_w = state.shapes["output_shape"].dims[2:]
    itemsize = 8 if state.shapes["input_shape"].dtype == np.float64 else 4
    tile_w = _balanced(out_w, DEPTHWISE_TILE_WIDTH)
    tile_h = _balanced(out_h, max(1, DEPTHWISE_TILE_OUTPUTS // tile_w))
    while True:
        region_h = (tile_h - 1) * attrs.stride_h + (attrs.kernel_h - 1) * attrs.dilation_h + 1
        region_w = (tile_w - 1) * attrs.stride_w + (attrs.kernel_w - 1) * attrs.dilation_w + 1
        shared = (attrs.kernel_h * attrs.kernel_w + region_h * region_w) * itemsize
        if shared <= DEPTHWISE_SHARED_LIMIT:
            break
        if tile_h == tile_w == 1:
            return None
        if tile_h >= tile_w:
            tile_h = -(-tile_h // 2)
        else:
            tile_w = -(-tile_w // 2)
    if max(-(-out_h // tile_h), -(-out_w // tile_w)) > gpu.MAX_GRID_YZ:
        return None
    return tile_h, tile_w, shared


def plan_forward(state: Conv2DState) -> list[Gemm]:
    """The pointwise forward: Y[n] = W @ X[n] for every image, one batched GEMM (W shared: stride 0)."""
    n, c, o, p, _ = _sizes(state)
    return [Gemm(False, False, p, o, c, ("input", 0), p, c * p, ("filter", 0), c, 0, 0.0, ("output", 0), p, o * p,
                 n)]


def _chunks(state: Conv2DState) -> list[tuple[int, int]]:
    n = state.shapes["input_shape"].dims[0]
    return [(first, min(first + state.chunk, n)) for first in range(0, n, state.chunk)]


def plan_backward_data(state: Conv2DState) -> list[Gemm | Fold]:
    """input_grad: dX[n] = W^T @ dY[n] (pointwise), or dcols[n] = W^T @ dY[n] then col2im, a chunk of
    images at a time."""
    n, c, o, p, k = _sizes(state)
    if state.paths["backward_data"] == "gemm":
        return [Gemm(False, True, p, c, o, ("grad", 0), p, o * p, ("filter", 0), c, 0, 0.0, ("input_grad", 0), p,
                     c * p, n)]
    steps: list[Gemm | Fold] = []
    for first, stop in _chunks(state):
        steps.append(Gemm(False, True, p, k, o, ("grad", first * o * p), p, o * p, ("filter", 0), k, 0, 0.0,
                          ("workspace", 0), p, k * p, stop - first))
        steps.append(Fold("col2im", first, stop))
    return steps


def plan_backward_filter(state: Conv2DState) -> list[Gemm | Fold]:
    """filter_grad: dW = sum over n of dY[n] @ cols[n]^T in a fixed order, no atomics; cols[n] is X[n]
    (pointwise) or im2col's. One image at a time (chunk 1): one GEMM per image, beta 0 for the first and
    1 after. Otherwise per chunk: one batched GEMM of the per-image gradients into the workspace, then
    a kernel adding them in image order (onto the earlier chunks' sum)."""
    n, c, o, p, k = _sizes(state)
    columns = state.paths["backward_filter"] == "columns"
    steps: list[Gemm | Fold] = []
    for first, stop in _chunks(state):
        if columns:
            steps.append(Fold("im2col", first, stop))
        image = ("workspace", 0) if columns else ("input", first * c * p)  # the chunk's first image
        if state.chunk == 1:
            steps.append(Gemm(True, False, k, o, p, image, p, 0, ("grad", first * o * p), p, 0,
                              0.0 if first == 0 else 1.0, ("filter_grad", 0), k, 0, 1))
        else:
            steps.append(Gemm(True, False, k, o, p, image, p, k * p, ("grad", first * o * p), p, o * p, 0.0,
                              ("workspace", state.partials_at), k, k * o, stop - first))
            steps.append(Fold("sum", first, stop))
    return steps


def choose_paths(state: Conv2DState) -> None:
    """Set state.paths, state.chunk and state.partials_at from the attrs and shapes (no device needed)."""
    attrs = state.attrs
    state.paths = dict.fromkeys(DIRECTIONS, "cudnn")
    if depthwise(attrs, state.shapes["input_shape"].dims[1]):
        state.paths = dict.fromkeys(DIRECTIONS, "depthwise")
        return
    if attrs.groups != 1:
        return
    n, _, o, p, k = _sizes(state)
    itemsize = state.shapes["input_shape"].dtype.itemsize
    if state.shapes["input_shape"].dtype in HALF_DTYPES:
        # Half precision: a pointwise forward and input gradient are one GEMM each, a float32 sum rounded
        # once as in cuDNN. The filter gradient also sums over the images, which the per-image GEMMs would
        # round to the dtype one image at a time: a batch's stays in cuDNN (the whole batch summed in
        # float32), a single image's is one GEMM. Other convolutions run in cuDNN.
        if pointwise(attrs):
            state.paths = {"forward": "gemm", "backward_data": "gemm", "backward_filter": "gemm" if n == 1 else "cudnn"}
            state.chunk, state.partials_at = 1, 0
        return
    if pointwise(attrs):
        state.paths = dict.fromkeys(DIRECTIONS, "gemm")
        state.chunk = max(1, min(n, COLUMN_LIMIT // max(o * k * itemsize, 1)))
        state.partials_at = 0
        return
    if 0 < k * p * itemsize <= COLUMN_LIMIT:
        state.paths["backward_data"] = state.paths["backward_filter"] = "columns"
        # Each image of a chunk: its columns, and (chunk > 1) its filter gradient after all the columns.
        state.chunk = max(1, min(n, COLUMN_LIMIT // ((k * p + o * k) * itemsize)))
        state.partials_at = -(-state.chunk * k * p // 64) * 64  # 64 elements: aligned for cuBLAS


def workspace_elements(state: Conv2DState) -> int:
    """Elements of the workspace the GEMM paths use: a chunk's columns, then its per-image filter
    gradients where a chunk holds more than one image."""
    if "gemm" not in state.paths.values() and "columns" not in state.paths.values():
        return 0
    _, _, o, p, k = _sizes(state)
    columns = state.chunk * k * p if state.paths["backward_data"] == "columns" else 0
    partials = state.chunk * o * k if state.chunk > 1 else 0
    return max(columns, state.partials_at + partials)
