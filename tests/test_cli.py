"""`python -m conformance` as a user meets it: help, filters and their errors,
devices, reports, and where it finds the golden file (in a checkout and after a
plain `pip install .`)."""

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile

import h5py
import pytest

import conformance.__main__ as cli
import conformance.golden as golden
import kernels
from conformance.cases import CASE_MODULES, all_cases
from conformance.golden import DEFAULT_PATH
from conformance.harness import device_unavailable
from conformance.runner import Result

from .conftest import run_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_REASON = device_unavailable("gpu")
needs_no_gpu = pytest.mark.skipif(GPU_REASON is None, reason="a GPU can run here; this checks the machine without one")

# One small case: fast, and exact on every device.
ONE_CASE = ["--op", "transpose", "-k", "transpose/3d_cycle_201"]


def run(capsys, *argv):
    return run_main(capsys, cli.main, argv)


def report(capsys, tmp_path, *argv):
    """Run with --json and return (exit status, the JSON report)."""
    path = tmp_path / "report.json"
    status, _, _ = run(capsys, *argv, "--json", str(path))
    return status, json.loads(path.read_text())


# --------------------------------------------------------------------------- help


def test_help_is_whole_with_examples(capsys):
    status, out, _ = run(capsys, "--help")
    assert status == 0
    assert cli.DESCRIPTION in out  # verbatim, not its first line cut mid-sentence
    assert "Exit status: 0 when no case failed; 1 when one did; 2 when the run could not" in out
    assert "examples:\n  python -m conformance " in out
    for flag in ("--device", "--op", "-k", "--goldens", "--junit-xml", "--json", "--verbose"):
        assert flag in out
    ops_listed = " ".join(out.split("ops:\n", 1)[1].split("examples:")[0].split())
    assert ops_listed == ", ".join(sorted(CASE_MODULES))


