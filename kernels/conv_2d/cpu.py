"""conv_2d on the CPU (NumPy): im2col through a strided view (or, for narrow outputs, through the
stride phases of the padded input, one contiguous span a tap), one batched matmul over the groups;
the input gradient scatters back tap by tap (a loop over the kh * kw taps, each a strided slice add).

forward and backward run after the package's checks (cpu_forward_kernel, cpu_backward_kernel).

Half precision (float16, bfloat16): the float32 code on widened copies, each result rounded to
the dtype at the GPU's rounding points (half_forward, half_backward).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np

from .. import activation
from ..runtime import core, cpu_paths
from ..runtime import cpu as cpu_runtime

if TYPE_CHECKING:
    from .attrs import Conv2DAttrs, Conv2DState


# im2col of rows at least this long (output width) copies fast enough as a strided view; shorter
# rows (SCDown's depthwise 40) go through the stride phases, one contiguous span a tap.
WIDE_ROWS_BELOW = 64

# The size-gated paths (kernels.runtime.cpu_paths).
FORWARD_WIDE_PATH, BACKWARD_WIDE_PATH, CHANNELS_THREADS_PATH, GROUPS_THREADS_PATH = cpu_paths.declare("conv_2d", {
    "forward.wide_rows": "forward: output rows WIDE_ROWS_BELOW wide or more, im2col as a strided view",
    "backward.wide_rows": "filter gradient: output rows WIDE_ROWS_BELOW wide or more, im2col as a strided view",
    "channels.threads": "im2col and col2im past PARALLEL_MIN_BYTES: the channels shared out to the threads",
    "groups.threads": "a grouped product past PARALLEL_MIN_BYTES: the groups shared out to the threads",
})


_BUFFERS = core.thread_local(buffers=None)  # each thread's scratch buffers by name: {name: bytes}


def _buffer(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array in this thread's scratch buffer `name`, which grows to the largest call's
    and is kept: a new array of megabytes each call paid its page faults as it was first written, which
    slowed the largest layers (docs/performance.md#convolution-scratch-buffers). An array
    lives for its call only; a call's names are distinct, so none overlaps another in use. The
    buffers of a thread hold about the largest layer's im2col matrix, like a GPU workspace."""
    buffers = _BUFFERS.buffers
    if buffers is None:
        buffers = _BUFFERS.buffers = {}
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    buffer = buffers.get(name)
    if buffer is None or buffer.size < nbytes:
        buffer = buffers[name] = np.empty(nbytes, np.uint8)
    return cpu_runtime.scratch(buffer[:nbytes].view(dtype).reshape(shape))


def _by_channels(function: Callable[[slice], None], channels: int, nbytes: int) -> None:
    """function(channel slice) over parts of the channels shared out to the threads (one call where the
    arrays are small): each channel's elements get the same operations, in the same order, whatever the parts."""
    if nbytes < cpu_runtime.PARALLEL_MIN_BYTES:
        function(slice(0, channels))
        return
    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(CHANNELS_THREADS_PATH, first, last, channels)
        function(slice(first, last))

    cpu_runtime.cpu_parallel(run, channels, 2 * nbytes)


def _product_shape(function: Callable[..., np.ndarray], left: np.ndarray, right: np.ndarray) -> tuple[int, ...]:
    """The shape of function(left, right) (np.matmul or np.multiply), broadcast over the leading axes."""
    if function is np.multiply:
        return np.broadcast_shapes(left.shape, right.shape)
    return np.broadcast_shapes(left.shape[:-2], right.shape[:-2]) + (left.shape[-2], right.shape[-1])


def _by_groups(function: Callable[..., np.ndarray], left: np.ndarray, right: np.ndarray, groups: int,
               out: np.ndarray, image_left: bool = False) -> np.ndarray:
    """function(left, right) (np.matmul or np.multiply) on (groups, ...) and (N, groups, ...) operands, in
    parts of the groups shared out to the threads where there are several groups and the columns are
    large: one BLAS call per (image, group) matrix either way, so each gets the same sums. BLAS itself
    only spreads a large GEMM over threads, never the many small ones of a grouped (depthwise) conv.
    With image_left, left is (N, groups, ...) too."""
    if groups < 2 or right.nbytes < cpu_runtime.PARALLEL_MIN_BYTES:
        function(left, right, out=out)
        return out

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(GROUPS_THREADS_PATH, first, last, groups)
        part = slice(first, last)
        function(left[:, part] if image_left else left[part], right[:, part], out=out[:, part])

    cpu_runtime.cpu_parallel(run, groups, left.nbytes + right.nbytes + out.nbytes)
    return out


