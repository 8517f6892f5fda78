"""What a conformance case is: a name, attrs, input tensors (output gradients
included), a dtype and a tolerance. Each op's module in `conformance/cases`
declares its cases once; the golden generator and the tests both read them.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from kernels.runtime.core import is_floating

# --------------------------------------------------------------------------- tolerances


@dataclass(frozen=True)
class Tolerance:
    """`exact` (ulps == 0) or at most `ulps` units in the last place from the golden.

    The ulp bound has a floor for near-zero results: an error up to `ulps` ulps of
    the tensor's largest golden magnitude also passes.
    """

    ulps: int = 0

    @property
    def exact(self) -> bool:
        return self.ulps == 0

    def to_json(self) -> dict[str, Any]:
        return {"kind": "exact"} if self.exact else {"kind": "ulp", "n": self.ulps}

    def __str__(self) -> str:
        return "exact" if self.exact else f"ulp({self.ulps})"


EXACT = Tolerance(0)


def ulp(n: int) -> Tolerance:
    """A measured bound of n ulps: use only where the math cannot be exact, with the reason beside it."""
    if n < 1:
        raise ValueError("ulp(n) needs n >= 1; use EXACT for exact math")
    return Tolerance(int(n))


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One conformance case of one op.

    `inputs` holds every tensor the kernels only read, by name: forward inputs,
    weights, and the output gradients fed to backward (`output_grad`, ...).
    Lists of tensors are named `inputs.0`, `inputs.1`, ... Values are given as
    small integers or short dyadic fractions and cast to `dtype` (except names in
    `extra["input_dtypes"]`, cast to the dtype given there; `extra["expected_dtypes"]`
    does the same for expected tensors). `tolerance` is one Tolerance for every
    expected tensor, or a mapping from expected tensor name to Tolerance with
    `"*"` as the default.

    Every input must be able to show a wrong stride (see `repeating_axis`); `repeats` names the
    inputs that may repeat along an axis anyway, each with the reason (all ones, all zeros).
    """

    op: str
    name: str
    attrs: Any
    inputs: Mapping[str, np.ndarray]
    dtype: Any = np.float32
    tolerance: Tolerance | Mapping[str, Tolerance] = EXACT
    description: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)  # op-specific settings of the harness
    repeats: Mapping[str, str] = field(default_factory=dict)  # input name -> why it may repeat

    def __post_init__(self) -> None:
        dtype = np.dtype(self.dtype)
        object.__setattr__(self, "dtype", dtype)
        cast = {}
        own = self.extra.get("input_dtypes", {})  # inputs whose dtype is not the case's (float32 gamma, half data)
        for name, value in self.inputs.items():
            array = np.asarray(value)
            target = np.dtype(own.get(name, dtype))
            if array.dtype.kind in "fiub" and (target.kind in "fiub" or is_floating(target)):
                converted = np.ascontiguousarray(array.astype(target))
                # Declared values must be representable in the case's dtype.
                if not np.array_equal(converted.astype(np.float64), array.astype(np.float64), equal_nan=True):
                    raise ValueError(f"{self.op}/{self.name}: input {name} is not exact in {target.name}")
                array = converted
            cast[name] = array
        object.__setattr__(self, "inputs", cast)
        self._check_strides_show()

    def _check_strides_show(self) -> None:
        """Refuse inputs whose values could hide a wrong stride, unless `repeats` says why they may."""
        for name, reason in self.repeats.items():
            if name not in self.inputs:
                raise ValueError(f"{self.op}/{self.name}: repeats names {name!r}, which is not an input")
            if not isinstance(reason, str) or not reason.strip():
                raise ValueError(f"{self.op}/{self.name}: repeats[{name!r}] needs the reason the input may repeat")
        for name, array in self.inputs.items():
            found = repeating_axis(array)
            if name in self.repeats:
                if found is None:  # a stale opt-out would let the next edit of the values through unseen
                    raise ValueError(f"{self.op}/{self.name}: input {name} is declared in repeats but does not "
                                     "repeat along any axis; remove it from repeats")
                continue
            if found is not None:
                axis, period = found
                size = array.shape[axis]
                what = "every slice is the same" if period == 1 else f"its slices repeat every {period}"
                raise ValueError(
                    f"{self.op}/{self.name}: input {name} {tuple(array.shape)} repeats along axis {axis} (size {size}): "
                    f"{what}, so a wrong stride along that axis would read the same values. Change its values "
                    "(another modulus or offset of pattern()), or, if it must repeat (all ones, all zeros), "
                    "name it in repeats= with the reason")

    @property
    def key(self) -> str:
        return f"{self.op}/{self.name}"

    def tolerance_for(self, tensor: str) -> Tolerance:
        if isinstance(self.tolerance, Tolerance):
            return self.tolerance
        return self.tolerance.get(tensor, self.tolerance.get("*", EXACT))

    def tolerance_json(self) -> str:
        if isinstance(self.tolerance, Tolerance):
            return json.dumps(self.tolerance.to_json(), sort_keys=True)
        return json.dumps({k: v.to_json() for k, v in self.tolerance.items()}, sort_keys=True)

    def attrs_json(self) -> str:
        return json.dumps(attrs_to_jsonable(self.attrs), sort_keys=True)


