"""conformance.compare on the shapes the harness meets, 0-d ones included."""

import numpy as np

from conformance.case import EXACT, ulp
from conformance.compare import compare, needed_ulps, ulp_distance


def test_a_0d_mismatch_is_reported_with_its_values():
    report = compare(np.array(1.0, np.float32), np.array(2.0, np.float32), EXACT)
    assert report is not None and report.startswith("1 of 1 values differ (exact)")
    # Values print as NumPy 1 printed them on every NumPy (NumPy 2's repr would add "np.float32(...)").
    assert "at (): got 1.0, expected 2.0, ulp distance 8388608" in report


def test_0d_matches_exactly_and_within_ulps():
    one = np.float32(1.0)
    assert compare(np.array(one), np.array(one), EXACT) is None
    assert compare(np.array(np.nextafter(one, np.float32(2))), np.array(one), ulp(1)) is None
    assert compare(np.array(np.nan, np.float64), np.array(np.nan, np.float64), EXACT) is None
    assert ulp_distance(np.array(np.nan, np.float32), np.array(one)) == np.inf
    assert needed_ulps(np.array(np.nextafter(one, np.float32(2))), np.array(one)) == 1.0


def test_half_dtypes_count_ulps_in_their_own_spacing():
    from kernels.runtime.core import BFLOAT16

    for dtype, step in ((np.dtype(np.float16), 2.0 ** -10), (BFLOAT16, 2.0 ** -7)):
        one = np.array([1.0, -1.0], dtype)
        two_up = np.array([1.0 + 2 * step, -1.0 - 2 * step], dtype)  # 2 ulps each, both signs
        assert ulp_distance(two_up, one).tolist() == [2.0, 2.0]
        assert needed_ulps(two_up, one) == 2.0
        assert compare(two_up, one, ulp(2)) is None
        report = compare(two_up, one, ulp(1))
        assert report is not None and report.startswith("2 of 2 values differ (ulp(1)); max ulp distance 2")
        assert compare(np.array([np.nan], dtype), np.array([1.0], dtype), ulp(8)) is not None


def test_poison_of_half_dtypes_is_nan_or_large_finite_values():
    from conformance.harness import poison_array
    from kernels.runtime.core import BFLOAT16

    for dtype in (np.dtype(np.float16), BFLOAT16):
        nan = poison_array((3, 4), dtype, "nan", seed=1)
        assert nan.dtype == dtype and np.isnan(nan.astype(np.float32)).all()
        noise = poison_array((3, 4), dtype, "random", seed=1).astype(np.float32)
        assert np.isfinite(noise).all() and np.abs(noise).max() > 100 and len(np.unique(noise)) > 6


def test_the_ulp_floor_at_a_dtypes_largest_value_is_finite():
    """At the largest finite value the spacing up is inf; the floor uses the spacing down, so an error
    of many ulps at 65504 (float16) still fails an ulp(1) bound."""
    from conformance.compare import ulp_of
    from kernels.runtime.core import BFLOAT16

    assert ulp_of(65504.0, np.dtype(np.float16)) == 32.0
    assert ulp_of(float(np.finfo(np.float32).max), np.dtype(np.float32)) == 2.0 ** 104
    top = float(np.array(3.3895313892515355e38, BFLOAT16))
    assert ulp_of(top, BFLOAT16) == 2.0 ** 120
    assert ulp_of(1.0, np.dtype(np.float16)) == 2.0 ** -10  # elsewhere: the spacing up, as before
    expected = np.array([65504.0, 65504.0], np.float16)
    got = np.array([65504.0, 65504.0 - 8 * 32], np.float16)  # 8 ulps below
    assert compare(got, expected, ulp(1)) is not None
    assert compare(got, expected, ulp(8)) is None
