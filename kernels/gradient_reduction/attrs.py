"""gradient_reduction's attrs (none) and the dtypes it sums."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.core import ALL_FLOAT_DTYPES

OP = "gradient_reduction"

INTEGER_DTYPES = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                             np.int64, np.uint64))
SUMMABLE_DTYPES = ALL_FLOAT_DTYPES + INTEGER_DTYPES


@dataclass(frozen=True)
class GradientReductionAttrs:
    """No attributes: the number of inputs is the length of the input list."""
