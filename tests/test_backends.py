"""The conformance run judging other libraries (conformance.backends, docs/backends.md): the protocol on
small fake backends (one wrong on purpose is caught, one that raises is reported and the run goes on,
what one lacks is skipped with the reason), the C ABI through the example library compiled here (it
passes its goldens; its broken build fails them), and the command line and pytest options."""

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import kernels
from conformance import __main__ as cli
from conformance.backends import KERNELS, Backend, Unsupported, load
from conformance.cases import CASE_MODULES
from conformance.harness import runs
from conformance.runner import run_case

from .conftest import run_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "c_backend", "kb_example.c")
HEADER_DIR = os.path.join(ROOT, "conformance", "backends")
C_OPS = ("transpose", "softmax", "element_binary")


def _cases(op, *names):
    return [case for case in CASE_MODULES[op].TABLE if not names or case.name in names]


# --------------------------------------------------------------------------- fake backends


class _Transpose:
    """kernels' transpose with a forward that leaves the last element of the output unwritten."""

    init_kernel, backward_kernel, cleanup_kernel = (kernels.transpose.init_kernel, kernels.transpose.backward_kernel,
                                                    kernels.transpose.cleanup_kernel)

    @staticmethod
    def forward_kernel(stream, handle, state, attrs, input, output):
        kernels.transpose.forward_kernel(stream, handle, state, attrs, input, output)
        output.reshape(-1)[-1:] = 0


class Wrong:
    """A backend of one op, transpose, wrong in one element (its other ops: none)."""

    name = "wrong"
    transpose = _Transpose


class Raising(Backend):
    """Every op is kernels', but softmax's forward raises; supports raises for reshape."""

    name = "raising"

    def op(self, name):
        if name != "softmax":
            return KERNELS.op(name)

        class Softmax:
            init_kernel, backward_kernel, cleanup_kernel = (kernels.softmax.init_kernel, kernels.softmax.backward_kernel,
                                                            kernels.softmax.cleanup_kernel)

            @staticmethod
            def forward_kernel(*args):
                raise RuntimeError("softmax exploded")

        return Softmax

    def supports(self, case, device):
        if case.op == "reshape":
            raise ValueError("cannot say")
        return None


class NoViews(Backend):
    """kernels' ops, declared to take no views: each tensor its own allocation, aligned runs only."""

    name = "no-views"
    views = False

    def op(self, name):
        return KERNELS.op(name)


class ForwardOnly(Backend):
    """kernels' ops without backward, which skips every case that calls backward; float64 only."""

    name = "forward-only"

    def op(self, name):
        module = KERNELS.op(name)
        return type("Forward", (), {f: staticmethod(getattr(module, f))
                                    for f in ("init_kernel", "forward_kernel", "cleanup_kernel")})

    def supports(self, case, device):
        return None if np.dtype(case.dtype) == np.float64 else "float64 only"


class UnsupportedInCall(Backend):
    """Raises Unsupported from init: the case is skipped with the message."""

    name = "unsupported-in-call"

    def op(self, name):
        class Op:
            forward_kernel = backward_kernel = cleanup_kernel = staticmethod(lambda *args: None)

            @staticmethod
            def init_kernel(*args):
                raise Unsupported("no plan for these shapes")

        return Op


class _CrashingTranspose(_Transpose):
    """kernels' transpose, whose forward kills its process on two inputs: SIGSEGV on float32 (2, 3, 4)
    (transpose/3d_cycle_201; with CRASH_LEAVES_CHILD set to a file, after forking a child that sleeps a
    minute and writing its pid there),
    os._exit(3) on uint8 (transpose/3d_021_uint8)."""

    @staticmethod
    def forward_kernel(stream, handle, state, attrs, input, output):
        if input.shape == (2, 3, 4) and input.dtype == np.float32:
            if os.environ.get("CRASH_LEAVES_CHILD"):  # a child that holds the worker's pipe, its pid in that file
                child = os.fork()
                if child == 0:
                    time.sleep(60)
                    os._exit(0)
                with open(os.environ["CRASH_LEAVES_CHILD"], "w") as file:
                    file.write(str(child))
            os.kill(os.getpid(), signal.SIGSEGV)
        if input.dtype == np.uint8:
            os._exit(3)
        kernels.transpose.forward_kernel(stream, handle, state, attrs, input, output)