def test_help_from_the_command_line():
    done = subprocess.run([sys.executable, "-m", "conformance", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0
    assert "usage: python -m conformance" in done.stdout and "examples:" in done.stdout


# --------------------------------------------------------------------------- ops


def test_unknown_op_suggests_the_nearest_and_lists_all(capsys):
    status, out, err = run(capsys, "--op", "conv2d", "--device", "cpu")
    assert status == 2
    assert out == ""
    assert "error: unknown op 'conv2d' (did you mean 'conv_2d'?)" in err
    assert err.rstrip().endswith("the ops are: " + ", ".join(sorted(CASE_MODULES)))


def test_unknown_op_without_a_near_one(capsys):
    status, _, err = run(capsys, "--op", "transpose", "--op", "zzzz", "--device", "cpu")
    assert status == 2
    assert "unknown op 'zzzz';" in err and "did you mean" not in err


def test_pattern_that_matches_nothing(capsys):
    status, _, err = run(capsys, "--op", "transpose", "-k", "no_such_case", "--device", "cpu")
    assert status == 2
    assert "error: no case of transpose matches -k 'no_such_case'" in err


def test_repeated_op_and_device_run_once(capsys, tmp_path):
    status, data = report(capsys, tmp_path, *ONE_CASE, "--op", "transpose", "--device", "cpu", "--device", "cpu")
    assert status == 0
    assert [(r["op"], r["case"], r["device"]) for r in data["results"]] == [("transpose", "3d_cycle_201", "cpu")]


def test_ops_filter_and_verbose(capsys):
    status, out, _ = run(capsys, "--op", "reshape", "--op", "transpose", "--device", "cpu", "-v")
    assert status == 0
    count = len(CASE_MODULES["reshape"].TABLE) + len(CASE_MODULES["transpose"].TABLE)
    assert out.count("PASSED  ") == count
    assert f"{count} passed, 0 failed, 0 skipped" in out


# --------------------------------------------------------------------------- devices


@pytest.mark.parametrize("name, device", [("cpu", "cpu"), ("gpu", "gpu"), ("gpu:0", "gpu"), ("gpu:1", "gpu:1"),
                                          ("gpu:12", "gpu:12")])
def test_device_names(name, device):
    assert cli.runner_device(name) == device


@pytest.mark.parametrize("name, message", [
    ("tpu", "invalid device 'tpu': expected cpu, gpu or gpu:N"),
    ("gpu:", "invalid device 'gpu:'"),
    ("gpu:x", "invalid device 'gpu:x'"),
    ("GPU", "invalid device 'GPU'"),
    ("gpu:-1", "invalid device 'gpu:-1'"),
])
def test_bad_device_is_a_usage_error(capsys, name, message):
    status, _, err = run(capsys, "--device", name)
    assert status == 2
    assert "usage: python -m conformance" in err and message in err


@needs_no_gpu
@pytest.mark.parametrize("name, reported", [("gpu", "gpu"), ("gpu:0", "gpu"), ("gpu:1", "gpu:1")])
def test_gpu_asked_for_without_one_is_an_error(capsys, name, reported):
    status, out, err = run(capsys, *ONE_CASE, "--device", "cpu", "--device", name)
    assert status == 2
    assert out == ""  # nothing ran, not even the CPU
    assert f"error: --device {reported} cannot run here: {GPU_REASON}" in err


@needs_no_gpu
def test_default_devices_skip_the_gpu_with_the_reason(capsys, tmp_path):
    status, data = report(capsys, tmp_path, *ONE_CASE)
    assert status == 0
    assert [(r["device"], r["status"], r["message"]) for r in data["results"]] == [
        ("cpu", "passed", ""), ("gpu", "skipped", GPU_REASON)]
    status, out, _ = run(capsys, *ONE_CASE)
    assert f"skipped gpu: {GPU_REASON}" in out
    assert "1 passed, 0 failed, 1 skipped" in out


# --------------------------------------------------------------------------- reports


@pytest.fixture
def tampered_goldens(tmp_path):
    """A copy of goldens.h5 whose transpose/2d_3x5 output is wrong in one element, checksum and all
    (as a wrong golden would be): the kernel fails against it."""
    path = tmp_path / "goldens.h5"
    shutil.copyfile(DEFAULT_PATH, path)
    with h5py.File(path, "r+") as store:
        dataset = store["transpose/2d_3x5/expected/output"]
        values = dataset[()]
        values[1, 2] += 1
        dataset[...] = values
        golden.seal(dataset)
    return str(path)


def test_a_failure_exits_1_and_says_where(capsys, tampered_goldens):
    status, out, _ = run(capsys, "--op", "transpose", "-k", "2d_3x5", "--device", "cpu", "--goldens", tampered_goldens)
    assert status == 1
    assert "FAILED transpose/2d_3x5[cpu]" in out
    assert "output (poison random):" in out
    assert "0 passed, 1 failed, 0 skipped" in out


def test_junit_xml_and_json_of_a_real_failure(capsys, tmp_path, tampered_goldens):
    xml_path, json_path = tmp_path / "report.xml", tmp_path / "report.json"
    status, _, _ = run(capsys, "--op", "transpose", "--device", "cpu",
                       "--goldens", tampered_goldens, "--junit-xml", str(xml_path), "--json", str(json_path))
    assert status == 1
    count = len(CASE_MODULES["transpose"].TABLE)

    suites = ET.parse(xml_path).getroot()
    assert suites.tag == "testsuites" and len(suites) == 1
    suite = suites[0]
    assert suite.tag == "testsuite" and suite.get("name") == "conformance"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        str(count), "1", "0", "0")
    testcases = suite.findall("testcase")
    assert len(testcases) == count
    assert {t.get("classname") for t in testcases} == {"conformance.transpose"}
    failed = [t for t in testcases if t.find("failure") is not None]
    assert [t.get("name") for t in failed] == ["2d_3x5[cpu]"]
    failure = failed[0].find("failure")
    assert failure.get("message") == "transpose / 2d_3x5 / cpu: (max 4194304 ulps)"  # 0.25 made 1.25: 2^22 float32 ulps
    assert {p.get("name"): p.get("value") for p in suite.find("properties")} == {"backend": "kernels", "margins": "true"}
    assert "output (poison random):" in failure.text and "output (poison nan):" in failure.text

    data = json.loads(json_path.read_text())
    assert data["summary"] == {"passed": count - 1, "failed": 1, "skipped": 0, "total": count,
                               "goldens": tampered_goldens,
                               "backend": {"name": "kernels", "schedules": ["plain", "delayed", "foreign", "small"],
                                           "margins": True, "settings": {}}}
    assert len(data["results"]) == count
    wrong = [r for r in data["results"] if r["status"] == "failed"]
    assert [(r["op"], r["case"], r["device"]) for r in wrong] == [("transpose", "2d_3x5", "cpu")]
    assert wrong[0]["message"] == failure.text
    assert set(data["results"][0]) == {"op", "case", "device", "status", "message", "max_ulps"}
    assert wrong[0]["max_ulps"] == 4194304 and {r["max_ulps"] for r in data["results"] if r["status"] == "passed"} == {None}


def test_junit_xml_of_skips_and_odd_characters(capsys, tmp_path, monkeypatch):
    """Skipped testcases carry the reason; a character XML cannot hold does not break the file."""
    def fake_run_case(case, golden, device, schedules=None, backend=None):
        if case.name == "2d_3x5":
            return Result(case.op, case.name, device, "failed", "bad\x00 value\nsecond line")
        return Result(case.op, case.name, device, "skipped", "no \x1b[1mdevice\x1b[0m here")

    monkeypatch.setattr(cli, "run_case", fake_run_case)
    xml_path = tmp_path / "report.xml"
    status, _, _ = run(capsys, "--op", "transpose", "-k", "transpose/[23]d_*", "--device", "cpu",
                       "--junit-xml", str(xml_path))
    assert status == 1
    suite = ET.parse(xml_path).getroot()[0]
    testcases = {t.get("name"): t for t in suite.findall("testcase")}
    assert suite.get("failures") == "1" and suite.get("skipped") == str(len(testcases) - 1)
    assert testcases["2d_3x5[cpu]"].find("failure").get("message") == "bad? value"
    assert testcases["2d_3x5[cpu]"].find("failure").text == "bad? value\nsecond line"
    skipped = testcases["3d_cycle_201[cpu]"].find("skipped")
    assert skipped.get("message") == "no ?[1mdevice?[0m here"


# --------------------------------------------------------------------------- the golden file


def test_goldens_that_do_not_exist(capsys, tmp_path):
    missing = str(tmp_path / "nothing.h5")
    status, _, err = run(capsys, "--device", "cpu", "--goldens", missing)
    assert status == 2
    assert f"error: --goldens {missing}: no such file" in err


def test_no_goldens_found_says_where_it_looked(capsys, tmp_path, monkeypatch):
    root, package = str(tmp_path / "root" / "goldens.h5"), str(tmp_path / "site" / "conformance" / "goldens.h5")
    monkeypatch.setattr(golden, "DEFAULT_PATH", root)
    monkeypatch.setattr(golden, "PACKAGE_PATH", package)
    status, _, err = run(capsys, "--device", "cpu")
    assert status == 2
    assert f"error: no golden file: looked for {root} and {package}. Pass --goldens FILE" in err


def test_stale_goldens_say_to_regenerate(capsys, tmp_path):
    path = tmp_path / "goldens.h5"
    shutil.copyfile(DEFAULT_PATH, path)
    with h5py.File(path, "r+") as store:
        store["softmax"].attrs["cases_digest"] = "0" * 64
    status, _, err = run(capsys, "--op", "softmax", "--device", "cpu", "--goldens", str(path))
    assert status == 2
    assert "older than the case declarations of softmax" in err and "python generate_goldens.py" in err


def test_a_checkout_reads_its_root_copy():
    assert golden.find_goldens() == DEFAULT_PATH
    assert not os.path.exists(golden.PACKAGE_PATH), "a second golden file in the source package would go stale"


def test_installed_package_carries_its_goldens(tmp_path):
    """`pip install .` builds a wheel: it must hold goldens.h5 inside `conformance`, byte-identical to the
    root copy, and the CLI run from the installed files, away from any checkout, must find it."""
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools")
    source = _mkdir(tmp_path / "source")  # a copy, so the build leaves nothing in the checkout
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "goldens.h5"):
        shutil.copy(os.path.join(ROOT, name), source / name)
    for package in ("kernels", "conformance"):
        shutil.copytree(os.path.join(ROOT, package), source / package, ignore=ignore)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("conformance/goldens.h5") == open(DEFAULT_PATH, "rb").read()
        assert "goldens.h5" not in archive.namelist()  # not loose in site-packages
        archive.extractall(site)

    elsewhere = _mkdir(tmp_path / "elsewhere")
    environment = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-m", "conformance", "--device", "cpu", "--op", "reshape",
                           "--json", "report.json"], capture_output=True, text=True, cwd=elsewhere, env=environment)
    assert done.returncode == 0, done.stderr
    data = json.loads((elsewhere / "report.json").read_text())
    assert data["summary"]["goldens"] == str(site / "conformance" / "goldens.h5")
    assert data["summary"]["passed"] == len(CASE_MODULES["reshape"].TABLE) and data["summary"]["failed"] == 0

    os.remove(site / "conformance" / "goldens.h5")
    done = subprocess.run([sys.executable, "-m", "conformance", "--device", "cpu"],
                          capture_output=True, text=True, cwd=elsewhere, env=environment)
    assert done.returncode == 2
    assert f"looked for {site / 'goldens.h5'} and {site / 'conformance' / 'goldens.h5'}" in done.stderr


