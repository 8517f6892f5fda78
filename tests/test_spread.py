"""`python -m conformance --jobs N`: the cases dealt out to worker processes, the merged results equal to a
run in one process (per-case outcomes and messages, in the same order), on the CPU and on the GPU."""

import json

import pytest

import conformance.__main__ as cli
from conformance import spread
from conformance.harness import device_unavailable

from .conftest import run_main

OPS = ["--op", "transpose", "--op", "softmax", "--op", "concat"]


def run(capsys, *argv):
    return run_main(capsys, cli.main, argv)


def report(capsys, tmp_path, name, *argv):
    path = tmp_path / f"{name}.json"
    status, out, _ = run(capsys, *argv, "--json", str(path))
    return status, out, json.loads(path.read_text())


def test_deal_gives_every_case_to_one_worker_round_robin():
    assert spread.deal(7, 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert spread.deal(2, 4) == [[0], [1], [], []]
    assert sorted(i for share in spread.deal(50, 6) for i in share) == list(range(50))


@pytest.mark.parametrize("device, worker, gpus, where", [
    ("gpu", 0, 2, "gpu"), ("gpu", 1, 2, "gpu:1"), ("gpu", 3, 2, "gpu:1"), ("gpu", 2, 4, "gpu:2"),
    ("gpu", 1, 1, "gpu"), ("gpu", 5, 0, "gpu"), ("cpu", 1, 2, "cpu"), ("gpu:3", 1, 4, "gpu:3"),
])
def test_worker_device(device, worker, gpus, where):
    assert spread.worker_device(device, worker, gpus) == where


@pytest.mark.parametrize("jobs", ["0", "-1", "two", ""])
def test_bad_jobs_is_a_usage_error(capsys, jobs):
    status, _, err = run(capsys, "--jobs", jobs)
    assert status == 2 and "--jobs: expected a count >= 1 or 'gpus'" in err


@pytest.mark.parametrize("seconds", ["0", "-1", "-0.5", "two", "", "nan", "inf"])
def test_bad_case_timeout_is_a_usage_error(capsys, seconds):
    status, _, err = run(capsys, "--case-timeout", seconds)
    assert status == 2 and "--case-timeout: expected a positive number of seconds" in err


def test_case_timeout_needs_workers(capsys):
    """--case-timeout with --no-isolate and --jobs 1 is refused: a case in this process cannot be killed."""
    status, out, err = run(capsys, "--device", "cpu", "--op", "transpose", "--case-timeout", "5", "--no-isolate")
    assert (status, out) == (2, "")
    assert "error: --case-timeout needs the cases in worker processes" in err


def test_a_case_started_as_its_worker_was_killed_runs_again():
    """The case a worker was killed for finished as the kill was decided and the next had started: the next
    one is not failed but left to the fresh worker; the one killed for keeps its result."""
    from types import SimpleNamespace

    from conformance.cases import all_cases
    from conformance.runner import Result

    cases = all_cases()[:3]
    worker = spread._Worker(0, [(0, 0), (0, 1), (0, 2)], process=SimpleNamespace(exitcode=-15),
                            running=(0, 1), ran=1, killed=(0, 0))
    outcomes = {(0, 0): (Result(cases[0].op, cases[0].name, "cpu", "passed"), 3.0, {}, {})}
    assert spread._ended(worker, cases, ["cpu"], outcomes, timeout=2.0) == [(0, 1), (0, 2)]
    assert list(outcomes) == [(0, 0)] and outcomes[(0, 0)][0].status == "passed"


def test_jobs_gpus_is_one_worker_per_visible_gpu_and_at_least_one(monkeypatch):
    monkeypatch.setattr(cli, "visible_gpus", lambda: 4)
    assert cli._jobs("gpus") == 4
    monkeypatch.setattr(cli, "visible_gpus", lambda: 0)
    assert cli._jobs("gpus") == 1
    assert cli._jobs("3") == 3


def _same_run(capsys, tmp_path, *argv, jobs="2"):
    status1, out1, one = report(capsys, tmp_path, "one", *argv, "-v")
    status2, out2, spread_ = report(capsys, tmp_path, "spread", *argv, "-v", "--jobs", jobs)
    assert status1 == status2 == 0
    assert one["results"] and spread_["results"] == one["results"]  # every case, its outcome and message, in order
    assert {k: v for k, v in spread_["summary"].items()} == one["summary"]
    assert out2 == out1  # the verbose lines, the failures, the table and the counts
    return one


def test_two_cpu_workers_give_the_results_of_one_process(capsys, tmp_path):
    one = _same_run(capsys, tmp_path, *OPS, "--device", "cpu")
    assert {r["status"] for r in one["results"]} == {"passed"}
    assert len(one["results"]) > 20


def test_more_workers_than_cases(capsys, tmp_path):
    _same_run(capsys, tmp_path, "--op", "transpose", "-k", "transpose/3d_cycle_201", "--device", "cpu", jobs="3")


@pytest.mark.skipif(device_unavailable("gpu") is None, reason="a GPU is here: the GPU tests below spread it")
def test_the_gpu_skipped_with_its_reason_in_every_worker(capsys, tmp_path):
    one = _same_run(capsys, tmp_path, "--op", "transpose")
    assert {(r["device"], r["status"]) for r in one["results"]} == {("cpu", "passed"), ("gpu", "skipped")}


@pytest.mark.gpu
def test_two_workers_on_one_gpu_give_the_results_of_one_process(capsys, tmp_path):
    """On any machine with a GPU: two workers, both on GPU 0 where only one is visible (every case, every
    schedule), read as the run in one process, named GPU paths included."""
    reason = device_unavailable("gpu")
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    paths = [tmp_path / "paths1.json", tmp_path / "paths2.json"]
    argv = [*OPS, "--op", "batch_norm", "--device", "gpu"]
    status1, _, one = report(capsys, tmp_path, "one", *argv, "--gpu-paths", str(paths[0]))
    status2, _, two = report(capsys, tmp_path, "two", *argv, "--gpu-paths", str(paths[1]), "--jobs", "2")
    assert status1 == status2 == 0
    assert two["results"] == one["results"] and {r["status"] for r in one["results"]} == {"passed"}
    assert json.loads(paths[1].read_text()) == json.loads(paths[0].read_text())


@pytest.mark.gpu
def test_one_worker_per_gpu_gives_the_results_of_one_process(capsys, tmp_path):
    reason = device_unavailable("gpu")
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    if spread.visible_gpus() < 2:
        pytest.skip(f"needs 2 CUDA devices, {spread.visible_gpus()} visible")
    _same_run(capsys, tmp_path, *OPS, "--op", "batch_norm", "--op", "conv_2d", "--device", "gpu", jobs="gpus")
