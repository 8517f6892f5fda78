"""element_unary's attrs: the op types, which take a scalar, and which are shared activations."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from ..activation import Activation
from ..runtime import core
from ..runtime.core import AttrsError, fail

OP = "element_unary"


class UnaryOpType(enum.Enum):
    """The op types; the value is the op code in element_unary.cu."""

    RELU = 0
    SIGMOID = 1
    TANH = 2
    ELU = 3
    GELU = 4
    SILU = 5
    EXP = 6
    IDENTITY = 7
    RSQRT = 8
    SIN = 9
    COS = 10
    POW = 11
    SCALAR_MULTIPLY = 12
    SCALAR_ADD = 13
    SCALAR_SUB = 14
    SCALAR_TRUE_DIV = 15


# Op types that are one of the shared activations (SILU only with beta 1).
_ACTIVATIONS = {
    UnaryOpType.RELU: Activation.RELU,
    UnaryOpType.SIGMOID: Activation.SIGMOID,
    UnaryOpType.TANH: Activation.TANH,
    UnaryOpType.GELU: Activation.GELU,
    UnaryOpType.SILU: Activation.SILU,
}
SCALAR_REQUIRED = frozenset({UnaryOpType.POW, UnaryOpType.SCALAR_MULTIPLY, UnaryOpType.SCALAR_ADD,
                             UnaryOpType.SCALAR_SUB, UnaryOpType.SCALAR_TRUE_DIV})
SCALAR_DEFAULTS = {UnaryOpType.ELU: 1.0, UnaryOpType.SILU: 1.0}  # scalar optional, None means this
# Backward reads `input` except where the derivative is a constant.
_CONSTANT_DERIVATIVE = frozenset({UnaryOpType.IDENTITY, UnaryOpType.SCALAR_MULTIPLY, UnaryOpType.SCALAR_ADD,
                                  UnaryOpType.SCALAR_SUB, UnaryOpType.SCALAR_TRUE_DIV})


@dataclass(frozen=True)
class ElementUnaryAttrs:
    """op_type, and scalar: alpha (ELU), beta (SILU), exponent (POW) or the SCALAR_* operand.

    ELU and SILU store their default 1.0 when scalar is None, so equal math means equal attrs.
    """

    op_type: UnaryOpType
    scalar: float | None = None

    def __post_init__(self) -> None:
        op_type = core.attr_enum(OP, "op_type", self.op_type, UnaryOpType)
        scalar = self.scalar
        if scalar is None:
            if op_type in SCALAR_REQUIRED:
                raise fail(AttrsError, OP, "scalar", f"a number ({op_type.name} needs one)", None)
            scalar = SCALAR_DEFAULTS.get(op_type)
        else:
            if op_type not in SCALAR_REQUIRED and op_type not in SCALAR_DEFAULTS:
                raise fail(AttrsError, OP, "scalar", f"None ({op_type.name} takes no scalar)", repr(scalar))
            if isinstance(scalar, (bool, np.bool_)) or not isinstance(scalar, (int, float, np.integer, np.floating)):
                raise fail(AttrsError, OP, "scalar", "a real number", repr(scalar))
            scalar = float(scalar)
            if not math.isfinite(scalar):
                raise fail(AttrsError, OP, "scalar", "a finite number", scalar)
        core.set_attr(self, "op_type", op_type)
        core.set_attr(self, "scalar", scalar)
        shared = None if op_type is UnaryOpType.SILU and scalar != 1.0 else _ACTIVATIONS.get(op_type)
        core.set_attr(self, "_activation", shared)  # not a field: neither compared, hashed nor shown

    @property
    def activation(self) -> Activation | None:
        """The shared activation this op type is, or None (SILU counts only with beta 1)."""
        return self._activation
