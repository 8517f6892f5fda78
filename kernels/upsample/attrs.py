"""upsample's attrs and mode, and the dtypes NEAREST's backward sums (the checks and the GPU's
instantiations both need them)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..runtime import core
from ..runtime.core import ALL_FLOAT_DTYPES

OP = "upsample"


class UpsampleMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"


# NEAREST backward sums: float and integer dtypes (bool and complex are forward only).
NEAREST_BACKWARD_DTYPES = ALL_FLOAT_DTYPES + tuple(
    np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64))


@dataclass(frozen=True)
class UpsampleAttrs:
    """scale_factor: an integer >= 2, the same for H and W; mode: NEAREST or BILINEAR (align_corners=False)."""

    scale_factor: int
    mode: UpsampleMode = UpsampleMode.NEAREST

    def __post_init__(self) -> None:
        core.set_attr(self, "scale_factor", core.attr_int(OP, "scale_factor", self.scale_factor, minimum=2))
        core.set_attr(self, "mode", core.attr_enum(OP, "mode", self.mode, UpsampleMode))
