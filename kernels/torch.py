"""PyTorch autograd through the kernels: every ``kernels.functional`` op as a ``torch.autograd.Function``.

::

    import kernels.torch as KT

    y = KT.conv2d(x, w, b, padding=1)        # x, w, b: torch tensors with requires_grad
    KT.silu(y).sum().backward()              # x.grad, w.grad, b.grad: computed by the kernels' backwards

Each function takes and returns torch tensors, with ``kernels.functional``'s signature (torch's names and
arguments) less ``ctx`` and ``stream``. Its forward is the functional op, run with a
``kernels.functional.Context`` when a gradient is wanted; its backward is the op's ``*_backward`` on
that context, asked only for the gradients autograd needs (``needs``). Without grad mode or an input
that requires grad the forward runs without a context (nothing is saved).

- **No copies.** Tensors cross by DLPack both ways: NumPy views of CPU tensors, CuPy views of CUDA
  ones (bfloat16 too, as uint16: kernels/runtime/dlpack.py). A non-contiguous input is copied contiguous by the
  functional layer, as for any caller.
- **Streams.** A CUDA call runs on torch's current stream of the input's device (the functional
  layer's ``stream=``, a ``kernels.runtime.gpu.GpuStream`` over torch's stream, one per torch stream, each with
  its own handle and states): torch's work before it and after it is ordered by the stream itself,
  with no event and no host synchronization. A backward runs on the stream torch makes current for
  it (the forward's).
- **Saved tensors.** The inputs and outputs are saved with ``ctx.save_for_backward``, so torch's
  version counters refuse a backward after one of them was modified in place; the op's own state
  (batch_norm's statistics, max pooling's argmax) stays in the Context until the autograd graph is
  freed, so ``retain_graph=True`` (and ``torch.autograd.gradcheck``) can run a backward again.
- **batch_norm** updates ``running_mean`` / ``running_var`` in place when training, as
  ``torch.nn.functional.batch_norm``.
- Gradients are first order (``once_differentiable``: a double backward raises torch's error).

torch is imported by this module only: ``import kernels`` never imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from . import functional as F
from .runtime import gpu

__all__ = [
    "conv2d", "batch_norm", "max_pool2d", "avg_pool2d", "interpolate", "upsample", "softmax", "topk", "cat", "split",
    "reshape", "permute", "transpose", "matmul", "add", "sub", "mul", "div", "maximum", "minimum",
    "relu", "sigmoid", "tanh", "elu", "gelu", "silu", "exp", "rsqrt", "sin", "cos", "pow", "gradient_reduction",
]

Forward = Callable[[Sequence[Any], Any, Any], Any]  # (tensors, functional Context or None, stream) -> output(s)
Backward = Callable[[Sequence[Any], Any, Sequence[bool], Any], Sequence[Any]]  # (grads, ctx, needs, stream)


# --------------------------------------------------------------------------- streams


class TorchStream(gpu.GpuStream):
    """torch's CUDA stream `ptr` of `device` as a kernels GPU stream (CuPy's ExternalStream over it)."""

    def __init__(self, device: int, ptr: int):  # pragma: no cover - GPU: a CUDA device and CuPy
        self.device = int(device)
        self.cupy_stream = gpu.cupy.cuda.ExternalStream(ptr, self.device)


_STREAMS: dict[tuple[int, int], TorchStream] = {}


def stream_of(tensor: torch.Tensor) -> Any:
    """None for a CPU tensor (the functional layer's CPU stream); for a CUDA one, torch's current stream
    of its device as a TorchStream, made once per torch stream (its handle and states with it)."""
    if tensor.device.type != "cuda":
        return None
    device = tensor.device.index  # pragma: no cover - GPU: a CUDA tensor
    key = (device, torch.cuda.current_stream(device).cuda_stream)  # pragma: no cover - GPU: a CUDA tensor
    if key not in _STREAMS:  # pragma: no cover - GPU: a CUDA tensor
        _STREAMS[key] = TorchStream(*key)
    return _STREAMS[key]  # pragma: no cover - GPU: a CUDA tensor


# --------------------------------------------------------------------------- the one Function


class _Bridge(torch.autograd.Function):
    """forward(ctx, forward, backward, *tensors): `forward(tensors, Context, stream)` (one tensor or a tuple);
    backward: `backward(grads, Context, needs_input_grad, stream)`, one gradient (or None) per tensor."""

    @staticmethod
    def forward(ctx: Any, forward: Forward, backward: Backward, *tensors: Any) -> Any:
        recorded = F.Context()
        output = forward(tensors, recorded, stream_of(_first(tensors)))
        ctx.recorded, ctx.backward = recorded, backward
        outputs = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*(t for t in tensors if t is not None), *outputs)
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: Any) -> Any:
        ctx.saved_tensors  # noqa: B018 - torch's check that none was modified in place since the forward
        needs = ctx.needs_input_grad[2:]
        computed = ctx.backward(grads, ctx.recorded, needs, stream_of(grads[0]))
        return (None, None, *(g if need else None for g, need in zip(computed, needs)))


def _first(tensors: Sequence[Any]) -> torch.Tensor:
    return next(t for t in tensors if isinstance(t, torch.Tensor))


def _apply(forward: Forward, backward: Backward, *tensors: Any) -> Any:
    """forward's result; through _Bridge (so with a backward) where grad mode is on and an input requires grad."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        return _Bridge.apply(forward, backward, *tensors)
    return forward(tensors, None, stream_of(_first(tensors)))


def _names(needs: Sequence[bool], names: Sequence[str]) -> list[str]:
    """The `needs=` of a functional backward: the names of the inputs autograd wants a gradient of."""
    return [name for name, need in zip(names, needs) if need]


def _one_input(name: str, **options: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The bridge of a functional op of one tensor `input` (positional options before keyword ones)."""
    forward_op, backward_op = getattr(F, name), getattr(F, f"{name}_backward")
    args = options.pop("args", ())

    def forward(tensors: Sequence[Any], ctx: Any, stream: Any) -> Any:
        return forward_op(tensors[0], *args, ctx=ctx, stream=stream, **options)

    def backward(grads: Sequence[Any], ctx: Any, needs: Sequence[bool], stream: Any) -> Sequence[Any]:
        return (backward_op(grads[0], ctx, retain=True, stream=stream),)

    return lambda input: _apply(forward, backward, input)


def _two_inputs(name: str, input: Any, other: Any, names: tuple[str, ...]) -> Any:
    """The bridge of a functional op of (input, other) whose backward returns named gradients."""
    forward_op, backward_op = getattr(F, name), getattr(F, f"{name}_backward")

    def forward(tensors: Sequence[Any], ctx: Any, stream: Any) -> Any:
        return forward_op(tensors[0], tensors[1] if len(tensors) > 1 else other, ctx=ctx, stream=stream)

    def backward(grads: Sequence[Any], ctx: Any, needs: Sequence[bool], stream: Any) -> Sequence[Any]:
        return tuple(backward_op(grads[0], ctx, needs=_names(needs, names), retain=True, stream=stream))[:len(needs)]

    if isinstance(other, torch.Tensor):
        return _apply(forward, backward, input, other)
    return _apply(forward, backward, input)  # a number `other`: the scalar form, one gradient


def _many_inputs(name: str, tensors: Sequence[torch.Tensor], **options: Any) -> torch.Tensor:
    """The bridge of cat and gradient_reduction: a list of tensors in, one out."""
    forward_op, backward_op = getattr(F, name), getattr(F, f"{name}_backward")
    if not isinstance(tensors, (list, tuple)) or not tensors:
        return forward_op(tensors, **options)  # the functional layer's own refusal

    def forward(inputs: Sequence[Any], ctx: Any, stream: Any) -> Any:
        return forward_op(list(inputs), ctx=ctx, stream=stream, **options)

    def backward(grads: Sequence[Any], ctx: Any, needs: Sequence[bool], stream: Any) -> Sequence[Any]:
        extra = {"needs": list(needs)} if name == "cat" else {}
        return backward_op(grads[0], ctx, retain=True, stream=stream, **extra)

    return _apply(forward, backward, *tensors)


# --------------------------------------------------------------------------- the ops


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
           padding: Any = 0, dilation: Any = 1, groups: int = 1, *, activation: Any = None) -> torch.Tensor:
    """torch.nn.functional.conv2d through the kernels (plus a fused activation), differentiable."""
    def forward(tensors: Sequence[Any], ctx: Any, stream: Any) -> Any:
        return F.conv2d(tensors[0], tensors[1], tensors[2], stride, padding, dilation, groups, activation=activation,
                        ctx=ctx, stream=stream)

    def backward(grads: Sequence[Any], ctx: Any, needs: Sequence[bool], stream: Any) -> Sequence[Any]:
        return F.conv2d_backward(grads[0], ctx, needs=_names(needs, ("input", "weight", "bias")), retain=True,
                                 stream=stream)

    return _apply(forward, backward, input, weight, bias)


def batch_norm(input: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
               weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5, *, activation: Any = None, mode: Any = "SPATIAL") -> torch.Tensor:
    """torch.nn.functional.batch_norm through the kernels (running statistics updated in place when training),
    differentiable through the batch statistics (training) or the fixed running ones (eval)."""
    def forward(tensors: Sequence[Any], ctx: Any, stream: Any) -> Any:
        return F.batch_norm(tensors[0], running_mean, running_var, tensors[1], tensors[2], training, momentum, eps,
                            activation=activation, mode=mode, ctx=ctx, stream=stream)

    def backward(grads: Sequence[Any], ctx: Any, needs: Sequence[bool], stream: Any) -> Sequence[Any]:
        return F.batch_norm_backward(grads[0], ctx, needs=_names(needs, ("input", "weight", "bias")), retain=True,
                                     stream=stream)

    return _apply(forward, backward, input, weight, bias)


def max_pool2d(input: torch.Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False, *, activation: Any = None) -> torch.Tensor:
    """torch.nn.functional.max_pool2d through the kernels, differentiable."""
    return _one_input("max_pool2d", args=(kernel_size, stride, padding, dilation, ceil_mode, return_indices),
                      activation=activation)(input)


def avg_pool2d(input: torch.Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None, *,
               activation: Any = None) -> torch.Tensor:
    """torch.nn.functional.avg_pool2d through the kernels, differentiable."""
    return _one_input("avg_pool2d", args=(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override),
                      activation=activation)(input)


def interpolate(input: torch.Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> torch.Tensor:
    """torch.nn.functional.interpolate (an integer scale, nearest or bilinear) through the kernels, differentiable."""
    return _one_input("interpolate", args=(size, scale_factor, mode, align_corners, recompute_scale_factor,
                                           antialias))(input)


def upsample(input: torch.Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
             align_corners: bool | None = None) -> torch.Tensor:
    """torch.nn.functional.upsample (interpolate's older name)."""
    return interpolate(input, size, scale_factor, mode, align_corners)


def softmax(input: torch.Tensor, dim: int, *, dtype: Any = None) -> torch.Tensor:
    """torch.nn.functional.softmax through the kernels, differentiable (`dtype`: a NumPy dtype the input is cast to)."""
    return _one_input("softmax", args=(dim,), dtype=dtype)(input)


def topk(input: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    """torch.topk along the last dim through the kernels (torch.sort(descending=True, stable=True)'s order:
    ties lower index first, NaN largest), as torch's (values, indices); values differentiable (their gradient
    goes back to the indices), indices int64, not (torch makes no integer output differentiable)."""
    return torch.return_types.topk(_one_input("topk", args=(k, dim, largest, sorted))(input))


def cat(tensors: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """torch.cat through the kernels, differentiable."""
    return _many_inputs("cat", tensors, dim=dim)


def gradient_reduction(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sum of same-shape tensors, left to right, through the kernels; differentiable."""
    return _many_inputs("gradient_reduction", tensors)


def split(tensor: torch.Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[torch.Tensor, ...]:
    """torch.split through the kernels (each piece a new tensor), differentiable."""
    def forward(tensors: Sequence[Any], ctx: Any, stream: Any) -> Any:
        return F.split(tensors[0], split_size_or_sections, dim, ctx=ctx, stream=stream)

    def backward(grads: Sequence[Any], ctx: Any, needs: Sequence[bool], stream: Any) -> Sequence[Any]:
        return (F.split_backward(list(grads), ctx, retain=True, stream=stream),)

    return _apply(forward, backward, tensor)


def reshape(input: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """torch.reshape through the kernels (a copy), differentiable."""
    return _one_input("reshape", args=(tuple(shape),))(input)


def permute(input: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """torch.permute through the kernels (a copy), differentiable."""
    return _one_input("permute", args=(tuple(dims),))(input)


def transpose(input: torch.Tensor, dim0: int, dim1: int) -> torch.Tensor:
    """torch.transpose through the kernels (a copy), differentiable."""
    return _one_input("transpose", args=(dim0, dim1))(input)


def matmul(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """torch.matmul (batched, rank >= 3, identical leading dims) through the kernels, differentiable."""
    return _two_inputs("matmul", input, other, ("input", "other"))


def add(input: torch.Tensor, other: torch.Tensor | float) -> torch.Tensor:
    """torch.add (broadcasting, or a number) through the kernels, differentiable."""
    return _two_inputs("add", input, other, ("input", "other"))


def sub(input: torch.Tensor, other: torch.Tensor | float) -> torch.Tensor:
    """torch.sub (broadcasting, or a number) through the kernels, differentiable."""
    return _two_inputs("sub", input, other, ("input", "other"))


def mul(input: torch.Tensor, other: torch.Tensor | float) -> torch.Tensor:
    """torch.mul (broadcasting, or a number) through the kernels, differentiable."""
    return _two_inputs("mul", input, other, ("input", "other"))


def div(input: torch.Tensor, other: torch.Tensor | float) -> torch.Tensor:
    """torch.div (true division; broadcasting, or a number) through the kernels, differentiable."""
    return _two_inputs("div", input, other, ("input", "other"))


def maximum(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """torch.maximum through the kernels (a tie gives each side half the gradient), differentiable."""
    return _two_inputs("maximum", input, other, ("input", "other"))


def minimum(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """torch.minimum through the kernels (a tie gives each side half the gradient), differentiable."""
    return _two_inputs("minimum", input, other, ("input", "other"))


def relu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """torch.nn.functional.relu through the kernels, differentiable."""
    return _one_input("relu", args=(inplace,))(input)


def elu(input: torch.Tensor, alpha: float = 1.0, inplace: bool = False) -> torch.Tensor:
    """torch.nn.functional.elu through the kernels, differentiable."""
    return _one_input("elu", args=(alpha, inplace))(input)


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """torch.nn.functional.gelu (the exact erf form) through the kernels, differentiable."""
    return _one_input("gelu", args=(approximate,))(input)


def silu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """torch.nn.functional.silu through the kernels, differentiable."""
    return _one_input("silu", args=(inplace,))(input)


def pow(input: torch.Tensor, exponent: float) -> torch.Tensor:  # noqa: A001 - torch's name
    """torch.pow with a number exponent through the kernels, differentiable."""
    return _one_input("pow", args=(exponent,))(input)


def _plain_unary(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def function(input: torch.Tensor) -> torch.Tensor:
        return _one_input(name)(input)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"torch.{name} through the kernels, differentiable."
    return function


sigmoid, tanh, exp, rsqrt, sin, cos = (_plain_unary(n) for n in ("sigmoid", "tanh", "exp", "rsqrt", "sin", "cos"))
