"""`python -m conformance --jobs N` and `--isolate`: the chosen cases run in N worker processes
(spawned, never forked: CUDA must never be forked), each running its share on every chosen device,
and the results merged back into the order of a run in one process. Worker w runs the cases of the
device named `gpu` on CUDA device w mod (visible devices), so N = the number of GPUs gives one worker
per GPU; a device named `gpu:N` stays on device N. Results keep the device names asked for: a merged
run reads exactly as a run in one process does.

A worker reports each case as it starts it and as it finishes it. A worker that dies in the middle of
a case (a signal, a non-zero exit: a backend that crashes) has that case failed with how it died, and
a fresh worker of the same number goes on with the rest of its share. With a case timeout, a worker in a
case longer than that is killed by the run (SIGTERM, then SIGKILL after a short grace): a death the run
caused, accounted for as any other, the case failed as having run past the timeout."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import signal
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from kernels.runtime import cpu_paths, gpu_paths

from .case import Case
from .harness import release_gpu_memory
from .runner import Result, run_case

# One case on one device: (device index, case index) into the run's devices and cases.
Item = tuple[int, int]


def visible_gpus() -> int:
    """How many CUDA devices this process sees (0 without CuPy or a device)."""
    import kernels

    if kernels.gpu_unavailable_reason() is not None:
        return 0
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


def worker_device(device: str, worker: int, gpus: int) -> str:
    """Where worker `worker` runs the cases asked for on `device`: `gpu` on device worker mod gpus, the
    others (cpu, gpu:N) as named."""
    if device != "gpu" or gpus <= 1:
        return device
    ordinal = worker % gpus
    return "gpu" if ordinal == 0 else f"gpu:{ordinal}"


def deal(count: int, jobs: int) -> list[list[int]]:
    """Case indices 0..count-1 dealt round-robin to `jobs` workers (neighbouring cases, often of one
    size, go to different workers)."""
    return [list(range(worker, count, jobs)) for worker in range(jobs)]


def work(connection: Any, goldens: str, items: list[tuple[str, str]], schedules: list[str] | None, worker: int,
         gpus: int, backend: str = "kernels") -> None:
    """One worker's share, in its own process: each (device, case key) of `items` in turn through the backend
    named `backend` (backends.load), sending ("start", n) before item n and ("done", n, result, seconds, GPU
    paths, CPU paths) after it, each result relabelled with the device name asked for."""
    from .backends import load
    from .cases import all_cases
    from .golden import GoldenStore

    judged = load(backend)
    store = GoldenStore(goldens)
    by_key = {case.key: case for case in all_cases()}
    for n, (device, key) in enumerate(items):
        connection.send(("start", n))
        case = by_key[key]
        start = time.perf_counter()
        with gpu_paths.recording() as recording, cpu_paths.recording() as cpu_recording:
            result = run_case(case, store.get(case), worker_device(device, worker, gpus), schedules, judged)
        result.device = device
        connection.send(("done", n, asdict(result), time.perf_counter() - start, dict(recording.counts),
                         dict(cpu_recording.counts)))
    release_gpu_memory()
    connection.close()


def tally(seen: dict[str, dict], counts: dict[str, int], key: str) -> None:
    """Add a case's counts of named paths (a gpu_paths or cpu_paths recording's) to `seen`: name -> {"first":
    case key, "count"}."""
    for name, count in counts.items():
        seen.setdefault(name, {"first": key, "count": 0})["count"] += count


def death(exitcode: int | None) -> str:
    """How a worker process ended, in words: `died with SIGSEGV (signal 11)`, `exited with status 3`."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "an unknown signal"
        return f"died with {name} (signal {-exitcode})"
    return f"exited with status {exitcode}"