def _padded(input: np.ndarray, attrs: Conv2DAttrs) -> np.ndarray:
    if not attrs.padding_h and not attrs.padding_w:
        return input
    n, c, h, w = input.shape
    padded = _buffer("padded", (n, c, h + 2 * attrs.padding_h, w + 2 * attrs.padding_w), input.dtype)
    # Zero the borders (the buffer holds whatever the last call left there).
    top, left = attrs.padding_h, attrs.padding_w
    padded[:, :, :top] = 0
    padded[:, :, top + h:] = 0
    padded[:, :, top:top + h, :left] = 0
    padded[:, :, top:top + h, left + w:] = 0
    cpu_runtime.cpu_copy(padded[:, :, attrs.padding_h:attrs.padding_h + h, attrs.padding_w:attrs.padding_w + w], input)
    return padded


def _taps(padded: np.ndarray, attrs: Conv2DAttrs, out_h: int, out_w: int) -> np.ndarray:
    """A read-only (N, groups, C/groups, kh, kw, Ho, Wo) view: tap (i, j) of every output pixel's window."""
    n, c = padded.shape[:2]
    groups, group_channels = attrs.groups, c // attrs.groups
    stride_n, stride_c, stride_y, stride_x = padded.strides
    return np.lib.stride_tricks.as_strided(
        padded, shape=(n, groups, group_channels, attrs.kernel_h, attrs.kernel_w, out_h, out_w),
        strides=(stride_n, stride_c * group_channels, stride_c, stride_y * attrs.dilation_h,
                 stride_x * attrs.dilation_w, stride_y * attrs.stride_h, stride_x * attrs.stride_w),
        writeable=False)


def _columns(padded: np.ndarray, attrs: Conv2DAttrs, out_h: int, out_w: int) -> np.ndarray:
    """im2col: (N, groups, C/groups * kh * kw, Ho * Wo), so that filter rows times columns is NCHW (a view
    of the input itself for a 1x1 kernel at stride 1 without padding; else copied in parts of the channels
    shared out to the threads)."""
    taps = _taps(padded, attrs, out_h, out_w)
    n, groups, group_channels = taps.shape[:3]
    shape = (n, groups, group_channels * attrs.kernel_h * attrs.kernel_w, out_h * out_w)
    if _plain(attrs):
        return taps.reshape(shape)
    columns = _buffer("columns", taps.shape, taps.dtype)
    by_channel = (n * groups, group_channels, *taps.shape[3:])  # no -1: NumPy cannot infer it for an empty batch
    cpu_runtime.cpu_copy(columns.reshape(by_channel), taps.reshape(by_channel))
    return columns.reshape(shape)


