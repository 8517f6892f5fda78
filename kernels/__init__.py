"""The YOLOv10 kernel library: every operator the detector needs, forward and backward, on the CPU
(NumPy) and the GPU (CUDA through NVRTC/CuPy, cuDNN, cuBLAS).

Each op is a package ``kernels/<op>/`` with the same functions in the same argument order
(``init_kernel``, ``forward_kernel``, ``backward_kernel``, ``cleanup_kernel`` and their
``cpu_``/``gpu_`` twins; docs/api.md) and one declaration, ``SPEC`` (kernels.runtime.spec), which
``kernels.registry`` finds. This package exports each op module, its attrs type and enums by those
declarations: nothing here lists the ops. ``kernels.functional`` is the layer above them: one
torch.nn.functional-like call per op, outputs allocated, states cached.
"""
import importlib
from typing import Any

from . import activation, registry
from .activation import Activation
from .runtime.core import (
    AttrsError,
    CudaError,
    DeviceError,
    DTypeError,
    KernelError,
    ShapeError,
    StateError,
    TensorShape,
)
from .runtime.cpu import cpu_handle, cpu_stream
from .runtime.gpu import gpu_stream, gpu_unavailable_reason
from .runtime.handle import gpu_handle


def _version() -> str:
    """The installed distribution's version, else (a source tree not installed) pyproject.toml's."""
    from importlib import metadata

    try:
        return metadata.version("yolov10-kernels")
    except metadata.PackageNotFoundError:
        import os
        import re

        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
        try:
            with open(path, encoding="utf-8") as file:
                match = re.search(r'^version\s*=\s*"([^"]+)"', file.read(), re.MULTILINE)
        except OSError:
            match = None
        return match.group(1) if match else "0+unknown"


__version__ = _version()

from . import functional  # noqa: E402  (the layer above the ops; imports them itself)


def _exports() -> dict[str, Any]:
    """Each declared op's module, attrs type and enums, by their names."""
    names: dict[str, Any] = {}
    for name, spec in registry.OPS.items():
        names[name] = importlib.import_module(spec.module)
        for value in (spec.attrs, *spec.exports):
            names[value.__name__] = value
    return names


_OPS_EXPORTS = _exports()
globals().update(_OPS_EXPORTS)
# The op modules by name, in name order.
OPS: dict[str, Any] = {name: _OPS_EXPORTS[name] for name in registry.OPS}

__all__ = [
    "__version__", "functional", "registry", "activation", "Activation", "OPS",
    "AttrsError", "CudaError", "DeviceError", "DTypeError", "KernelError", "ShapeError", "StateError",
    "TensorShape", "cpu_handle", "cpu_stream", "gpu_handle", "gpu_stream", "gpu_unavailable_reason",
    *_OPS_EXPORTS,
]

