"""Machinery of the property tests (tests/test_properties.py): devices, value drawing,
the comparison with a stated bound, and error bounds derived from each operation.

Bounds, and why they hold:

- **exact**: equal values (+0 equals -0, NaN matches NaN). Used for data movement,
  selection (max, min, relu) and sums that are exact for the drawn values (short
  dyadic fractions whose sums stay far below 2**mantissa; see `exact_sum`).
  A float64 reference of float32 inputs rounded once to float32 is the correctly
  rounded float32 result of one +, -, *, / or sqrt (float64 has more than
  2 * 24 + 2 bits, so the double rounding is innocuous): one such operation is exact too.
- **sum of products** (`sum_bound`): a sum of n terms, each a product of a few
  rounded factors, computed in any order, is within gamma_(n + c) * sum(|terms|)
  of the exact sum (Higham, Accuracy and Stability of Numerical Algorithms, 3.1 and
  4.2; the bound ARM's TOSA conformance DOT_PRODUCT mode uses), c the roundings inside
  a term plus the final rounding. We state it as k * eps * sum(|terms|) with
  k = n + c and eps the dtype's machine epsilon (2 u, so a factor 2 to spare). The
  same bound holds for the float64 reference, which is then negligible for float32
  and is counted in c for float64. sum(|terms|) comes from the same PyTorch program
  run on absolute values (every op here is linear in each operand).
- **transcendental elementwise**: n ulps of the float64 reference rounded to the
  dtype, with conformance/compare.py's floor (n ulps of the tensor's largest
  magnitude, for results that cancel).
- **GPU vs CPU**: bit for bit where both devices do the same operations in the same
  order (stated per op); elsewhere each device is within the bound of the exact
  value, so they are within twice the bound of each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st

import kernels
from conformance.case import Tolerance
from conformance.compare import compare

FLOATS = (np.float32, np.float64)
# Data movement takes any numeric dtype: those a float64 reference holds exactly (small values).
MOVABLE = (np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
           np.uint64, np.bool_)


# --------------------------------------------------------------------------- devices


class Device:
    """A stream, a handle and the array module of one device; GPU arrays are made inside
    `with stream:` (CuPy's pool orders reuse by the stream current at allocation) and read
    back only after the stream has finished."""

    def __init__(self, name: str):
        self.name = name
        if name == "cpu":
            self.stream, self.handle, self.xp = kernels.cpu_stream(), kernels.cpu_handle(), np
        else:
            import cupy

            self.stream, self.handle, self.xp = kernels.gpu_stream(0), kernels.gpu_handle(0), cupy

    def put(self, array: np.ndarray) -> Any:
        if self.xp is np:
            return np.array(array, copy=True)
        with self.stream:  # np.array, not np.ascontiguousarray, which makes a 0-d array 1-d
            return self.xp.asarray(np.array(array, copy=True, order="C"))

    def poison(self, dims: tuple[int, ...], dtype: Any) -> Any:
        """A written buffer, filled with NaN (or the dtype's maximum) so that an unwritten element shows."""
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            fill = np.nan
        elif dtype.kind == "b":
            fill = True
        else:
            fill = np.iinfo(dtype).max
        return self.put(np.full(dims, fill, dtype=dtype))

    def host(self, array: Any) -> np.ndarray:
        if self.xp is np:
            return np.array(array, copy=True)
        import cupy

        self.stream.synchronize()
        with self.stream:
            return cupy.asnumpy(array, stream=self.stream.cupy_stream)

    def close(self) -> None:
        self.handle.close()


# --------------------------------------------------------------------------- values


@dataclass
class Sample:
    """One drawn example of an op: attrs, the tensors the kernels read (by name), the dtype,
    and whether values are dyadic (so that sums are exact) or random floats."""

    op: str
    attrs: Any
    inputs: dict[str, Any]
    dtype: np.dtype
    dyadic: bool
    extra: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        shapes = {k: (v.shape if isinstance(v, np.ndarray) else None if v is None else [a.shape for a in v])
                  for k, v in self.inputs.items()}
        return (f"Sample({self.op}, {self.attrs!r}, dtype={self.dtype.name}, dyadic={self.dyadic}, "
                f"shapes={shapes}, extra={self.extra})")


def seeded(draw: Any) -> np.random.Generator:
    """A NumPy generator whose seed hypothesis draws (and shrinks)."""
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


def draw_values(rng: np.random.Generator, dims: tuple[int, ...], dtype: Any, dyadic: bool, *, scale: float = 1.0,
                step: float = 0.25, limit: int = 16, nonzero: bool = False, positive: bool = False,
                specials: float = 0.0) -> np.ndarray:
    """Values of `dims` in `dtype`: for floats, multiples of `step` in [-limit*step, limit*step] (dyadic)
    or normal floats times `scale`; small integers otherwise. `specials` is the share of NaN, -inf,
    +inf, -0.0 and +0.0 sprinkled in (dyadic only)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return np.asarray(rng.integers(0, 2, dims)).astype(dtype)
    if dtype.kind in "iu":
        low = 0 if dtype.kind == "u" else -20
        return np.asarray(rng.integers(low, 21, dims)).astype(dtype)
    # np.array(...) throughout: arithmetic on a 0-d array gives a NumPy scalar, which takes no assignment.
    if dyadic:
        low = 1 if positive else -limit
        values = np.array(rng.integers(low, limit + 1, dims), dtype=np.float64)
        if nonzero and not positive:
            values[values == 0] = 1
        values = np.array(values * step)
        if specials:
            mask = np.array(rng.random(dims)) < specials
            values[mask] = rng.choice([np.nan, -np.inf, np.inf, -0.0, 0.0], size=int(mask.sum()))
    else:
        values = np.array(rng.standard_normal(dims) * scale)
        if positive:
            values = np.array(np.abs(values) + 0.05 * scale)
        elif nonzero:
            values[np.abs(values) < 1e-3 * scale] = scale
    return values.astype(dtype)


def small_dims(draw: Any, rank: int, low: int = 0, high: int = 5) -> tuple[int, ...]:
    return tuple(draw(st.integers(low, high)) for _ in range(rank))


def reduce_to(terms: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    """Sum per-output-element terms over the dims an operand of `dims` was broadcast along."""
    lead = terms.ndim - len(dims)
    summed = terms.sum(axis=tuple(range(lead))) if lead else terms
    axes = tuple(i for i, d in enumerate(dims) if d == 1 and summed.shape[i] != 1)
    return summed.sum(axis=axes, keepdims=True) if axes else summed


# --------------------------------------------------------------------------- checks


@dataclass
class Expect:
    """The expected value of one tensor (float64, or the dtype for non-float data) and how to
    compare with it: exact (bound None), |got - ref| <= bound (an array), or within `ulps`."""

    ref: np.ndarray
    bound: np.ndarray | None = None
    ulps: int = 0
    gpu_exact: bool = False  # the GPU must equal the CPU bit for bit


def eps(dtype: Any) -> float:
    return float(np.finfo(np.dtype(dtype)).eps)


def exact_sum(abs_sum: np.ndarray, dtype: Any, dyadic: bool, quantum: float) -> bool:
    """Whether a sum of multiples of `quantum` with sum(|terms|) = abs_sum is exact in `dtype` in
    any order: every partial sum is a multiple of quantum below 2**mantissa * quantum."""
    if not dyadic:
        return False
    largest = float(np.max(abs_sum, initial=0.0))
    return largest / quantum < 2.0 ** (np.finfo(np.dtype(dtype)).nmant - 1)


def sum_bound(abs_sum: np.ndarray, terms: int, dtype: Any, roundings: int = 2) -> np.ndarray:
    """k * eps * sum(|terms|) with k = terms + roundings (see the module docstring)."""
    return (terms + roundings) * eps(dtype) * np.asarray(abs_sum, dtype=np.float64)


def _same(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Elementwise equality of values where +0 equals -0 and NaN matches NaN."""
    if got.dtype.kind in "fc":
        return (got == ref) | (np.isnan(got) & np.isnan(ref))
    return got == ref


def _report(name: str, bad: np.ndarray, got: np.ndarray, ref: np.ndarray, rule: str,
            bound: np.ndarray | None = None) -> str:
    lines = [f"{name}: {int(np.count_nonzero(bad))} of {got.size} values differ ({rule})"]
    for index in np.argwhere(bad)[:5]:
        index = tuple(int(i) for i in index)
        extra = f", bound {bound[index]!r}" if bound is not None else ""
        lines.append(f"  at {index}: got {got[index]!r}, expected {ref[index]!r}{extra}")
    return "\n".join(lines)


def check(name: str, got: np.ndarray, expect: Expect, dtype: Any) -> str | None:
    """None when `got` (in its dtype) meets `expect`, else a report of where it does not."""
    ref = expect.ref
    if got.shape != ref.shape:
        return f"{name}: shape {got.shape}, expected {ref.shape}"
    if got.dtype != np.dtype(dtype):
        return f"{name}: dtype {got.dtype}, expected {np.dtype(dtype)}"
    if got.size == 0:
        return None
    if expect.ulps:
        # compare() indexes its distances in place, which a rank-0 array does not allow: one element instead.
        report = compare(got.reshape(-1), ref.astype(dtype).reshape(-1), Tolerance(expect.ulps))
        return None if report is None else f"{name}: {report}"
    if expect.bound is None:
        rounded = ref.astype(dtype) if ref.dtype != got.dtype else ref
        bad = ~_same(got, rounded)
        return _report(name, bad, got, rounded, "exact") if bad.any() else None
    wide = got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        within = np.abs(wide - ref) <= expect.bound
    bad = ~(within | _same(wide, ref))
    return _report(name, bad, wide, ref, "|got - ref| <= bound", expect.bound) if bad.any() else None


def check_gpu(name: str, gpu: np.ndarray, cpu: np.ndarray, expect: Expect, dtype: Any) -> str | None:
    """The GPU result against the CPU's: bit for bit where stated, else within twice the CPU's bound."""
    if expect.gpu_exact or (expect.bound is None and not expect.ulps):
        return check(name, gpu, Expect(cpu), dtype)
    if expect.ulps:
        return check(name, gpu, Expect(cpu.astype(np.float64), ulps=2 * expect.ulps), dtype)
    return check(name, gpu, Expect(cpu.astype(np.float64), bound=2 * expect.bound), dtype)


# --------------------------------------------------------------------------- fused activations

# Evaluating an activation takes a handful of correctly rounded or few-ulp operations (exp,
# erf, tanh, a division, products): its absolute error is below ACTIVATION_ROUNDINGS * eps
# times the magnitudes of its terms, each at most |f(x)|, |x| or 1 (GELU's 1 + erf cancels:
# eps * |x|; sigmoid's 1 - s: eps).
ACTIVATION_ROUNDINGS = 8
# |f''| <= 1 for every fused activation (sigmoid 0.1, tanh 0.77, silu 0.5, gelu 0.8): how far a
# derivative moves when its argument is off by pre_bound.
SECOND_DERIVATIVE = 1.0


def torch_activation(activation: Any) -> Callable:
    import torch.nn.functional as F

    return {"RELU": F.relu, "SIGMOID": F.sigmoid, "TANH": F.tanh, "GELU": F.gelu, "SILU": F.silu}[activation.name]


def activation_chain(activation: Any, pre: Any, pre_bound: np.ndarray | None, output_grad: np.ndarray,
                     dtype: Any) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None]:
    """(output, its bound, the pre-activation's gradient, its bound) of `activation` applied to the
    float64 tensor `pre`, itself within pre_bound of the computed one (None: exact)."""
    import torch

    if activation is None:
        return pre.detach().numpy(), pre_bound, output_grad, None
    x = pre.detach().clone().requires_grad_()
    y = torch_activation(activation)(x)
    (derivative,) = torch.autograd.grad(y, x, torch.ones_like(y), retain_graph=True)
    (grad,) = torch.autograd.grad(y, x, torch_tensor(output_grad))  # PyTorch's own (relu: 0 * NaN is 0)
    x, y, derivative, grad = x.detach().numpy(), y.detach().numpy(), derivative.numpy(), grad.numpy()
    if activation.name == "RELU":
        if pre_bound is None:
            return y, None, grad, None
        # relu is 1-Lipschitz; its derivative may flip where x is within pre_bound of 0.
        return y, pre_bound, grad, np.where(np.abs(x) <= pre_bound, np.abs(output_grad), 0.0)
    e = eps(dtype)
    pre_bound = np.zeros_like(x) if pre_bound is None else pre_bound
    out_bound = (np.abs(derivative) + SECOND_DERIVATIVE * pre_bound) * pre_bound + \
        ACTIVATION_ROUNDINGS * e * (np.abs(y) + np.abs(x) + 1)
    grad_bound = np.abs(output_grad) * (SECOND_DERIVATIVE * pre_bound + ACTIVATION_ROUNDINGS * e * (1 + np.abs(x))) + \
        e * np.abs(grad)
    return y, out_bound, grad, grad_bound


# --------------------------------------------------------------------------- helpers


def torch_tensor(array: np.ndarray, grad: bool = False) -> Any:
    import torch

    return torch.tensor(np.asarray(array, dtype=np.float64), dtype=torch.float64, requires_grad=grad)


def grads_of(output: Any, inputs: list[Any], upstream: np.ndarray) -> list[np.ndarray]:
    """Autograd gradients (float64 NumPy) of `output` for `inputs`, given the upstream gradient."""
    import torch

    grads = torch.autograd.grad(output, inputs, torch_tensor(upstream), allow_unused=True, retain_graph=True)
    return [np.zeros(tuple(t.shape)) if g is None else g.detach().numpy() for t, g in zip(inputs, grads)]


def run_state(module: Any, dev: Device, attrs: Any, *shapes: Any) -> Any:
    return module.init_kernel(dev.handle, attrs, *shapes)
