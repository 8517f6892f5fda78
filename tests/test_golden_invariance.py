"""goldens.h5 is a function of the case declarations alone, never of the host.

Two hosts' libms, SIMD widths and thread counts round float64 transcendentals and sums
differently in the last place; the generator's exact references (conformance.exact) take those
last bits out of PyTorch's hands. Here that is checked two ways:

- regeneration under each ATen CPU capability this CPU has (avx2, avx512: different SIMD code,
  as another host's libm would be), at one thread and at several, gives the committed bytes
  (tests/test_goldens.py checks the generator's own setting, the scalar kernels);
- every float64 expected value that a transcendental, a quotient or a sum of inexact terms
  touches is the correctly rounded value of the math: the references evaluated again at twice
  the precision, and for element_unary's outputs mpmath's functions called directly, round to
  the stored bits.
"""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys

import numpy as np
import pytest

mpmath = pytest.importorskip("mpmath", reason="the exact references need mpmath (the goldens and dev extras)")

from conformance import exact  # noqa: E402
from conformance.cases import CASE_MODULES  # noqa: E402
from conformance.golden import DEFAULT_PATH, GoldenStore, exact_references  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Regenerate with torch forced onto one capability and thread count, in a process of its own (the
# capability is read once, when torch is imported).
_REGENERATE = """
import os, sys
capability, threads, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.environ["ATEN_CPU_CAPABILITY"] = capability
import torch
torch.set_num_threads(threads)
from conformance.golden import write_goldens
write_goldens(path, capability=capability)
"""

# x86's capabilities from the least to the most; a CPU runs every one up to its own.
X86_CAPABILITIES = ("default", "avx2", "avx512")


def _capabilities() -> list[str]:
    """The ATen CPU capabilities this machine can run (its best one, and every one below it)."""
    best = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                          capture_output=True, text=True, check=True, env=_without_capability()).stdout.strip().lower()
    if best not in X86_CAPABILITIES:
        return ["default"]
    return list(X86_CAPABILITIES[:X86_CAPABILITIES.index(best) + 1])


def _without_capability() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    return env


def _settings() -> list[tuple[str, int]]:
    """(capability, threads): every SIMD capability this CPU has, on one thread and on several in
    turn (4, past this machine's cores where it has fewer: ATen still splits); the scalar kernels
    on one thread where there is no other. tests/test_goldens.py regenerates with the generator's
    own setting (the scalar kernels, torch's default threads), so together they cover both thread
    counts under every capability at the cost of one regeneration each."""
    simd = [capability for capability in _capabilities() if capability != "default"]
    if not simd:
        return [("default", 1)]
    return [(capability, 1 if index % 2 == 0 else 4) for index, capability in enumerate(simd)]


