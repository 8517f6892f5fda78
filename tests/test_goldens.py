"""goldens.h5 is fresh: every declared case is in it, it was made from the current
declarations, and regenerating it reproduces the committed bytes."""

import filecmp
import importlib.util
import os
import subprocess
import sys

import pytest

from conformance.cases import CASE_MODULES, all_cases, softmax
from conformance.golden import DEFAULT_PATH, GoldenStore, cases_digest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_declared_case_is_stored(store):
    missing = [c.key for c in all_cases() if c.key not in store.goldens]
    assert not missing, f"declared but not in {store.path}: {missing}; run `python generate_goldens.py`"


def test_no_stored_case_is_undeclared(store):
    declared = {c.key for c in all_cases()}
    extra = sorted(set(store.goldens) - declared)
    assert not extra, f"in {store.path} but not declared: {extra}; run `python generate_goldens.py`"


def test_digest_matches_declarations(store):
    assert store.attrs.get("cases_digest") == cases_digest(), (
        f"{store.path} is older than the case declarations; run `python generate_goldens.py`")


def test_every_op_has_cases():
    for op, module in CASE_MODULES.items():
        assert len(module.TABLE) >= 3, f"{op} declares too few cases"


def test_regeneration_is_byte_identical(tmp_path):
    torch = pytest.importorskip("torch", reason="regenerating goldens needs torch (the goldens extra)")
    committed = GoldenStore(DEFAULT_PATH).attrs.get("torch_version")
    if torch.__version__.split("+")[0] != committed:
        pytest.skip(f"goldens.h5 was made with torch {committed}, this is {torch.__version__}")
    path = str(tmp_path / "goldens.h5")
    # A process of its own: the generator pins ATen's CPU kernels before torch is imported,
    # which this process (benchmarks, references) may already have done.
    subprocess.run([sys.executable, os.path.join(ROOT, "generate_goldens.py"), "--output", path], check=True, cwd=ROOT)
    assert filecmp.cmp(path, DEFAULT_PATH, shallow=False), (
        "regenerated goldens differ from goldens.h5; run `python generate_goldens.py` and commit the result")


# --------------------------------------------------------------------------- what the digest covers


def _edited_softmax(tmp_path, old, new):
    """conformance/cases/softmax.py with `old` replaced by `new`, imported as a module of its own."""
    source = open(softmax.__file__).read()
    assert old in source, f"the test's anchor {old!r} is gone from softmax.py"
    path = tmp_path / "softmax_edited.py"
    path.write_text(source.replace(old, new, 1))
    spec = importlib.util.spec_from_file_location("conformance.cases.softmax_edited", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digest(module):
    return cases_digest({"softmax": module})


PROGRAM = "    input = tensors[\"input\"].requires_grad_()\n"


@pytest.mark.parametrize("old, new", [
    (PROGRAM, "    # a comment in the PyTorch program\n" + PROGRAM),
    (PROGRAM, PROGRAM + "    # trailing\n\n"),
    ('"""softmax cases:', '"""The softmax cases (a reworded module docstring):'),
    ("def torch_program(case, tensors):\n", "def torch_program(case, tensors):\n    \"\"\"A new docstring.\"\"\"\n"),
    ("TABLE = CaseTable(\"softmax\")", "TABLE = CaseTable(  \"softmax\"  )  # spacing and a comment"),
    # A module's own harness (run) calls the kernels and never feeds a golden.
    ("TABLE = CaseTable(\"softmax\")", "def run(case, env):\n    env.op()\n\n\nTABLE = CaseTable(\"softmax\")"),
])
def test_digest_ignores_comments_docstrings_and_the_harness(tmp_path, old, new):
    assert _digest(_edited_softmax(tmp_path, old, new)) == _digest(softmax)


@pytest.mark.parametrize("old, new", [
    ("torch.softmax(input, case.attrs.dim)", "torch.softmax(input * 1, case.attrs.dim)"),
    ("torch.softmax(input, case.attrs.dim)", "torch.log_softmax(input, case.attrs.dim)"),
    ('"output": output', '"output": output.detach()'),
])
def test_digest_follows_the_torch_program(tmp_path, old, new):
    assert _digest(_edited_softmax(tmp_path, old, new)) != _digest(softmax)


def test_digest_follows_a_case_declaration(tmp_path):
    edited = _edited_softmax(tmp_path, 'description="DFL decode:', 'description="DFL:')
    assert _digest(edited) != _digest(softmax)


def test_bfloat16_is_stored_as_its_bits_and_read_back(tmp_path):
    import h5py
    import numpy as np

    from conformance.golden import _dataset, _read
    from kernels.runtime.core import BFLOAT16

    values = np.array([1.0, -2.5, 3.0e38, 2.0 ** -130, np.inf], dtype=BFLOAT16)
    with h5py.File(tmp_path / "t.h5", "w") as store:
        _dataset(store, "b", values)
        _dataset(store, "h", np.array([1.0, -2.5], np.float16))
    with h5py.File(tmp_path / "t.h5", "r") as store:
        assert store["b"].dtype == np.uint16 and store["b"].attrs["dtype"] == "bfloat16"
        back = _read(store["b"])
        half = _read(store["h"])
    assert back.dtype == BFLOAT16 and back.view(np.uint16).tolist() == values.view(np.uint16).tolist()
    assert half.dtype == np.float16 and half.tolist()[:2] == [1.0, -2.5]
