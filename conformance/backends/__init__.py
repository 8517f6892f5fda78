"""Backends: the kernel library a conformance run judges (docs/backends.md).

A backend gives, for each op name of ``kernels.registry.OPS``, an object with the op's four
functions, with exactly the kernels' signatures (docs/api.md#signatures)::

    state = init_kernel(handle, attrs, *shapes)
    forward_kernel(stream, handle, state, attrs, *forward tensors, **forward options)
    backward_kernel(stream, handle, state, attrs, *backward tensors)
    cleanup_kernel(handle, state)

and may say which cases it cannot run (``supports``), raise `Unsupported` from a call for the same,
describe its settings for the report (``describe``) and add likely causes to a failure (``notes``).
The harness hands every backend the same tensors (poisoned outputs, red zones) and the same streams
and handles (``kernels.cpu_stream()``; on the GPU ``kernels.gpu_stream(n)``, whose ``cupy_stream``
the backend must run its work on).

`load` makes one from a name: ``kernels`` (the default), ``torch``, ``torch-strict``, ``c:PATH`` (a
shared library of the C ABI, kernels_backend.h) or ``module:attr`` (any object of the protocol).
"""

from __future__ import annotations

import importlib
from typing import Any

FUNCTIONS = ("init_kernel", "forward_kernel", "backward_kernel", "cleanup_kernel")
SCHEDULES = ("plain", "delayed", "foreign")  # the GPU schedules any backend runs under (harness.SCHEDULES)


class Unsupported(Exception):
    """Raised by a backend's call (or init) for a case it cannot run: the case is skipped with the message."""


class Backend:
    """The protocol, with its defaults. Subclass it, or give any object with `op` (or one attribute
    per op name) and any of the others: `adapt` fills in what is missing.

    - ``name``: how reports name it.
    - ``schedules``: the GPU schedules it is run under. "small" (launches planned for a one-SM device)
      acts on this library's kernels only, so other backends leave it out.
    - ``views``: whether it takes tensors that are views at any element offset inside a larger
      allocation (the red zones). False: each tensor is handed as an allocation of its own, without
      margins, in the aligned layout only, and the report says margins were not applied.
    - ``isolate``: whether `python -m conformance` runs it in worker processes unless told otherwise
      (--isolate, --no-isolate), so that a crash fails one case, not the run: True for C libraries.
    """

    name = "backend"
    schedules: tuple[str, ...] = SCHEDULES
    views = True
    isolate = False

    def op(self, name: str) -> Any:
        """The object with op `name`'s four functions, or None where the backend has no such op."""
        return None

    def supports(self, case: Any, device: str) -> str | None:
        """None where the backend can run `case` on `device` ("cpu", "gpu", "gpu:N"), else why not."""
        return None

    def describe(self, device: str) -> str | None:
        """A line for the report on its settings on `device` (say, PyTorch's TF32 flags), or None."""
        return None

    def notes(self, case: Any, device: str) -> list[str]:
        """Lines added to a failure of `case` on `device`: what in the backend may explain it."""
        return []

    def layouts(self, device: str) -> tuple[str, ...] | None:
        """The red-zone layouts (harness.LAYOUTS) it runs on `device`; None: every one its views allow."""
        return None


class KernelsBackend(Backend):
    """This library: each op's module as kernels.registry declares it. Runs under every GPU schedule,
    the small device's too, and in every red-zone layout: the default run."""

    name = "kernels"
    schedules = SCHEDULES + ("small",)

    def op(self, name: str) -> Any:
        from kernels.registry import OPS

        spec = OPS.get(name)
        return None if spec is None else importlib.import_module(spec.module)


KERNELS = KernelsBackend()


class _Adapted(Backend):
    """Any object of the protocol, with the defaults of Backend for what it leaves out."""

    def __init__(self, target: Any, name: str):
        self.target, self.name = target, getattr(target, "name", name)
        self.schedules = tuple(getattr(target, "schedules", SCHEDULES))
        self.views = bool(getattr(target, "views", True))
        self.isolate = bool(getattr(target, "isolate", False))

    def op(self, name: str) -> Any:
        if callable(getattr(self.target, "op", None)):
            return self.target.op(name)
        return getattr(self.target, name, None)

    def supports(self, case: Any, device: str) -> str | None:
        method = getattr(self.target, "supports", None)
        return None if method is None else method(case, device)

    def describe(self, device: str) -> str | None:
        method = getattr(self.target, "describe", None)
        return None if method is None else method(device)

    def notes(self, case: Any, device: str) -> list[str]:
        method = getattr(self.target, "notes", None)
        return [] if method is None else list(method(case, device))

    def layouts(self, device: str) -> tuple[str, ...] | None:
        method = getattr(self.target, "layouts", None)
        return None if method is None else method(device)


def running_statistics(attrs: Any, input: Any, stream: Any) -> tuple[Any, Any]:
    """batch_norm's running mean and variance for a backend's state: 0 and 1, of the statistics' shape
    ((C,) SPATIAL, the input's (C, H, W) PER_ACTIVATION), float32 for half input, else its dtype; on the
    input's device, made on the harness's stream (not CuPy's current one, which the foreign schedule
    replaces)."""
    import numpy as np

    from kernels.runtime.core import HALF_DTYPES

    dtype = np.float32 if np.dtype(input.dtype) in HALF_DTYPES else input.dtype
    shape = input.shape[1:2] if attrs.mode.name == "SPATIAL" else input.shape[1:]
    if isinstance(input, np.ndarray):
        return np.zeros(shape, dtype), np.ones(shape, dtype)
    import cupy

    with stream.cupy_stream:
        return cupy.zeros(shape, dtype), cupy.ones(shape, dtype)


def adapt(target: Any, name: str = "backend") -> Backend:
    """`target` as a Backend: itself where it is one, else wrapped with the protocol's defaults."""
    return target if isinstance(target, Backend) else _Adapted(target, name)


def load(text: str) -> Backend:
    """The backend named by `text`: kernels, torch, torch-strict, c:PATH or module:attr. Raises
    ValueError with the reason where it cannot be loaded."""
    if text == "kernels":
        return KERNELS
    if text in ("torch", "torch-strict"):
        from .torch_backend import TorchBackend

        return TorchBackend(strict=text == "torch-strict")
    if text.startswith("c:"):
        from .c_abi import CBackend

        return CBackend(text[2:])
    module_name, colon, attribute = text.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"unknown backend {text!r}: expected kernels, torch, torch-strict, c:PATH or module:attr")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"backend {text}: cannot import {module_name}: {error}") from error
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"backend {text}: {module_name} has no attribute {attribute}")
        target = getattr(target, part)
    if isinstance(target, type):
        target = target()
    return adapt(target, text)


def unsupported(backend: Backend, case: Any, device: str, backward: bool) -> str | None:
    """Why `backend` cannot run `case` on `device` (with its backward, where `backward`), or None: its own
    `supports`, an op it lacks, or a function the case needs that it lacks."""
    reason = backend.supports(case, device)
    if reason is not None:
        return reason
    functions = backend.op(case.op)
    if functions is None:
        return f"backend {backend.name} has no {case.op}"
    needed = FUNCTIONS if backward else tuple(f for f in FUNCTIONS if f != "backward_kernel")
    missing = [f for f in needed if not callable(getattr(functions, f, None))]
    if missing:
        return f"backend {backend.name}'s {case.op} has no {', '.join(missing)}"
    return None


__all__ = ["Backend", "KernelsBackend", "KERNELS", "Unsupported", "adapt", "load", "unsupported", "running_statistics",
           "FUNCTIONS", "SCHEDULES"]
