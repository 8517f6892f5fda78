"""An op's declaration, as data: its name, attrs type, tensors with their roles, dtypes, devices and
its four functions. Each op's package declares one (``SPEC = declare_op(...)``, the last lines of its
``__init__.py``); ``kernels.registry`` finds them, and everything that lists ops or calls them the
same way (the package's exports, the functional layer's state cache, the named GPU paths, the
conformance backends, the tests' parametrizations) reads them there.

The tensors are listed in the order the functions take them (docs/api.md#signatures)::

    forward_kernel(stream, handle, state, attrs, *forward, **forward_options)
    backward_kernel(stream, handle, state, attrs, *backward)

Roles:

- ``input``: a tensor the forward reads (``many``: a list of them, as concat's ``inputs``);
- ``weight``: a parameter the forward reads (conv_2d's filter, batch_norm's gamma);
- ``output``: a tensor the forward writes; in a backward, the forward's result, read by the ops
  whose gradient needs it;
- ``output_grad``: the gradient of an output, read by backward;
- ``grad``: a gradient backward writes, of the tensor named by ``of``.

``required`` is False where ``None`` may be passed: an absent optional tensor (a bias), a gradient
not wanted, a forward value the gradient does not read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import core

ROLES = ("input", "weight", "output", "output_grad", "grad")
DEVICES = ("cpu", "gpu")


@dataclass(frozen=True)
class Arg:
    """One tensor argument of forward_kernel or backward_kernel."""

    name: str
    role: str
    many: bool = False
    required: bool = True
    of: str | None = None  # role "grad": whose gradient

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise core.KernelError(f"{self.name}: role must be one of {ROLES}, found {self.role!r}")
        if (self.role == "grad") != (self.of is not None):
            raise core.KernelError(f"{self.name}: a grad names the tensor it is the gradient of (of=), nothing else does")


@dataclass(frozen=True)
class OpSpec:
    """One op, as kernels.registry lists it."""

    name: str
    attrs: type
    shapes: tuple[str, ...]  # init_kernel's shape arguments, after (handle, attrs)
    forward: tuple[Arg, ...]
    backward: tuple[Arg, ...]
    dtypes: tuple[np.dtype, ...]
    devices: tuple[str, ...]
    module: str  # the op package's name, kernels.<op>
    init_kernel: Callable[..., Any]
    forward_kernel: Callable[..., None]
    backward_kernel: Callable[..., None]
    cleanup_kernel: Callable[..., None]
    forward_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # keyword-only, with defaults
    exports: tuple[Any, ...] = ()  # public names besides the attrs type (its enums)

    @property
    def twins(self) -> tuple[Callable[..., Any], ...]:
        """cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel: the same on both devices."""
        return self.init_kernel, self.init_kernel, self.cleanup_kernel, self.cleanup_kernel

    def args(self, direction: str, role: str | None = None) -> tuple[Arg, ...]:
        """The tensors of "forward" or "backward", of one role or all."""
        listed = self.forward if direction == "forward" else self.backward
        return tuple(arg for arg in listed if role is None or arg.role == role)


def declare_op(op: str, namespace: Mapping[str, Any], *, attrs: type, shapes: tuple[str, ...],
               forward: tuple[Arg, ...], backward: tuple[Arg, ...], dtypes: tuple[np.dtype, ...],
               forward_doc: str, backward_doc: str,
               cleanup_doc: str = "Release everything the state holds (descriptors, device memory).",
               forward_options: Mapping[str, Any] | None = None, exports: tuple[Any, ...] = (),
               devices: tuple[str, ...] = DEVICES) -> OpSpec:
    """The op's spec, with its public forward_kernel and backward_kernel made from the twins
    (cpu_forward_kernel, gpu_forward_kernel, ...) of the op module's `namespace`, dispatching on the
    stream's device, and its cleanup_kernel. Called once, at the end of the op's __init__.py."""
    for direction, listed in (("forward", forward), ("backward", backward)):
        names = [arg.name for arg in listed]
        if len(set(names)) != len(names):
            raise core.KernelError(f"{op}: {direction} names a tensor twice: {names}")
    missing = [name for name in ("init_kernel", "cpu_forward_kernel", "gpu_forward_kernel", "cpu_backward_kernel",
                                 "gpu_backward_kernel") if name not in namespace]
    if missing:
        raise core.KernelError(f"{op}: declare_op needs {', '.join(missing)} in the op's module")
    return OpSpec(
        name=op, attrs=attrs, shapes=tuple(shapes), forward=tuple(forward), backward=tuple(backward),
        dtypes=tuple(np.dtype(dtype) for dtype in dtypes), devices=tuple(devices), module=namespace["__name__"],
        init_kernel=namespace["init_kernel"],
        forward_kernel=core.entry_point(op, "forward_kernel", namespace["cpu_forward_kernel"],
                                        namespace["gpu_forward_kernel"], forward_doc),
        backward_kernel=core.entry_point(op, "backward_kernel", namespace["cpu_backward_kernel"],
                                         namespace["gpu_backward_kernel"], backward_doc),
        cleanup_kernel=core.cleanup_entry_point(op, cleanup_doc),
        forward_options=dict(forward_options or {}), exports=tuple(exports))


# The signatures most ops share (docs/api.md#signatures).
UNARY_SHAPES = ("input_shape", "output_shape")
UNARY_FORWARD = (Arg("input", "input"), Arg("output", "output"))


def unary_backward(*, output: bool, input: bool) -> tuple[Arg, ...]:
    """(output, output_grad, input, input_grad); `output`/`input`: whether the gradient reads that forward value."""
    return (Arg("output", "output", required=output), Arg("output_grad", "output_grad"),
            Arg("input", "input", required=input), Arg("input_grad", "grad", required=False, of="input"))


BINARY_SHAPES = ("lhs_shape", "rhs_shape", "output_shape")
BINARY_FORWARD = (Arg("lhs", "input"), Arg("rhs", "input"), Arg("output", "output"))


def binary_backward(*, output: bool, lhs: bool, rhs: bool) -> tuple[Arg, ...]:
    """(output, output_grad, lhs, lhs_grad, rhs, rhs_grad); the flags: which forward values the gradients read."""
    return (Arg("output", "output", required=output), Arg("output_grad", "output_grad"),
            Arg("lhs", "input", required=lhs), Arg("lhs_grad", "grad", required=False, of="lhs"),
            Arg("rhs", "input", required=rhs), Arg("rhs_grad", "grad", required=False, of="rhs"))


__all__ = ["Arg", "OpSpec", "declare_op", "ROLES", "DEVICES", "UNARY_SHAPES", "UNARY_FORWARD", "unary_backward",
           "BINARY_SHAPES", "BINARY_FORWARD", "binary_backward"]
