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

conv_2d.cu adds the bias (conv_add_bias, after the GEMM or cuDNN; fused in the depthwise
forward) and sums the bias gradient. Everything shape-only of a call (path, kernels, grids, GEMM
arguments, descriptors, scalars) is made once per state (_forward_runner, _backward_runner). The GEMM and
fold steps of each path are planned as data (plan_*), so their index math is
checked on the CPU against NumPy (tests/test_conv_2d_gemm_plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import activation, core, gpu
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


def output_dims(attrs: Conv2DAttrs, dims: tuple[int, ...]) -> tuple[int, ...]:
    """(N, out_channels, Ho, Wo) of an NCHW input, by the convolution formula."""
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
    _, channels, height, width = input_shape.dims
    if channels % attrs.groups:
        raise fail(ShapeError, OP, "input_shape", f"channels divisible by groups ({attrs.groups})", input_shape.dims)
    for size, kernel, padding, dilation, what in ((height, attrs.kernel_h, attrs.padding_h, attrs.dilation_h, "H"),
                                                  (width, attrs.kernel_w, attrs.padding_w, attrs.dilation_w, "W")):
        extent = dilation * (kernel - 1) + 1
        if size + 2 * padding < extent:
            raise fail(ShapeError, OP, "input_shape",
                       f"{what} + 2 * padding >= the dilated kernel ({extent}), so that the output is not empty",
                       input_shape.dims)
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
    f"{kernel}<{t}, {i}>" for kernel in ("conv_depthwise_forward", "conv_add_bias") for t in gpu.FLOAT_TYPES
    for i in gpu.INDEX_TYPES])
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
# buffers, offsets in elements; the GPU runs it (_compiled_plan) and the tests emulate it in NumPy.


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
    except BaseException:
        state.release()
        raise


def _buffer(stream, state: Conv2DState, name: str, like: Any) -> Any:
    """A buffer the state keeps until cleanup (pre-activation, its gradient), made on first use on
    the stream that uses it: CuPy's pool then reuses it after cleanup only in that stream's order."""
    import cupy

    if name not in state.buffers:
        with stream:
            state.buffers[name] = cupy.empty(like.shape, dtype=like.dtype)
    return state.buffers[name]


def _zero(stream, array) -> None:
    if array.nbytes:
        array.data.memset_async(0, array.nbytes, stream.cupy_stream)


def _workspace(handle: Any, state: Conv2DState) -> tuple[int, int]:
    """The handle's workspace, grown on the stream that uses it (so a freed smaller one is
    reused only in that stream's order): (pointer, bytes)."""
    workspace = handle.workspace(state.workspace_size)
    return workspace.data.ptr, workspace.nbytes


# Host alpha and beta for cuBLAS (pointer mode host): float for S, double for D. cuBLAS reads them
# during the call, so module-level arrays are safe.
_BLAS_SCALARS = {(np.dtype(t), v): np.array(v, dtype=t) for t in (np.float32, np.float64) for v in (0.0, 1.0)}


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


def _gemm_step(state: Conv2DState, step: Gemm) -> Any:
    """One planned GEMM as a function of (stream, blas_handle, pointers), everything but the
    pointers looked up once: the cuBLAS routine, operations, sizes, byte offsets, alpha and beta."""
    from cupy.cuda import cublas

    dtype = state.shapes["input_shape"].dtype
    itemsize = dtype.itemsize
    name = "sgemmStridedBatched" if dtype == np.float32 else "dgemmStridedBatched"
    routine = getattr(cublas, name)
    op_a, op_b = (cublas.CUBLAS_OP_T if trans else cublas.CUBLAS_OP_N for trans in (step.trans_a, step.trans_b))
    alpha = _BLAS_SCALARS[(dtype, 1.0)].ctypes.data
    beta = _BLAS_SCALARS[(dtype, step.beta)].ctypes.data
    (a, a_at), (b, b_at), (c, c_at) = ((buffer, offset * itemsize) for buffer, offset in (step.a, step.b, step.c))
    m, n, k, lda, ldb, ldc = step.m, step.n, step.k, step.lda, step.ldb, step.ldc
    stride_a, stride_b, stride_c, batch = step.stride_a, step.stride_b, step.stride_c, step.batch
    error_type = cublas.CUBLASError

    def run(stream, blas_handle: int, pointers: dict[str, int]) -> None:
        try:
            routine(blas_handle, op_a, op_b, m, n, k, alpha, pointers[a] + a_at, lda, stride_a, pointers[b] + b_at,
                    ldb, stride_b, beta, pointers[c] + c_at, ldc, stride_c, batch)
        except error_type as error:
            raise core.CudaError("cuBLAS", str(error),
                                 f"{OP}: {name} (m={m}, n={n}, k={k}, batch={batch})") from error

    return run