class Crashing:
    """A backend of one op, transpose, that crashes on two cases. With CRASH_AT_LOAD set, it exits as it is
    made in a worker process (multiprocessing's child), before any case."""

    name = "crashing"
    transpose = _CrashingTranspose

    def __init__(self):
        if os.environ.get("CRASH_AT_LOAD") and multiprocessing.parent_process() is not None:
            os._exit(4)


class _HangingTranspose(_Transpose):
    """kernels' transpose, whose forward sleeps an hour (a hang) on float32 (2, 3, 4) (transpose/3d_cycle_201);
    with HANG_IGNORES_TERM set, deaf to SIGTERM."""

    @staticmethod
    def forward_kernel(stream, handle, state, attrs, input, output):
        if input.shape == (2, 3, 4) and input.dtype == np.float32:
            if os.environ.get("HANG_IGNORES_TERM"):
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(3600)
        kernels.transpose.forward_kernel(stream, handle, state, attrs, input, output)


class Hanging:
    """A backend of one op, transpose, that hangs in one case."""

    name = "hanging"
    transpose = _HangingTranspose


def test_a_backend_wrong_in_one_element_is_caught(store):
    backend = load("tests.test_backends:Wrong")
    assert backend.name == "wrong"
    result = run_case(_cases("transpose", "2d_3x5")[0], store.get(_cases("transpose", "2d_3x5")[0]), "cpu",
                      backend=backend)
    assert result.status == "failed"
    assert "output (poison random): 1 of 15 values differ" in result.message
    assert result.max_ulps is not None and result.max_ulps > 0
    softmax = _cases("softmax")[0]
    skipped = run_case(softmax, store.get(softmax), "cpu", backend=backend)
    assert (skipped.status, skipped.message) == ("skipped", "backend wrong has no softmax")


def test_a_backend_that_raises_is_reported_and_the_run_goes_on(store):
    backend = Raising()
    softmax = _cases("softmax")[0]
    result = run_case(softmax, store.get(softmax), "cpu", backend=backend)
    assert result.status == "failed" and "raised" in result.message and "softmax exploded" in result.message
    reshape = _cases("reshape")[0]
    result = run_case(reshape, store.get(reshape), "cpu", backend=backend)
    assert result.status == "failed" and "supports raised" in result.message and "cannot say" in result.message
    transpose = _cases("transpose")[0]
    assert run_case(transpose, store.get(transpose), "cpu", backend=backend).status == "passed"


def test_what_a_backend_lacks_is_skipped_with_the_reason(store):
    backward_case = _cases("softmax", "f64_3d_dim0")[0]
    result = run_case(backward_case, store.get(backward_case), "cpu", backend=ForwardOnly())
    assert (result.status, result.message) == ("skipped", "backend forward-only's softmax has no backward_kernel")
    float32 = _cases("softmax")[0]
    assert run_case(float32, store.get(float32), "cpu", backend=ForwardOnly()).message == "float64 only"
    forward_only = next(c for c in CASE_MODULES["conv_2d"].TABLE if not c.attrs.backward and np.dtype(c.dtype) == np.float64)
    assert run_case(forward_only, store.get(forward_only), "cpu", backend=ForwardOnly()).status == "passed"
    result = run_case(float32, store.get(float32), "cpu", backend=UnsupportedInCall())
    assert (result.status, result.message) == ("skipped", "backend unsupported-in-call: no plan for these shapes")