def _grouped(array: np.ndarray, groups: int) -> np.ndarray:
    """(N, O, H, W) as a (N, groups, O/groups, H * W) view."""
    n, o, h, w = array.shape
    return array.reshape(n, groups, o // groups, h * w)


def _plain(attrs: Conv2DAttrs) -> bool:
    """A 1x1 kernel, stride 1, no padding: the input is its own im2col matrix (a view)."""
    return (attrs.kernel_h == attrs.kernel_w == 1 and attrs.stride_h == attrs.stride_w == 1
            and attrs.padding_h == attrs.padding_w == 0)


def _phase_layout(attrs: Conv2DAttrs, height: int, width: int) -> tuple[int, int]:
    """(Hq, Wq): rows and columns of each stride phase of the zero-padded input (one spare zero row)."""
    padded_h, padded_w = height + 2 * attrs.padding_h, width + 2 * attrs.padding_w
    return -(-padded_h // attrs.stride_h) + 1, -(-padded_w // attrs.stride_w)


def _phase_blocks(attrs: Conv2DAttrs, height: int, width: int) -> list[tuple[int, int, slice, slice, slice, slice]]:
    """Per stride phase (a, b) holding input elements: (a, b, its input rows, input columns, phase rows, phase
    columns). Padded row y + padding_h belongs to phase (y + padding_h) % stride_h, at row (y + padding_h) // stride_h."""
    blocks = []
    for a in range(attrs.stride_h):
        first_row = (a - attrs.padding_h) % attrs.stride_h
        rows = len(range(first_row, height, attrs.stride_h))
        top = (first_row + attrs.padding_h) // attrs.stride_h
        for b in range(attrs.stride_w):
            first_column = (b - attrs.padding_w) % attrs.stride_w
            columns = len(range(first_column, width, attrs.stride_w))
            left = (first_column + attrs.padding_w) // attrs.stride_w
            if rows and columns:
                blocks.append((a, b, slice(first_row, height, attrs.stride_h), slice(first_column, width, attrs.stride_w),
                               slice(top, top + rows), slice(left, left + columns)))
    return blocks


def _tap_spans(attrs: Conv2DAttrs, wide: int, out_h: int) -> list[tuple[int, int, int, int, slice]]:
    """Per tap (i, j): (i, j, phase a, phase b, span). Tap (i, j) of every output pixel, in rows Wq wide (the
    pixels x >= Wo of each row are spares), is the contiguous span of its flattened phase."""
    spans = []
    for i in range(attrs.kernel_h):
        top, a = divmod(i * attrs.dilation_h, attrs.stride_h)
        for j in range(attrs.kernel_w):
            left, b = divmod(j * attrs.dilation_w, attrs.stride_w)
            start = top * wide + left
            spans.append((i, j, a, b, slice(start, start + out_h * wide)))
    return spans


def _phases(input: np.ndarray, attrs: Conv2DAttrs, form: _NarrowForm | None = None) -> np.ndarray:
    """The zero-padded input split by stride phase: (N, C, stride_h, stride_w, Hq * Wq); phase (a, b) holds
    padded rows a::stride_h and columns b::stride_w, so that every tap is a contiguous span of one phase.
    `form`: the layout and blocks worked out already (a plan's), else worked out here."""
    n, c, height, width = input.shape
    if form is None:
        (rows, wide), blocks = _phase_layout(attrs, height, width), _phase_blocks(attrs, height, width)
    else:
        rows, wide, blocks = form.rows, form.wide, form.blocks
    phases = _buffer("phases", (n, c, attrs.stride_h, attrs.stride_w, rows, wide), input.dtype)
    phases.fill(0)  # the padding and the spare row; the input's elements are written over it

    def fill(channels: slice) -> None:
        for a, b, input_rows, input_columns, phase_rows, phase_columns in blocks:
            phases[:, channels, a, b, phase_rows, phase_columns] = input[:, channels, input_rows, input_columns]

    _by_channels(fill, c, phases.nbytes)
    return phases.reshape(n, c, attrs.stride_h, attrs.stride_w, rows * wide)


def _wide_columns(phases: np.ndarray, attrs: Conv2DAttrs, wide: int, out_h: int,
                  spans: list[tuple[int, int, int, int, slice]] | None = None,
                  gather: np.ndarray | None = None) -> np.ndarray:
    """im2col in rows Wq wide: (N, groups, C/groups * kh * kw, Ho * Wq), one contiguous copy a tap
    (`spans`: _tap_spans worked out already, a plan's), or with `gather` (a plan's, on a small form:
    _NarrowForm) the same copies as one np.take of each plane's taps."""
    n, c = phases.shape[:2]
    columns = _buffer("wide_columns", (n, c, attrs.kernel_h, attrs.kernel_w, out_h * wide), phases.dtype)
    if gather is not None:
        np.take(phases.reshape(n, c, math.prod(phases.shape[2:])), gather, axis=2, mode="clip",
                out=columns.reshape(n, c, gather.size))  # indices are in bounds: clip skips their check
        return columns.reshape(n, attrs.groups, c // attrs.groups * attrs.kernel_h * attrs.kernel_w, out_h * wide)
    if spans is None:
        spans = _tap_spans(attrs, wide, out_h)

    def fill(channels: slice) -> None:
        for i, j, a, b, span in spans:
            columns[:, channels, i, j] = phases[:, channels, a, b, span]

    _by_channels(fill, c, columns.nbytes)
    return columns.reshape(n, attrs.groups, c // attrs.groups * attrs.kernel_h * attrs.kernel_w, out_h * wide)


class _NarrowForm(NamedTuple):
    """What forward's narrow path (rows in phases, WIDE_ROWS_BELOW) works out from the dims of its call:
    the phases' layout and blocks, the taps' spans and the product's dims; a plan's, worked out once."""

    rows: int
    wide: int
    blocks: list[tuple[int, int, slice, slice, slice, slice]]
    spans: list[tuple[int, int, int, int, slice]]
    product: tuple[int, ...]
    gather: np.ndarray | None = None  # a plan's on a small form: each tap's span of a plane's phases, in order


def _narrow_form(attrs: Conv2DAttrs, input_dims: tuple[int, ...], output_dims: tuple[int, ...]) -> _NarrowForm:
    n, o, out_h, _ = output_dims
    rows, wide = _phase_layout(attrs, *input_dims[2:])
    return _NarrowForm(rows, wide, _phase_blocks(attrs, *input_dims[2:]), _tap_spans(attrs, wide, out_h),
                       (n, attrs.groups, o // attrs.groups, out_h * wide))


def forward_plan(state: Conv2DState, attrs: Conv2DAttrs, threads: int) -> Callable[..., None]:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, input, filter, bias, output) on checked arrays, with `threads` as the handle's thread
    count and BLAS's, the narrow path's layout, blocks and spans worked out once."""
    input_shape, output_shape = state.shapes["input_shape"], state.shapes["output_shape"]
    form = None
    if input_shape.dtype not in core.HALF_DTYPES and not (output_shape.dims[3] >= WIDE_ROWS_BELOW or _plain(attrs)):
        form = _narrow_form(attrs, input_shape.dims, output_shape.dims)
        n, c = input_shape.dims[:2]
        taps = len(form.spans) * output_shape.dims[2] * form.wide  # a plane's im2col elements
        if 0 < n * c * taps * input_shape.dtype.itemsize < cpu_runtime.PARALLEL_MIN_BYTES:  # one call of fill
            phase = form.rows * form.wide
            form = form._replace(gather=np.concatenate([
                (a * attrs.stride_w + b) * phase + np.arange(span.start, span.stop, dtype=np.intp)
                for _, _, a, b, span in form.spans]))

    def compute(state: Conv2DState, input: np.ndarray, filter: np.ndarray, bias: np.ndarray | None,
                output: np.ndarray) -> None:
        with cpu_runtime.blas_threads(threads):
            forward(state, attrs, input, filter, bias, output, form)

    return cpu_runtime.with_threads(compute, threads)


def forward(state: Conv2DState, attrs: Conv2DAttrs, input: np.ndarray, filter: np.ndarray, bias: np.ndarray | None,
            output: np.ndarray, form: _NarrowForm | None = None) -> None:
    """output = activation(conv(input, filter) + bias); with an activation, the pre-activation is kept
    in state.pre for the backward. `form`: what the narrow path works out from the dims, worked out already
    (a plan's: forward_plan)."""
    if output.dtype in core.HALF_DTYPES:
        half_forward(state, attrs, input, filter, bias, output)
        return
    n, o, out_h, out_w = output.shape
    groups = attrs.groups
    # The pre-activation: kept for a backward, or (no backward) the output itself, activated in place.
    target = np.empty_like(output) if attrs.activation is not None and attrs.backward else output
    if out_w >= WIDE_ROWS_BELOW or _plain(attrs):
        cpu_paths.reach_if(FORWARD_WIDE_PATH, not _plain(attrs))
        columns = _columns(_padded(input, attrs), attrs, out_h, out_w)  # 1x1 s1 p0: the input
        weights = filter.reshape(groups, o // groups, columns.shape[2])
        # (groups, O/groups, K) @ (N, groups, K, Ho * Wo) -> (N, groups, O/groups, Ho * Wo): NCHW itself.
        _by_groups(np.matmul, weights, columns, groups, _grouped(target, groups))
    else:
        if form is None:
            form = _narrow_form(attrs, input.shape, output.shape)
        wide = form.wide
        columns = _wide_columns(_phases(input, attrs, form), attrs, wide, out_h, form.spans, form.gather)
        weights = filter.reshape(groups, o // groups, columns.shape[2])
        # The same product in rows Wq wide: NCHW with spare columns.
        product = _buffer("product", form.product, target.dtype)
        _by_groups(np.matmul, weights, columns, groups, product)
        cpu_runtime.cpu_copy(target, product.reshape(n, o, out_h, wide)[..., :out_w])
    if bias is not None:
        cpu_runtime.cpu_parts(lambda part, bias_part: np.add(part, bias_part, out=part), target, bias.reshape(1, o, 1, 1))
    if attrs.activation is not None:
        activation.cpu_forward(attrs.activation, target, output)
        if attrs.backward:
            state.pre = target


def backward(state: Conv2DState, attrs: Conv2DAttrs, output_grad: np.ndarray, input: np.ndarray | None,
             input_grad: np.ndarray | None, filter: np.ndarray | None, filter_grad: np.ndarray | None,
             bias_grad: np.ndarray | None) -> None:
    """Write input_grad, filter_grad and bias_grad (those not None) from output_grad (and, with an
    activation, the pre-activation the forward kept)."""
    if output_grad.dtype in core.HALF_DTYPES:
        half_backward(state, attrs, output_grad, input, input_grad, filter, filter_grad, bias_grad)
        return
    grad = output_grad
    if attrs.activation is not None:
        grad = _buffer("pre_grad", output_grad.shape, output_grad.dtype)
        activation.cpu_backward(attrs.activation, state.pre, output_grad, grad)
    if bias_grad is not None:
        # Summed in float64 and rounded once, as the GPU kernel does.
        np.copyto(bias_grad, grad.sum(axis=(0, 2, 3), dtype=np.float64), casting="same_kind")
    n, o, out_h, out_w = grad.shape
    _, channels, height, width = state.shapes["input_shape"].dims
    groups = attrs.groups
    plain = _plain(attrs)
    rows, wide = _phase_layout(attrs, height, width)
    grad_wide = None
    if not plain and (input_grad is not None or (filter_grad is not None and out_w < WIDE_ROWS_BELOW)):
        # The gradient in rows Wq wide, zero in the spare columns: they then add exact zeros.
        grad_wide = _buffer("grad_wide", (n, o, out_h, wide), grad.dtype)
        grad_wide[..., out_w:] = 0
        cpu_runtime.cpu_copy(grad_wide[..., :out_w], grad)
        grad_wide = grad_wide.reshape(n, groups, o // groups, out_h * wide)
    if filter_grad is not None:
        if out_w >= WIDE_ROWS_BELOW or plain:
            cpu_paths.reach_if(BACKWARD_WIDE_PATH, not plain)
            grad_rows, columns = _grouped(grad, groups), _columns(_padded(input, attrs), attrs,
                                                                  out_h, out_w)
        else:
            grad_rows, columns = grad_wide, _wide_columns(_phases(input, attrs), attrs, wide,
                                                          out_h)
        # (N, groups, O/groups, P) @ (N, groups, P, K), summed over N.
        columns = columns.transpose(0, 1, 3, 2)
        per_image = _buffer("per_image", _product_shape(np.matmul, grad_rows, columns), grad.dtype)
        _by_groups(np.matmul, grad_rows, columns, groups, per_image, image_left=True)
        np.copyto(filter_grad, per_image.sum(axis=0).reshape(filter_grad.shape))
    if input_grad is None:
        return
    weights = filter.reshape(groups, o // groups, channels // groups * attrs.kernel_h * attrs.kernel_w).transpose(0, 2, 1)
    if plain:  # what each pixel sends back is its input gradient
        np.matmul(weights, _grouped(grad, groups), out=_grouped(input_grad, groups))
        return
    # (groups, K, O/groups) @ (N, groups, O/groups, Ho * Wq): what each tap of each window sends back
    # (one output channel a group: a product, without BLAS's per-group overhead); then col2im,
    # tap by tap in row-major order, each tap one contiguous span of its stride phase.
    product = np.multiply if o == groups else np.matmul
    sent = _buffer("sent", _product_shape(product, weights, grad_wide), grad.dtype)
    _by_groups(product, weights, grad_wide, groups, sent)
    sent = sent.reshape(n, channels, attrs.kernel_h, attrs.kernel_w, out_h * wide)
    # The sums of the taps start from zero every call.
    phases = _buffer("sums", (n, channels, attrs.stride_h, attrs.stride_w, rows * wide), input_grad.dtype)
    phases.fill(0)
    spans = _tap_spans(attrs, wide, out_h)
    blocks = _phase_blocks(attrs, height, width)
    grid = phases.reshape(n, channels, attrs.stride_h, attrs.stride_w, rows, wide)

    def fold(part: slice) -> None:
        # Per channel, the taps added in row-major order whatever the parts: the same sums.
        for i, j, a, b, span in spans:
            phases[:, part, a, b, span] += sent[:, part, i, j]
        for a, b, input_rows, input_columns, phase_rows, phase_columns in blocks:
            input_grad[:, part, input_rows, input_columns] = grid[:, part, a, b, phase_rows, phase_columns]

    _by_channels(fold, channels, sent.nbytes)



# --------------------------------------------------------------------------- half precision
#
# float16 and bfloat16: the float32 code above on widened copies, with the GPU's rounding points
# (kernels/conv_2d/__init__.py): the convolution rounded to the dtype, then the bias added in float32
# and rounded, then the activation of that (the kept pre-activation) in float32, rounded; backward:
# the activation's gradient rounded, then each gradient rounded once.


def _wide(array: np.ndarray | None) -> np.ndarray | None:
    """A half tensor widened to float32 (exact)."""
    return None if array is None else array.astype(core.compute_dtype(array.dtype))


def _store(target: np.ndarray, values: np.ndarray) -> None:
    """target = values rounded once (to nearest even) to target's half dtype."""
    np.copyto(target, values.astype(target.dtype))


def half_forward(state: Conv2DState, attrs: Conv2DAttrs, input: np.ndarray, filter: np.ndarray,
                 bias: np.ndarray | None, output: np.ndarray) -> None:
    """forward for float16 and bfloat16 tensors: float32 products and sums, rounded at the GPU's points."""
    plain = dataclasses.replace(attrs, activation=None)
    wide = np.empty(output.shape, dtype=np.float32)
    forward(state, plain, _wide(input), _wide(filter), None, wide)
    pre = wide.astype(output.dtype)  # the convolution, rounded as cuDNN writes it
    if bias is not None:
        pre = (pre.astype(np.float32) + _wide(bias).reshape(1, -1, 1, 1)).astype(output.dtype)
    if attrs.activation is None:
        np.copyto(output, pre)
        return
    activated = np.empty(output.shape, dtype=np.float32)
    activation.cpu_forward(attrs.activation, pre.astype(np.float32), activated)
    _store(output, activated)
    if attrs.backward:  # an inference state keeps nothing
        state.pre = pre


def half_backward(state: Conv2DState, attrs: Conv2DAttrs, output_grad: np.ndarray, input: np.ndarray | None,
                  input_grad: np.ndarray | None, filter: np.ndarray | None, filter_grad: np.ndarray | None,
                  bias_grad: np.ndarray | None) -> None:
    """backward for float16 and bfloat16 tensors: float32 products and sums, each gradient rounded once."""
    grad = _wide(output_grad)
    if attrs.activation is not None:
        pre_grad = np.empty(grad.shape, dtype=np.float32)
        activation.cpu_backward(attrs.activation, state.pre.astype(np.float32), grad, pre_grad)
        grad = pre_grad.astype(output_grad.dtype).astype(np.float32)  # rounded, as the GPU keeps it
    if bias_grad is not None:
        # A float64 sum rounded to float32, then to the dtype: conv_bias_grad's two roundings.
        _store(bias_grad, grad.sum(axis=(0, 2, 3), dtype=np.float64).astype(np.float32))
    wide_input_grad = None if input_grad is None else np.empty(input_grad.shape, dtype=np.float32)
    wide_filter_grad = None if filter_grad is None else np.empty(filter_grad.shape, dtype=np.float32)
    backward(state, dataclasses.replace(attrs, activation=None), grad, _wide(input), wide_input_grad, _wide(filter),
             wide_filter_grad, None)
    for target, wide in ((input_grad, wide_input_grad), (filter_grad, wide_filter_grad)):
        if target is not None:
            _store(target, wide)