def crashed(case: Case, device: str, how: str, started: bool, timeout: float | None = None) -> Result:
    """The failed result of a case whose process died (`how`, death's words) in it, or before it started; or,
    with `timeout`, whose process the run killed because the case ran past it."""
    if timeout is not None:
        return Result(case.op, case.name, device, "failed", f"{case.op} / {case.name} / {device}:\n"
                      f"the case ran past --case-timeout {timeout:g} s; its worker was killed and the run went on")
    when = "during this case (the run went on without it)" if started else \
        "before this case started, in a fresh process that had run no case yet: the case did not run"
    return Result(case.op, case.name, device, "failed", f"{case.op} / {case.name} / {device}:\n"
                  f"the backend's process {how} {when}")


@dataclass
class _Worker:
    """A worker's number, and its process: the items handed to it (in order), the one it has started and not
    finished, and how many it finished."""

    number: int
    items: list[Item]
    process: Any = None
    connection: Any = None
    running: Item | None = None
    started: float = 0.0
    ran: int = 0
    killed: Item | None = None  # the item it was running when the run killed it for the timeout
    terminated: float = 0.0  # when it was sent SIGTERM for that (SIGKILL follows after KILL_GRACE)


# Seconds between the SIGTERM and the SIGKILL of a worker in a case past the timeout.
KILL_GRACE = 1.0


def run_spread(goldens: str, cases: list[Case], devices: list[str], jobs: int, schedules: list[str] | None,
               paths: dict[str, dict], cpu_seen: dict[str, dict] | None = None,
               backend: str = "kernels", timeout: float | None = None) -> tuple[list[Result], list[float]]:
    """Every case on every device over `jobs` worker processes (spawned: CUDA is never forked), each replaced
    by a fresh one where it dies or, in a case longer than `timeout` seconds (None: no limit), is killed; the
    results and seconds in the order of a run in one process (devices, then cases), the GPU paths merged into
    `paths` and the CPU paths into `cpu_seen` (each path's first case: the first in that order)."""
    cpu_seen = {} if cpu_seen is None else cpu_seen
    gpus = visible_gpus() if "gpu" in devices else 0
    context = multiprocessing.get_context("spawn")
    outcomes: dict[Item, tuple[Result, float, dict, dict]] = {}

    def launch(worker: _Worker) -> _Worker:
        receive, send = context.Pipe(duplex=False)
        items = [(devices[d], cases[c].key) for d, c in worker.items]
        worker.process = context.Process(target=work, args=(send, goldens, items, schedules, worker.number, gpus,
                                                            backend), daemon=True)
        worker.process.start()
        send.close()  # the worker's end: it alone holds it now, so its death ends the pipe
        worker.connection, worker.running, worker.ran, worker.killed = receive, None, 0, None
        return worker

    live = [launch(_Worker(number, [(d, c) for d in range(len(devices)) for c in share]))
            for number, share in enumerate(deal(len(cases), jobs)) if share]
    while live:
        # A worker's death ends its pipe, unless a child of its own outlives it holding the pipe (and the
        # process's sentinel) open: hence the timeout, and the exit status asked for each time.
        ready = multiprocessing.connection.wait([worker.connection for worker in live],
                                                timeout=_next_look(live, timeout))
        for worker in list(live):
            ended = worker.process.exitcode is not None  # before reading: all it sent is in the pipe by now
            if not ended and worker.connection not in ready:
                continue
            try:
                while worker.connection.poll():
                    _receive(worker, worker.connection.recv(), outcomes)
            except (EOFError, OSError):  # every message it sent has been read (OSError: a message cut short)
                ended = True
            if ended:
                worker.process.join()
                worker.connection.close()
                live.remove(worker)
                worker.items = _ended(worker, cases, devices, outcomes, timeout)
                if worker.items:
                    live.append(launch(worker))
        if timeout is not None:
            for worker in live:
                _watch(worker, timeout)
    order = sorted(outcomes)
    for item in order:
        result, _, gpu_counts, cpu_counts = outcomes[item]
        tally(paths, gpu_counts, result.key)
        tally(cpu_seen, cpu_counts, result.key)
    return [outcomes[item][0] for item in order], [outcomes[item][1] for item in order]


