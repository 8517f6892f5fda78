"""Correctly rounded expected values: the last bit of a golden must not depend on the host.

A case's PyTorch program says what an op computes; in float64 on the CPU it says it to within a
few ulps, and those last bits come from the host's libm, its SIMD width and its summation order
(two hosts gave different goldens for the same case). Where a result is not exact in float64
(transcendentals, quotients, sums of inexact terms), the case module also gives an
``exact_program``: the same math evaluated here with mpmath at PRECISION bits, from the case's
inputs alone. The generator then stores that value rounded once to the case's dtype (round half
to even), after checking that PyTorch's float64 result lies within AGREEMENT_ULPS of it, so the
two programs cannot silently mean different things. PyTorch stays the authority on what is not a
number: where its result is NaN or infinite, the golden keeps it (NaN stored as one canonical
pattern), whatever the reference says.

Values are object arrays of ``mpmath.mpf``; NumPy's elementwise arithmetic, broadcasting and sums
work on them unchanged, and :func:`apply` maps an mpmath function over one.
"""

from __future__ import annotations

import contextlib
import math
from fractions import Fraction
from typing import Any, Callable, Iterator, Sequence

import mpmath
import numpy as np

from kernels.runtime.core import BFLOAT16

# Working precision of every reference: 256 bits leaves some 200 bits of margin over float64's 53
# for the few hundred operations of a case, so rounding the reference once gives the correctly
# rounded result unless the true value lies within 2^-(PRECISION - TIE_MARGIN_BITS) of a rounding
# boundary, which round_to refuses rather than guesses.
PRECISION = 256
TIE_MARGIN_BITS = 40
# How far PyTorch's float64 result may lie from the reference, in float64 ulps with the floor of
# that many ulps of the tensor's largest magnitude (conformance.compare's rule): PyTorch rounds its
# intermediate results (s, 1 - s, the mean, the variance of values near float16's maximum) and a
# result that cancels (a softmax gradient, a batch norm gradient over thousands of values)
# inherits their errors; batch norm's long channels measure about a hundred. 2^10 ulps is a
# relative 2^-42: a reference that means something else (another eps, another momentum rule,
# another derivative) misses by orders of magnitude more.
AGREEMENT_ULPS = 1024

# (significand bits with the implicit one, least normal exponent, largest exponent) of each dtype.
FORMATS = {
    np.dtype(np.float64): (53, -1022, 1023),
    np.dtype(np.float32): (24, -126, 127),
    np.dtype(np.float16): (11, -14, 15),
    np.dtype(BFLOAT16): (8, -126, 127),
}


@contextlib.contextmanager
def precision(bits: int | None = None) -> Iterator[None]:
    """mpmath's working precision for the references evaluated inside (PRECISION by default)."""
    with mpmath.workprec(PRECISION if bits is None else bits):
        yield


def hp(array: Any) -> np.ndarray:
    """An exact object array of mpf from a float array of any dtype (every value converts exactly)."""
    values = np.asarray(array)
    wide = values.astype(np.float64)  # exact for float16, bfloat16, float32 and float64
    out = np.empty(wide.shape, dtype=object)
    flat = out.reshape(-1)
    for index, value in enumerate(wide.reshape(-1)):
        flat[index] = mpmath.mpf(float(value))
    return out


def scalar(value: float) -> Any:
    """A Python float (an attr) as the exact mpf it is."""
    return mpmath.mpf(float(value))


def apply(function: Callable[..., Any], *arrays: Any) -> np.ndarray:
    """`function` of mpf values elementwise over broadcast object arrays. Each distinct tuple of
    arguments is evaluated once: a case's values come from a few short patterns, so a medium case's
    hundred thousand exponentials are a few hundred."""
    broadcast = np.broadcast_arrays(*[np.asarray(a, dtype=object) for a in arrays])
    out = np.empty(broadcast[0].shape, dtype=object)
    flat = out.reshape(-1)
    known: dict[tuple, Any] = {}
    for index, items in enumerate(zip(*[b.reshape(-1) for b in broadcast])):
        try:
            flat[index] = known[items]
        except KeyError:
            flat[index] = known[items] = function(*items)
        except TypeError:  # an unhashable argument
            flat[index] = function(*items)
    return out


