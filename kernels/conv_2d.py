"""conv_2d: 2-D cross-correlation of an NCHW input with an (O, C/groups, kh, kw) filter,
plus an optional bias of (O,), then an optional fused activation (PyTorch's conv2d).

The output is (N, O, Ho, Wo) with Ho = floor((H + 2 padding_h - dilation_h (kernel_h - 1) - 1)
/ stride_h) + 1, likewise Wo; the padded input must hold one dilated kernel. Input
channels C must divide into the groups, and so must O (an attrs check).

Backward overwrites every gradient it is given (None skips it): input_grad,
filter_grad and bias_grad (the sum of the pre-activation gradient over N, H, W).
With a fused activation, the forward keeps the pre-activation in the state (like
cuDNN's reserve space) and a backward without a forward before it raises StateError;
without one, backward needs no forward.

CPU: NumPy im2col through a strided view, one batched matmul over the groups;
the input gradient scatters back tap by tap (a loop over the kh * kw taps, each a
strided slice add). GPU, every path deterministic, a plain sum of products in FMA
math (no TF32, no FFT, no Winograd, no atomics), chosen at init from the shapes:

- groups == 1, a 1x1 kernel, stride 1, no padding ("pointwise"): cuBLAS GEMMs
  (pedantic math) for the forward and both gradients, the filter gradient summed
  over the batch one image at a time (beta 0, then 1) in a fixed order;
- other groups == 1 convolutions ("columns"): the forward in cuDNN (IMPLICIT_GEMM
  first), the filter gradient by im2col (conv_2d.cu) and one GEMM per image, the
  input gradient by one batched GEMM into columns and a col2im gather (conv_2d.cu,
  each input element sums its taps in a fixed order); the columns of one chunk of
  images at a time live in the handle's workspace (at most COLUMN_LIMIT bytes), and
  where one image's columns exceed that, the gradients fall back to cuDNN;
- depthwise (groups == C > 1, any filters per channel): conv_2d.cu's own kernels:
  the forward (one thread per output, the bias added after the taps), a per-element
  gather for the input gradient, one block per filter element (a fixed tree in
  double) for the filter's;
- other groups > 1: cuDNN's legacy convolution API (kernels/cudnn.py) throughout.

The cuDNN forward is IMPLICIT_GEMM where supported (the cheapest per call on the
H200), otherwise the heuristics' deterministic choice; cuDNN's backward algorithms
are the heuristics' deterministic ones.

cudnnAddTensor adds the bias; conv_2d.cu sums the bias gradient. The GEMM and
fold steps of each path are planned as data (plan_*), so their index math is
checked on the CPU against NumPy (tests/test_conv_2d_gemm_plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import activation, core, cublas, gpu
from .core import FLOAT_DTYPES, AttrsError, ShapeError, StateError, TensorShape, fail

OP = "conv_2d"

# The largest cuDNN workspace an algorithm may ask for; faster algorithms needing more are passed over.
WORKSPACE_LIMIT = 256 * 2**20
# The most bytes of im2col columns held at once (a chunk of whole images); an image needing more
# takes cuDNN's backward algorithms instead.
COLUMN_LIMIT = 256 * 2**20


@dataclass(frozen=True)
class Conv2DAttrs:
    out_channels: int
    kernel_h: int
    kernel_w: int
    stride_h: int = 1
    stride_w: int = 1
    padding_h: int = 0
    padding_w: int = 0
    dilation_h: int = 1
    dilation_w: int = 1
    groups: int = 1
    use_bias: bool = False
    activation: activation.Activation | None = None  # applied after the bias

    def __post_init__(self) -> None:
        for name in ("out_channels", "kernel_h", "kernel_w", "stride_h", "stride_w", "dilation_h", "dilation_w",
                     "groups"):
            core.set_attr(self, name, core.attr_int(OP, name, getattr(self, name), minimum=1))
        for name in ("padding_h", "padding_w"):
            core.set_attr(self, name, core.attr_int(OP, name, getattr(self, name), minimum=0))
        if self.out_channels % self.groups:
            raise fail(AttrsError, OP, "groups", f"a divisor of out_channels ({self.out_channels})", self.groups)
        if not isinstance(self.use_bias, (bool, np.bool_)):
            raise fail(AttrsError, OP, "use_bias", "a bool", repr(self.use_bias))
        core.set_attr(self, "use_bias", bool(self.use_bias))
        core.set_attr(self, "activation", activation.attr_activation(OP, self.activation))


def _check_extent(attrs: Conv2DAttrs, dims: tuple[int, ...]) -> None:
    """An NCHW input whose padded H and W hold one dilated kernel (so the output is not empty)."""
    if len(dims) != 4:
        raise fail(ShapeError, OP, "input_shape", "rank 4 (N, C, H, W)", f"rank {len(dims)} {tuple(dims)}")
    for size, kernel, padding, dilation, what in ((dims[2], attrs.kernel_h, attrs.padding_h, attrs.dilation_h, "H"),
                                                  (dims[3], attrs.kernel_w, attrs.padding_w, attrs.dilation_w, "W")):
        extent = dilation * (kernel - 1) + 1
        if size + 2 * padding < extent:
            raise fail(ShapeError, OP, "input_shape",
                       f"{what} + 2 * padding >= the dilated kernel ({extent}), so that the output is not empty",
                       tuple(dims))


def output_dims(attrs: Conv2DAttrs, dims: tuple[int, ...]) -> tuple[int, ...]:
    """(N, out_channels, Ho, Wo) of an NCHW input, by the convolution formula; ShapeError where the input
    is not rank 4 or its padded H or W is smaller than the dilated kernel (the formula would give Ho < 1)."""
    _check_extent(attrs, dims)
    n, _, h, w = dims
    out_h = (h + 2 * attrs.padding_h - attrs.dilation_h * (attrs.kernel_h - 1) - 1) // attrs.stride_h + 1
    out_w = (w + 2 * attrs.padding_w - attrs.dilation_w * (attrs.kernel_w - 1) - 1) // attrs.stride_w + 1
    return (n, attrs.out_channels, out_h, out_w)


def filter_dims(attrs: Conv2DAttrs, in_channels: int) -> tuple[int, int, int, int]:
    return (attrs.out_channels, in_channels // attrs.groups, attrs.kernel_h, attrs.kernel_w)


def flops(attrs: Conv2DAttrs, input_dims: tuple[int, ...]) -> int:
    """Multiply-adds of one forward, counted as 2 flops each."""
    n, o, out_h, out_w = output_dims(attrs, input_dims)
    return 2 * n * o * out_h * out_w * (input_dims[1] // attrs.groups) * attrs.kernel_h * attrs.kernel_w


@dataclass(eq=False)
class Conv2DState(core.KernelState):
    """The state of one conv_2d: on the GPU its cuDNN descriptors (owned until cleanup), the
    algorithms picked at init, the workspace they need and the pre-activation buffers."""

    descriptors: dict[str, Any] = field(default_factory=dict)
    algorithms: dict[str, Any] = field(default_factory=dict)
    buffers: dict[str, Any] = field(default_factory=dict)
    workspace_size: int = 0
    # direction -> "gemm" (cuBLAS, no columns), "columns" (im2col/col2im and cuBLAS) or "cudnn"
    paths: dict[str, str] = field(default_factory=dict)
    chunk: int = 1  # images whose columns and per-image filter gradients the workspace holds at once
    partials_at: int = 0  # where in the workspace (elements) the per-image filter gradients start
    plans: dict[str, Any] = field(default_factory=dict)  # plans and kernel geometry, made on first use

    def release(self) -> None:
        errors = []
        for descriptor in self.descriptors.values():
            try:
                descriptor.destroy()
            except core.KernelError as error:  # destroy the others, then report the first failure
                errors.append(error)
        self.descriptors.clear()
        self.algorithms.clear()
        self.paths.clear()
        self.plans.clear()
        self.buffers.clear()
        super().release()
        if errors:
            raise errors[0]


def init_kernel(handle: Any, attrs: Conv2DAttrs, input_shape: TensorShape, output_shape: TensorShape) -> Conv2DState:
    """Check the shapes against the attrs and record them; on the GPU also make the cuDNN
    descriptors, pick the algorithms from the shapes and size the workspace."""
    state = core.make_state(OP, handle, attrs, Conv2DAttrs, Conv2DState,
                            input_shape=input_shape, output_shape=output_shape)
    core.check_dtype(OP, "input_shape", input_shape, FLOAT_DTYPES)
    core.check_rank(OP, "input_shape", input_shape, rank=4)
    channels = input_shape.dims[1]
    if channels % attrs.groups:
        raise fail(ShapeError, OP, "input_shape", f"channels divisible by groups ({attrs.groups})", input_shape.dims)
    _check_extent(attrs, input_shape.dims)
    core.check_rank(OP, "output_shape", output_shape, rank=4)
    core.check_dims(OP, "output_shape", output_shape, output_dims(attrs, input_shape.dims))
    core.check_same_dtype(OP, "output_shape", output_shape, input_shape, "input_shape")
    state.shapes["filter_shape"] = TensorShape(filter_dims(attrs, channels), input_shape.dtype)
    state.shapes["bias_shape"] = TensorShape((attrs.out_channels,), input_shape.dtype)
    if state.device != "cpu":
        _gpu_init(handle, state)
    return state


def _check_absent(name: str, array: Any, reason: str) -> None:
    if array is not None:
        raise fail(ShapeError, OP, name, f"None ({reason})", f"an array of dims {tuple(array.shape)}")


def _check_forward(stream, handle, state, attrs, input, filter, bias, output) -> None:
    core.check_call(OP, stream, handle, state, attrs, [
        ("input", input, state.shapes["input_shape"], True),
        ("filter", filter, state.shapes["filter_shape"], True),
        ("bias", bias, state.shapes["bias_shape"], attrs.use_bias),
        ("output", output, state.shapes["output_shape"], True),
    ])
    if not attrs.use_bias:
        _check_absent("bias", bias, "use_bias is False")


def _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                    bias_grad) -> None:
    core.check_call(OP, stream, handle, state, attrs, [
        ("output", output, state.shapes["output_shape"], False),
        ("output_grad", output_grad, state.shapes["output_shape"], True),
        ("input", input, state.shapes["input_shape"], filter_grad is not None),  # filter_grad reads it
        ("input_grad", input_grad, state.shapes["input_shape"], False),
        ("filter", filter, state.shapes["filter_shape"], input_grad is not None),  # input_grad reads it
        ("filter_grad", filter_grad, state.shapes["filter_shape"], False),
        ("bias_grad", bias_grad, state.shapes["bias_shape"], False),
    ])
    if not attrs.use_bias:
        _check_absent("bias_grad", bias_grad, "use_bias is False")
    if attrs.activation is not None and "pre" not in state.saved:
        raise fail(StateError, OP, "state",
                   f"a forward before the backward (it saves the pre-{attrs.activation.name} values)", "none")


# --------------------------------------------------------------------------- CPU


# im2col of rows at least this long (output width) copies fast enough as a strided view; shorter
# rows (SCDown's depthwise 40) go through the stride phases, one contiguous span a tap.
WIDE_ROWS_BELOW = 64


def _padded(input: np.ndarray, attrs: Conv2DAttrs) -> np.ndarray:
    if not attrs.padding_h and not attrs.padding_w:
        return input
    n, c, h, w = input.shape
    padded = np.zeros((n, c, h + 2 * attrs.padding_h, w + 2 * attrs.padding_w), dtype=input.dtype)
    padded[:, :, attrs.padding_h:attrs.padding_h + h, attrs.padding_w:attrs.padding_w + w] = input
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
    """im2col: (N, groups, C/groups * kh * kw, Ho * Wo), so that filter rows times columns is NCHW."""
    taps = _taps(padded, attrs, out_h, out_w)
    n, groups, group_channels = taps.shape[:3]
    return taps.reshape(n, groups, group_channels * attrs.kernel_h * attrs.kernel_w, out_h * out_w)


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


def _phases(input: np.ndarray, attrs: Conv2DAttrs) -> np.ndarray:
    """The zero-padded input split by stride phase: (N, C, stride_h, stride_w, Hq * Wq); phase (a, b) holds
    padded rows a::stride_h and columns b::stride_w, so that every tap is a contiguous span of one phase."""
    n, c, height, width = input.shape
    rows, wide = _phase_layout(attrs, height, width)
    phases = np.zeros((n, c, attrs.stride_h, attrs.stride_w, rows, wide), dtype=input.dtype)
    for a, b, input_rows, input_columns, phase_rows, phase_columns in _phase_blocks(attrs, height, width):
        phases[:, :, a, b, phase_rows, phase_columns] = input[:, :, input_rows, input_columns]
    return phases.reshape(n, c, attrs.stride_h, attrs.stride_w, rows * wide)


def _wide_columns(phases: np.ndarray, attrs: Conv2DAttrs, wide: int, out_h: int) -> np.ndarray:
    """im2col in rows Wq wide: (N, groups, C/groups * kh * kw, Ho * Wq), one contiguous copy a tap."""
    n, c = phases.shape[:2]
    columns = np.empty((n, c, attrs.kernel_h, attrs.kernel_w, out_h * wide), dtype=phases.dtype)
    for i, j, a, b, span in _tap_spans(attrs, wide, out_h):
        columns[:, :, i, j] = phases[:, :, a, b, span]
    return columns.reshape(n, attrs.groups, c // attrs.groups * attrs.kernel_h * attrs.kernel_w, out_h * wide)


def cpu_forward_kernel(stream, handle, state, attrs, input, filter, bias, output) -> None:
    """output = activation(conv(input, filter) + bias)."""
    _check_forward(stream, handle, state, attrs, input, filter, bias, output)
    n, o, out_h, out_w = output.shape
    groups = attrs.groups
    target = np.empty_like(output) if attrs.activation is not None else output
    if out_w >= WIDE_ROWS_BELOW or _plain(attrs):
        columns = _columns(_padded(input, attrs), attrs, out_h, out_w)  # 1x1 s1 p0: a view of the input itself
        weights = filter.reshape(groups, o // groups, columns.shape[2])
        # (groups, O/groups, K) @ (N, groups, K, Ho * Wo) -> (N, groups, O/groups, Ho * Wo): NCHW itself.
        np.matmul(weights, columns, out=_grouped(target, groups))
    else:
        wide = _phase_layout(attrs, *input.shape[2:])[1]
        columns = _wide_columns(_phases(input, attrs), attrs, wide, out_h)
        weights = filter.reshape(groups, o // groups, columns.shape[2])
        # The same product in rows Wq wide: NCHW with spare columns.
        np.copyto(target, np.matmul(weights, columns).reshape(n, o, out_h, wide)[..., :out_w])
    if bias is not None:
        target += bias.reshape(1, o, 1, 1)
    if attrs.activation is not None:
        activation.cpu_forward(attrs.activation, target, output)
        state.saved["pre"] = target


def cpu_backward_kernel(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                        bias_grad) -> None:
    """Write input_grad, filter_grad and bias_grad (those not None) from output_grad."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                    bias_grad)
    grad = output_grad
    if attrs.activation is not None:
        grad = np.empty_like(output_grad)
        activation.cpu_backward(attrs.activation, state.saved["pre"], output_grad, grad)
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
        grad_wide = np.zeros((n, o, out_h, wide), dtype=grad.dtype)
        grad_wide[..., :out_w] = grad
        grad_wide = grad_wide.reshape(n, groups, o // groups, out_h * wide)
    if filter_grad is not None:
        if out_w >= WIDE_ROWS_BELOW or plain:
            grad_rows, columns = _grouped(grad, groups), _columns(_padded(input, attrs), attrs, out_h, out_w)
        else:
            grad_rows, columns = grad_wide, _wide_columns(_phases(input, attrs), attrs, wide, out_h)
        # (N, groups, O/groups, P) @ (N, groups, P, K), summed over N.
        per_image = np.matmul(grad_rows, columns.transpose(0, 1, 3, 2))
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
    sent = (np.multiply(weights, grad_wide) if o == groups else np.matmul(weights, grad_wide)).reshape(
        n, channels, attrs.kernel_h, attrs.kernel_w, out_h * wide)
    phases = np.zeros((n, channels, attrs.stride_h, attrs.stride_w, rows * wide), dtype=input_grad.dtype)
    for i, j, a, b, span in _tap_spans(attrs, wide, out_h):
        phases[:, :, a, b, span] += sent[:, :, i, j]
    phases = phases.reshape(n, channels, attrs.stride_h, attrs.stride_w, rows, wide)
    for a, b, input_rows, input_columns, phase_rows, phase_columns in _phase_blocks(attrs, height, width):
        input_grad[:, :, input_rows, input_columns] = phases[:, :, a, b, phase_rows, phase_columns]


# --------------------------------------------------------------------------- GPU

_CUDA = gpu.CudaModule("conv_2d.cu", [f"conv_bias_grad<{t}>" for t in gpu.FLOAT_TYPES] + [
    f"{kernel}<{t}, {i}>" for kernel in ("conv_im2col", "conv_col2im") for t in gpu.FLOAT_TYPES
    for i in gpu.INDEX_TYPES] + [
    f"conv_depthwise_{which}_grad<{t}, {i}>" for which in ("input", "filter") for t in gpu.FLOAT_TYPES
    for i in gpu.INDEX_TYPES] + [f"conv_sum_images<{t}>" for t in gpu.FLOAT_TYPES] + [
    f"conv_depthwise_forward<{t}, {i}>" for t in gpu.FLOAT_TYPES for i in gpu.INDEX_TYPES])
_BIAS_GRAD_BLOCK = 512  # CONV_BIAS_GRAD_BLOCK in conv_2d.cu
_DEPTHWISE_FILTER_BLOCK = 256  # CONV_DEPTHWISE_FILTER_BLOCK in conv_2d.cu
_GRID_SLACK = 65536 * gpu.BLOCK  # index room for a grid-stride loop's last step (grid_for caps at 65536 blocks)
_GEOMETRY = np.dtype([("v", np.int64, (13,))])  # struct ConvGeometry in conv_2d.cu


# --------------------------------------------------------------------------- GEMM plans
#
# cuBLAS is column-major: a row-major (r, c) matrix is, to cuBLAS, its (c, r) transpose with
# leading dimension c. With P = Ho * Wo and K = C * kh * kw (K = C for a 1x1 kernel), in
# row-major terms per image n:
#   forward       Y[n] (O x P) = W (O x K) @ cols[n] (K x P)      -> Y^T = cols^T @ W^T: gemm(N, N, P, O, K)
#   input grad    dcols[n] (K x P) = W^T (K x O) @ dY[n] (O x P)  -> dcols^T = dY^T @ W: gemm(N, T, P, K, O)
#   filter grad   dW (O x K) = sum_n dY[n] (O x P) @ cols[n]^T    -> dW^T = cols @ dY^T: gemm(T, N, K, O, P)
# where cols[n] is the input image itself for a pointwise conv. A plan is a list of steps over named
# buffers, offsets in elements; the GPU runs it (_run_plan) and the tests emulate it in NumPy.


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

    kind: str  # "im2col", "col2im" or "sum"
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


def depthwise(attrs: Conv2DAttrs, channels: int) -> bool:
    """One input channel per group (groups == C > 1), any number of filters per channel."""
    return 1 < attrs.groups == channels


def choose_paths(state: Conv2DState) -> None:
    """Set state.paths and state.chunk from the attrs and shapes (no device needed)."""
    attrs = state.attrs
    state.paths = {"forward": "cudnn", "backward_data": "cudnn", "backward_filter": "cudnn"}
    if depthwise(attrs, state.shapes["input_shape"].dims[1]):
        state.paths = dict.fromkeys(state.paths, "depthwise")
        return
    if attrs.groups != 1:
        return
    n, _, o, p, k = _sizes(state)
    itemsize = state.shapes["input_shape"].dtype.itemsize
    if pointwise(attrs):
        state.paths = dict.fromkeys(state.paths, "gemm")
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


# --------------------------------------------------------------------------- GPU


class _QueryStream:
    """Stands in for a stream where cuDNN is only asked (algorithm heuristics, workspace sizes):
    binds the handle to the default stream, on which nothing is enqueued; every kernel call
    binds it to its own stream again."""

    ptr = 0


def _convolvable(state: Conv2DState) -> bool:
    """cuDNN cannot describe zero-size tensors: those convolutions are done without it."""
    return all(state.shapes[name].numel > 0 for name in ("input_shape", "output_shape", "filter_shape"))


def _gpu_init(handle: Any, state: Conv2DState) -> None:
    import cupy

    from . import cudnn

    attrs = state.attrs
    dtype = state.shapes["input_shape"].dtype
    output = state.shapes["output_shape"]
    try:
        with cupy.cuda.Device(state.device):
            if output.numel > 0:
                state.descriptors["y"] = cudnn.TensorDescriptor(output.dims, dtype)
                if attrs.use_bias:
                    state.descriptors["bias"] = cudnn.TensorDescriptor((1, attrs.out_channels, 1, 1), dtype)
            if _convolvable(state):
                x = state.descriptors["x"] = cudnn.TensorDescriptor(state.shapes["input_shape"].dims, dtype)
                w = state.descriptors["w"] = cudnn.FilterDescriptor(state.shapes["filter_shape"].dims, dtype)
                conv = state.descriptors["conv"] = cudnn.ConvolutionDescriptor(
                    (attrs.padding_h, attrs.padding_w), (attrs.stride_h, attrs.stride_w),
                    (attrs.dilation_h, attrs.dilation_w), attrs.groups, dtype)
                y = state.descriptors["y"]
                found = cudnn.convolution_output_dims(conv, x, w)
                if found != output.dims:
                    raise core.CudaError("cuDNN", "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
                                         f"{OP}: cuDNN computes output dims {found}, the formula {output.dims}")
                cudnn_handle = handle.cudnn(_QueryStream)
                for direction, descriptors, preferred in (
                        ("forward", (x, w, y), cudnn.FWD_ALGO_IMPLICIT_GEMM), ("backward_data", (w, y, x), None),
                        ("backward_filter", (x, y, w), None)):
                    state.algorithms[direction] = cudnn.find_algorithm(direction, cudnn_handle, descriptors, conv,
                                                                       dtype, WORKSPACE_LIMIT, preferred)
                choose_paths(state)
                sizes = [state.algorithms[d].workspace for d, path in state.paths.items() if path == "cudnn"]
                sizes.append(workspace_elements(state) * dtype.itemsize)
                state.workspace_size = max(sizes)
                handle.reserve(state.workspace_size)  # calls never allocate
    except BaseException:
        state.release()
        raise


def _buffer(state: Conv2DState, name: str, like: Any) -> Any:
    """A buffer the state keeps until cleanup (pre-activation, its gradient), made on first use
    (gpu.device_empty: outside CuPy's pool, freed only when the device is done with it)."""
    if name not in state.buffers:
        state.buffers[name] = gpu.device_empty(like.shape, like.dtype, state.device)
    return state.buffers[name]


def _zero(stream, array) -> None:
    if array.nbytes:
        array.data.memset_async(0, array.nbytes, stream.cupy_stream)


def _workspace(handle: Any, state: Conv2DState) -> tuple[int, int]:
    """The handle's workspace (reserved by init_kernel): (pointer, bytes)."""
    workspace = handle.workspace(state.workspace_size)
    return workspace.data.ptr, workspace.nbytes


def _run_gemm(stream, handle: Any, dtype: np.dtype, step: Gemm, pointers: dict[str, int]) -> None:
    itemsize = dtype.itemsize
    a, b, c = (pointers[buffer] + offset * itemsize for buffer, offset in (step.a, step.b, step.c))
    cublas.gemm_strided_batched(stream, handle, dtype, step.trans_a, step.trans_b, step.m, step.n, step.k, a, step.lda,
                                step.stride_a, b, step.ldb, step.stride_b, step.beta, c, step.ldc, step.stride_c,
                                step.batch, OP)


def _cached(state: Conv2DState, name: str, make: Any) -> Any:
    """make(state), made once per state: the shapes and attrs never change after init."""
    made = state.plans.get(name)
    if made is None:
        made = state.plans[name] = make(state)
    return made


def _geometry(state: Conv2DState) -> Any:
    """struct ConvGeometry of conv_2d.cu, by value: C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw."""
    return _cached(state, "geometry", _make_geometry)


def _make_geometry(state: Conv2DState) -> Any:
    attrs = state.attrs
    _, c, h, w = state.shapes["input_shape"].dims
    _, _, out_h, out_w = state.shapes["output_shape"].dims
    geometry = np.zeros((), dtype=_GEOMETRY)
    geometry["v"] = (c, h, w, out_h, out_w, attrs.kernel_h, attrs.kernel_w, attrs.stride_h, attrs.stride_w,
                     attrs.padding_h, attrs.padding_w, attrs.dilation_h, attrs.dilation_w)
    return geometry[()]


def _run_fold(stream, state: Conv2DState, step: Fold, arrays: dict[str, Any], workspace: Any) -> None:
    attrs = state.attrs
    n, c, h, w = state.shapes["input_shape"].dims
    _, o, out_h, out_w = state.shapes["output_shape"].dims
    images = step.stop - step.first
    dtype = state.shapes["input_shape"].dtype
    if step.kind == "sum":
        size = arrays["filter_grad"].size
        partials = workspace[state.partials_at * dtype.itemsize:(state.partials_at + images * size) * dtype.itemsize]
        gpu.launch(stream, _CUDA.function(f"conv_sum_images<{gpu.cuda_type(dtype)}>"), gpu.grid_for(size), gpu.BLOCK,
                   (partials.view(dtype), arrays["filter_grad"], np.int64(images), np.int64(size),
                    np.int32(step.first > 0)))
        return
    count = images * c * attrs.kernel_h * attrs.kernel_w * out_h * out_w
    # Room for the grid-stride step past the last index too.
    index = gpu.index_type(count + _GRID_SLACK, images * c * h * w + _GRID_SLACK)
    index_scalar = np.int32 if index == "int" else np.int64
    columns = workspace[:count * dtype.itemsize].view(dtype)  # the chunk's columns, at the workspace's start
    if step.kind == "im2col":
        images_array = arrays["input"][step.first:step.stop]
        total = count
    else:
        images_array = arrays["input_grad"][step.first:step.stop]
        total = images * c * h * w
    kernel = _CUDA.function(f"conv_{step.kind}<{gpu.cuda_type(dtype)}, {index}>")
    first, second = (images_array, columns) if step.kind == "im2col" else (columns, images_array)
    gpu.launch(stream, kernel, gpu.grid_for(total), gpu.BLOCK, (first, second, index_scalar(images), _geometry(state)))


def _run_depthwise(stream, state: Conv2DState, which: str, grad: Any, input: Any, filter: Any,
                   target: Any, bias: Any = None) -> None:
    """conv_depthwise_forward (grad unused) or conv_depthwise_{input,filter}_grad of conv_2d.cu into
    target, enqueued on the stream."""
    attrs = state.attrs
    n, c, h, w = state.shapes["input_shape"].dims
    o = attrs.out_channels
    dtype = state.shapes["input_shape"].dtype
    index = gpu.index_type(n * c * h * w + _GRID_SLACK, state.shapes["output_shape"].numel + _GRID_SLACK,
                           o * attrs.kernel_h * attrs.kernel_w + 65536)
    index_scalar = np.int32 if index == "int" else np.int64
    name = "forward" if which == "forward" else f"{which}_grad"
    kernel = _CUDA.function(f"conv_depthwise_{name}<{gpu.cuda_type(dtype)}, {index}>")
    sizes = (index_scalar(n), index_scalar(o // c), _geometry(state))
    if which == "forward":
        gpu.launch(stream, kernel, gpu.grid_for(target.size), gpu.BLOCK,
                   (input, filter, filter if bias is None else bias, target, np.int32(bias is not None)) + sizes)
    elif which == "input":
        gpu.launch(stream, kernel, gpu.grid_for(n * c * h * w), gpu.BLOCK, (grad, filter, target) + sizes)
    else:
        gpu.launch(stream, kernel, min(o * attrs.kernel_h * attrs.kernel_w, 65535), _DEPTHWISE_FILTER_BLOCK,
                   (grad, input, target) + sizes)


def _run_plan(stream, handle: Any, state: Conv2DState, steps: list[Gemm | Fold], arrays: dict[str, Any],
              workspace: Any = None) -> None:
    """Enqueue a plan's GEMMs (kernels.cublas) and folds on the stream."""
    dtype = state.shapes["input_shape"].dtype
    pointers = {name: array.data.ptr for name, array in arrays.items() if array is not None}
    if workspace is not None:
        pointers["workspace"] = workspace.data.ptr
    for step in steps:
        if isinstance(step, Gemm):
            _run_gemm(stream, handle, dtype, step, pointers)
        else:
            _run_fold(stream, state, step, arrays, workspace)


@core.gpu_kernel
def gpu_forward_kernel(stream, handle, state, attrs, input, filter, bias, output) -> None:
    """output = activation(conv(input, filter) + bias), enqueued on the stream."""
    from . import cudnn

    _check_forward(stream, handle, state, attrs, input, filter, bias, output)
    target = output
    if attrs.activation is not None:
        target = _buffer(state, "pre", output)
    if output.size:
        dtype = output.dtype
        if _convolvable(state) and state.paths["forward"] == "depthwise":  # the bias too
            _run_depthwise(stream, state, "forward", None, input, filter, target, bias)
        elif _convolvable(state) and state.paths["forward"] == "gemm":
            _run_plan(stream, handle, state, _cached(state, "forward", plan_forward),
                      {"input": input, "filter": filter, "output": target})
        if not _convolvable(state):  # an empty sum: zero input channels, or an input of zero size inside the padding
            _zero(stream, target)
        elif state.paths["forward"] == "cudnn":
            cudnn_handle = handle.cudnn(stream)
            workspace, workspace_bytes = _workspace(handle, state)
            d = state.descriptors
            cudnn.convolution_forward(cudnn_handle, cudnn.scalar(dtype, 1), d["x"], input.data.ptr,
                                      d["w"], filter.data.ptr, d["conv"], state.algorithms["forward"],
                                      workspace, workspace_bytes, cudnn.scalar(dtype, 0), d["y"], target.data.ptr)
        if bias is not None and not (_convolvable(state) and state.paths["forward"] == "depthwise"):
            cudnn.add_tensor(handle.cudnn(stream), cudnn.scalar(dtype, 1), state.descriptors["bias"], bias.data.ptr,
                             cudnn.scalar(dtype, 1), state.descriptors["y"], target.data.ptr)
        if attrs.activation is not None:
            activation.gpu_forward(stream, attrs.activation, target, output)
    if attrs.activation is not None:
        state.saved["pre"] = target


@core.gpu_kernel
def gpu_backward_kernel(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                        bias_grad) -> None:
    """Write input_grad, filter_grad and bias_grad (those not None), enqueued on the stream."""
    from . import cudnn

    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                    bias_grad)
    dtype = output_grad.dtype
    grad = output_grad
    if attrs.activation is not None:
        grad = _buffer(state, "pre_grad", output_grad)
        activation.gpu_backward(stream, attrs.activation, state.saved["pre"], output_grad, grad)
    if bias_grad is not None and bias_grad.size:
        n, o, out_h, out_w = grad.shape
        gpu.launch(stream, _CUDA.function(f"conv_bias_grad<{gpu.cuda_type(dtype)}>"), min(o, 65535),
                   _BIAS_GRAD_BLOCK, (grad, bias_grad, np.int64(n), np.int64(o), np.int64(out_h * out_w)))
    wants_input = input_grad is not None and input_grad.size > 0
    wants_filter = filter_grad is not None and filter_grad.size > 0
    if not (wants_input or wants_filter):
        return
    if not _convolvable(state):  # nothing flows through an empty convolution
        for array in (input_grad, filter_grad):
            if array is not None:
                _zero(stream, array)
        return
    if state.paths["backward_data"] == "depthwise":  # both gradients by conv_2d.cu's depthwise kernels
        if wants_input:
            _run_depthwise(stream, state, "input", grad, input, filter, input_grad)
        if wants_filter:
            _run_depthwise(stream, state, "filter", grad, input, filter, filter_grad)
        return
    workspace_array = handle.workspace(state.workspace_size)  # one buffer for every step below, in stream order
    workspace, workspace_bytes = workspace_array.data.ptr, workspace_array.nbytes
    arrays = {"input": input, "filter": filter, "grad": grad, "input_grad": input_grad, "filter_grad": filter_grad}
    if wants_input and state.paths["backward_data"] != "cudnn":
        _run_plan(stream, handle, state, _cached(state, "backward_data", plan_backward_data), arrays, workspace_array)
    if wants_filter and state.paths["backward_filter"] != "cudnn":
        _run_plan(stream, handle, state, _cached(state, "backward_filter", plan_backward_filter), arrays, workspace_array)
    if not ((wants_input and state.paths["backward_data"] == "cudnn")
            or (wants_filter and state.paths["backward_filter"] == "cudnn")):
        return
    cudnn_handle = handle.cudnn(stream)
    d = state.descriptors
    one, zero = cudnn.scalar(dtype, 1), cudnn.scalar(dtype, 0)
    if wants_input and state.paths["backward_data"] == "cudnn":
        cudnn.convolution_backward_data(cudnn_handle, one, d["w"], filter.data.ptr, d["y"], grad.data.ptr,
                                        d["conv"], state.algorithms["backward_data"], workspace, workspace_bytes,
                                        zero, d["x"], input_grad.data.ptr)
    if wants_filter and state.paths["backward_filter"] == "cudnn":
        cudnn.convolution_backward_filter(cudnn_handle, one, d["x"], input.data.ptr, d["y"], grad.data.ptr,
                                          d["conv"], state.algorithms["backward_filter"], workspace,
                                          workspace_bytes, zero, d["w"], filter_grad.data.ptr)


# --------------------------------------------------------------------------- dispatch


def forward_kernel(stream, handle, state, attrs, input, filter, bias, output) -> None:
    """Write output = activation(conv(input, filter) + bias), on the stream's device."""
    core.dispatch(OP, cpu_forward_kernel, gpu_forward_kernel, stream, handle, state, attrs, input, filter, bias,
                  output)


def backward_kernel(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                    bias_grad) -> None:
    """Write input_grad, filter_grad and bias_grad (those not None) from output_grad, on the stream's device."""
    core.dispatch(OP, cpu_backward_kernel, gpu_backward_kernel, stream, handle, state, attrs, output, output_grad,
                  input, input_grad, filter, filter_grad, bias_grad)


def cleanup_kernel(handle, state) -> None:
    """Destroy the state's cuDNN descriptors and drop its buffers."""
    core.cleanup_state(OP, handle, state)


cpu_init_kernel = gpu_init_kernel = init_kernel
cpu_cleanup_kernel = gpu_cleanup_kernel = cleanup_kernel