def _mkdir(path):
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_json_report_values_are_plain(capsys, tmp_path):
    status, data = report(capsys, tmp_path, *ONE_CASE, "--device", "cpu")
    assert status == 0
    assert data == {
        "summary": {"passed": 1, "failed": 0, "skipped": 0, "total": 1, "goldens": DEFAULT_PATH,
                    "backend": {"name": "kernels", "schedules": ["plain", "delayed", "foreign", "small"], "margins": True,
                                "settings": {}}},
        "results": [{"op": "transpose", "case": "3d_cycle_201", "device": "cpu", "status": "passed", "message": "",
                     "max_ulps": None}],
    }


def test_schedule_filters_the_gpu_schedules(monkeypatch, capsys):
    """--schedule reaches the runner; an unknown schedule is refused by argparse (exit 2)."""
    seen = []

    def fake_run_case(case, golden, device, schedules=None, backend=None):
        seen.append(schedules)
        return Result(case.op, case.name, device, "passed")

    monkeypatch.setattr(cli, "run_case", fake_run_case)
    assert cli.main(["--device", "cpu", "--op", "reshape", "--schedule", "delayed", "--schedule", "plain"]) == 0
    assert seen and all(s == ["delayed", "plain"] for s in seen)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--schedule", "sideways"])
    assert exit_info.value.code == 2
    assert "sideways" in capsys.readouterr().err


