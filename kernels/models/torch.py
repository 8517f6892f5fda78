"""YOLOv10 as a ``torch.nn.Module`` whose forward and backward run the kernels::

    from kernels.models.torch import YOLOv10

    model = YOLOv10("yolov10n", device="cuda", dtype=torch.float32)    # or "cpu"; any variant
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    out = model(x)                         # training: {"one2many": [p3, p4, p5], "one2one": [p3, p4, p5]}
    loss = my_loss(out, targets)           # any torch loss of the raw heads
    loss.backward()                        # through the kernel model's backward
    optimizer.step()                       # updates the arrays the kernels read

- **Shared memory.** Every parameter and buffer is a torch tensor over the kernel model's own array
  (``model.kernel_model``: a ``kernels.models.YOLOv10``), through DLPack: an optimizer's in-place
  update is what the kernels read next, and the BatchNorms' running statistics the kernels update are
  the module's buffers. The names are ultralytics' (``model.0.conv.weight``, ...; nested modules as
  ultralytics' attribute paths), so ``state_dict()`` loads into ultralytics' YOLOv10 and back.
  ``num_batches_tracked`` buffers are CPU int64 tensors (the kernel model counts on the host).
- **Autograd.** A training forward is one ``torch.autograd.Function`` around the kernel model's
  ``forward`` and ``backward`` (the whole network): the heads are returned as new tensors (copies of the
  plan's buffers, which the next call overwrites), and the backward returns the input's gradient and
  each trainable parameter's, which autograd accumulates into ``.grad`` as for any module. Only the
  last forward can be differentiated (the kernel model keeps one forward's activations): the backward
  of an earlier one raises RuntimeError. The DFL's fixed weight has ``requires_grad=False``.
- **Eval** returns the same dict plus ``"decoded"`` and ``"detections"`` (docs/models.md), without grad.
- **Device and dtype** are fixed at construction (``.to()``, ``.cuda()``, ``.double()`` and the like
  would move the tensors away from the arrays the kernels read: they raise, except where nothing
  changes). On CUDA the kernel model runs on its own stream, ordered with torch's current stream by
  events both ways at each forward and backward (no host synchronization).
- ``load_state_dict`` recognises checkpoint wrappers and key prefixes as the kernel model's does
  (kernels/models/checkpoint.py), then is torch's (``strict`` included).

torch is imported here only: ``import kernels.models`` does not import this module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..runtime import dlpack, gpu
from . import checkpoint
from .network import StateDictError
from .yolov10 import YOLOv10 as KernelYOLOv10

HEADS = ("one2many", "one2one")
_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def kernel_device(device: Any) -> str:
    """torch's device (or its name) as the kernel model's: "cpu", "gpu:N"."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"gpu:{torch.cuda.current_device() if device.index is None else device.index}"
    return device.type  # "cpu", or another the kernel model refuses by name


def _copy(array: Any) -> torch.Tensor:
    """A torch copy of a kernel model's array (its buffers are overwritten by the next call), on torch's stream
    once it waits for the model's (_ordered)."""
    return dlpack.to_torch(array).clone()


