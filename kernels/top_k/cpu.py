"""top_k on the CPU (NumPy): a stable argsort of an order-preserving integer key of each value.

The key (order_key) maps each float to an unsigned integer of its width that orders as the values do,
with -0.0 and +0.0 one key and every NaN the largest key; sorting the keys' complements stably gives
the values in descending order with ties in ascending index, torch.sort(descending=True, stable=True)'s
order. forward and backward run after the package's checks (cpu_forward_kernel, cpu_backward_kernel).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import core
from .attrs import rows_and_length

# Per storage width: (unsigned type, sign bit, the bits of +inf).
_KEY_TYPES = {
    2: (np.uint16, 0x8000, None),  # +inf per dtype below (float16 and bfloat16 differ)
    4: (np.uint32, 0x8000_0000, 0x7F80_0000),
    8: (np.uint64, 0x8000_0000_0000_0000, 0x7FF0_0000_0000_0000),
}
_HALF_INF = {np.dtype(np.float16): 0x7C00, core.BFLOAT16: 0x7F80}


def order_key(x: np.ndarray) -> np.ndarray:
    """Unsigned integers ordered as the values of `x` are, -0.0 equal to +0.0, every NaN above +inf."""
    dtype = np.dtype(x.dtype)
    unsigned, sign, inf = _KEY_TYPES[dtype.itemsize]
    if inf is None:
        inf = _HALF_INF[dtype]
    unsigned, sign, inf = np.dtype(unsigned), unsigned(sign), unsigned(inf)
    bits = np.ascontiguousarray(x).view(unsigned)
    bits = np.where(bits == sign, unsigned.type(0), bits)  # -0.0 as +0.0
    key = np.where(bits & sign, ~bits, bits | sign)
    key[(bits & ~sign) > inf] = np.iinfo(unsigned).max  # NaN (any sign, any payload): the largest
    return key


def forward_plan(state: core.KernelState, attrs: Any, threads: int) -> Any:
    """forward for the calls of a functional plan of the state's form (kernels/functional.py, _Plan):
    compute(state, input, values, indices) on checked arrays, the rows' dims worked out once. `threads` is
    not used: the CPU top_k shares no work out (one argsort of all the rows)."""
    rows, n = rows_and_length(state)
    k = attrs.k
    if rows == 0:
        return lambda state, input, values, indices: None
    return lambda state, input, values, indices: _select(input.reshape(rows, n), values.reshape(rows, k),
                                                         indices.reshape(rows, k))


def forward(state: core.KernelState, input: np.ndarray, values: np.ndarray, indices: np.ndarray) -> None:
    """values, indices = the k largest of each row, descending, ties by the lower index first."""
    rows, n = rows_and_length(state)
    k = state.attrs.k
    if rows == 0:
        return
    _select(input.reshape(rows, n), values.reshape(rows, k), indices.reshape(rows, k))


def _select(x: np.ndarray, values: np.ndarray, indices: np.ndarray) -> None:
    """values, indices (rows, k) = the k largest of each row of x (rows, n), as forward describes."""
    # The complement of the key sorts the largest first; kind="stable" keeps equal keys in index order.
    order = np.argsort(~order_key(x), axis=1, kind="stable")[:, :values.shape[1]]
    np.copyto(indices, order, casting="same_kind")
    np.copyto(values, np.take_along_axis(x, order, axis=1))


def backward(state: core.KernelState, values_grad: np.ndarray, indices: np.ndarray,
             input_grad: np.ndarray | None) -> None:
    """input_grad = 0, then each values_grad[r, j] added at (r, indices[r, j]) in order of j, in the
    compute dtype (float32 for the half dtypes), rounded once; an index outside [0, n) is skipped."""
    if input_grad is None or input_grad.size == 0:
        return
    rows, n = rows_and_length(state)
    k = state.attrs.k
    index = indices.reshape(rows, k)
    valid = (index >= 0) & (index < n)
    flat = (np.arange(rows, dtype=np.int64)[:, None] * n + index)[valid]
    compute = core.compute_dtype(input_grad.dtype)
    total = np.zeros(rows * n, dtype=compute)
    # np.add.at adds one term at a time in the order given (row-major: j ascending), as the GPU's gather does.
    np.add.at(total, flat, values_grad.reshape(rows, k)[valid].astype(compute))
    np.copyto(input_grad.reshape(-1), total, casting="unsafe")