def where(condition: Callable[[Any], bool], array: np.ndarray, if_true: Any, if_false: Any) -> np.ndarray:
    """Elementwise choice by a predicate on `array`'s mpf values (NumPy's comparisons of object
    arrays would give NaN no answer of its own)."""
    return apply(lambda x, a, b: a if condition(x) else b, array, if_true, if_false)


def is_power_of_two(value: Any) -> bool:
    """Whether an mpf is +-2^k (a divisor that leaves a quotient exact)."""
    if not isinstance(value, mpmath.mpf) or not mpmath.isfinite(value) or value == 0:
        return False
    return value._mpf_[1] == 1


def total(array: np.ndarray, axis: Any = None, keepdims: bool = False) -> Any:
    """A sum of mpf values at the working precision (NumPy's object sum, with 0 for an empty sum)."""
    summed = np.sum(np.asarray(array, dtype=object), axis=axis, keepdims=keepdims)
    if isinstance(summed, np.ndarray):
        return apply(lambda v: v if isinstance(v, mpmath.mpf) else mpmath.mpf(v), summed)
    return summed if isinstance(summed, mpmath.mpf) else mpmath.mpf(summed)


# --------------------------------------------------------------------------- rounding


def _to_fraction(value: Any) -> Fraction:
    sign, mantissa, exponent, _ = value._mpf_
    magnitude = Fraction(mantissa) * (Fraction(2) ** exponent)
    return -magnitude if sign else magnitude


def round_value(value: Any, dtype: Any) -> float:
    """The mpf (or Fraction) `value` rounded once, half to even, to `dtype` (returned as a Python
    float, exact for every dtype of FORMATS), with IEEE overflow to infinity and subnormals. An mpf
    within 2^-(PRECISION - TIE_MARGIN_BITS) of a half-way point, and not on it, raises: the
    reference cannot tell which way it rounds (a Fraction is exact: on a half-way point it is)."""
    bits, emin, emax = FORMATS[np.dtype(dtype)]
    if isinstance(value, mpmath.mpf):
        if mpmath.isnan(value):
            return float("nan")
        if mpmath.isinf(value):
            return float("inf") if value > 0 else float("-inf")
        sign, numerator, exponent, _ = value._mpf_
        denominator, approximate = 1, True  # |value| = numerator 2^exponent
    else:
        value = Fraction(value)
        sign, numerator, denominator, exponent, approximate = value < 0, abs(value.numerator), value.denominator, 0, False
    if numerator == 0:
        return 0.0
    # 2^top <= |value| < 2^(top + 1)
    top = exponent + numerator.bit_length() - denominator.bit_length()
    if (numerator << max(0, -(top - exponent))) < (denominator << max(0, top - exponent)):
        top -= 1
    quantum = max(top, emin) - (bits - 1)  # the spacing of the dtype's values at |value|: 2^quantum
    # |value| / 2^quantum = numerator 2^(exponent - quantum) / denominator = whole + remainder / scale
    shift = exponent - quantum
    scaled_numerator = numerator << shift if shift >= 0 else numerator
    scale = denominator if shift >= 0 else denominator << -shift
    whole, remainder = divmod(scaled_numerator, scale)
    twice = 2 * remainder
    if approximate and twice != scale and abs(twice - scale) * (1 << (PRECISION - TIE_MARGIN_BITS)) < scaled_numerator * 2:
        raise ArithmeticError(f"{float(value)!r} lies too close to a half-way point of {np.dtype(dtype).name} "
                              "for the reference's precision to round it")
    if twice > scale or (twice == scale and whole % 2 == 1):
        whole += 1
    largest = ((1 << bits) - 1) * 2.0 ** (emax - bits + 1)
    try:
        result = math.ldexp(whole, quantum)
    except OverflowError:
        result = float("inf")
    if result > largest:
        result = float("inf")
    return -result if sign else result