def _receive(worker: _Worker, message: tuple, outcomes: dict[Item, tuple[Result, float, dict, dict]]) -> None:
    """Take a worker's message: ("start", n) or ("done", n, result, seconds, GPU paths, CPU paths)."""
    item = worker.items[message[1]]
    if message[0] == "start":
        worker.running, worker.started = item, time.perf_counter()
    else:
        _, _, fields, seconds, gpu_counts, cpu_counts = message
        outcomes[item] = (Result(**fields), seconds, gpu_counts, cpu_counts)
        worker.running, worker.ran = None, worker.ran + 1


def _next_look(live: list[_Worker], timeout: float | None) -> float:
    """Seconds to wait for a message before looking at the workers again: at most one (a death that leaves
    its pipe open is seen by its exit status), less where a case's timeout or a kill's grace ends sooner."""
    now, wait = time.perf_counter(), 1.0
    for worker in live:
        if worker.killed is not None:
            wait = min(wait, worker.terminated + KILL_GRACE - now)
        elif timeout is not None and worker.running is not None:
            wait = min(wait, worker.started + timeout - now)
    return max(wait, 0.01)


def _watch(worker: _Worker, timeout: float) -> None:
    """Kill a worker whose case has run past `timeout` seconds: SIGTERM, then SIGKILL where it is still
    alive KILL_GRACE seconds later. Its death is then seen and accounted for as any other (_ended)."""
    now = time.perf_counter()
    if worker.killed is None and worker.running is not None and now - worker.started > timeout:
        worker.killed, worker.terminated = worker.running, now
        worker.process.terminate()
    elif worker.killed is not None and now - worker.terminated > KILL_GRACE and worker.process.exitcode is None:
        worker.process.kill()


def _ended(worker: _Worker, cases: list[Case], devices: list[str],
           outcomes: dict[Item, tuple[Result, float, dict, dict]], timeout: float | None = None) -> list[Item]:
    """Account for a worker process that has ended; the items a fresh process must go on with. A case it
    died in is failed with how it died (or, where the run killed it for running past `timeout`, with that);
    where it died before its first case, a fresh one would too, and the rest are failed."""
    if worker.killed is not None and worker.running not in (None, worker.killed):
        # The case it was killed for finished as the kill was decided, and the next one had started: that
        # one is not to blame, and a fresh process runs it again.
        worker.running = None
    left = [item for item in worker.items if item not in outcomes and item != worker.running]
    how = death(worker.process.exitcode)
    name = f"worker {worker.number}"
    if worker.running is not None:
        d, c = worker.running
        limit = timeout if worker.running == worker.killed else None
        outcomes[worker.running] = (crashed(cases[c], devices[d], how, True, limit),
                                    time.perf_counter() - worker.started, {}, {})
        what = (f"{cases[c].key}[{devices[d]}] ran past --case-timeout {limit:g} s and the process was killed "
                f"({how})") if limit is not None else f"the process {how} during {cases[c].key}[{devices[d]}]"
        print(f"[{name}: {what}; {len(left)} cases left to a fresh process]", file=sys.stderr, flush=True)
    elif not left:
        print(f"[{name} done: {worker.ran} results" + ("" if worker.process.exitcode == 0 else
              f"; then the process {how}") + "]", file=sys.stderr, flush=True)
    elif worker.ran == 0:
        for d, c in left:
            outcomes[(d, c)] = (crashed(cases[c], devices[d], how, False), 0.0, {}, {})
        print(f"[{name}: the process {how} before its first case; its {len(left)} cases failed]",
              file=sys.stderr, flush=True)
        return []
    else:
        print(f"[{name}: the process {how} between two cases; {len(left)} cases left to a fresh process]",
              file=sys.stderr, flush=True)
    return left
