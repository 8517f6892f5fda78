"""pool_2d's attrs, its enum and what both cpu.py and gpu.py (and plan.py) need: the argmax taps'
dtype and the buffers the state keeps (the op's contract is the package's docstring)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import activation
from ..runtime import core
from ..runtime import gpu as gpu_runtime
from ..runtime.core import AttrsError, fail

OP = "pool_2d"


class PoolOp(enum.Enum):
    MAX = "MAX"
    AVG = "AVG"


@dataclass(frozen=True)
class Pool2DAttrs:
    kernel_h: int
    kernel_w: int
    stride_h: int
    stride_w: int
    padding_h: int
    padding_w: int
    pool_type: PoolOp
    count_include_pad: bool = True  # AVG only, PyTorch's default
    activation: activation.Activation | None = None  # applied after the pooling

    def __post_init__(self) -> None:
        for name in ("kernel_h", "kernel_w", "stride_h", "stride_w"):
            core.set_attr(self, name, core.attr_int(OP, name, getattr(self, name), minimum=1))
        for name, kernel_name in (("padding_h", "kernel_h"), ("padding_w", "kernel_w")):
            padding = core.attr_int(OP, name, getattr(self, name), minimum=0)
            half = getattr(self, kernel_name) // 2
            if padding > half:
                raise fail(AttrsError, OP, name, f"at most half of {kernel_name} ({half})", padding)
            core.set_attr(self, name, padding)
        core.set_attr(self, "pool_type", core.attr_enum(OP, "pool_type", self.pool_type, PoolOp))
        core.set_attr(self, "count_include_pad", core.attr_bool(OP, "count_include_pad", self.count_include_pad))
        core.set_attr(self, "activation", activation.attr_activation(OP, self.activation))


def tap_dtype(attrs: Pool2DAttrs) -> np.dtype:
    """The dtype of the saved argmax taps: one byte while the window has at most 255 taps."""
    return np.dtype(np.uint8 if attrs.kernel_h * attrs.kernel_w <= 255 else np.int32)


def _saved(state, name: str, xp: Any, dims: tuple[int, ...], dtype: Any) -> Any:
    """A buffer the state keeps across calls (argmax taps, pre-activation), made on first use
    (on the GPU by gpu.device_empty: outside CuPy's pool, freed only once the device is done)."""
    if name not in state.saved:
        state.saved[name] = np.empty(dims, dtype=dtype) if xp is np else gpu_runtime.device_empty(
            dims, dtype, state.device)
    return state.saved[name]
