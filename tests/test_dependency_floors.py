"""What broke at the floors pyproject.toml declares (the `lowest` nox session runs the whole suite there):
each behaviour that once needed a newer NumPy or ml_dtypes than the floor, pinned on the CPU here."""

import ml_dtypes
import numpy as np
import pytest

from conformance.models.session import HEADROOM, gradient_limit
from kernels.core import BFLOAT16


@pytest.mark.parametrize("dtype, largest", [
    (np.dtype(np.float16), 65504.0),
    (BFLOAT16, 3.3895313892515355e38),  # (2 - 2**-7) * 2**127
    (np.dtype(np.float32), 3.4028234663852886e38),
    (np.dtype(np.float64), 1.7976931348623157e308),
])
def test_whole_network_gradient_limit_of_every_float_dtype(dtype, largest):
    # np.finfo refuses ml_dtypes' bfloat16 before ml_dtypes 0.7, which crashed
    # `python -m conformance.models yolov10n --dtype bfloat16` before its first step.
    assert gradient_limit(dtype) == largest / HEADROOM
    assert gradient_limit(np.dtype(ml_dtypes.bfloat16)) == gradient_limit(BFLOAT16)
