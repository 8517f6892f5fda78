"""Running one case on one device against its golden: with both poisons, and on the GPU under
every schedule (plain, delayed stream, foreign current stream)."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .case import Case, Golden
from .cases import CASE_MODULES
from .compare import compare
from .harness import POISONS, SCHEDULES, Env, device_unavailable

DEVICES = ("cpu", "gpu")


@dataclass
class Result:
    op: str
    case: str
    device: str
    status: str  # "passed", "failed", "skipped"
    message: str = ""

    @property
    def key(self) -> str:
        return f"{self.op}/{self.case}[{self.device}]"


def produce(case: Case, golden: Golden, device: str, poison: str = "random",
            schedule: str = "plain") -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run a case once: (what it wrote and observed, what its read-only tensors hold afterwards),
    copied to the host after the kernels' stream is synchronized."""
    env = Env(case, golden, device, poison, schedule)
    try:
        with env.scheduled():
            CASE_MODULES[case.op].run(case, env)
        env.stream.synchronize()
        produced = {name: env.to_host(array) for name, array in env.writes.items()}
        produced.update(env.observed)
        reads = {name: env.to_host(array) for name, array in env.reads.items()}
        return produced, reads
    finally:
        env.close()


def _check_once(case: Case, golden: Golden, device: str, poison: str, schedule: str) -> list[str]:
    produced, reads = produce(case, golden, device, poison, schedule)
    where = f"poison {poison}" + ("" if schedule == "plain" else f", schedule {schedule}")
    problems = []
    for name, expected in golden.expected.items():
        if name not in produced:
            problems.append(f"{name}: the harness produced no such tensor")
            continue
        report = compare(produced[name], expected, case.tolerance_for(name))
        if report:
            problems.append(f"{name} ({where}): {report}")
    for name, after in reads.items():
        if not np.array_equal(after.view(np.uint8), golden.inputs[name].view(np.uint8)):
            changed = int(np.count_nonzero(after != golden.inputs[name]))
            problems.append(f"{name} ({where}): a tensor the kernels only read was modified ({changed} values)")
    return problems


def run_case(case: Case, golden: Golden, device: str, schedules: Sequence[str] | None = None) -> Result:
    """Run a case on a device with both poisons under every schedule of the device (or those of
    `schedules` that apply to it); passed, failed (with where) or skipped (with why)."""
    reason = device_unavailable(device)
    if reason is not None:
        return Result(case.op, case.name, device, "skipped", reason)
    devices = case.extra.get("devices")
    if devices is not None and device not in devices:
        return Result(case.op, case.name, device, "skipped", f"declared for {', '.join(devices)} only")
    problems: list[str] = []
    for schedule in SCHEDULES[device] if schedules is None else [s for s in SCHEDULES[device] if s in schedules]:
        for poison in POISONS:
            try:
                problems += _check_once(case, golden, device, poison, schedule)
            except Exception:  # a kernel error is a failure of the case, reported with its traceback
                problems.append(f"poison {poison}, schedule {schedule}: raised\n{traceback.format_exc(limit=6)}")
                break
    if problems:
        message = f"{case.op} / {case.name} / {device}:\n" + "\n".join(problems)
        return Result(case.op, case.name, device, "failed", message)
    return Result(case.op, case.name, device, "passed")
