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

The package: this module holds output_dims, init_kernel, the checks and the entry points (each
checks, then calls its device's code); attrs.py the attrs and mode; cpu.py the NumPy code and the
bilinear weights; plan.py the device-free GPU path names; gpu.py the launches of upsample.cu.
"""

from __future__ import annotations

from typing import Any

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime import gpu as gpu_runtime
from ..runtime.core import ALL_FLOAT_DTYPES, MOVABLE_DTYPES, ShapeError, TensorShape, fail
from ..runtime.spec import UNARY_FORWARD, UNARY_SHAPES, declare_op, unary_backward
from . import cpu, gpu, plan  # noqa: F401  (plan: the GPU path names, as tests/test_gpu_paths.py reads them)
from .attrs import NEAREST_BACKWARD_DTYPES, OP, UpsampleAttrs, UpsampleMode


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


# --------------------------------------------------------------------------- entry points


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                       attrs: UpsampleAttrs, input: core.Array, output: core.Array) -> None:
    """output = input upsampled by scale_factor (NEAREST or BILINEAR), in parts of whole planes shared out
    to the threads (an output element reads only its own plane)."""
    _check_forward(stream, handle, state, attrs, input, output)
    cpu.forward(attrs, input, output)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                        attrs: UpsampleAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = the sum of output_grad over each input element's sources, weighted for BILINEAR."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    cpu.backward(attrs, output_grad, input_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                       attrs: UpsampleAttrs, input: core.Array, output: core.Array) -> None:
    """output = input upsampled, enqueued on the stream."""
    _check_forward(stream, handle, state, attrs, input, output)
    gpu.forward(stream, state, attrs, input, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                        attrs: UpsampleAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = the gathered sum of output_grad over each input element's sources, enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    gpu.backward(stream, state, attrs, output_grad, input_grad)


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