def test_a_backend_without_views_runs_without_margins(store):
    assert {layout for _, layout, _ in runs("cpu", NoViews())} == {"aligned"}
    assert {layout for _, layout, _ in runs("gpu", NoViews())} == {"aligned"}
    assert {schedule for schedule, _, _ in runs("gpu", NoViews())} == {"plain", "delayed", "foreign"}
    assert {schedule for schedule, _, _ in runs("gpu")} == {"plain", "delayed", "foreign", "small"}
    for case in _cases("concat")[:3] + _cases("batch_norm")[:2]:
        assert run_case(case, store.get(case), "cpu", backend=NoViews()).status == "passed", case.key


def test_load_refuses_what_it_cannot_load():
    with pytest.raises(ValueError, match="unknown backend 'nonsense'"):
        load("nonsense")
    with pytest.raises(ValueError, match="cannot import no_such_module"):
        load("no_such_module:BACKEND")
    with pytest.raises(ValueError, match="has no attribute Missing"):
        load("tests.test_backends:Missing")
    with pytest.raises(ValueError, match="cannot load"):
        load("c:/no/such/library.so")
    assert load("kernels") is KERNELS


def test_the_command_line_names_the_backend_and_its_skips(capsys, tmp_path):
    xml_path, json_path = tmp_path / "report.xml", tmp_path / "report.json"
    status, out, _ = run_main(capsys, cli.main, ["--backend", "tests.test_backends:Wrong", "--device", "cpu",
                                                 "--op", "transpose", "--op", "softmax", "--junit-xml", str(xml_path),
                                                 "--json", str(json_path)])
    assert status == 1
    assert "backend wrong: schedules plain, delayed, foreign; red-zone margins applied" in out
    assert "skipped cpu: backend wrong has no softmax" in out
    assert "FAILED transpose/2d_3x5[cpu] (max " in out
    transposes, softmaxes = len(CASE_MODULES["transpose"].TABLE), len(CASE_MODULES["softmax"].TABLE)
    # It fails wherever the golden's last element is not 0.
    failing = sum(1 for c in CASE_MODULES["transpose"].TABLE
                  if c.inputs["input"].size and np.transpose(c.inputs["input"], c.attrs.permutation).flat[-1] != 0)
    assert out.rstrip().endswith(f"{transposes - failing} passed, {failing} failed, {softmaxes} skipped (backend wrong)")
    suite = ET.parse(xml_path).getroot()[0]
    assert {p.get("name"): p.get("value") for p in suite.find("properties")}["backend"] == "wrong"
    assert {s.get("message") for s in suite.iter("skipped")} == {"backend wrong has no softmax"}
    data = json.loads(json_path.read_text())
    assert data["summary"]["backend"]["name"] == "wrong"
    status, _, err = run_main(capsys, cli.main, ["--backend", "nonsense", "--device", "cpu"])
    assert status == 2 and "--backend nonsense: unknown backend" in err


# --------------------------------------------------------------------------- a backend that crashes

CRASH_ARGV = ["--backend", "tests.test_backends:Crashing", "--device", "cpu", "--op", "transpose", "-k", "transpose/3d_[c0]*"]
CRASHES = {"transpose/3d_cycle_201[cpu]": "died with SIGSEGV (signal 11)",
           "transpose/3d_021_uint8[cpu]": "exited with status 3"}


def test_death_names_the_signal_or_the_exit_status():
    from conformance.spread import death

    assert death(-11) == "died with SIGSEGV (signal 11)"
    assert death(-signal.SIGKILL) == "died with SIGKILL (signal 9)"
    assert death(-200) == "died with an unknown signal (signal 200)"
    assert death(3) == "exited with status 3"


def test_isolation_is_a_backends_default_that_it_may_declare():
    from conformance.backends import adapt

    assert (KERNELS.isolate, load("tests.test_backends:Crashing").isolate) == (False, False)
    assert adapt(type("Fragile", (), {"isolate": True})()).isolate is True


