"""`python -m conformance --jobs N`: the chosen cases dealt out to N worker processes, each running
its share on every chosen device, and the results merged back into the order of a run in one
process. Worker w runs the cases of the device named `gpu` on CUDA device w mod (visible devices), so
N = the number of GPUs gives one worker per GPU; a device named `gpu:N` stays on device N. Results
keep the device names asked for: a merged run reads exactly as a run in one process does."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import sys
import time
from dataclasses import asdict

from kernels.runtime import cpu_paths, gpu_paths

from .case import Case
from .harness import release_gpu_memory
from .runner import Result, run_case

# (device, case index) -> (result, seconds) for each case a worker ran, and its named GPU paths.
WorkerOutput = tuple[list[tuple[dict, float]], dict[str, dict], dict[str, dict]]


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


def work(goldens: str, keys: list[str], devices: list[str], schedules: list[str] | None, worker: int,
         gpus: int, backend: str = "kernels") -> WorkerOutput:
    """One worker's share, in its own process: every case of `keys` on every device (in the order of a
    run in one process) through the backend named `backend` (backends.load), each result relabelled
    with the device name asked for."""
    from .backends import load
    from .cases import all_cases
    from .golden import GoldenStore

    judged = load(backend)
    store = GoldenStore(goldens)
    by_key = {case.key: case for case in all_cases()}
    outputs: list[tuple[dict, float]] = []
    paths: dict[str, dict] = {}
    cpu_seen: dict[str, dict] = {}
    for device in devices:
        where = worker_device(device, worker, gpus)
        for key in keys:
            case = by_key[key]
            start = time.perf_counter()
            with gpu_paths.recording() as recording, cpu_paths.recording() as cpu_recording:
                result = run_case(case, store.get(case), where, schedules, judged)
            result.device = device
            tally(paths, recording, result.key)
            tally(cpu_seen, cpu_recording, result.key)
            outputs.append((asdict(result), time.perf_counter() - start))
    release_gpu_memory()
    return outputs, paths, cpu_seen


def tally(seen: dict[str, dict], recording, key: str) -> None:
    """Add a case's recording (gpu_paths' or cpu_paths') to `seen`: name -> {"first": case key, "count"}."""
    for name, count in recording.counts.items():
        seen.setdefault(name, {"first": key, "count": 0})["count"] += count


def run_spread(goldens: str, cases: list[Case], devices: list[str], jobs: int, schedules: list[str] | None,
               paths: dict[str, dict], cpu_seen: dict[str, dict] | None = None,
               backend: str = "kernels") -> tuple[list[Result], list[float]]:
    """Every case on every device over `jobs` worker processes (spawned: CUDA is never forked); the results
    and seconds in the order of a run in one process (devices, then cases), the GPU paths merged into
    `paths` and the CPU paths into `cpu_seen` (each path's first case: the first in that order)."""
    cpu_seen = {} if cpu_seen is None else cpu_seen
    gpus = visible_gpus() if "gpu" in devices else 0
    index = {case.key: i for i, case in enumerate(cases)}
    shares = [[cases[i].key for i in share] for share in deal(len(cases), jobs)]
    context = multiprocessing.get_context("spawn")
    gathered: list[tuple[dict, float]] = []
    found: list[tuple[dict[str, dict], dict[str, dict]]] = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(work, goldens, share, devices, schedules, worker, gpus, backend)
                   for worker, share in enumerate(shares) if share]
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            outputs, worker_paths, worker_cpu = future.result()
            gathered += outputs
            found += [(paths, worker_paths), (cpu_seen, worker_cpu)]
            print(f"[worker {done}/{len(futures)} done: {len(outputs)} results]", file=sys.stderr, flush=True)
    gathered.sort(key=lambda item: (devices.index(item[0]["device"]), index[f"{item[0]['op']}/{item[0]['case']}"]))
    results = [Result(**fields) for fields, _ in gathered]
    order = {result.key: n for n, result in enumerate(results)}
    for into, worker_paths in found:
        for name, entry in worker_paths.items():
            merged = into.setdefault(name, {"first": entry["first"], "count": 0})
            merged["count"] += entry["count"]
            if order[entry["first"]] < order[merged["first"]]:
                merged["first"] = entry["first"]
    return results, [seconds for _, seconds in gathered]
