"""Running one case on one device against its golden: with both poisons, in red zones at aligned
and misaligned offsets, and on the GPU under every schedule (plain, delayed stream, foreign
current stream, small device); harness.runs says which combinations run."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .backends import KERNELS, Backend, Unsupported, unsupported
from .case import Case, Golden
from .compare import compare, needed_ulps
from .harness import Env, device_kind, device_unavailable, execute, has_backward, runs

DEVICES = ("cpu", "gpu")


@dataclass
class Result:
    op: str
    case: str
    device: str
    status: str  # "passed", "failed", "skipped"
    message: str = ""
    max_ulps: float | None = None  # a failure's largest distance from a golden, in ulps (inf: NaN, non-float)

    @property
    def key(self) -> str:
        return f"{self.op}/{self.case}[{self.device}]"


def produce(case: Case, golden: Golden, device: str, poison: str = "random", schedule: str = "plain",
            layout: str = "aligned", backend: Backend = KERNELS
            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[tuple[str, str]]]:
    """Run a case once through `backend`: (what it wrote and observed, what its read-only tensors hold
    afterwards, what changed in the red zones' margins as (tensor, what)), copied to the host after
    the kernels' stream is synchronized."""
    env = Env(case, golden, device, poison, schedule, layout, backend)
    try:
        with env.scheduled(), env.scratch_poisoned():
            execute(case, env)
        env.stream.synchronize()
        produced, reads, margins = env.collect()
        produced.update(env.observed)
        return produced, reads, margins
    finally:
        env.close()


def where(poison: str, schedule: str, layout: str) -> str:
    """How a run is named in a report: its poison, and its schedule and layout where not the default."""
    return ", ".join([f"poison {poison}"] + ([] if schedule == "plain" else [f"schedule {schedule}"])
                     + ([] if layout == "aligned" else [f"layout {layout}"]))


def _check_once(case: Case, golden: Golden, device: str, poison: str, schedule: str, layout: str,
                backend: Backend, ulps: list[float]) -> list[str]:
    """The problems of one run; each mismatching tensor's distance in ulps is added to `ulps`."""
    produced, reads, margins = produce(case, golden, device, poison, schedule, layout, backend)
    run = where(poison, schedule, layout)
    problems = []
    for name, expected in golden.expected.items():
        if name not in produced:
            problems.append(f"{name}: the harness produced no such tensor")
            continue
        got = produced[name]
        report = compare(got, expected, case.tolerance_for(name))
        if report:
            problems.append(f"{name} ({run}): {report}")
            same = got.shape == expected.shape and got.dtype == expected.dtype
            ulps.append(needed_ulps(got, expected) if same else float("inf"))
    for name, after in reads.items():
        if not np.array_equal(after.view(np.uint8), golden.inputs[name].view(np.uint8)):
            changed = int(np.count_nonzero(after != golden.inputs[name]))
            problems.append(f"{name} ({run}): a tensor the kernels only read was modified ({changed} values)")
    problems += [f"{name} ({run}): {what}" for name, what in margins]
    return problems


def run_case(case: Case, golden: Golden, device: str, schedules: Sequence[str] | None = None,
             backend: Backend = KERNELS) -> Result:
    """Run a case on a device through `backend` in every run of `harness.runs` (only those under
    `schedules`, where given): passed, failed (with where, and the backend's notes) or skipped (with
    why: the device, the case's declared devices, or the backend, before the runs or by raising
    Unsupported in one)."""
    reason = device_unavailable(device)
    if reason is not None:
        return Result(case.op, case.name, device, "skipped", reason)
    devices = case.extra.get("devices")
    if devices is not None and device_kind(device) not in devices:
        return Result(case.op, case.name, device, "skipped", f"declared for {', '.join(devices)} only")
    problems: list[str] = []
    try:
        reason = unsupported(backend, case, device, has_backward(case, golden))
    except Exception:  # a backend that cannot say is a failure of the case, not of the run
        reason = None
        problems.append(f"backend {backend.name}: supports raised\n{traceback.format_exc(limit=6)}")
    if reason is not None:
        return Result(case.op, case.name, device, "skipped", reason)
    raised: set[tuple[str, str]] = set()
    ulps: list[float] = []
    for schedule, layout, poison in runs(device, backend) if not problems else []:
        if schedules is not None and schedule not in schedules:
            continue
        if (schedule, layout) in raised:
            continue  # the other poison would raise the same way
        try:
            problems += _check_once(case, golden, device, poison, schedule, layout, backend, ulps)
        except Unsupported as why:
            return Result(case.op, case.name, device, "skipped", f"backend {backend.name}: {why}")
        except Exception:  # a kernel error is a failure of the case, reported with its traceback
            problems.append(f"{where(poison, schedule, layout)}: raised\n{traceback.format_exc(limit=6)}")
            raised.add((schedule, layout))
    if problems:
        try:
            problems += [f"note ({backend.name}): {line}" for line in backend.notes(case, device)]
        except Exception:
            problems.append(f"backend {backend.name}: notes raised\n{traceback.format_exc(limit=6)}")
        message = f"{case.op} / {case.name} / {device}:\n" + "\n".join(problems)
        return Result(case.op, case.name, device, "failed", message, max(ulps) if ulps else None)
    return Result(case.op, case.name, device, "passed")