def test_shards_cover_every_case_once(monkeypatch):
    """--shard 1/3 .. 3/3 run disjoint parts whose union is the unsharded run; bad shards exit 2."""
    seen = []

    def fake_run_case(case, golden, device, schedules=None, backend=None):
        seen.append(case.key)
        return Result(case.op, case.name, device, "passed")

    monkeypatch.setattr(cli, "run_case", fake_run_case)
    assert cli.main(["--device", "cpu", "--op", "softmax"]) == 0
    whole, seen[:] = list(seen), []
    parts = []
    for index in (1, 2, 3):
        assert cli.main(["--device", "cpu", "--op", "softmax", "--shard", f"{index}/3"]) == 0
        parts.append(list(seen))
        seen.clear()
    assert sorted(sum(parts, [])) == sorted(whole) and len(whole) > 3
    assert all(parts) and not set(parts[0]) & set(parts[1])
    for bad in ("0/3", "4/3", "x"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["--shard", bad])
        assert exit_info.value.code == 2


# --------------------------------------------------------------------------- named GPU paths


def test_gpu_paths_report(capsys, tmp_path, monkeypatch):
    """--gpu-paths FILE: each declared path with the first case that reached it and how often, and
    the ones no case reached. The GPU's launches are played by a run_case that reaches two paths."""
    real = cli.run_case

    def run_case(case, golden, device, schedules=None, backend=None):
        kernels.runtime.gpu_paths.reach("transpose.tiled32")
        if case.name == "3d_cycle_201":
            kernels.runtime.gpu_paths.reach("transpose.tiled32")
            kernels.runtime.gpu_paths.reach("transpose.gather")
        return real(case, golden, device, schedules)

    monkeypatch.setattr(cli, "run_case", run_case)
    path = tmp_path / "paths.json"
    status, _, _ = run(capsys, "--device", "cpu", "--op", "transpose", "-k", "transpose/3d_*", "--gpu-paths", str(path))
    assert status == 0
    got = json.loads(path.read_text())
    cases = [c for c in all_cases() if c.op == "transpose" and c.name.startswith("3d_")]
    assert got["reached"]["transpose.tiled32"]["first"] == f"{cases[0].key}[cpu]"
    assert got["reached"]["transpose.tiled32"]["count"] == len(cases) + 1
    assert got["reached"]["transpose.gather"] == {"first": "transpose/3d_cycle_201[cpu]", "count": 1,
                                                 "description": kernels.runtime.gpu_paths.declared()["transpose.gather"]}
    declared = kernels.runtime.gpu_paths.declared()
    assert got["summary"] == {"declared": len(declared), "reached": 2}
    assert set(got["unreached"]) == set(declared) - {"transpose.tiled32", "transpose.gather"}
