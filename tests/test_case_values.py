"""The check every case's inputs pass when declared: values that can show a wrong stride.

A kernel that steps along an axis with the wrong stride reads other slices of the tensor; if
those slices hold the same values it gets the same bits and passes. conformance.case refuses,
at declaration, an input whose slices along some axis repeat with a period dividing the axis
(period 1: constant along it), unless the case names it in `repeats` with the reason.
"""

import numpy as np
import pytest

from conformance.case import CaseTable, pattern, repeating_axis
from conformance.cases import all_cases
from kernels import ElementUnaryAttrs, UnaryOpType

ATTRS = ElementUnaryAttrs(UnaryOpType.RELU)


def _declare(inputs, repeats=None):
    table = CaseTable("element_unary")
    return table.add("probe", ATTRS, inputs, repeats=repeats)


def _grad(shape):
    return pattern(shape, modulus=11, scale=0.5, offset=3)


# (what, tensor, the (axis, period) repeating_axis reports)
REPEATING = [
    ("constant", np.full((2, 3), 0.5), (0, 1)),
    ("zeros", np.zeros((4,)), (0, 1)),
    ("rows_equal", np.array([[1.0, 2.0, 3.0]] * 4), (0, 1)),
    ("columns_equal", np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]), (1, 1)),
    # pattern(modulus=5) steps by 7 mod 5: period 5 in the flat index, so rows of 5 are all alike.
    ("period_5_rows_of_5", pattern((1, 2, 7, 5), modulus=5, scale=1.0), (1, 1)),
    ("slices_every_2_of_4", np.array([1.0, 2.0, 1.0, 2.0]), (0, 2)),
    ("slices_every_3_of_6", np.array([[1.0], [2.0], [3.0]] * 2).reshape(6, 1), (0, 3)),
    ("batches_alike", np.stack([pattern((3, 4))] * 2), (0, 1)),
    ("all_nan", np.full((3,), np.nan), (0, 1)),
    ("signed_zeros_equal", np.array([0.0, -0.0, 0.0, -0.0]), (0, 1)),
    ("nan_period_2", np.array([np.nan, 1.0, np.nan, 1.0]), (0, 2)),
]

# Tensors that can show a wrong stride on every axis (or have none to get wrong).
SHOWING = [
    ("pattern_default", pattern((2, 3, 4, 5))),
    ("period_not_dividing", np.array([1.0, 2.0, 3.0, 1.0, 2.0])),  # abcab: no period divides 5
    ("one_slice_differs", np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 2.0]])),
    ("palindrome", np.array([1.0, 2.0, 2.0, 1.0])),
    ("single_element", np.array([[[7.0]]])),
    ("size_one_axes", np.ones((1, 1, 1))),
    ("zero_size", np.zeros((2, 0, 3))),
    ("integers", np.arange(6).reshape(2, 3)),
    ("nan_once", np.array([np.nan, 1.0, 2.0, 3.0])),
]


@pytest.mark.parametrize("what, tensor, found", REPEATING, ids=[r[0] for r in REPEATING])
def test_repeating_axis_finds_the_axis_and_period(what, tensor, found):
    assert repeating_axis(tensor) == found


@pytest.mark.parametrize("what, tensor", SHOWING, ids=[s[0] for s in SHOWING])
def test_repeating_axis_passes_tensors_that_show_a_stride(what, tensor):
    assert repeating_axis(tensor) is None


def test_integers_and_booleans_are_checked_too():
    assert repeating_axis(np.array([[True, False, True], [True, False, True]])) == (0, 1)
    assert repeating_axis(np.array([3, 4, 3, 4], dtype=np.int8)) == (0, 2)
    assert repeating_axis(np.array([True, False, False])) is None


def test_a_repeating_input_is_refused_naming_op_case_input_and_axis():
    rows_alike = pattern((1, 2, 7, 5), modulus=5, scale=1.0)
    with pytest.raises(ValueError) as error:
        _declare({"input": rows_alike, "output_grad": _grad((1, 2, 7, 5))})
    message = str(error.value)
    assert message.startswith("element_unary/probe: input input (1, 2, 7, 5) repeats along axis 1 (size 2)")
    assert "every slice is the same" in message and "repeats=" in message


def test_a_period_is_named_in_the_message():
    with pytest.raises(ValueError, match=r"element_unary/probe: input output_grad \(6,\) repeats along axis 0 "
                                         r"\(size 6\): its slices repeat every 2"):
        _declare({"input": pattern((6,)), "output_grad": np.array([1.0, -2.0] * 3)})


def test_the_check_runs_on_an_integer_case_too():
    table = CaseTable("element_unary")
    with pytest.raises(ValueError, match="input input"):
        table.add("probe", ATTRS, {"input": np.ones((2, 2)), "output_grad": np.arange(4).reshape(2, 2)}, dtype=np.int32)


def test_a_declared_opt_out_with_its_reason_passes():
    case = _declare({"input": np.ones((2, 3)), "output_grad": _grad((2, 3))},
                    repeats={"input": "all ones: relu's gradient passes output_grad through unchanged"})
    assert case.repeats == {"input": "all ones: relu's gradient passes output_grad through unchanged"}
    np.testing.assert_array_equal(case.inputs["input"], np.ones((2, 3), np.float32))


def test_an_opt_out_needs_a_reason():
    with pytest.raises(ValueError, match=r"element_unary/probe: repeats\['input'\] needs the reason"):
        _declare({"input": np.ones((2, 3)), "output_grad": _grad((2, 3))}, repeats={"input": " "})


def test_an_opt_out_must_name_an_input():
    with pytest.raises(ValueError, match="repeats names 'gamma', which is not an input"):
        _declare({"input": pattern((2, 3)), "output_grad": _grad((2, 3))}, repeats={"gamma": "all ones"})


def test_a_stale_opt_out_is_refused():
    with pytest.raises(ValueError, match="input input is declared in repeats but does not repeat"):
        _declare({"input": pattern((2, 3)), "output_grad": _grad((2, 3))}, repeats={"input": "all ones"})


def test_every_declared_case_passes_and_opt_outs_are_rare():
    cases = all_cases()
    opted = [(case.key, name, reason) for case in cases for name, reason in case.repeats.items()]
    for case in cases:
        for name, array in case.inputs.items():
            assert (repeating_axis(array) is None) != (name in case.repeats), (case.key, name)
    assert len(opted) <= len(cases) // 50, opted
