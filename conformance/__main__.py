"""`python -m conformance`: run the conformance cases on the devices asked for, print
per op and device how many passed, failed and were skipped, and optionally write
JUnit XML and JSON reports. Exit status: 0 when no case failed, 1 when one did, 2
when the run could not start (see DESCRIPTION)."""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import json
import os
import re
import sys
import textwrap
import time
import xml.etree.ElementTree as ET

from kernels.runtime import cpu_paths, gpu_paths

from .backends import KERNELS, Backend, load
from .case import Case
from .cases import CASE_MODULES, all_cases
from .golden import GoldenFileError, GoldenStore, find_goldens, golden_candidates
from .harness import SCHEDULES, device_unavailable, release_gpu_memory
from .runner import DEVICES, Result, run_case
from .spread import run_spread, tally, visible_gpus

DESCRIPTION = """\
Run the conformance suite: every case that conformance/cases declares, checked
against its golden (made by PyTorch, stored in goldens.h5) on every device, and
print per op and device how many cases passed, failed and were skipped, then
each failure with where it differs.

Exit status: 0 when no case failed; 1 when one did; 2 when the run could not
start (a bad option, an unknown op, a device asked for that cannot run here, a
missing, stale or damaged golden file)."""

EPILOG = f"""\
devices:
  cpu, gpu (CUDA device 0, reported as gpu), gpu:N (CUDA device N, reported
  as gpu:N; its streams, handles and arrays are of device N, whichever device
  is current).
  Without --device every device runs, and one that cannot run here (no CUDA
  device, no CuPy) is skipped with the reason. A device named with --device
  that cannot run here is an error.

GPU schedules (every GPU case runs under each, with both poisons):
  plain     as a user would call the kernels
  delayed   a 2 ms spin kernel on the kernels' stream before the case's first
            transfer and before every kernel call: work a kernel puts on any
            other stream runs out of order and the results show it
  foreign   delayed, and CuPy's current stream is another non-blocking stream
  small     every launch planned as for a device of one SM, its grids capped
            at two blocks (kernels.runtime.gpu.simulated_device): grid-stride loops go
            round, unrolled and multi-block paths run on the small tensors
            (aligned with both poisons, misaligned with random values)

red zones (every tensor, every run): a view inside a larger allocation, with
  canary bytes (0xA5) around written tensors and, around read ones, NaN
  (integer maximum, True) in the NaN-poison runs, +inf and -inf in turn
  (integer maximum and minimum) in the random ones, checked unchanged. Layouts: aligned (each tensor at a
  256-byte boundary), misaligned (each one element past it), staggered (every
  other tensor one element past): on each device every layout with both
  poisons, aligned also under every schedule, misaligned also under foreign.

ops:
{textwrap.fill(", ".join(sorted(CASE_MODULES)), 78, initial_indent="  ", subsequent_indent="  ")}

examples:
  python -m conformance                          every case, every device
  python -m conformance --device cpu --op softmax -v
                                                 one op on the CPU, each case's result
  python -m conformance -k 'conv_2d/*depthwise*' cases by op/name glob or substring
  python -m conformance --device gpu --junit-xml report.xml --json report.json
                                                 the GPU only, with reports for CI
  python -m conformance --goldens /path/to/goldens.h5
  python -m conformance --device gpu --jobs gpus  the GPU cases spread over every visible GPU
  python -m conformance --device gpu --gpu-paths paths.json
                                                 which named GPU paths the run reached
  python -m conformance --device cpu --cpu-paths paths.json
                                                 which size-gated CPU paths the run reached
  python -m conformance --backend torch --device cpu
                                                 judge PyTorch's ops instead (docs/backends.md)
  python -m conformance --backend c:./libmykernels.so --device cpu
                                                 judge a library of the C ABI (kernels_backend.h), in a
                                                 worker process: a crash fails only the case it hit
  python -m conformance --backend mypkg.mymod:BACKEND --isolate
                                                 the same isolation for any backend

backends (--backend, or the environment variable KERNELS_BACKEND):
  kernels        this library (the default)
  torch          each op through torch / torch.nn.functional, with PyTorch's defaults
  torch-strict   the same with TF32, reduced-precision reductions and non-deterministic
                 algorithms off
  c:PATH         a shared library exporting kb_<op>_forward / kb_<op>_backward
                 (conformance/backends/kernels_backend.h)
  module:attr    any Python object of the protocol (docs/backends.md)
  Cases a backend cannot run are skipped with its reason. With --isolate (the default
  for c:PATH) or --jobs N the cases run in spawned worker processes; a case in which
  one dies is failed with the signal or exit status, and a fresh worker goes on.
  --case-timeout SECONDS does the same for a case that hangs: its worker is killed.
"""


