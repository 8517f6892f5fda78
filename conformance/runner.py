"""Running one case on one device against its golden, with both poisons."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .case import Case, Golden
from .cases import CASE_MODULES
from .compare import compare
from .harness import POISONS, Env, device_unavailable

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


def _check_once(case: Case, golden: Golden, device: str, poison: str, run: Callable[[Case, Env], None]) -> list[str]:
    env = Env(case, golden, device, poison)
    try:
        run(case, env)
        env.stream.synchronize()
        problems = []
        produced = {name: env.to_host(array) for name, array in env.writes.items()}
        produced.update(env.observed)
        for name, expected in golden.expected.items():
            if name not in produced:
                problems.append(f"{name}: the harness produced no such tensor")
                continue
            report = compare(produced[name], expected, case.tolerance_for(name))
            if report:
                problems.append(f"{name} (poison {poison}): {report}")
        for name, array in env.reads.items():
            after = env.to_host(array)
            if not np.array_equal(after.view(np.uint8), golden.inputs[name].view(np.uint8)):
                changed = int(np.count_nonzero(after != golden.inputs[name]))
                problems.append(f"{name}: a tensor the kernels only read was modified ({changed} values)")
        return problems
    finally:
        env.close()


def run_case(case: Case, golden: Golden, device: str) -> Result:
    """Run a case on a device with both poisons; passed, failed (with where) or skipped (with why)."""
    reason = device_unavailable(device)
    if reason is not None:
        return Result(case.op, case.name, device, "skipped", reason)
    devices = case.extra.get("devices")
    if devices is not None and device not in devices:
        return Result(case.op, case.name, device, "skipped", f"declared for {', '.join(devices)} only")
    run = CASE_MODULES[case.op].run
    problems: list[str] = []
    for poison in POISONS:
        try:
            problems += _check_once(case, golden, device, poison, run)
        except Exception:  # a kernel error is a failure of the case, reported with its traceback
            problems.append(f"poison {poison}: raised\n{traceback.format_exc(limit=6)}")
            break
    if problems:
        message = f"{case.op} / {case.name} / {device}:\n" + "\n".join(problems)
        return Result(case.op, case.name, device, "failed", message)
    return Result(case.op, case.name, device, "passed")