def test_a_case_that_crashes_its_process_fails_and_the_run_goes_on(capsys, tmp_path):
    """--isolate: the two cases whose process died fail, naming how, in the printed report, JSON and JUnit;
    the one between them passes, in a fresh process; --jobs 2 gives the same results in the same order."""
    reports = []
    for extra in (["--isolate"], ["--jobs", "2"]):
        xml_path, json_path = tmp_path / "report.xml", tmp_path / "report.json"
        status, out, err = run_main(capsys, cli.main, [*CRASH_ARGV, *extra, "--junit-xml", str(xml_path),
                                                       "--json", str(json_path)])
        assert status == 1
        for key, how in CRASHES.items():
            assert f"FAILED {key}\n" in out
            assert f"the backend's process {how} during this case (the run went on without it)" in out
            assert f"the process {how} during {key}" in err
        assert out.rstrip().endswith("1 passed, 2 failed, 0 skipped (backend crashing)")
        data = json.loads(json_path.read_text())
        crashed = {f"{r['op']}/{r['case']}[{r['device']}]": r for r in data["results"] if r["status"] == "failed"}
        assert set(crashed) == set(CRASHES)
        assert all(CRASHES[key] in r["message"] and r["max_ulps"] is None for key, r in crashed.items())
        failures = {case.get("name"): case.find("failure") for case in ET.parse(xml_path).getroot()[0].iter("testcase")}
        assert {name for name, failure in failures.items() if failure is not None} == {"3d_cycle_201[cpu]",
                                                                                       "3d_021_uint8[cpu]"}
        assert "SIGSEGV (signal 11)" in failures["3d_cycle_201[cpu]"].text
        reports.append(data["results"])
    assert reports[0] == reports[1]


def test_a_worker_that_dies_before_its_first_case_fails_its_cases(capsys, monkeypatch):
    """A fresh worker that dies before it starts a case would die again: its cases fail, saying so, and the
    run ends instead of starting workers forever."""
    monkeypatch.setenv("CRASH_AT_LOAD", "1")
    status, out, err = run_main(capsys, cli.main, [*CRASH_ARGV[:-1], "transpose/3d_cycle_1*", "--isolate"])
    assert status == 1
    assert "the backend's process exited with status 4 before this case started" in out
    assert out.rstrip().endswith("0 passed, 1 failed, 0 skipped (backend crashing)")
    assert "[worker 0: the process exited with status 4 before its first case; its 1 cases failed]" in err


def test_a_worker_that_dies_is_seen_dead_though_its_child_holds_its_pipe(capsys, monkeypatch, tmp_path):
    """A library that forks leaves a child holding the worker's pipe open after the worker dies: the run
    notices the death by the worker's exit status, not the pipe's end, and does not wait for the child."""
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("CRASH_LEAVES_CHILD", str(pid_file))
    start = time.monotonic()
    try:
        status, out, _ = run_main(capsys, cli.main, [*CRASH_ARGV[:-1], "transpose/3d_cycle_2*", "--isolate"])
        assert time.monotonic() - start < 40  # the child sleeps 60 s
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert status == 1 and "the backend's process died with SIGSEGV (signal 11) during this case" in out