def runner_device(name: str) -> str:
    """The runner's device for a --device name: cpu, gpu, or gpu:N (N a CUDA ordinal)."""
    if name in DEVICES:
        return name
    match = re.fullmatch(r"gpu:(\d+)", name)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid device {name!r}: expected cpu, gpu or gpu:N (N a CUDA ordinal)")
    ordinal = int(match.group(1))
    return "gpu" if ordinal == 0 else f"gpu:{ordinal}"  # device 0 keeps its name in the reports


def _shard(text: str) -> tuple[int, int]:
    """--shard I/N as (I, N)."""
    match = re.fullmatch(r"(\d+)/(\d+)", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise argparse.ArgumentTypeError(f"expected I/N with 1 <= I <= N, found {text!r}")
    return int(match[1]), int(match[2])


def _jobs(text: str) -> int:
    """--jobs N (N >= 1) or --jobs gpus (one worker per visible GPU, at least one) as a count."""
    if text == "gpus":
        return max(visible_gpus(), 1)
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a count >= 1 or 'gpus', found {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    """--case-timeout SECONDS: a positive, finite number."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, found {text!r}")
    return seconds


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m conformance", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", action="append", type=runner_device, metavar="DEVICE",
                        help="only this device: cpu, gpu or gpu:N (repeatable; default: every device)")
    parser.add_argument("--op", action="append", metavar="OP", help="only this op (repeatable; default: every op)")
    parser.add_argument("-k", dest="pattern", metavar="PATTERN",
                        help="only cases whose op/name (say conv_2d/depthwise_3x3) matches this glob or contains it")
    parser.add_argument("--goldens", metavar="FILE",
                        help="the golden file (default: goldens.h5 at the root of this checkout, "
                             "else the copy installed with the package)")
    parser.add_argument("--schedule", action="append", choices=SCHEDULES["gpu"], metavar="SCHEDULE",
                        help="only this GPU schedule: plain, delayed (the kernels' stream held back before each "
                             "call), foreign (delayed, and another CuPy current stream) or small (launches planned "
                             "for a one-SM device, grids of two blocks) (repeatable; default: all)")
    parser.add_argument("--shard", type=_shard, metavar="I/N",
                        help="only every N-th of the chosen cases, starting at the I-th (1 <= I <= N): N processes "
                             "with shards 1/N .. N/N run every case once (tools/sanitize.sh does)")
    parser.add_argument("--jobs", type=_jobs, default=1, metavar="N",
                        help="deal the cases out to N worker processes (default 1: this one); 'gpus': one per "
                             "visible GPU. Worker w runs the cases of --device gpu on CUDA device w mod (visible "
                             "GPUs); the merged results read as a run in one process. A worker that dies in a "
                             "case (a crash) fails that case and a fresh one goes on")
    parser.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                        help="run the cases in worker processes even with --jobs 1: a backend that crashes (a "
                             "segfault, an exit) fails the case it crashed in, naming the signal, and a fresh worker "
                             "goes on with the rest (default: on for c:PATH backends, off for the others; "
                             "--no-isolate runs a c:PATH backend in this process, where --jobs is 1)")
    parser.add_argument("--case-timeout", type=_seconds, metavar="SECONDS",
                        help="fail a case that runs longer than this in its worker process, kill that worker "
                             "(SIGTERM, then SIGKILL) and go on with a fresh one: a backend that hangs fails the "
                             "case it hung in (default: no limit). Implies --isolate where --jobs is 1; refused "
                             "with --no-isolate and --jobs 1")
    parser.add_argument("--backend", metavar="BACKEND", default=os.environ.get("KERNELS_BACKEND", "kernels"),
                        help="the kernel library to judge: kernels, torch, torch-strict, c:PATH or module:attr "
                             "(default: $KERNELS_BACKEND, else kernels)")
    parser.add_argument("--junit-xml", metavar="FILE", help="also write the results as JUnit XML (for CI)")
    parser.add_argument("--json", metavar="FILE", help="also write the results and a summary as JSON")
    parser.add_argument("--gpu-paths", metavar="FILE",
                        help="also write, as JSON, which named GPU paths (kernels.runtime.gpu_paths) the run reached, "
                             "each with the first case that did and its count, and which it did not")
    parser.add_argument("--cpu-paths", metavar="FILE",
                        help="also write, as JSON, which named size-gated CPU paths (kernels.runtime.cpu_paths) the run "
                             "reached, each with the first case that did and its count, and which it did not")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case's result")
    return parser


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _unknown_op(op: str) -> str:
    known = sorted(CASE_MODULES)
    nearest = difflib.get_close_matches(op, known, n=1)
    hint = f" (did you mean {nearest[0]!r}?)" if nearest else ""
    return f"unknown op {op!r}{hint}; the ops are: {', '.join(known)}"


def _golden_path(requested: str | None) -> tuple[str | None, str | None]:
    """(the golden file to read, None) or (None, why there is none)."""
    if requested is not None:
        if not os.path.isfile(requested):
            return None, f"--goldens {requested}: no such file"
        return requested, None
    found = find_goldens()
    if found is None:
        looked = " and ".join(golden_candidates())
        return None, (f"no golden file: looked for {looked}. Pass --goldens FILE, or, in a checkout of the "
                      "repository, make it with `python generate_goldens.py`")
    return found, None


def main(argv: list[str] | None = None) -> int:
    """The command line, `argv` without the program name; returns the exit status."""
    arguments = _parser().parse_args(argv)
    # A repeated --op or --device runs once, in the order first given.
    ops = list(dict.fromkeys(arguments.op or []))
    devices = list(dict.fromkeys(arguments.device or DEVICES))

    for op in ops:
        if op not in CASE_MODULES:
            return _error(_unknown_op(op))
    for device in devices if arguments.device else []:
        reason = device_unavailable(device)
        if reason is not None:
            return _error(f"--device {device} cannot run here: {reason}")

    if arguments.case_timeout is not None and arguments.isolate is False and arguments.jobs == 1:
        return _error("--case-timeout needs the cases in worker processes, and --no-isolate with --jobs 1 runs "
                      "them in this one: drop --no-isolate (--case-timeout implies --isolate) or give --jobs N")
    if arguments.case_timeout is not None and arguments.isolate is None:
        arguments.isolate = True  # a case can be timed out only in a worker that can be killed

    try:
        backend = load(arguments.backend)
    except Exception as error:  # an unknown name, a library that does not load, a module that raises
        return _error(f"--backend {arguments.backend}: {error}")

    path, why_not = _golden_path(arguments.goldens)
    if path is None:
        return _error(why_not)
    try:
        store = GoldenStore(path)
    except GoldenFileError as error:
        return _error(str(error))
    cases = [c for c in all_cases() if not ops or c.op in ops]
    for op in sorted({c.op for c in cases}):
        stale = store.staleness(op)
        if stale:
            return _error(stale)
    if arguments.pattern:
        p = arguments.pattern
        cases = [c for c in cases if p in c.key or fnmatch.fnmatch(c.key, p)]
        if not cases:
            return _error(f"no case of {', '.join(ops) or 'any op'} matches -k {p!r} (a glob or a substring of op/name)")
    if arguments.shard:
        index, count = arguments.shard
        cases = cases[index - 1::count]

    paths: dict[str, dict] = {}
    cpu_seen: dict[str, dict] = {}
    isolate = backend.isolate if arguments.isolate is None else arguments.isolate
    if arguments.jobs > 1 or isolate:
        results, seconds = run_spread(path, cases, devices, arguments.jobs, arguments.schedule, paths, cpu_seen,
                                      arguments.backend, arguments.case_timeout)
        if arguments.verbose:
            for result in results:
                _print_result(result)
    else:
        results, seconds = _run(store, cases, devices, arguments.verbose, arguments.schedule, paths, cpu_seen,
                                backend)
    release_gpu_memory()  # so that a leak check at exit sees only what is still held
    about = backend_report(backend, devices)
    _print_summary(results, about)
    if arguments.junit_xml:
        write_junit_xml(arguments.junit_xml, results, seconds, about)
    if arguments.json:
        write_json(arguments.json, results, path, about)
    if arguments.gpu_paths:
        write_gpu_paths(arguments.gpu_paths, paths)
    if arguments.cpu_paths:
        write_paths(arguments.cpu_paths, cpu_seen, cpu_paths.declared())
    return 1 if any(r.status == "failed" for r in results) else 0


def backend_report(backend: Backend, devices: list[str]) -> dict:
    """What a report says of the backend: its name, the schedules it ran under, whether the red zones'
    margins applied (Backend.views) and its own description of each device's settings."""
    settings = {}
    for device in devices:
        try:
            line = backend.describe(device)
        except Exception as error:  # a description that fails must not lose the results
            line = f"describe raised {type(error).__name__}: {error}"
        if line:
            settings[device] = line
    return {"name": backend.name, "schedules": list(backend.schedules), "margins": bool(backend.views),
            "settings": settings}


def _run(store: GoldenStore, cases: list[Case], devices: list[str], verbose: bool,
         schedules: list[str] | None = None, paths: dict[str, dict] | None = None,
         cpu_seen: dict[str, dict] | None = None, backend: Backend = KERNELS) -> tuple[list[Result], list[float]]:
    """Every case on every device, with progress on stderr; the results and each one's seconds. The
    named GPU paths each case reaches are added to `paths` (name -> {"first": case key, "count"}), the
    named CPU paths to `cpu_seen`."""
    paths = {} if paths is None else paths
    cpu_seen = {} if cpu_seen is None else cpu_seen
    total = len(cases) * len(devices)
    results: list[Result] = []
    seconds: list[float] = []
    for device in devices:
        for case in cases:
            start = time.perf_counter()
            with gpu_paths.recording() as recording, cpu_paths.recording() as cpu_recording:
                result = run_case(case, store.get(case), device, schedules, backend)
            tally(paths, recording.counts, result.key)
            tally(cpu_seen, cpu_recording.counts, result.key)
            seconds.append(time.perf_counter() - start)
            results.append(result)
            if sys.stderr.isatty():
                print(f"\r[{len(results)}/{total}] {result.key:<70.70}", end="", file=sys.stderr, flush=True)
            elif len(results) % 50 == 0 or len(results) == total:
                print(f"[{len(results)}/{total}] {result.key}", file=sys.stderr, flush=True)
            if verbose:
                _print_result(result)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    return results, seconds


def _print_result(result: Result) -> None:
    print(f"{result.status.upper():7} {result.key}" + (f"  ({result.message})" if result.status == "skipped" else ""))


def _counts(results: list[Result]) -> dict[str, int]:
    counts = {status: sum(r.status == status for r in results) for status in ("passed", "failed", "skipped")}
    counts["total"] = len(results)
    return counts


def _ulps(result: Result) -> str:
    """A failure's largest distance in ulps, as the report says it ("" where there is none)."""
    if result.max_ulps is None:
        return ""
    return " (max inf ulps: NaN, or not a float)" if result.max_ulps == float("inf") else f" (max {result.max_ulps:.0f} ulps)"


def _print_summary(results: list[Result], about: dict | None = None) -> None:
    for result in results:
        if result.status == "failed":
            print(f"FAILED {result.key}{_ulps(result)}\n{result.message}\n")
    if about is not None and about["name"] != KERNELS.name:
        print(f"backend {about['name']}: schedules {', '.join(about['schedules'])}; red-zone margins "
              + ("applied" if about["margins"] else "not applied (it takes no views into a larger allocation)"))
        for device, line in about["settings"].items():
            print(f"  {device}: {line}")
    table: dict[tuple[str, str], dict[str, int]] = {}
    for result in results:
        row = table.setdefault((result.op, result.device), {"passed": 0, "failed": 0, "skipped": 0})
        row[result.status] += 1
    print(f"{'op':<22}{'device':<8}{'passed':>8}{'failed':>8}{'skipped':>9}")
    for (op, device), row in sorted(table.items()):
        print(f"{op:<22}{device:<8}{row['passed']:>8}{row['failed']:>8}{row['skipped']:>9}")
    for reason in sorted({f"{r.device}: {r.message}" for r in results if r.status == "skipped"}):
        print(f"skipped {reason}")
    failures = [r for r in results if r.status == "failed" and r.max_ulps is not None]
    if failures and about is not None and about["name"] != KERNELS.name:
        print("largest distance from the golden, in ulps, per failing case:")
        for result in failures:
            print(f"  {result.key:<70}{result.max_ulps:>12.0f}")
    counts = _counts(results)
    named = "" if about is None or about["name"] == KERNELS.name else f" (backend {about['name']})"
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped{named}")


# Characters XML 1.0 cannot hold (a traceback could carry one); replaced so the report stays readable.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub("?", text)


def write_junit_xml(path: str, results: list[Result], seconds: list[float], about: dict | None = None) -> None:
    """One testsuite `conformance`, one testcase per (op, case, device): classname conformance.<op>,
    name <case>[<device>], with a failure (its message) or skipped (the reason) element. The backend
    is the suite's property `backend` (and `margins`, `settings.<device>`)."""
    counts = _counts(results)
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="conformance", tests=str(counts["total"]),
                          failures=str(counts["failed"]), errors="0", skipped=str(counts["skipped"]),
                          time=f"{sum(seconds):.3f}")
    if about is not None:
        properties = ET.SubElement(suite, "properties")
        named = {"backend": about["name"], "margins": str(about["margins"]).lower(),
                 **{f"settings.{device}": line for device, line in about["settings"].items()}}
        for name, value in named.items():
            ET.SubElement(properties, "property", name=name, value=_xml_text(value))
    for result, elapsed in zip(results, seconds):
        testcase = ET.SubElement(suite, "testcase", classname=f"conformance.{result.op}",
                                 name=f"{result.case}[{result.device}]", time=f"{elapsed:.3f}")
        message = _xml_text(result.message)
        if result.status == "failed":
            # The attribute holds the first line (CI lists show it); the text, the whole report.
            first = (message.splitlines()[0] if message else "failed") + _ulps(result)
            failure = ET.SubElement(testcase, "failure", message=first)
            failure.text = message
        elif result.status == "skipped":
            ET.SubElement(testcase, "skipped", message=message)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def write_json(path: str, results: list[Result], goldens: str, about: dict | None = None) -> None:
    """{"summary": {passed, failed, skipped, total, goldens, backend}, "results": [{op, case, device, status,
    message, max_ulps}]}: backend as backend_report gives it; max_ulps a failure's largest distance in ulps
    (null where none was measured, a string "inf" for NaN or a non-float mismatch)."""
    def ulps(value: float | None) -> float | str | None:
        return "inf" if value == float("inf") else value

    report = {
        "summary": {**_counts(results), "goldens": goldens, **({} if about is None else {"backend": about})},
        "results": [{"op": r.op, "case": r.case, "device": r.device, "status": r.status, "message": r.message,
                     "max_ulps": ulps(r.max_ulps)} for r in results],
    }
    with open(path, "w", encoding="utf-8") as file:
        json.dump(report, file, indent=1)
        file.write("\n")


def write_gpu_paths(path: str, paths: dict[str, dict]) -> None:
    """{"summary": {declared, reached}, "reached": {name: {first, count, description}}, "unreached":
    {name: description}}: the named GPU paths (kernels.runtime.gpu_paths) of the run."""
    write_paths(path, paths, gpu_paths.declared())


def write_paths(path: str, paths: dict[str, dict], declared: dict[str, str]) -> None:
    """The report of write_gpu_paths for the names `declared` (gpu_paths' or cpu_paths')."""
    report = {
        "summary": {"declared": len(declared), "reached": sum(name in paths for name in declared)},
        "reached": {name: {**paths[name], "description": declared[name]} for name in declared if name in paths},
        "unreached": {name: description for name, description in declared.items() if name not in paths},
    }
    with open(path, "w", encoding="utf-8") as file:
        json.dump(report, file, indent=1)
        file.write("\n")


if __name__ == "__main__":
    sys.exit(main())
