"""Every declared case on every device against its golden, through the backend of --backend or
KERNELS_BACKEND (this library by default): a case the backend cannot run is skipped with its reason
(docs/conformance.md, docs/backends.md)."""

import pytest

from conformance.cases import all_cases
from conformance.runner import run_case

from .conftest import DEVICE_PARAMS

CASES = all_cases()


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("case", CASES, ids=[c.key for c in CASES])
def test_case(case, device, store, backend):
    stale = store.staleness(case.op)  # the whole file's freshness is tests/test_goldens.py's
    if stale:
        pytest.fail(stale)
    result = run_case(case, store.get(case), device, backend=backend)
    if result.status == "skipped":
        pytest.skip(result.message)
    assert result.status == "passed", result.message
