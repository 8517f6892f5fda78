"""conv_2d: 2-D cross-correlation of an NCHW input with an (O, C/groups, kh, kw) filter,
plus an optional bias of (O,), then an optional fused activation (PyTorch's conv2d).

The output is (N, O, Ho, Wo) with Ho = floor((H + 2 padding_h - dilation_h (kernel_h - 1) - 1)
/ stride_h) + 1, likewise Wo; the padded input must hold one dilated kernel. Input
channels C must divide into the groups, and so must O (an attrs check).

Backward overwrites every gradient it is given (None skips it): input_grad,
filter_grad and bias_grad (the sum of the pre-activation gradient over N, H, W).
With a fused activation, the forward keeps the pre-activation in the state (like
cuDNN's reserve space) and a backward without a forward before it raises StateError;
without one, backward needs no forward. A state made with ``attrs.backward=False`` is for
inference only: the activation is applied in the output itself (no pre-activation kept, the
same bits) and backward_kernel raises StateError.

CPU: NumPy im2col through a strided view, one batched matmul over the groups;
the input gradient scatters back tap by tap (a loop over the kh * kw taps, each a
strided slice add). GPU, every path deterministic, a plain sum of products in FMA
math (no TF32, no FFT, no Winograd, no atomics), chosen at init from the shapes:

- groups == 1, a 1x1 kernel, stride 1, no padding ("pointwise"): cuBLAS GEMMs
  (pedantic math) for the forward and both gradients, the filter gradient summed
  over the batch one image at a time (beta 0, then 1) in a fixed order;
- other groups == 1 convolutions ("columns"): the forward in cuDNN, the filter
  gradient by im2col (conv_2d.cu) and one GEMM per image, the input gradient by
  one batched GEMM into columns and a col2im gather (conv_2d.cu, each input
  element sums its taps in a fixed order); the columns of one chunk of
  images at a time live in the handle's workspace (at most COLUMN_LIMIT bytes), and
  where one image's columns exceed that, the gradients fall back to cuDNN;
- depthwise (groups == C > 1, any filters per channel): conv_2d.cu's own kernels:
  the forward (for YOLOv10's 3x3 and 7x7 kernels with one filter a channel, a thread
  computes 4 rows of 1 or 2 outputs (plan.DEPTHWISE_SHARES) from the input rows they
  reach; else a tile of an output plane a block, from its input region staged in
  shared memory; one thread an output where no tile fits; the same bits on each;
  the bias added after the
  taps), a per-element gather for the input gradient (where the forward has rows: at
  stride 1 the rows forward of the output gradient with the filter turned, taking
  each sum's taps in the gather's order; at stride 2 the gather compiled for the
  kernel and stride), one block per filter element (a fixed
  tree in double) for the filter's, or, with rows and a channel for every two SMs,
  one block per channel for all its taps (the same sums and trees);
- other groups > 1: cuDNN (kernels/runtime/cudnn.py) throughout.

Each direction in cuDNN runs an execution plan of cuDNN's backend API built at init
(an engine of its heuristics whose numerical notes keep these rules; KERNELS_CUDNN_BACKEND,
docs/ops.md), with cuDNN's legacy call as the fallback: its forward in FMA math (float32,
float64) is IMPLICIT_GEMM below plan.IMPLICIT_GEMM_BELOW_FLOPS where supported (the
cheapest per call on the H200), otherwise, and in tensor-op math, the heuristics'
deterministic choice; its backward algorithms are the heuristics' deterministic ones.
A plan or algorithm may ask for plan.workspace_limit bytes of workspace.

Half precision (float16, bfloat16): storage in the dtype, products and sums in float32.
On the GPU a pointwise forward and input gradient are one cuBLAS GEMM each (float32
compute, rounded once), and its filter gradient too for one image; every other direction
but the depthwise ones runs in cuDNN (half tensors, float compute type, tensor-core
algorithms allowed): a batch's filter gradient sums the whole batch in float32, where
the per-image GEMMs would round each image's part to the dtype. The depthwise kernels
widen, sum in float (double for the filter gradient) and round once.
The rounding points, the same on the CPU: the convolution's result is rounded to the
dtype; the bias is added to it in float32 and the sum rounded; a fused activation reads
that (the kept pre-activation, in the dtype) in float32 and its result is rounded. The
backward rounds the activation's gradient to the dtype, then each gradient once
(bias_grad: a float64 sum rounded to float32, then to the dtype, as on the GPU).

TF32: a float32 state initialised with a GpuHandle made with allow_tf32=True lets cuDNN
pick tensor-op (TF32) algorithms and runs the cuBLAS GEMMs with
CUBLAS_COMPUTE_32F_FAST_TF32; the depthwise kernels are unchanged. Never otherwise.

cudnnAddTensor adds the bias; conv_2d.cu sums the bias gradient. The GEMM and
fold steps of each path are planned as data (plan_*), so their index math is
checked on the CPU against NumPy (tests/test_conv_2d_gemm_plan.py).

The package: this module holds the shapes, init_kernel, the checks and the entry
points (each checks, then calls its device's code); attrs.py the attrs and the state;
cpu.py the NumPy code; plan.py the device-free path choice and GEMM/fold plans; gpu.py
the GPU code; conv_2d.cu the CUDA kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime.core import ALL_FLOAT_DTYPES, ShapeError, StateError, TensorShape, fail
from ..runtime.spec import UNARY_SHAPES, Arg, declare_op, unary_backward
from . import cpu, gpu
from .attrs import OP, Conv2DAttrs, Conv2DState
from .attrs import Conv2DDescriptors as Conv2DDescriptors  # public: the type of Conv2DState.descriptors


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


def init_kernel(handle: Any, attrs: Conv2DAttrs, input_shape: TensorShape, output_shape: TensorShape) -> Conv2DState:
    """Check the shapes against the attrs and record them; on the GPU also make the cuDNN
    descriptors, pick the algorithms from the shapes and size the workspace."""
    state = core.make_state(OP, handle, attrs, Conv2DAttrs, Conv2DState,
                            input_shape=input_shape, output_shape=output_shape)
    core.check_dtype(OP, "input_shape", input_shape, ALL_FLOAT_DTYPES)
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
    # TF32 is the handle's setting at init (a CPU handle has none), for float32 only.
    state.tf32 = bool(getattr(handle, "allow_tf32", False)) and input_shape.dtype == np.float32
    if state.device != "cpu":  # pragma: no cover - GPU: cuDNN descriptors of a GPU handle
        gpu.init(handle, state)
    return state


def _check_absent(name: str, array: Any, reason: str) -> None:
    if array is not None:
        raise fail(ShapeError, OP, name, f"None ({reason})", f"an array of dims {tuple(array.shape)}")


def _check_forward(stream: Any, handle: Any, state: Any, attrs: Any, input: Any, filter: Any, bias: Any,
                   output: Any) -> None:
    shapes = core.state_shapes(OP, stream, handle, state, attrs)
    core.check_call(OP, stream, handle, state, attrs, [
        ("input", input, shapes["input_shape"], True),
        ("filter", filter, shapes["filter_shape"], True),
        ("bias", bias, shapes["bias_shape"], state.attrs.use_bias),
        ("output", output, shapes["output_shape"], True),
    ])
    if not attrs.use_bias:
        _check_absent("bias", bias, "use_bias is False")


def _check_backward(stream: Any, handle: Any, state: Any, attrs: Any, output: Any, output_grad: Any, input: Any,
                    input_grad: Any, filter: Any, filter_grad: Any, bias_grad: Any) -> None:
    shapes = core.state_shapes(OP, stream, handle, state, attrs)
    core.check_call(OP, stream, handle, state, attrs, [
        ("output", output, shapes["output_shape"], False),
        ("output_grad", output_grad, shapes["output_shape"], True),
        ("input", input, shapes["input_shape"], filter_grad is not None),  # filter_grad reads it
        ("input_grad", input_grad, shapes["input_shape"], False),
        ("filter", filter, shapes["filter_shape"], input_grad is not None),  # input_grad reads it
        ("filter_grad", filter_grad, shapes["filter_shape"], False),
        ("bias_grad", bias_grad, shapes["bias_shape"], False),
    ])
    if not attrs.use_bias:
        _check_absent("bias_grad", bias_grad, "use_bias is False")
    if not state.attrs.backward:
        raise fail(StateError, OP, "state", "a state made for a backward (attrs.backward True)",
                   "a state made with attrs.backward False (inference only: its forward keeps nothing for one)")
    if attrs.activation is not None and state.pre is None:
        raise fail(StateError, OP, "state",
                   f"a forward before the backward (it saves the pre-{attrs.activation.name} values)", "none")


# --------------------------------------------------------------------------- entry points
#
# Arrays are NumPy arrays on the CPU and CuPy arrays on the GPU; None stands for an absent bias or an
# unwanted gradient.


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: Any, handle: Any, state: Conv2DState, attrs: Conv2DAttrs, input: np.ndarray,
                       filter: np.ndarray, bias: np.ndarray | None, output: np.ndarray) -> None:
    """output = activation(conv(input, filter) + bias)."""
    _check_forward(stream, handle, state, attrs, input, filter, bias, output)
    with cpu_runtime.blas_threads():
        cpu.forward(state, attrs, input, filter, bias, output)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: Any, handle: Any, state: Conv2DState, attrs: Conv2DAttrs, output: np.ndarray | None,
                        output_grad: np.ndarray, input: np.ndarray | None, input_grad: np.ndarray | None,
                        filter: np.ndarray | None, filter_grad: np.ndarray | None, bias_grad: np.ndarray | None) -> None:
    """Write input_grad, filter_grad and bias_grad (those not None) from output_grad."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                    bias_grad)
    with cpu_runtime.blas_threads():
        cpu.backward(state, attrs, output_grad, input, input_grad, filter, filter_grad, bias_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: Any, handle: Any, state: Conv2DState, attrs: Conv2DAttrs, input: Any, filter: Any,
                       bias: Any, output: Any) -> None:
    """output = activation(conv(input, filter) + bias), enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, filter, bias, output)
    gpu.forward(stream, handle, state, attrs, input, filter, bias, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: Any, handle: Any, state: Conv2DState, attrs: Conv2DAttrs, output: Any,
                        output_grad: Any, input: Any, input_grad: Any, filter: Any, filter_grad: Any,
                        bias_grad: Any) -> None:
    """Write input_grad, filter_grad and bias_grad (those not None), enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad, filter, filter_grad,
                    bias_grad)
    gpu.backward(stream, handle, state, attrs, output_grad, input, input_grad, filter, filter_grad, bias_grad)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=Conv2DAttrs,
    shapes=UNARY_SHAPES,
    forward=(Arg("input", "input"), Arg("filter", "weight"), Arg("bias", "weight", required=False),
             Arg("output", "output")),
    backward=(*unary_backward(output=False, input=False), Arg("filter", "weight", required=False),
              Arg("filter_grad", "grad", required=False, of="filter"), Arg("bias_grad", "grad", required=False, of="bias")),
    dtypes=ALL_FLOAT_DTYPES,
    forward_doc="Write output = activation(conv(input, filter) + bias), on the stream's device.",
    backward_doc="Write input_grad, filter_grad and bias_grad (those not None) from output_grad, on the stream's device.",
    cleanup_doc="Destroy the state's cuDNN descriptors and drop its buffers.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