def test_regeneration_is_the_same_under_every_cpu_capability_and_thread_count(tmp_path):
    torch = pytest.importorskip("torch", reason="regenerating goldens needs torch (the goldens extra)")
    committed = GoldenStore(DEFAULT_PATH).attrs.get("torch_version")
    if torch.__version__.split("+")[0] != committed:
        pytest.skip(f"goldens.h5 was made with torch {committed}, this is {torch.__version__}")
    settings = _settings()
    processes = []
    for capability, threads in settings:
        path = str(tmp_path / f"goldens_{capability}_{threads}.h5")
        processes.append((capability, threads, path, subprocess.Popen(
            [sys.executable, "-c", _REGENERATE, capability, str(threads), path], cwd=ROOT, env=_without_capability(),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    different = []
    for capability, threads, path, process in processes:
        output, _ = process.communicate()
        assert process.returncode == 0, f"regenerating under {capability} on {threads} threads failed:\n{output}"
        if not filecmp.cmp(path, DEFAULT_PATH, shallow=False):
            different.append(f"{capability} on {threads} threads: {', '.join(_differing_datasets(path)[:8])}")
    assert not different, ("goldens.h5 depends on the host: regenerated under\n  " + "\n  ".join(different))


def _differing_datasets(path: str) -> list[str]:
    import h5py

    names: list[str] = []
    with h5py.File(path, "r") as ours, h5py.File(DEFAULT_PATH, "r") as committed:
        def visit(name, item):
            if isinstance(item, h5py.Dataset) and (name not in committed or
                                                   item[()].tobytes() != committed[name][()].tobytes()):
                names.append(name)
        ours.visititems(visit)
    return names or ["(attributes or layout)"]


# --------------------------------------------------------------------------- correct rounding


def _float64_cases_with_references():
    for _op, module in sorted(CASE_MODULES.items()):
        if getattr(module, "exact_program", None) is None:
            continue
        for case in module.TABLE:
            if case.dtype == np.float64:
                yield pytest.param(module, case, id=case.key)


@pytest.fixture(scope="module")
def store():
    return GoldenStore(DEFAULT_PATH)


@pytest.mark.parametrize("module, case", list(_float64_cases_with_references()))
def test_float64_goldens_are_correctly_rounded(module, case, store):
    """Every finite float64 golden of an exact reference is its value at twice the precision, rounded once."""
    pytest.importorskip("torch", reason="the linear references read PyTorch's Jacobians")
    original = exact.PRECISION
    try:
        exact.PRECISION = 2 * original
        references = exact_references(module, case)
    finally:
        exact.PRECISION = original
    golden = store.get(case)
    for name, reference in references.items():
        stored = golden.expected[name]
        rounded = exact.round_to(reference, np.float64)
        finite = np.isfinite(stored)
        wrong = np.flatnonzero(finite & (rounded != stored))
        assert wrong.size == 0, (f"{case.key} {name}: {wrong.size} values are not the correctly rounded ones, "
                                 f"first at {np.unravel_index(wrong[0], stored.shape)}: stored {stored.flat[wrong[0]]!r}, "
                                 f"correctly rounded {rounded.flat[wrong[0]]!r}")


# element_unary's outputs, from mpmath's functions called here: an evaluation that shares nothing
# with conformance.exact's activation table.
_DIRECT = {
    "SIGMOID": lambda x, a: 1 / (1 + mpmath.e ** -x),
    "TANH": lambda x, a: mpmath.sinh(x) / mpmath.cosh(x),
    "GELU": lambda x, a: x * mpmath.ncdf(x),
    "SILU": lambda x, a: x / (1 + mpmath.e ** (-(1 if a is None else a) * x)),
    "ELU": lambda x, a: x if x > 0 else (1 if a is None else a) * (mpmath.e ** x - 1),
    "EXP": lambda x, a: mpmath.e ** x,
    "SIN": lambda x, a: mpmath.sin(x),
    "COS": lambda x, a: mpmath.cos(x),
    "RSQRT": lambda x, a: x ** mpmath.mpf(-0.5),
    "POW": lambda x, a: x ** mpmath.mpf(a),
}


@pytest.mark.parametrize("case", [c for c in CASE_MODULES["element_unary"].TABLE
                                  if c.dtype == np.float64 and c.attrs.op_type.name in _DIRECT], ids=lambda c: c.name)
def test_element_unary_float64_outputs_are_mpmaths_functions_rounded_once(case, store):
    stored = store.get(case).expected["output"].reshape(-1)
    function = _DIRECT[case.attrs.op_type.name]
    with mpmath.workprec(320):
        for index, x in enumerate(case.inputs["input"].reshape(-1)):
            x = float(x)
            if x != x:
                continue
            value = function(mpmath.mpf(x), case.attrs.scalar)
            expected = float(mpmath.mpf(value, prec=53, rounding="n")) if value != 0 else 0.0
            assert stored[index] == expected, (f"{case.key} output[{index}] = {stored[index]!r} for x = {x!r}; "
                                               f"correctly rounded: {expected!r}")


def test_a_program_that_fails_leaves_no_partial_file(tmp_path, monkeypatch):
    """The generator writes to a temporary beside the goldens and renames it into place; a case whose
    program raises leaves neither the temporary nor a goldens file."""
    torch = pytest.importorskip("torch", reason="regenerating goldens needs torch (the goldens extra)")
    from conformance import golden

    def failing(module, case):
        raise ZeroDivisionError("a reference that cannot be computed")

    monkeypatch.setattr(golden, "run_program", failing)
    with pytest.raises(ZeroDivisionError):
        golden.write_goldens(str(tmp_path / "goldens.h5"), ops=["transpose"],
                             capability=torch.backends.cpu.get_cpu_capability().lower())
    assert os.listdir(tmp_path) == []
