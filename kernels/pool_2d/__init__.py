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

A package: this module holds the checks, init and the entry points; attrs.py the attrs, PoolOp
and what cpu.py and gpu.py share (the taps' dtype, the state's kept buffers); cpu.py the NumPy
code, plan.py the GPU tile and the path names (pure Python, no device), gpu.py the launches of
pool_2d.cu.
"""

from __future__ import annotations

from typing import Any

from ..runtime import core
from ..runtime import cpu as cpu_runtime
from ..runtime import gpu as gpu_runtime
from ..runtime.core import ALL_FLOAT_DTYPES, ShapeError, StateError, TensorShape, fail
from ..runtime.spec import UNARY_FORWARD, UNARY_SHAPES, declare_op, unary_backward
from . import cpu, gpu
from .attrs import OP, Pool2DAttrs, PoolOp


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


@cpu_runtime.cpu_kernel
def cpu_forward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                       attrs: Pool2DAttrs, input: core.Array, output: core.Array) -> None:
    """output = activation(pool(input)); MAX saves the argmax taps, an activation its input."""
    _check_forward(stream, handle, state, attrs, input, output)
    cpu.forward(state, attrs, input, output)


@cpu_runtime.cpu_kernel
def cpu_backward_kernel(stream: cpu_runtime.CpuStream, handle: cpu_runtime.CpuHandle, state: core.KernelState,
                        attrs: Pool2DAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = the gather of output_grad (through the activation's derivative) to the windows' elements."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is not None and input_grad.size:
        cpu.backward(state, attrs, output_grad, input_grad)


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                       attrs: Pool2DAttrs, input: core.Array, output: core.Array) -> None:
    """output = activation(pool(input)), enqueued on the stream; MAX saves the argmax taps."""
    _check_forward(stream, handle, state, attrs, input, output)
    gpu.forward(stream, state, attrs, input, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu_runtime.GpuStream, handle: gpu_runtime.GpuHandle, state: core.KernelState,
                        attrs: Pool2DAttrs, output: core.Array | None, output_grad: core.Array,
                        input: core.Array | None, input_grad: core.Array | None) -> None:
    """input_grad = the gather of output_grad to the windows' elements, enqueued on the stream."""
    _check_backward(stream, handle, state, attrs, output, output_grad, input, input_grad)
    if input_grad is not None and input_grad.size:
        gpu.backward(stream, state, attrs, output_grad, input_grad)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=Pool2DAttrs,
    shapes=UNARY_SHAPES,
    forward=UNARY_FORWARD,
    backward=unary_backward(output=False, input=False),
    dtypes=ALL_FLOAT_DTYPES,
    exports=(PoolOp,),
    forward_doc="Write output = activation(pool(input)) on the stream's device.",
    backward_doc="Write input_grad from output_grad (MAX: to the saved argmax of each window) on the stream's device.",
    cleanup_doc='Release the state and the buffers it saved.',
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