def repeating_axis(array: np.ndarray) -> tuple[int, int] | None:
    """The first (axis, period) along which `array` repeats, or None.

    An axis of size n >= 2 repeats with period p (a divisor of n below n) when rolling the tensor
    by p along it gives the same values: its slices then come back every p, and a kernel that
    steps along that axis with a wrong stride (or reads the slice p further on) gets the same
    values and cannot be caught. Period 1 is a tensor constant along the axis. Values compare as
    the comparison does: NaN equals NaN, +0 equals -0. A tensor without values, or with no axis
    of size 2 or more, has no stride to get wrong.
    """
    array = np.asarray(array)
    if array.size == 0:
        return None
    # float64 holds every value a case declares (integers, bool, half dtypes) exactly.
    values = array.astype(np.float64)
    for axis, size in enumerate(values.shape):
        for period in range(1, size):
            if size % period:
                continue
            # Slices 0 and p differ in almost every tensor: the whole roll only where they do not.
            if not np.array_equal(np.take(values, 0, axis), np.take(values, period, axis), equal_nan=True):
                continue
            if np.array_equal(np.roll(values, period, axis=axis), values, equal_nan=True):
                return axis, period
    return None


def attrs_to_jsonable(attrs: Any) -> Any:
    """Attrs dataclass -> JSON-ready dict: enums by name, tuples as lists, class name kept."""
    def convert(value: Any) -> Any:
        if isinstance(value, enum.Enum):
            return value.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out = {f.name: convert(getattr(value, f.name)) for f in dataclasses.fields(value)}
            out["__class__"] = type(value).__name__
            return out
        if isinstance(value, (tuple, list)):
            return [convert(v) for v in value]
        if isinstance(value, np.generic):
            return value.item()
        return value

    return convert(attrs)


def values(rows: Any, dtype: Any = np.float64) -> np.ndarray:
    """A declared tensor from nested lists of small values."""
    return np.array(rows, dtype=dtype)


def pattern(shape: tuple[int, ...], modulus: int = 17, scale: float = 0.25, offset: int = 0) -> np.ndarray:
    """Distinct, small, exactly representable values for a shape: ((i * 7 + offset) % modulus - modulus // 2) * scale.

    Not random, not all ones: neighbours differ, so an index or transpose bug shows,
    and every value is a short dyadic fraction (exact in float32 and float64).
    """
    count = int(np.prod(shape, dtype=np.int64))
    index = np.arange(count, dtype=np.int64)
    return (((index * 7 + offset) % modulus - modulus // 2) * scale).reshape(shape)


def aperiodic(shape: tuple[int, ...], modulus: int = 5, scale: float = 1.0, offset: int = 0) -> np.ndarray:
    """Few distinct values that never fall into a period: ((s(i) + offset) % modulus - modulus // 2) * scale,
    s(i) the sum of the base-`modulus` digits of the flat index i.

    pattern(modulus=m) repeats every m elements, so along any axis whose stride is a multiple of m
    every slice is alike. The digit sum has no period (it steps by one inside each run of m and
    jumps at carries), so it keeps pattern's many equal values (ties for pooling) without that.
    """
    count = int(np.prod(shape, dtype=np.int64))
    index = np.arange(count, dtype=np.int64)
    digits = np.zeros(count, dtype=np.int64)
    while np.any(index):
        digits += index % modulus
        index //= modulus
    return (((digits + offset) % modulus - modulus // 2) * scale).reshape(shape)


def nonfinite(values: np.ndarray, positions: Any) -> np.ndarray:
    """A copy of `values` with NaN, +inf and -inf, in turn, at the given flat positions: output
    gradients for the cases that check how a backward carries what is not a number."""
    out = np.array(values, dtype=np.float64)
    flat = out.reshape(-1)
    for k, position in enumerate(positions):
        flat[position] = (np.nan, np.inf, -np.inf)[k % 3]
    return out


def int_pattern(shape: tuple[int, ...], modulus: int = 23, offset: int = 0) -> np.ndarray:
    """Distinct small integers (non-negative, so every integer dtype holds them)."""
    count = int(np.prod(shape, dtype=np.int64))
    return ((np.arange(count, dtype=np.int64) * 5 + offset) % modulus).reshape(shape)


@dataclass
class CaseTable:
    """The cases of one op, in declaration order; a duplicate name is an error."""

    op: str
    cases: list[Case] = field(default_factory=list)

    def add(self, name: str, attrs: Any, inputs: Mapping[str, Any], dtype: Any = np.float32,
            tolerance: Tolerance | Mapping[str, Tolerance] = EXACT, description: str = "",
            repeats: Mapping[str, str] | None = None, **extra: Any) -> Case:
        if any(c.name == name for c in self.cases):
            raise ValueError(f"{self.op}: duplicate case name {name!r}")
        if "/" in name:
            raise ValueError(f"{self.op}: case name {name!r} may not contain '/'")
        case = Case(self.op, name, attrs, dict(inputs), dtype, tolerance, description, dict(extra),
                    dict(repeats or {}))
        self.cases.append(case)
        return case

    def __iter__(self):
        return iter(self.cases)

    def __len__(self) -> int:
        return len(self.cases)


@dataclass
class Golden:
    """A case's stored tensors: the inputs the kernels read and the expected results."""

    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]


# The shape of a PyTorch program: (case, float64 tensors by input name) -> expected tensors by name.
TorchProgram = Callable[[Case, dict[str, Any]], dict[str, Any]]
