"""element_binary's attrs, BinaryOpType (whose values are element_binary.cu's op codes, which
cpu.py and gpu.py both read) and the state (the op's contract is the package's docstring)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..runtime import core

if TYPE_CHECKING:
    from .gpu import BackwardStep, ForwardLaunch
    from .plan import GpuPlan

OP = "element_binary"


class BinaryOpType(enum.Enum):
    """The binary ops; the values are the op codes of element_binary.cu (OP_ADD ..., -D options from gpu.py)."""

    ADD = 0
    SUB = 1
    MUL = 2
    DIV = 3
    MAX = 4
    MIN = 5


@dataclass(frozen=True)
class ElementBinaryAttrs:
    op_type: BinaryOpType

    def __post_init__(self) -> None:
        core.set_attr(self, "op_type", core.attr_enum(OP, "op_type", self.op_type, BinaryOpType))


@dataclass(eq=False)
class ElementBinaryState(core.KernelState):
    """The shapes, and on the GPU what each call would otherwise work out again: the plan, the
    forward's launch, the backward's launches for each (lhs_grad wanted, rhs_grad wanted) and the
    buffer of partial sums of a split reduction (made on first need, kept until cleanup)."""

    plan: GpuPlan | None = None
    gpu_forward: ForwardLaunch | None = None
    gpu_backward: dict[tuple[bool, bool], list[BackwardStep] | None] = field(default_factory=dict)
    partials: Any = None

    def release(self) -> None:
        super().release()
        self.gpu_forward = self.partials = None
        self.gpu_backward.clear()
