"""Every op's attrs normalize what they are given (docs/api.md): integers given as NumPy integers, bools as
NumPy bools, reals as NumPy floats, sequences as lists and enums by name give the very attrs that Python's
own values give, field by field and type by type. Run over the attrs of every conformance case, so each
field of each attrs class is normalized on some value; a field whose checked value is not stored (its
normalization dropped, or stored under another name) fails here."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np
import pytest

from conformance.cases import all_cases
from kernels.registry import OPS

CASES = all_cases()


def _loose(value: Any) -> Any:
    """The same value as a caller might give it: NumPy scalars, a list, an enum's name."""
    if isinstance(value, bool):
        return np.bool_(value)
    if isinstance(value, int):
        return np.int64(value)
    if isinstance(value, float):
        return np.float64(value)
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, tuple):
        return [_loose(v) for v in value]
    return value


def _typed(value: Any) -> Any:
    """A value with the type of every part spelled out, to compare attrs type by type."""
    if isinstance(value, tuple):
        return tuple(_typed(v) for v in value)
    return (type(value), value)


@pytest.mark.parametrize("op", list(OPS))
def test_attrs_normalize_numpy_scalars_lists_and_names(op):
    distinct = {repr(case.attrs): case.attrs for case in CASES if case.op == op}
    assert distinct, f"{op}: no case"
    seen_fields = set()
    for attrs in distinct.values():
        fields = {field.name: getattr(attrs, field.name) for field in dataclasses.fields(attrs)}
        again = type(attrs)(**{name: _loose(value) for name, value in fields.items()})
        assert again == attrs
        for name, value in fields.items():
            assert _typed(getattr(again, name)) == _typed(value), f"{op}: {name} {getattr(again, name)!r} for {value!r}"
            if _loose(value) is not value:
                seen_fields.add(name)
    loosened = {field.name for field in dataclasses.fields(OPS[op].attrs)}
    assert seen_fields == loosened, f"{op}: no case gives a value to loosen for {sorted(loosened - seen_fields)}"