def test_a_case_that_runs_past_the_timeout_fails_and_the_run_goes_on(capsys, tmp_path):
    """--case-timeout: the case that hangs fails, its worker killed, and the others pass in a fresh one; the
    reports read as for a crash. Without --isolate (implied) and with --jobs 2, the same results in order."""
    argv = ["--backend", "tests.test_backends:Hanging", *CRASH_ARGV[2:], "--case-timeout", "2"]
    key = "transpose/3d_cycle_201[cpu]"
    message = "the case ran past --case-timeout 2 s; its worker was killed and the run went on"
    reports = []
    for extra in ([], ["--jobs", "2"]):
        xml_path, json_path = tmp_path / "report.xml", tmp_path / "report.json"
        start = time.monotonic()
        status, out, err = run_main(capsys, cli.main, [*argv, *extra, "--junit-xml", str(xml_path),
                                                       "--json", str(json_path)])
        assert time.monotonic() - start < 60  # the backend sleeps an hour
        assert status == 1
        assert f"FAILED {key}\ntranspose / 3d_cycle_201 / cpu:\n{message}\n" in out
        assert f"{key} ran past --case-timeout 2 s and the process was killed (died with SIGTERM (signal 15))" in err
        assert out.rstrip().endswith("2 passed, 1 failed, 0 skipped (backend hanging)")
        data = json.loads(json_path.read_text())
        failed = [r for r in data["results"] if r["status"] == "failed"]
        assert [(r["case"], r["max_ulps"]) for r in failed] == [("3d_cycle_201", None)] and message in failed[0]["message"]
        failures = [case.find("failure") for case in ET.parse(xml_path).getroot()[0].iter("testcase")]
        assert [f.text for f in failures if f is not None] == [failed[0]["message"]]
        reports.append(data["results"])
    assert reports[0] == reports[1]


def test_a_hung_worker_deaf_to_sigterm_is_killed(capsys, monkeypatch):
    """A worker that ignores the SIGTERM is sent SIGKILL after the grace."""
    monkeypatch.setenv("HANG_IGNORES_TERM", "1")
    argv = ["--backend", "tests.test_backends:Hanging", *CRASH_ARGV[2:-1], "transpose/3d_cycle_2*", "--case-timeout", "1"]
    status, out, err = run_main(capsys, cli.main, argv)
    assert status == 1 and "the case ran past --case-timeout 1 s; its worker was killed" in out
    assert "the process was killed (died with SIGKILL (signal 9))" in err


# --------------------------------------------------------------------------- the C ABI, on the example library


def _compiler():
    return next((path for path in (shutil.which(name) for name in ("cc", "gcc", "clang")) if path), None)


def _build(tmp_path_factory, name, *defines):
    compiler = _compiler()
    if compiler is None:
        pytest.skip("no C compiler (cc, gcc or clang) on PATH to build examples/c_backend")
    output = tmp_path_factory.mktemp("c_backend") / f"lib{name}.so"
    done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", *defines, "-I", HEADER_DIR, EXAMPLE, "-o", str(output),
                           "-lm"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return str(output)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return _build(tmp_path_factory, "kb_example")


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    return _build(tmp_path_factory, "kb_broken", "-DBREAK_TRANSPOSE", "-DBREAK_SOFTMAX")


@pytest.fixture(scope="module")
def crashing(tmp_path_factory):
    return _build(tmp_path_factory, "kb_crash", "-DCRASH_SOFTMAX")


def _judge(library, store, ops=C_OPS):
    backend = load(f"c:{library}")
    return {case.key: run_case(case, store.get(case), "cpu", backend=backend)
            for op in ops for case in CASE_MODULES[op].TABLE}


def test_the_c_example_passes_its_goldens(example, store):
    results = _judge(example, store)
    assert not [r.message for r in results.values() if r.status == "failed"]
    skipped = {key: r.message for key, r in results.items() if r.status == "skipped"}
    # transpose moves bytes: every dtype; the others take float32 and float64 only, and say so.
    assert not [key for key in skipped if key.startswith("transpose/")]
    assert set(skipped.values()) == {f"backend c:{example}: kb_{op}_forward: the example takes float32 and float64 only"
                                     for op in ("softmax", "element_binary")}
    for key, result in results.items():
        case = next(c for c in CASE_MODULES[key.split("/")[0]].TABLE if c.key == key)
        floats = np.dtype(case.dtype) in (np.float32, np.float64)
        assert result.status == ("passed" if floats or case.op == "transpose" else "skipped"), key


