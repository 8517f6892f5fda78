"""The activations an op's attrs name (Activation), their validation and their codes in activation.cuh."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from ..runtime import core


class Activation(enum.Enum):
    """An activation applied after an op; the value is its code in activation.cuh."""

    RELU = 0
    SIGMOID = 1
    TANH = 2
    GELU = 3
    SILU = 4


NONE_CODE = -1  # no activation


def attr_activation(op: str, value: Any) -> Activation | None:
    """Validate an op's `activation` attrs field: an Activation, its name, or None for no activation."""
    return core.attr_enum(op, "activation", value, Activation, optional=True)


def code(activation: Activation | None) -> np.int32:
    """The activation's code for the CUDA device functions (KERNELS_ACTIVATION_NONE for None)."""
    return np.int32(NONE_CODE if activation is None else activation.value)
