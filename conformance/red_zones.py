"""Red zones: every tensor a case hands to a kernel is a C-contiguous view inside a larger 1-D
allocation of its dtype, with margins that show an access one element past either end.

- Margins around a tensor the kernel writes hold a canary (CANARY repeated, byte for byte) and must
  be unchanged after the call: an out-of-bounds write fails the case.
- Margins around a tensor the kernel only reads hold a guard that poisons any result computed from
  it, and must be unchanged too. Two guards (GUARDS), one per poison of the runs (harness.GUARD_OF):
  "nan" (NaN for floats and complex, the dtype's maximum for integers, True for bool) shows an
  out-of-bounds read in a sum or a product; "inf" (+inf and -inf in turn, element by element; the
  maximum and the minimum for integers) shows one in a max or a min, which drops NaN (fmax, or a
  comparison that keeps its first operand). The turns count from the 256-byte boundary, so the
  element right past either end has one sign in the aligned layout and the other in the misaligned one.

Each margin is at least one 16-byte pack plus one row (the tensor's last dim) wide, so a pack or a
row read or written past an edge still lands in it. The view starts `shift` elements past a
256-byte boundary (as a fresh allocation would start, so shift 0 is "aligned"): the runner's
layouts choose the shifts (see harness.LAYOUTS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.runtime.core import is_floating

PACK_BYTES = 16  # the widest access the GPU kernels make: they check (ptr & 15) == 0 before it
ALIGNMENT = 256  # where a fresh cudaMalloc'd (and CuPy pool) allocation starts
CANARY = 0xA5  # fills the margins of written tensors; as float32, -2.87e-16: a plausible value, never NaN
FIRST_FEW = 5


GUARDS = ("nan", "inf")  # what fills a read-only tensor's margins (see the module docstring)


def guard_value(dtype: np.dtype) -> Any:
    """The "nan" guard: a value that poisons any sum or product read from it."""
    if is_floating(dtype):  # bfloat16 too (its kind is "V")
        return np.nan
    if dtype.kind == "c":
        return complex(np.nan, np.nan)
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


def guard_extremes(dtype: np.dtype) -> tuple[Any, Any]:
    """The "inf" guard's two values, (high, low), taken in turn: a max that reads one shows high, a
    min shows low (bool has one value: True)."""
    if is_floating(dtype):
        return np.inf, -np.inf
    if dtype.kind == "c":
        return complex(np.inf, np.inf), complex(-np.inf, -np.inf)
    if dtype.kind == "b":
        return True, True
    info = np.iinfo(dtype)
    return info.max, info.min


def _fill_guard(host: np.ndarray, boundary: int, guard: str) -> None:
    """Fill the whole buffer with `guard`; the "inf" turns begin with high at element `boundary`."""
    if guard == "nan":
        host[:] = guard_value(host.dtype)
        return
    high, low = guard_extremes(host.dtype)
    host[boundary % 2::2] = high
    host[1 - boundary % 2::2] = low


def margin_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """The least width of each margin: one 16-byte pack plus one row (the last dim; 1 for a scalar)."""
    row = shape[-1] if shape else 1
    return PACK_BYTES + row * dtype.itemsize


@dataclass
class RedZone:
    """Where a tensor lies in its allocation, and what its margins held when it was placed."""

    buffer: Any  # the 1-D allocation, NumPy or CuPy
    start: int  # the view's first element in `buffer`
    shape: tuple[int, ...]
    role: str  # "written" (canary margins) or "read" (guard margins)
    before: np.ndarray  # the bytes of the margin before the view, as placed
    after: np.ndarray  # the bytes of the margin after it
    host: np.ndarray | None = None  # the GPU buffer's source, kept alive until the case ends

    @property
    def count(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def view(self) -> Any:
        """The tensor: `buffer[start:start + count]` shaped, C-contiguous."""
        return self.buffer[self.start:self.start + self.count].reshape(self.shape)

    def tensor_of(self, host_buffer: np.ndarray) -> np.ndarray:
        """The tensor's part of a host copy of the whole buffer."""
        return host_buffer[self.start:self.start + self.count].reshape(self.shape)

    def problems(self, host_buffer: np.ndarray) -> list[str]:
        """What changed in the margins of a host copy of the whole buffer: one line per side."""
        width = host_buffer.dtype.itemsize
        raw = host_buffer.view(np.uint8)
        what = "canary" if self.role == "written" else "read-only margin"
        lines = []
        changed = np.flatnonzero(raw[:self.start * width] != self.before)
        if changed.size:
            # Offsets from the tensor's first byte, nearest first: -1 is the byte right before it.
            offsets = (changed - self.start * width)[::-1][:FIRST_FEW]
            lines.append(f"{changed.size} bytes of the {what} before the tensor changed, nearest at byte offsets "
                         f"{', '.join(str(int(o)) for o in offsets)} from its start")
        end = (self.start + self.count) * width
        changed = np.flatnonzero(raw[end:] != self.after)
        if changed.size:
            # Offsets past the tensor's end: 0 is the first byte after its last element.
            offsets = changed[:FIRST_FEW]
            lines.append(f"{changed.size} bytes of the {what} after the tensor changed, first at byte offsets "
                         f"{', '.join('+' + str(int(o)) for o in offsets)} past its end")
        return lines