def test_the_c_example_skips_the_ops_it_does_not_export(example, store):
    case = _cases("concat")[0]
    result = run_case(case, store.get(case), "cpu", backend=load(f"c:{example}"))
    assert (result.status, result.message) == ("skipped", f"{example} exports no kb_concat_forward")


def test_the_broken_c_example_fails(broken, store):
    results = _judge(broken, store, ("transpose", "softmax"))
    failed = {key for key, r in results.items() if r.status == "failed"}
    # Every transpose that is not the identity or empty, and the softmaxes a naive exp overflows.
    assert {c.key for c in CASE_MODULES["transpose"].TABLE
            if list(c.attrs.permutation) != sorted(c.attrs.permutation) and c.inputs["input"].size} <= failed
    assert {"softmax/stable_pm1000", "softmax/f64_3d_dim0"} <= failed


def test_a_c_library_that_crashes_fails_those_cases_and_the_run_goes_on(crashing, capsys, tmp_path):
    """c:PATH runs in worker processes by default: the softmaxes that segfault fail, naming SIGSEGV, in the
    report, JSON and JUnit; every other case of the three ops gets its verdict of the sound build."""
    xml_path, json_path = tmp_path / "report.xml", tmp_path / "report.json"
    status, out, _ = run_main(capsys, cli.main, ["--backend", f"c:{crashing}", "--device", "cpu",
                                                 *(arg for op in C_OPS for arg in ("--op", op)),
                                                 "--junit-xml", str(xml_path), "--json", str(json_path)])
    assert status == 1
    crashed = {"softmax/stable_pm1000", "softmax/stable_pm1000_dim0"}
    results = json.loads(json_path.read_text())["results"]
    for r in results:
        key = f"{r['op']}/{r['case']}"
        if key in crashed:
            assert (r["status"], r["max_ulps"]) == ("failed", None)
            assert "the backend's process died with SIGSEGV (signal 11) during this case" in r["message"]
            continue
        case = next(c for c in CASE_MODULES[r["op"]].TABLE if c.key == key)
        floats = np.dtype(case.dtype) in (np.float32, np.float64)
        assert r["status"] == ("passed" if floats or case.op == "transpose" else "skipped"), key
    assert len(results) == sum(len(CASE_MODULES[op].TABLE) for op in C_OPS)
    assert {f"FAILED {key}[cpu]" for key in crashed} == {line for line in out.splitlines() if line.startswith("FAILED")}
    failures = [case for case in ET.parse(xml_path).getroot()[0].iter("testcase") if case.find("failure") is not None]
    assert sorted(case.get("name") for case in failures) == ["stable_pm1000[cpu]", "stable_pm1000_dim0[cpu]"]
    assert all("SIGSEGV (signal 11)" in case.find("failure").text for case in failures)


