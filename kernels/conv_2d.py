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
strided slice add). GPU: cuDNN's legacy convolution API (kernels/cudnn.py) with
algorithms picked at init from cuDNN's heuristics on the shapes alone, kept only
when deterministic and plain sums of products (no FFT, no Winograd), in FMA math
(no TF32); cudnnAddTensor for the bias; conv_2d.cu for the bias gradient.
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

    def release(self) -> None:
        errors = []
        for descriptor in self.descriptors.values():
            try:
                descriptor.destroy()
            except core.KernelError as error:  # destroy the others, then report the first failure
                errors.append(error)
        self.descriptors.clear()
        self.algorithms.clear()
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


def cpu_forward_kernel(stream, handle, state, attrs, input, filter, bias, output) -> None:
    """output = activation(conv(input, filter) + bias)."""
    _check_forward(stream, handle, state, attrs, input, filter, bias, output)
    n, o, out_h, out_w = output.shape
    groups = attrs.groups
    target = np.empty_like(output) if attrs.activation is not None else output
    columns = _columns(_padded(input, attrs), attrs, out_h, out_w)
    weights = filter.reshape(groups, o // groups, columns.shape[2])
    # (groups, O/groups, K) @ (N, groups, K, Ho * Wo) -> (N, groups, O/groups, Ho * Wo): NCHW itself.
    np.matmul(weights, columns, out=_grouped(target, groups))
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
    groups = attrs.groups
    grad_rows = _grouped(grad, groups)  # (N, groups, O/groups, Ho * Wo)
    if filter_grad is not None:
        columns = _columns(_padded(input, attrs), attrs, out_h, out_w)
        # (N, groups, O/groups, P) @ (N, groups, P, K), summed over N.
        per_image = np.matmul(grad_rows, columns.transpose(0, 1, 3, 2))
        np.copyto(filter_grad, per_image.sum(axis=0).reshape(filter_grad.shape))
    if input_grad is not None:
        _, channels, height, width = input_grad.shape
        group_channels = channels // groups
        weights = filter.reshape(groups, o // groups, group_channels * attrs.kernel_h * attrs.kernel_w)
        # (groups, K, O/groups) @ (N, groups, O/groups, P): what each tap of each window sends back.
        sent = np.matmul(weights.transpose(0, 2, 1), grad_rows).reshape(
            n, groups, group_channels, attrs.kernel_h, attrs.kernel_w, out_h, out_w)
        padded = np.zeros((n, groups, group_channels, height + 2 * attrs.padding_h, width + 2 * attrs.padding_w),
                          dtype=input_grad.dtype)
        rows_span, columns_span = attrs.stride_h * (out_h - 1) + 1, attrs.stride_w * (out_w - 1) + 1
        for row in range(attrs.kernel_h):
            top = row * attrs.dilation_h
            for column in range(attrs.kernel_w):
                left = column * attrs.dilation_w
                padded[:, :, :, top:top + rows_span:attrs.stride_h, left:left + columns_span:attrs.stride_w] += \
                    sent[:, :, :, row, column]
        np.copyto(input_grad, padded.reshape(n, channels, *padded.shape[3:])[
            :, :, attrs.padding_h:attrs.padding_h + height, attrs.padding_w:attrs.padding_w + width])


# --------------------------------------------------------------------------- GPU

_CUDA = gpu.CudaModule("conv_2d.cu", [f"conv_bias_grad<{t}>" for t in gpu.FLOAT_TYPES])
_BIAS_GRAD_BLOCK = 512  # CONV_BIAS_GRAD_BLOCK in conv_2d.cu


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
                for direction, descriptors in (("forward", (x, w, y)), ("backward_data", (w, y, x)),
                                               ("backward_filter", (x, y, w))):
                    state.algorithms[direction] = cudnn.find_algorithm(direction, cudnn_handle, descriptors, conv,
                                                                       dtype, WORKSPACE_LIMIT)
                state.workspace_size = max(a.workspace for a in state.algorithms.values())
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


def gpu_forward_kernel(stream, handle, state, attrs, input, filter, bias, output) -> None:
    """output = activation(conv(input, filter) + bias), enqueued on the stream."""
    from . import cudnn

    _check_forward(stream, handle, state, attrs, input, filter, bias, output)
    target = output
    if attrs.activation is not None:
        target = _buffer(stream, state, "pre", output)
    if output.size:
        dtype = output.dtype
        # Not nested around gpu.launch (which enters the stream itself): activation runs after the block.
        with stream:
            cudnn_handle = handle.cudnn(stream)
            if _convolvable(state):
                workspace, workspace_bytes = _workspace(handle, state)
                d = state.descriptors
                cudnn.convolution_forward(cudnn_handle, cudnn.scalar(dtype, 1), d["x"], input.data.ptr,
                                          d["w"], filter.data.ptr, d["conv"], state.algorithms["forward"],
                                          workspace, workspace_bytes, cudnn.scalar(dtype, 0), d["y"], target.data.ptr)
            else:  # an empty sum: zero input channels, or an input of zero size inside the padding
                _zero(stream, target)
            if bias is not None:
                cudnn.add_tensor(cudnn_handle, cudnn.scalar(dtype, 1), state.descriptors["bias"], bias.data.ptr,
                                 cudnn.scalar(dtype, 1), state.descriptors["y"], target.data.ptr)
        if attrs.activation is not None:
            activation.gpu_forward(stream, attrs.activation, target, output)
    if attrs.activation is not None:
        state.saved["pre"] = target


def gpu_backward_kernel(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                        bias_grad) -> None:
    """Write input_grad, filter_grad and bias_grad (those not None), enqueued on the stream."""
    from . import cudnn

    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                    bias_grad)
    dtype = output_grad.dtype
    grad = output_grad
    if attrs.activation is not None:
        grad = _buffer(stream, state, "pre_grad", output_grad)
        activation.gpu_backward(stream, attrs.activation, state.saved["pre"], output_grad, grad)
    if bias_grad is not None and bias_grad.size:
        n, o, out_h, out_w = grad.shape
        gpu.launch(stream, _CUDA.function(f"conv_bias_grad<{gpu.cuda_type(dtype)}>"), min(o, 65535),
                   _BIAS_GRAD_BLOCK, (grad, bias_grad, np.int64(n), np.int64(o), np.int64(out_h * out_w)))
    wants_input = input_grad is not None and input_grad.size > 0
    wants_filter = filter_grad is not None and filter_grad.size > 0
    if not (wants_input or wants_filter):
        return
    with stream:
        if not _convolvable(state):  # nothing flows through an empty convolution
            for array in (input_grad, filter_grad):
                if array is not None:
                    _zero(stream, array)
            return
        cudnn_handle = handle.cudnn(stream)
        workspace, workspace_bytes = _workspace(handle, state)
        d = state.descriptors
        one, zero = cudnn.scalar(dtype, 1), cudnn.scalar(dtype, 0)
        if wants_input:
            cudnn.convolution_backward_data(cudnn_handle, one, d["w"], filter.data.ptr, d["y"], grad.data.ptr,
                                            d["conv"], state.algorithms["backward_data"], workspace, workspace_bytes,
                                            zero, d["x"], input_grad.data.ptr)
        if wants_filter:
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
