"""Comparison of a kernel's result with its golden: exact or within n ulps,
with a report that says exactly where and by how much it differs."""

from __future__ import annotations

import math

import numpy as np

from kernels.runtime.core import is_floating

from .case import Tolerance

FIRST_FEW = 5


def _ordered_bits(array: np.ndarray) -> np.ndarray:
    """Map floats to integers whose difference is the distance in ulps (+0 and -0 both map to 0)."""
    bits_type = {2: np.int16, 4: np.int32, 8: np.int64}[array.dtype.itemsize]
    bits = array.view(bits_type).astype(np.int64)
    negative = bits < 0
    magnitude = bits & np.int64(np.iinfo(bits_type).max)
    return np.where(negative, -magnitude, magnitude)


def ulp_distance(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Units in the last place between two float arrays of one dtype (NaN vs non-NaN: max)."""
    # np.array: on 0-d inputs the arithmetic gives NumPy scalars, which the masked writes below need as arrays
    distance = np.array(np.abs(_ordered_bits(got) - _ordered_bits(expected)), dtype=np.float64)
    nan_got, nan_expected = np.isnan(got), np.isnan(expected)
    distance[nan_got & nan_expected] = 0
    distance[nan_got ^ nan_expected] = np.inf
    return distance


def ulp_of(magnitude: float, dtype: np.dtype) -> float:
    """The spacing of `dtype` at `magnitude` (to the next value up). At the dtype's largest finite value
    the next value up is inf: there it is the spacing down (float16's 65504: 32), never inf, which
    would let any error pass the floor."""
    value = dtype.type(magnitude)
    with np.errstate(over="ignore"):
        spacing = float(np.spacing(value))
    if math.isinf(spacing) and math.isfinite(float(value)):
        spacing = float(value) - float(np.nextafter(value, dtype.type(0)))
    return spacing


def compare(got: np.ndarray, expected: np.ndarray, tolerance: Tolerance) -> str | None:
    """None when `got` matches `expected`, else a report of the mismatches."""
    if got.shape != expected.shape:
        return f"shape {got.shape}, expected {expected.shape}"
    if got.dtype != expected.dtype:
        return f"dtype {got.dtype}, expected {expected.dtype}"
    if got.size == 0:
        return None
    if is_floating(got.dtype):
        distance = ulp_distance(got, expected)
        if tolerance.exact:
            bad = distance > 0
        else:
            finite = expected[np.isfinite(expected)]
            largest = float(np.max(np.abs(finite))) if finite.size else 0.0
            floor = tolerance.ulps * ulp_of(largest, got.dtype)
            absolute = np.abs(got.astype(np.float64) - expected.astype(np.float64))
            bad = (distance > tolerance.ulps) & ~(absolute <= floor)
    elif got.dtype.kind == "c":
        bad = ~((got == expected) | (np.isnan(got) & np.isnan(expected)))
        distance = np.where(bad, np.inf, 0.0)
    else:
        bad = got != expected
        distance = np.where(bad, np.inf, 0.0)
    count = int(np.count_nonzero(bad))
    if count == 0:
        return None
    lines = [f"{count} of {got.size} values differ ({tolerance}); max ulp distance {np.max(distance[bad]):.0f}"]
    for index in np.argwhere(bad)[:FIRST_FEW]:
        index = tuple(int(i) for i in index)
        # str, not repr: the same text on NumPy 1 and 2 (whose repr reads "np.float32(1.0)").
        lines.append(f"  at {index}: got {got[index]}, expected {expected[index]}, ulp distance {distance[index]:.0f}")
    return "\n".join(lines)


def needed_ulps(got: np.ndarray, expected: np.ndarray) -> float:
    """The smallest n for which `compare(got, expected, ulp(n))` passes (0: exact; inf: a NaN or
    non-float mismatch): what a case's tolerance is measured with before it is stated."""
    if got.size == 0:
        return 0.0
    if not is_floating(got.dtype):
        return 0.0 if np.array_equal(got, expected) else np.inf
    distance = ulp_distance(got, expected)
    finite = expected[np.isfinite(expected)]
    spacing = ulp_of(float(np.max(np.abs(finite))) if finite.size else 0.0, got.dtype)
    absolute = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    with np.errstate(invalid="ignore"):
        by_floor = np.where(np.isfinite(absolute), np.ceil(absolute / spacing), np.inf)
    return float(np.max(np.minimum(distance, by_floor)))