def _fold_step(state: Conv2DState, step: Fold, device: int) -> Any:
    """One planned fold (conv_im2col, conv_col2im or conv_sum_images of conv_2d.cu) as a function of
    (stream, blas_handle, pointers): kernel, grid and every argument but the pointers made once."""
    attrs = state.attrs
    dtype = state.shapes["input_shape"].dtype
    itemsize = dtype.itemsize
    _, c, h, w = state.shapes["input_shape"].dims
    _, _, out_h, out_w = state.shapes["output_shape"].dims
    images = step.stop - step.first
    if step.kind == "sum":
        size = c * attrs.kernel_h * attrs.kernel_w * attrs.out_channels  # the filter's elements (groups == 1)
        kernel = _CUDA.function(f"conv_sum_images<{gpu.cuda_type(dtype)}>", device)
        grid = gpu.grid_for(size)
        partials_at = state.partials_at * itemsize
        tail = (np.int64(images), np.int64(size), np.int32(step.first > 0))

        def run_sum(stream, blas_handle: int, pointers: dict[str, int]) -> None:
            gpu.launch(stream, kernel, grid, gpu.BLOCK, (np.uint64(pointers["workspace"] + partials_at),
                                                         np.uint64(pointers["filter_grad"])) + tail)

        return run_sum
    count = images * c * attrs.kernel_h * attrs.kernel_w * out_h * out_w
    # Room for the grid-stride step past the last index too.
    index = gpu.index_type(count + _GRID_SLACK, images * c * h * w + _GRID_SLACK)
    index_scalar = np.int32 if index == "int" else np.int64
    kernel = _CUDA.function(f"conv_{step.kind}<{gpu.cuda_type(dtype)}, {index}>", device)
    image_at = step.first * c * h * w * itemsize  # the chunk's first image; its columns at the workspace's start
    tail = (index_scalar(images), _geometry(state))
    if step.kind == "im2col":
        grid = gpu.grid_for(count)

        def run_im2col(stream, blas_handle: int, pointers: dict[str, int]) -> None:
            gpu.launch(stream, kernel, grid, gpu.BLOCK, (np.uint64(pointers["input"] + image_at),
                                                         np.uint64(pointers["workspace"])) + tail)

        return run_im2col
    grid = gpu.grid_for(images * c * h * w)

    def run_col2im(stream, blas_handle: int, pointers: dict[str, int]) -> None:
        gpu.launch(stream, kernel, grid, gpu.BLOCK, (np.uint64(pointers["workspace"]),
                                                     np.uint64(pointers["input_grad"] + image_at)) + tail)

    return run_col2im


def _compiled_plan(state: Conv2DState, steps: list[Gemm | Fold], device: int) -> tuple[Any, ...]:
    """A plan's steps as functions of (stream, blas_handle, pointers by buffer name), in order."""
    return tuple(_gemm_step(state, step) if isinstance(step, Gemm) else _fold_step(state, step, device)
                 for step in steps)