def test_a_crashing_c_library_run_in_this_process_takes_it_down(crashing):
    """--no-isolate runs the library in the command's own process: the segfault ends it, with no report."""
    done = subprocess.run([sys.executable, "-m", "conformance", "--backend", f"c:{crashing}", "--device", "cpu",
                           "--op", "softmax", "-k", "stable_pm1000_dim0", "--no-isolate"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == -signal.SIGSEGV
    assert "passed" not in done.stdout


def test_pytest_judges_a_backend_through_its_option(example):
    env = {**os.environ, "KERNELS_BACKEND": f"c:{example}"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_conformance.py",
                           "-k", "transpose and 2d_3x5 or concat and cpu and axis0_three_rank2", "-rs"],
                          capture_output=True, text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exports no kb_concat_forward" in done.stdout
    assert " passed" in done.stdout


# --------------------------------------------------------------------------- the torch backend

EXACT_IN_TORCH = ("batch_matmul", "concat", "reshape", "split", "transpose")


def _torch_results(store, device, ops, backend="torch"):
    judged = load(backend)
    return {case.key: run_case(case, store.get(case), device, backend=judged)
            for op in ops for case in CASE_MODULES[op].TABLE}


def test_torch_passes_what_pytorch_computes_as_the_goldens_do(store):
    """Data movement and matmuls of dyadic values, every float64 case of the exact and elementwise ops, and
    every float32 case of element_unary and element_binary: PyTorch's CPU results are the goldens'. Integer
    cases with a backward are skipped: autograd does not differentiate them."""
    results = _torch_results(store, "cpu", EXACT_IN_TORCH + ("element_unary", "element_binary"))
    for key, result in results.items():
        op = key.split("/")[0]
        case = next(c for c in CASE_MODULES[op].TABLE if c.key == key)
        dtype = np.dtype(case.dtype)
        if dtype.kind in "iub":
            assert (result.status, result.message) == (
                "skipped", f"PyTorch's autograd differentiates floating-point tensors only, not {dtype}"), key
        elif op in EXACT_IN_TORCH or dtype in (np.float32, np.float64):
            assert result.status == "passed", result.message


def test_torch_reports_settings_ulps_and_likely_causes(capsys, store):
    status, out, _ = run_main(capsys, cli.main, ["--backend", "torch", "--device", "cpu", "--op", "element_unary",
                                                 "-k", "*sigmoid_f16*"])
    assert status == 1
    assert "  cpu: torch " in out and "deterministic_algorithms=False" in out
    assert "FAILED element_unary/sigmoid_f16[cpu] (max 1 ulps)" in out
    assert "note (torch): float16: PyTorch rounds every op's result to float16" in out
    torch_backend = load("torch")
    conv = next(c for c in CASE_MODULES["conv_2d"].TABLE if np.dtype(c.dtype) == np.float32)
    notes = torch_backend.notes(conv, "gpu")  # the settings are read, not the device: any machine can say
    assert any(line.startswith("TF32: torch.backends.cudnn.allow_tf32 is True") for line in notes) == \
        __import__("torch").backends.cudnn.allow_tf32
    strict = load("torch-strict")
    assert not any(line.startswith(("TF32", "non-deterministic")) for line in strict.notes(conv, "gpu"))


def test_torch_strict_leaves_the_settings_as_they_were(store):
    import torch

    before = (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
              torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)
    case = _cases("batch_matmul")[0]
    assert run_case(case, store.get(case), "cpu", backend=load("torch-strict")).status == "passed"
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction) == before


@pytest.mark.gpu
def test_torch_on_the_gpu_runs_on_the_harness_stream(store):
    """On CUDA, under every schedule (the delayed and foreign ones hold the harness's stream back): the exact
    ops pass, so PyTorch's work was ordered on the stream the harness synchronizes."""
    from .conftest import require

    require("gpu")
    results = _torch_results(store, "gpu", EXACT_IN_TORCH, "torch-strict")
    assert not [r.message for r in results.values() if r.status == "failed"]
    assert any(r.status == "passed" for r in results.values())


def test_a_backend_may_name_its_layouts_per_device():
    """Backend.layouts narrows the red-zone layouts on a device (the torch backend keeps the aligned one
    on the GPU, as PyTorch's allocator places tensors), and an adapted object's method is used."""
    from conformance.backends import adapt
    from conformance.backends.torch_backend import TorchBackend

    torch = TorchBackend()
    assert {layout for _, layout, _ in runs("cpu", torch)} == {"aligned", "misaligned", "staggered"}
    assert {layout for _, layout, _ in runs("gpu", torch)} == {"aligned"}
    assert {schedule for schedule, _, _ in runs("gpu", torch)} == {"plain", "delayed", "foreign"}

    class Plain:
        def op(self, name):
            return None

        def layouts(self, device):
            return ("aligned", "staggered") if device == "cpu" else None

    adapted = adapt(Plain())
    assert {layout for _, layout, _ in runs("cpu", adapted)} == {"aligned", "staggered"}
    assert {layout for _, layout, _ in runs("gpu", adapted)} == {"aligned", "misaligned", "staggered"}
