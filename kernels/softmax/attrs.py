"""softmax's attrs, and the axis helper that the CPU and GPU code share."""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime import core

OP = "softmax"


@dataclass(frozen=True)
class SoftmaxAttrs:
    dim: int

    def __post_init__(self) -> None:
        core.set_attr(self, "dim", core.attr_int(OP, "dim", self.dim))


def _axis(state: core.KernelState) -> int:
    return core.normalize_axis(OP, "dim", state.attrs.dim, state.shapes["input_shape"].rank)
