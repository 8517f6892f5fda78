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

from kernels.core import is_floating

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
    """

    op: str
    name: str
    attrs: Any
    inputs: Mapping[str, np.ndarray]
    dtype: Any = np.float32
    tolerance: Tolerance | Mapping[str, Tolerance] = EXACT
    description: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)  # op-specific settings of the harness

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
            **extra: Any) -> Case:
        if any(c.name == name for c in self.cases):
            raise ValueError(f"{self.op}: duplicate case name {name!r}")
        if "/" in name:
            raise ValueError(f"{self.op}: case name {name!r} may not contain '/'")
        case = Case(self.op, name, attrs, dict(inputs), dtype, tolerance, description, dict(extra))
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