def _depthwise_launch(state: Conv2DState, which: str, device: int) -> tuple[Any, int, int, tuple[Any, ...]]:
    """(kernel, grid, block, trailing arguments) of conv_depthwise_forward or
    conv_depthwise_{input,filter}_grad of conv_2d.cu."""
    attrs = state.attrs
    n, c, h, w = state.shapes["input_shape"].dims
    o = attrs.out_channels
    dtype = state.shapes["input_shape"].dtype
    outputs = state.shapes["output_shape"].numel
    index = gpu.index_type(n * c * h * w + _GRID_SLACK, outputs + _GRID_SLACK,
                           o * attrs.kernel_h * attrs.kernel_w + 65536)
    index_scalar = np.int32 if index == "int" else np.int64
    name = "forward" if which == "forward" else f"{which}_grad"
    kernel = _CUDA.function(f"conv_depthwise_{name}<{gpu.cuda_type(dtype)}, {index}>", device)
    sizes = (index_scalar(n), index_scalar(o // c), _geometry(state))
    if which == "forward":
        return kernel, gpu.grid_for(outputs), gpu.BLOCK, sizes
    if which == "input":
        return kernel, gpu.grid_for(n * c * h * w), gpu.BLOCK, sizes
    return kernel, min(o * attrs.kernel_h * attrs.kernel_w, 65535), _DEPTHWISE_FILTER_BLOCK, sizes


def _bias_adder(state: Conv2DState, device: int) -> Any:
    """A function (stream, bias, target) enqueuing target += bias broadcast over (N, O, P) (conv_add_bias
    of conv_2d.cu, one launch), or None without a bias or output."""
    n, o, out_h, out_w = state.shapes["output_shape"].dims
    total = n * o * out_h * out_w
    if not state.attrs.use_bias or total == 0:
        return None
    dtype = state.shapes["output_shape"].dtype
    index = gpu.index_type(total + _GRID_SLACK)
    index_scalar = np.int32 if index == "int" else np.int64
    kernel = _CUDA.function(f"conv_add_bias<{gpu.cuda_type(dtype)}, {index}>", device)
    grid = gpu.grid_for(total)
    tail = (index_scalar(total), index_scalar(o), index_scalar(out_h * out_w))

    def add(stream, bias: Any, target: Any) -> None:
        gpu.launch(stream, kernel, grid, gpu.BLOCK, (target, bias) + tail)

    return add


def _forward_runner(state: Conv2DState, device: int) -> Any:
    """The forward's per-call work as a function (stream, handle, input, filter, bias, target), made
    once per state: the path, kernels, grids, plans, descriptors and scalars are shape-only."""
    add_bias = _bias_adder(state, device)
    path = state.paths["forward"] if _convolvable(state) else "zero"
    if path == "depthwise":  # the bias fused
        kernel, grid, block, sizes = _depthwise_launch(state, "forward", device)

        def run_depthwise(stream, handle, input, filter, bias, target) -> None:
            gpu.launch(stream, kernel, grid, block,
                       (input, filter, filter if bias is None else bias, target, np.int32(bias is not None)) + sizes)

        return run_depthwise
    if path == "gemm":
        steps = _compiled_plan(state, plan_forward(state), device)

        def convolve(stream, handle, input, filter, target) -> None:
            blas_handle = handle.cublas(stream)
            pointers = {"input": input.data.ptr, "filter": filter.data.ptr, "output": target.data.ptr}
            for step in steps:
                step(stream, blas_handle, pointers)
    elif path == "cudnn":
        from . import cudnn

        dtype = state.shapes["input_shape"].dtype
        one, zero = cudnn.scalar(dtype, 1), cudnn.scalar(dtype, 0)
        d = state.descriptors
        x, w, conv, y = d["x"], d["w"], d["conv"], d["y"]
        algorithm, workspace_size = state.algorithms["forward"], state.workspace_size

        def convolve(stream, handle, input, filter, target) -> None:
            workspace = handle.workspace_on(stream, workspace_size)
            cudnn.convolution_forward(handle.cudnn(stream), one, x, input.data.ptr, w, filter.data.ptr, conv, algorithm,
                                      workspace.data.ptr, workspace.nbytes, zero, y, target.data.ptr)
    else:  # an empty sum: zero input channels, or an input of zero size inside the padding

        def convolve(stream, handle, input, filter, target) -> None:
            _zero(stream, target)

    def run(stream, handle, input, filter, bias, target) -> None:
        convolve(stream, handle, input, filter, target)
        if bias is not None and add_bias is not None:
            add_bias(stream, bias, target)

    return run


def _on_device(stream, run: Any, *args: Any) -> None:
    """run(*args) with the stream's device current (cuBLAS and cuDNN calls need it): entered only
    where another device is current."""
    if gpu.cupy.cuda.runtime.getDevice() == stream.device:
        run(*args)
    else:
        with stream:
            run(*args)


def gpu_forward_kernel(stream, handle, state, attrs, input, filter, bias, output) -> None:
    """output = activation(conv(input, filter) + bias), enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, filter, bias, output)
    target = output
    if attrs.activation is not None:
        target = _buffer(stream, state, "pre", output)
    if output.size:
        run = state.plans.get("gpu_forward")
        if run is None:
            run = state.plans["gpu_forward"] = _forward_runner(state, stream.device)
        _on_device(stream, run, stream, handle, input, filter, bias, target)
        if attrs.activation is not None:
            activation.gpu_forward(stream, attrs.activation, target, output)
    if attrs.activation is not None:
        state.saved["pre"] = target


def _backward_runner(state: Conv2DState, device: int) -> Any:
    """The backward's per-call work (after the activation's) as a function (stream, handle, grad, input,
    filter, input_grad, filter_grad, bias_grad), made once per state like _forward_runner."""
    dtype = state.shapes["output_shape"].dtype
    n, o, out_h, out_w = state.shapes["output_shape"].dims
    bias_grad_launch = None
    if state.attrs.use_bias and o > 0:
        bias_grad_launch = (_CUDA.function(f"conv_bias_grad<{gpu.cuda_type(dtype)}>", device), min(o, 65535),
                            (np.int64(n), np.int64(o), np.int64(out_h * out_w)))
    convolvable = _convolvable(state)
    data_path = state.paths["backward_data"] if convolvable else "zero"
    filter_path = state.paths["backward_filter"] if convolvable else "zero"
    input_launch = filter_launch = None
    if data_path == "depthwise":
        input_launch = _depthwise_launch(state, "input", device)
        filter_launch = _depthwise_launch(state, "filter", device)
    data_steps = filter_steps = ()
    if data_path in ("gemm", "columns"):
        data_steps = _compiled_plan(state, plan_backward_data(state), device)
    if filter_path in ("gemm", "columns"):
        filter_steps = _compiled_plan(state, plan_backward_filter(state), device)
    workspace_size = state.workspace_size
    cudnn_data = cudnn_filter = None
    if "cudnn" in (data_path, filter_path):
        from . import cudnn

        one, zero = cudnn.scalar(dtype, 1), cudnn.scalar(dtype, 0)
        d = state.descriptors
        x, w, conv, y = d["x"], d["w"], d["conv"], d["y"]
        data_algorithm, filter_algorithm = state.algorithms["backward_data"], state.algorithms["backward_filter"]

        def cudnn_data(cudnn_handle, workspace, grad, filter, input_grad) -> None:
            cudnn.convolution_backward_data(cudnn_handle, one, w, filter.data.ptr, y, grad.data.ptr, conv,
                                            data_algorithm, workspace.data.ptr, workspace.nbytes, zero, x,
                                            input_grad.data.ptr)

        def cudnn_filter(cudnn_handle, workspace, grad, input, filter_grad) -> None:
            cudnn.convolution_backward_filter(cudnn_handle, one, x, input.data.ptr, y, grad.data.ptr, conv,
                                              filter_algorithm, workspace.data.ptr, workspace.nbytes, zero, w,
                                              filter_grad.data.ptr)

    def run(stream, handle, grad, input, filter, input_grad, filter_grad, bias_grad) -> None:
        if bias_grad is not None and bias_grad_launch is not None:
            kernel, grid, tail = bias_grad_launch
            gpu.launch(stream, kernel, grid, _BIAS_GRAD_BLOCK, (grad, bias_grad) + tail)
        wants_input = input_grad is not None and input_grad.size > 0
        wants_filter = filter_grad is not None and filter_grad.size > 0
        if not (wants_input or wants_filter):
            return
        if not convolvable:  # nothing flows through an empty convolution
            for array in (input_grad, filter_grad):
                if array is not None:
                    _zero(stream, array)
            return
        if data_path == "depthwise":  # both gradients by conv_2d.cu's depthwise kernels
            if wants_input:
                kernel, grid, block, sizes = input_launch
                gpu.launch(stream, kernel, grid, block, (grad, filter, input_grad) + sizes)
            if wants_filter:
                kernel, grid, block, sizes = filter_launch
                gpu.launch(stream, kernel, grid, block, (grad, input, filter_grad) + sizes)
            return
        # One buffer for every step below: they run one after another on the stream.
        workspace = handle.workspace_on(stream, workspace_size)
        run_data = wants_input and bool(data_steps)
        run_filter = wants_filter and bool(filter_steps)
        if run_data or run_filter:
            blas_handle = handle.cublas(stream)
            pointers = {"grad": grad.data.ptr, "workspace": workspace.data.ptr}
            if run_data:
                pointers["filter"] = filter.data.ptr
                pointers["input_grad"] = input_grad.data.ptr
                for step in data_steps:
                    step(stream, blas_handle, pointers)
            if run_filter:
                pointers["input"] = input.data.ptr
                pointers["filter_grad"] = filter_grad.data.ptr
                for step in filter_steps:
                    step(stream, blas_handle, pointers)
        if wants_input and data_path == "cudnn":
            cudnn_data(handle.cudnn(stream), workspace, grad, filter, input_grad)
        if wants_filter and filter_path == "cudnn":
            cudnn_filter(handle.cudnn(stream), workspace, grad, input, filter_grad)

    return run


def gpu_backward_kernel(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                        bias_grad) -> None:
    """Write input_grad, filter_grad and bias_grad (those not None), enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                    bias_grad)
    grad = output_grad
    if attrs.activation is not None:
        grad = _buffer(stream, state, "pre_grad", output_grad)
        activation.gpu_backward(stream, attrs.activation, state.saved["pre"], output_grad, grad)
    run = state.plans.get("gpu_backward")
    if run is None:
        run = state.plans["gpu_backward"] = _backward_runner(state, stream.device)
    _on_device(stream, run, stream, handle, grad, input, filter, input_grad, filter_grad, bias_grad)


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