class _Network(torch.autograd.Function):
    """forward(ctx, module, x, *trainable parameters) -> the six heads; backward -> x's and the parameters' grads."""

    @staticmethod
    def forward(ctx: Any, module: "YOLOv10", x: torch.Tensor, *parameters: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = module._forward_heads(x)
        ctx.module, ctx.call = module, module._calls
        return outputs

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        module = ctx.module
        if module._calls != ctx.call:
            raise RuntimeError("kernels.models.torch.YOLOv10: backward of an earlier forward: the kernel model keeps "
                               "the activations of its last forward only (call backward before the next forward)")
        return (None, *module._backward_heads(grads))


class YOLOv10(nn.Module):
    """ultralytics' YOLOv10 of `variant` ("n" ... "x" or "yolov10n" ...) as a torch module over the kernels;
    `device` "cpu" or a CUDA device, `dtype` a torch (or NumPy) float dtype. Starts in training mode with
    the kernel model's init_random(0) values."""

    def __init__(self, variant: str = "n", num_classes: int = 80, device: Any = "cpu", dtype: Any = torch.float32):
        super().__init__()
        name = _DTYPES.get(dtype, dtype)
        net = KernelYOLOv10(variant, num_classes, device=kernel_device(device), dtype=name)
        object.__setattr__(self, "kernel_model", net)  # not a submodule: its arrays are registered below
        self.variant, self.num_classes = net.variant, net.num_classes
        self._calls = 0  # forwards run: a backward must be of the last one
        self._counts: dict[str, torch.Tensor] = {}
        self._trainable: list[str] = []
        for entry in net.registry.entries:
            if entry.kind == "count":
                prefix = entry.name[: -len(".num_batches_tracked")]
                self._counts[prefix] = torch.tensor(net.counts[prefix], dtype=torch.int64)
                self._register(entry.name, self._counts[prefix], buffer=True)
            elif entry.kind in ("running_mean", "running_var"):
                self._register(entry.name, dlpack.to_torch(net._target(entry)), buffer=True)
            else:
                self._register(entry.name, nn.Parameter(dlpack.to_torch(net.params[entry.name]),
                                                        requires_grad=entry.kind == "param"), buffer=False)
                if entry.kind == "param":
                    self._trainable.append(entry.name)
        self.train(net.training)

    def _register(self, name: str, value: torch.Tensor, buffer: bool) -> None:
        """Register `value` under its dotted name, making the nested modules of its path as needed."""
        *path, leaf = name.split(".")
        owner: nn.Module = self
        for part in path:
            if part not in owner._modules:
                owner.add_module(part, nn.Module())
            owner = owner._modules[part]
        if buffer:
            owner.register_buffer(leaf, value)
        else:
            owner.register_parameter(leaf, value)

    # ----------------------------------------------------------------- modes, devices, weights

    def train(self, mode: bool = True) -> "YOLOv10":
        super().train(mode)
        self.kernel_model.train(mode)
        return self

    def _apply(self, fn: Any, recurse: bool = True) -> "YOLOv10":
        """Refuse what would move a tensor off the kernel model's array (.to, .cuda, .double, ...)."""
        for tensor in list(self.parameters()) + list(self.buffers()):
            moved = fn(tensor)
            if moved.data_ptr() != tensor.data_ptr() or moved.dtype != tensor.dtype or moved.device != tensor.device:
                raise RuntimeError("kernels.models.torch.YOLOv10: the tensors are the kernel model's arrays and cannot "
                                   "move or change dtype; construct YOLOv10(..., device=, dtype=) as wanted instead")
        return self

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """torch's load_state_dict (copies into the shared tensors), after unwrapping a checkpoint and renaming
        prefixed keys (kernels/models/checkpoint.py); StateDictError, saying why, where no key is a name."""
        names = list(self.state_dict())
        mapping, done = checkpoint.normalize(state_dict, names)
        if not isinstance(mapping, Mapping):
            raise StateDictError(f"YOLOv10: load_state_dict: expected a mapping of names to tensors (or a checkpoint), "
                                 f"found {type(mapping).__name__}")
        if strict and mapping and not any(name in mapping for name in names):
            raise StateDictError(f"YOLOv10: load_state_dict: {checkpoint.unmatched(mapping, names, done)}")
        if assign:
            raise ValueError("kernels.models.torch.YOLOv10: load_state_dict(assign=True) would replace the kernel "
                             "model's arrays; values are copied in (assign=False)")
        tensors = {key: value if isinstance(value, torch.Tensor) else dlpack.to_torch(value)
                   if hasattr(value, "__dlpack__") else torch.as_tensor(value) for key, value in mapping.items()}
        result = super().load_state_dict(tensors, strict=strict)
        for prefix, count in self._counts.items():
            self.kernel_model.counts[prefix] = int(count)
        if self.kernel_model.fused_params:
            self.kernel_model._fold()
        return result

    # ----------------------------------------------------------------- running

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        """Training: {"one2many": [p3, p4, p5], "one2one": [p3, p4, p5]} (differentiable). Eval: the same and
        "decoded" and "detections" (no grad)."""
        if self.training:
            trainable = [self.get_parameter(name) for name in self._trainable]
            heads = _Network.apply(self, x, *trainable)
            return {"one2many": list(heads[:3]), "one2one": list(heads[3:])}
        with torch.no_grad():
            with self._ordered(x):
                outputs = self._run(x)
            return {key: [_copy(a) for a in value] if isinstance(value, list) else _copy(value)
                    for key, value in outputs.items()}

    def _run(self, x: torch.Tensor) -> dict[str, Any]:
        net = self.kernel_model
        for prefix, count in self._counts.items():  # a count loaded or set through the buffer
            net.counts[prefix] = int(count)
        self._calls += 1
        outputs = net(self._array(x.detach()))
        for prefix, count in self._counts.items():
            count.fill_(net.counts[prefix])
        return outputs

    def _forward_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with self._ordered(x):
            outputs = self._run(x)
        return tuple(_copy(a) for head in HEADS for a in outputs[head])

    def _backward_heads(self, grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        net = self.kernel_model
        with self._ordered(grads[0]):
            arrays = [self._array(g) for g in grads]
            result = net.backward({"one2many": arrays[:3], "one2one": arrays[3:]})
        computed = net.grads
        return (_copy(result["input"]), *(_copy(computed[name]) for name in self._trainable))

    def _array(self, tensor: torch.Tensor) -> Any:
        """A C-contiguous tensor as an array of the kernel model's device (a view; the model checks the rest)."""
        return dlpack.from_dlpack(tensor.contiguous(), self.kernel_model.xp)

    @contextlib.contextmanager
    def _ordered(self, tensor: torch.Tensor) -> Iterator[None]:
        """On CUDA: the kernel model's stream waits for torch's current stream before, and torch's current
        stream for the model's after (events; nothing waits on the host). Nothing on the CPU."""
        if tensor.device.type != "cuda":
            yield
            return
        net = self.kernel_model  # pragma: no cover - GPU: a CUDA device
        torch_stream = torch.cuda.current_stream(net.device).cuda_stream  # pragma: no cover - GPU: a CUDA device
        current = gpu.cupy.cuda.ExternalStream(torch_stream, net.device)  # pragma: no cover - GPU: a CUDA device
        gpu.stream_wait(net.stream.cupy_stream, current, net.device)  # pragma: no cover - GPU: a CUDA device
        try:  # pragma: no cover - GPU: a CUDA device
            yield
        finally:  # pragma: no cover - GPU: a CUDA device
            gpu.stream_wait(current, net.stream.cupy_stream, net.device)
