"""conformance.compare on the shapes the harness meets, 0-d ones included."""

import numpy as np

from conformance.case import EXACT, ulp
from conformance.compare import compare, needed_ulps, ulp_distance


def test_a_0d_mismatch_is_reported_with_its_values():
    report = compare(np.array(1.0, np.float32), np.array(2.0, np.float32), EXACT)
    assert report is not None and report.startswith("1 of 1 values differ (exact)")
    assert "at (): got np.float32(1.0), expected np.float32(2.0)" in report


def test_0d_matches_exactly_and_within_ulps():
    one = np.float32(1.0)
    assert compare(np.array(one), np.array(one), EXACT) is None
    assert compare(np.array(np.nextafter(one, np.float32(2))), np.array(one), ulp(1)) is None
    assert compare(np.array(np.nan, np.float64), np.array(np.nan, np.float64), EXACT) is None
    assert ulp_distance(np.array(np.nan, np.float32), np.array(one)) == np.inf
    assert needed_ulps(np.array(np.nextafter(one, np.float32(2))), np.array(one)) == 1.0