def round_to(values: np.ndarray, dtype: Any) -> np.ndarray:
    """An object array of mpf rounded elementwise to `dtype` (see round_value)."""
    flat = [round_value(v, dtype) for v in np.asarray(values, dtype=object).reshape(-1)]
    return np.array(flat, dtype=np.float64).reshape(np.shape(values)).astype(dtype)


# --------------------------------------------------------------------------- activations


def _sigmoid(x: Any) -> Any:
    return 1 / (1 + mpmath.exp(-x))


def activation(name: str, x: np.ndarray, scalar_value: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(f(x), f'(x)) of an activation or unary op by its name, elementwise on mpf values, with
    PyTorch's conventions: relu'(0) = 0; ELU's x <= 0 branch tests the input (so NaN takes the
    other); GELU is the erf form; SiLU is x sigmoid(beta x); POW's derivative is p x^(p - 1),
    and 0 for p = 0."""
    a = None if scalar_value is None else scalar(scalar_value)
    one = mpmath.mpf(1)
    x = as_mp(x)
    if name == "RELU":
        return where(lambda v: v > 0, x, x, mpmath.mpf(0)), where(lambda v: v > 0, x, one, mpmath.mpf(0))
    if name == "SIGMOID":
        s = apply(_sigmoid, x)
        return s, s * (1 - s)
    if name == "TANH":
        t = apply(mpmath.tanh, x)
        return t, 1 - t * t
    if name == "GELU":
        cdf = apply(lambda v: (1 + mpmath.erf(v / mpmath.sqrt(2))) / 2, x)
        pdf = apply(lambda v: mpmath.exp(-v * v / 2) / mpmath.sqrt(2 * mpmath.pi), x)
        return x * cdf, cdf + x * pdf
    if name == "SILU":
        beta = one if a is None else a
        s = apply(lambda v: _sigmoid(beta * v), x)
        return x * s, s + beta * x * s * (1 - s)
    if name == "ELU":
        alpha = one if a is None else a
        out = apply(lambda v: v if v > 0 else alpha * mpmath.expm1(v), x)
        return out, apply(lambda v: alpha * mpmath.exp(v) if v <= 0 else one, x)
    if name == "EXP":
        e = apply(mpmath.exp, x)
        return e, e
    if name == "SIN":
        return apply(mpmath.sin, x), apply(mpmath.cos, x)
    if name == "COS":
        return apply(mpmath.cos, x), apply(lambda v: -mpmath.sin(v), x)
    if name == "RSQRT":
        r = apply(lambda v: 1 / mpmath.sqrt(v) if v != 0 else mpmath.inf, x)
        return r, apply(lambda v: -r_cubed_half(v), x)
    if name == "POW":
        if a == 0:
            return apply(lambda v: one, x), apply(lambda v: mpmath.mpf(0), x)
        return apply(lambda v: mpmath.power(v, a), x), apply(lambda v: a * mpmath.power(v, a - 1), x)
    if name == "IDENTITY":
        return x.copy(), apply(lambda v: one, x)
    if name == "SCALAR_MULTIPLY":
        return x * a, apply(lambda v: a, x)
    if name == "SCALAR_ADD":
        return x + a, apply(lambda v: one, x)
    if name == "SCALAR_SUB":
        return x - a, apply(lambda v: one, x)
    if name == "SCALAR_TRUE_DIV":
        return x / a, apply(lambda v: one / a, x)
    raise KeyError(f"no exact reference for {name}")


def r_cubed_half(v: Any) -> Any:
    """0.5 v^(-3/2): the magnitude of rsqrt's derivative (infinite at 0)."""
    return mpmath.inf if v == 0 else 1 / (2 * v * mpmath.sqrt(v))


# --------------------------------------------------------------------------- linear maps


def exact_coefficient(value: float) -> Fraction:
    """A Jacobian entry PyTorch computed in float64, as the exact rational it stands for: a short
    dyadic (a weight, an input, a power-of-two share) as it is; otherwise (1/9, 2/9: an average's
    or a bilinear tap's share, which PyTorch's float64 index arithmetic gives a few ulps off) the
    nearest rational of denominator at most 2^12, which must lie within 2^-40 of the entry
    (a double that is no such share lies some 2^-24 from the nearest one)."""
    exact = Fraction(value)
    if exact.numerator.bit_length() <= 30:
        return exact
    small = exact.limit_denominator(1 << 12)
    if abs(small - exact) > abs(exact) * Fraction(1, 1 << 40):
        raise ArithmeticError(f"Jacobian entry {value!r} is neither a short dyadic nor a small rational")
    return small


def rational(value: Any) -> Any:
    """An mpf as the exact Fraction it is (NaN and infinities stay mpf)."""
    if isinstance(value, mpmath.mpf) and mpmath.isfinite(value):
        return _to_fraction(value)
    return value


def mp(value: Any) -> Any:
    """A Fraction as an mpf at the working precision (an mpf as it is)."""
    if isinstance(value, Fraction):
        return mpmath.mpf(value.numerator) / value.denominator
    return value


def as_mp(array: np.ndarray) -> np.ndarray:
    """An object array of Fractions and mpf as mpf throughout (for the transcendental functions)."""
    return apply(mp, array)


class LinearMap:
    """The exact sparse matrix of a map that is linear in one argument, from PyTorch's Jacobian at
    the case's point: rows index the output, columns the argument, coefficients exact rationals.
    It maps exactly (Fractions): an average that lies on a half-way point of the dtype is known to
    lie on it, and rounds half to even; a NaN or infinity among the values is carried as mpf."""

    def __init__(self, jacobian: np.ndarray, output_shape: Sequence[int], input_shape: Sequence[int]):
        matrix = np.asarray(jacobian, dtype=np.float64).reshape(int(np.prod(output_shape)), int(np.prod(input_shape)))
        self.rows, self.columns = np.nonzero(matrix)
        self.coefficients = [exact_coefficient(float(v)) for v in matrix[self.rows, self.columns]]
        self.output_shape, self.input_shape = tuple(output_shape), tuple(input_shape)

    def _map(self, values: np.ndarray, size: int, source: np.ndarray, target: np.ndarray) -> np.ndarray:
        flat = [rational(v) for v in np.asarray(values, dtype=object).reshape(-1)]
        out: list[Any] = [Fraction(0)] * size
        for into, frm, coefficient in zip(target, source, self.coefficients):
            term = flat[frm]
            if isinstance(term, Fraction) and isinstance(out[into], Fraction):
                out[into] += coefficient * term
            else:
                out[into] = mp(out[into]) + mp(coefficient) * mp(term)
        return _objects(out)

    def forward(self, values: np.ndarray) -> np.ndarray:
        """The map applied to `values` (object array of the argument's shape)."""
        return self._map(values, int(np.prod(self.output_shape)), self.columns, self.rows).reshape(self.output_shape)

    def adjoint(self, values: np.ndarray) -> np.ndarray:
        """The transposed map applied to `values` (object array of the output's shape): a gradient."""
        return self._map(values, int(np.prod(self.input_shape)), self.rows, self.columns).reshape(self.input_shape)


def _objects(items: list) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


# A case's linear map is a dense Jacobian built by PyTorch: past this many entries a case is too
# large for its reference (a medium case must keep its math exact instead).
MAX_JACOBIAN_ENTRIES = 40_000_000


def linear_maps(function: Callable[..., Any], arguments: Sequence[np.ndarray]) -> list[LinearMap]:
    """The LinearMap of `function` (PyTorch, float64 tensors in, one tensor out) in each argument,
    at `arguments`; `function` must be linear in each argument with the others fixed."""
    import torch

    tensors = tuple(torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in arguments)
    with torch.no_grad():
        output_shape = tuple(function(*tensors).shape)
    size = int(np.prod(output_shape))
    for argument in arguments:
        if size * np.asarray(argument).size > MAX_JACOBIAN_ENTRIES:
            raise ValueError(f"a {output_shape} by {np.shape(argument)} Jacobian is too large for an exact reference")
    jacobians = torch.autograd.functional.jacobian(function, tensors, vectorize=True)
    return [LinearMap(j.numpy(), output_shape, a.shape) for j, a in zip(jacobians, arguments)]


# --------------------------------------------------------------------------- checking PyTorch


def ulps_apart(got: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|got - reference| in float64 ulps of the reference, with conformance.compare's floor (one ulp
    of the tensor's largest magnitude counts no more than one ulp of an element): finite values."""
    got, reference = np.asarray(got, np.float64), np.asarray(reference, np.float64)
    if reference.size == 0:
        return np.zeros(reference.shape)
    floor = np.spacing(np.max(np.abs(reference)))
    unit = np.maximum(np.spacing(np.abs(reference)), floor)
    return np.abs(got - reference) / unit


def unambiguous(program_value: np.ndarray, dtype: Any) -> bool:
    """Whether PyTorch's float64 `program_value` rounds to `dtype` as every value within
    AGREEMENT_ULPS of it does (the ulps with their floor of the tensor's largest magnitude): then the
    correctly rounded result is PyTorch's rounded, whatever the host's last bits. Non-finite values
    are PyTorch's anyway."""
    value = np.asarray(program_value, dtype=np.float64)
    finite = value[np.isfinite(value)]
    if finite.size == 0:
        return True
    floor = np.spacing(np.max(np.abs(finite)))
    margin = AGREEMENT_ULPS * np.maximum(np.spacing(np.abs(finite)), floor)
    low, high = (finite - margin).astype(dtype), (finite + margin).astype(dtype)
    return bool(np.all(low.astype(np.float64) == high.astype(np.float64)))


def settle(name: str, program_value: np.ndarray, reference: np.ndarray, dtype: Any) -> np.ndarray:
    """The golden of one tensor: `reference` rounded once to `dtype` where PyTorch's float64
    `program_value` is finite, PyTorch's value where it is not; raises where the two disagree by
    more than AGREEMENT_ULPS or on finiteness."""
    program_value = np.asarray(program_value, dtype=np.float64)
    reference = np.asarray(reference, dtype=object)
    if program_value.shape != reference.shape:
        raise ValueError(f"{name}: the exact reference has shape {reference.shape}, the program {program_value.shape}")
    # float() rounds an mpf or a Fraction to the nearest double: enough for the check, and fast.
    reference64 = np.array([float(v) for v in reference.reshape(-1)], dtype=np.float64).reshape(reference.shape)
    finite = np.isfinite(program_value)
    if not np.all(np.isfinite(reference64[finite])):
        raise ArithmeticError(f"{name}: the exact reference is not finite where PyTorch's result is")
    apart = ulps_apart(program_value[finite], reference64[finite])
    if apart.size and apart.max() > AGREEMENT_ULPS:
        worst = int(np.argmax(apart))
        raise ArithmeticError(f"{name}: PyTorch's float64 result {program_value[finite][worst]!r} lies "
                              f"{apart.max():.0f} ulps from the exact reference {reference64[finite][worst]!r}")
    rounded = round_to(reference, dtype).astype(np.float64)
    # mpmath has no -0: a zero takes PyTorch's sign where PyTorch's result is an exact zero too (the
    # sign IEEE arithmetic gives 0 * -3 or -0 + -0), else +0 (a result that cancels to zero in the
    # math, whose sign in PyTorch is its rounding's); what is not finite is PyTorch's.
    settled = np.where((rounded == 0) & (program_value == 0), program_value, rounded + 0.0)
    settled = np.where(finite, settled, program_value)
    return settled.astype(dtype)
