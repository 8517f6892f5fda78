"""The bad-input table machinery: each row builds a call that must raise a given
KernelError subclass whose message names the op and the argument, and must leave
every tensor it could write untouched."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

import kernels


@dataclass
class Row:
    """id: what is wrong; call(dev) -> (function, written tensors); error; pattern in the message."""

    id: str
    call: Callable[[Any], tuple[Callable[[], Any], list[Any]]]
    error: type
    pattern: str
    devices: tuple[str, ...] = ("cpu", "gpu")
    marks: list[Any] = field(default_factory=list)


def params(rows: list[Row]) -> list[Any]:
    """pytest params of (row, device) with the GPU ones marked `gpu`."""
    out = []
    for row in rows:
        for device in row.devices:
            marks = list(row.marks) + ([pytest.mark.gpu] if device == "gpu" else [])
            out.append(pytest.param(row, device, id=f"{row.id}-{device}", marks=marks))
    return out


def check_row(row: Row, dev: Any, op: str, argument_pattern: str | None = None) -> None:
    """Run the row's call and check the error class, the message and that nothing was written."""
    function, written = row.call(dev)
    before = [dev.host(w).copy() for w in written if w is not None]
    with pytest.raises(row.error) as raised:
        function()
    message = str(raised.value)
    assert isinstance(raised.value, kernels.KernelError)
    assert message.startswith(f"{op}:"), f"message does not name the op {op}: {message}"
    assert re.search(row.pattern, message), f"message {message!r} does not match {row.pattern!r}"
    after = [dev.host(w) for w in written if w is not None]
    for b, a in zip(before, after):
        assert np.array_equal(b.view(np.uint8), a.view(np.uint8)), "a call that raised modified a tensor"


def poisoned(dev: Any, dims: tuple[int, ...], dtype: Any = np.float32) -> Any:
    """A tensor full of a recognizable value, to show that a failed call wrote nothing."""
    return dev.array(np.full(dims, 7, dtype=dtype))