def place(values: np.ndarray, role: str, shift: int, empty: Any, address: Any,
          guard: str = "nan") -> tuple[RedZone, np.ndarray]:
    """Lay `values` out in a fresh 1-D allocation of its dtype, `shift` elements past a 256-byte
    boundary, between margins (canary for a written tensor, `guard` for a read one: GUARDS).

    `empty(n, dtype)` allocates on the device and `address(buffer)` gives its data pointer: the
    start is chosen from the real address, so the alignment holds on either device. Returns the
    zone and the host image of the whole buffer (on the CPU, the buffer itself), which the caller
    copies to the device where the buffer is not the host image.
    """
    if guard not in GUARDS:
        raise ValueError(f"unknown guard {guard!r}: expected one of {', '.join(GUARDS)}")
    dtype = values.dtype
    width = dtype.itemsize
    margin = margin_bytes(values.shape, dtype)
    lead = -(-(margin + ALIGNMENT + shift * width) // width)  # room to find the boundary past the margin
    total = lead + values.size + -(-margin // width)
    buffer = empty(total, dtype)
    base = address(buffer)
    if base % width:
        raise AssertionError(f"allocation at {base:#x} is not aligned for {dtype}")
    boundary = -(-(base + margin) // ALIGNMENT) * ALIGNMENT
    start = (boundary - base) // width + shift
    end = start + values.size
    host = buffer if isinstance(buffer, np.ndarray) else np.empty(total, dtype)
    if role == "written":
        host.view(np.uint8)[:] = CANARY
    else:
        _fill_guard(host, start - shift, guard)
    host[start:end] = values.reshape(-1)
    raw = host.view(np.uint8)
    zone = RedZone(buffer, start, tuple(values.shape), role,
                   raw[:start * width].copy(), raw[end * width:].copy())
    return zone, host


def alone(values: np.ndarray, role: str, shift: int, empty: Any, address: Any,
          guard: str = "nan") -> tuple[RedZone, np.ndarray]:
    """`values` in an allocation of its own, with no margins (for a backend that takes no views into a
    larger allocation): `place`'s signature and result, its shift and guard unused."""
    buffer = empty(values.size, values.dtype)
    host = buffer if isinstance(buffer, np.ndarray) else np.empty(values.size, values.dtype)
    host[:] = values.reshape(-1)
    empty_margin = np.empty(0, np.uint8)
    return RedZone(buffer, 0, tuple(values.shape), role, empty_margin, empty_margin), host
