"""Benchmark machinery: each benchmark is one (op, shape) group holding our kernel
and its PyTorch twin on the same device and shapes. GPU timings synchronize the
stream after every call and leave compilation and init out (one warm-up call).

`pytest tests/bench --benchmark-only` prints pytest-benchmark's table, then our
summary (tools/bench_summary.py): one row per benchmark with our median beside
PyTorch's, the ratio, our GB/s (bytes each call must move) and TFLOP/s, and each
op's geometric-mean ratio. It also writes the summary as JSON to
$BENCH_SUMMARY_JSON or .benchmarks/summary.json; tools/bench_table.py reads it.

CPU threads: ours run on a handle of $KERNELS_BENCH_THREADS threads and PyTorch is set to as many
(torch.set_num_threads); unset, each takes its default (ours: the cores this process may use).
CPU rows take the median of 5 rounds, or of $KERNELS_BENCH_CPU_ROUNDS: on a shared host, where one
round can take half again as long as the next, more rounds make the medians of two runs agree.
The summary's header line says what each side used.

$KERNELS_BENCH_PARTS=1 also splits each GPU row's call in two (Bench.parts): its host time, the call
alone up to its return, and its GPU time, timed by two CUDA events with the whole call's work queued
behind a sleeping kernel, so no launch gap counts. The summary then shows both parts of both sides. It
needs torch on both sides (its events and its sleep kernel), and is left out of ordinary runs: the
sleeping kernels add a few seconds, and a row's median is timed before them, unchanged.

$KERNELS_BENCH_SET sets int constants of the kernels' modules for the run, for sweeps of the CPU's
part counts and block lengths: "runtime.cpu.PIECE_BYTES=1,softmax.cpu.PARALLEL_BLOCK_ELEMENTS=262144" (each
name a module under kernels and its constant; one part a thread where PIECE_BYTES is 1). The header
line says what was set.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

import kernels
from conformance.harness import device_unavailable
from kernels.runtime.core import BFLOAT16
from tools import bench_summary as summary

# The CPU threads of both sides ($KERNELS_BENCH_THREADS), or None: each side's default.
THREADS = int(os.environ["KERNELS_BENCH_THREADS"]) if os.environ.get("KERNELS_BENCH_THREADS") else None
# The rounds of a CPU row ($KERNELS_BENCH_CPU_ROUNDS, default 5); a GPU row takes 20 rounds of 5 calls.
CPU_ROUNDS = int(os.environ.get("KERNELS_BENCH_CPU_ROUNDS") or 5)
# Whether GPU rows also time the host and GPU parts of one call ($KERNELS_BENCH_PARTS=1), and from how many calls.
PARTS = os.environ.get("KERNELS_BENCH_PARTS") == "1"
PARTS_CALLS = 21
# The sleeping kernel queued before each call of a parts measurement: 4M GPU cycles, 2 ms at the
# H100's and H200's 1.98 GHz, doubled until it lasts more than twice the longest call's host time.
SLEEP_CYCLES = 4_000_000


def set_constants(text: str) -> dict[str, int]:
    """Set each "module.NAME=value" of a comma-separated list (a module under kernels, an int constant
    of it); what was set, by name. Anything else is refused (pytest.UsageError), before any row runs."""
    done = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, value = item.partition("=")
        module_name, _, attribute = name.strip().rpartition(".")
        try:
            module = importlib.import_module(f"kernels.{module_name}") if module_name else None
            current = getattr(module, attribute)
            number = int(value)
        except (ImportError, AttributeError, ValueError):
            module = current = None
        if not equals or module is None or type(current) is not int:
            raise pytest.UsageError(f"$KERNELS_BENCH_SET: {item!r} is not MODULE.NAME=INT for an int constant "
                                    "of a module under kernels (for example runtime.cpu.PIECE_BYTES=1)")
        setattr(module, attribute, number)
        done[name.strip()] = number
    return done


# The constants this run sets ($KERNELS_BENCH_SET), set when pytest loads this file (pytest_configure).
SET: dict[str, int] = {}


def pytest_configure(config):
    SET.update(set_constants(os.environ.get("KERNELS_BENCH_SET", "")))


# The environment variables that change how the thread pools of either side wait or how many threads
# they make (read when the libraries load): the header line names those set. OpenBLAS's idle threads
# spin for 2^OPENBLAS_THREAD_TIMEOUT cycles (2^28 unset) after each GEMM they ran, beside whatever runs
# next: PyTorch's rows and ours (docs/api.md, CPU threads).
THREAD_ENVIRONMENT = ("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                      "GOMP_SPINCOUNT")


def cpu_threads_used() -> dict:
    """What each side runs on: our handle's threads, NumPy's BLAS (threadpoolctl), PyTorch's threads,
    and the thread pools' environment variables that are set."""
    used = {"ours": kernels.cpu_handle(THREADS).threads, "cores": kernels.runtime.cpu.available_cores(),
            "blas": [{k: info.get(k) for k in ("internal_api", "version", "num_threads")}
                     for info in kernels.runtime.cpu.blas_info()]}
    if SET:
        used["set"] = dict(SET)
    environment = {name: os.environ[name] for name in THREAD_ENVIRONMENT if name in os.environ}
    if environment:
        used["environment"] = environment
    try:
        import torch
    except ImportError:  # the summary says so; the torch rows skip
        return used
    if THREADS is not None:
        torch.set_num_threads(THREADS)
    used["torch"] = torch.get_num_threads()
    return used

# The dtypes of the rows of ops that take half precision: float32 everywhere, float16 and bfloat16 on
# the GPU only (half precision is a GPU matter, and the CPU twins would take minutes at these sizes).
# A half row's group ends in the dtype's name; the float32 groups are unchanged.
DTYPES = [
    pytest.param(np.dtype(np.float32), id="f32"),
    pytest.param(np.dtype(np.float16), id="f16"),
    pytest.param(BFLOAT16, id="bf16"),
]


def dtype_suffix(dtype) -> str:
    """What a row's group name ends in: nothing for float32, else ' float16' or ' bfloat16'."""
    return "" if np.dtype(dtype) == np.float32 else " " + np.dtype(dtype).name


def half_rows_on_gpu_only(bench, dtype) -> None:
    if np.dtype(dtype) != np.float32 and bench.device == "cpu":
        pytest.skip("half-precision rows run on the GPU only")


IMPLS = [
    pytest.param(("ours", "cpu"), id="ours-cpu"),
    pytest.param(("torch", "cpu"), id="torch-cpu"),
    pytest.param(("ours", "gpu"), id="ours-gpu", marks=pytest.mark.gpu),
    pytest.param(("torch", "gpu"), id="torch-gpu", marks=pytest.mark.gpu),
]


class Bench:
    """One implementation on one device: array factories and a timed runner."""

    def __init__(self, impl: str, device: str):
        self.impl, self.device = impl, device
        reason = device_unavailable(device)
        if reason is not None:
            pytest.skip(f"{device}: {reason}")
        if impl == "torch":
            self.torch = pytest.importorskip("torch", reason="the PyTorch twin needs torch")
            if device == "gpu" and not self.torch.cuda.is_available():
                pytest.skip("torch has no CUDA here")
            self.torch.backends.cuda.matmul.allow_tf32 = False
            self.torch.backends.cudnn.allow_tf32 = False
            if THREADS is not None:
                self.torch.set_num_threads(THREADS)
        if device == "cpu":
            self.stream, self.handle, self.xp = kernels.cpu_stream(), kernels.cpu_handle(THREADS), np
        else:
            import cupy

            self.stream, self.handle, self.xp = kernels.gpu_stream(0), kernels.gpu_handle(0), cupy

    def array(self, dims, dtype=np.float32, seed=0):
        """Random data (never zeros) as our array type or a torch tensor on the device; half dtypes get
        the same values rounded (bfloat16 reaches torch through float32, which holds it exactly)."""
        host = np.random.default_rng(seed).standard_normal(dims).astype(dtype)
        if self.impl == "torch":
            if np.dtype(dtype) == BFLOAT16:
                tensor = self.torch.from_numpy(host.astype(np.float32)).to(self.torch.bfloat16)
            else:
                tensor = self.torch.from_numpy(host)
            return tensor.cuda() if self.device == "gpu" else tensor
        if self.device == "gpu":
            with self.stream:  # the upload ordered before the kernels that read it, on their stream
                return self.xp.asarray(host)
        return self.xp.asarray(host)

    def empty(self, dims, dtype=np.float32):
        if self.impl == "torch":
            return self.torch.empty(dims, dtype=getattr(self.torch, np.dtype(dtype).name),
                                    device="cuda" if self.device == "gpu" else "cpu")
        if self.device == "gpu":
            with self.stream:  # pool memory tied to the kernels' stream, which writes it
                return self.xp.empty(dims, dtype=dtype)
        return self.xp.empty(dims, dtype=dtype)

    def sync(self):
        if self.device == "gpu":
            if self.impl == "torch":
                self.torch.cuda.synchronize()
            else:
                self.stream.synchronize()

    def run(self, benchmark, function, bytes_moved: int, group: str, flops: int = 0):
        """Time `function` (one warm-up call first), synchronizing after each call."""
        def call():
            function()
            self.sync()

        call()  # compile, pick algorithms, fill caches: not timed
        benchmark.group = group
        benchmark.extra_info.update(bytes=int(bytes_moved), flops=int(flops), impl=self.impl, device=self.device)
        benchmark.pedantic(call, rounds=20 if self.device == "gpu" else CPU_ROUNDS, iterations=5 if self.device == "gpu" else 1,
                           warmup_rounds=1)
        if PARTS and self.device == "gpu":
            host, device = self.parts(function)
            benchmark.extra_info.update(host_us=host * 1e6)
            if device is not None:
                benchmark.extra_info.update(device_us=device * 1e6)

    def parts(self, function, calls: int = PARTS_CALLS) -> tuple[float, float | None]:
        """The medians of `calls` calls' host time and GPU time.

        The host time is the call alone, up to its return, each call made with the GPU idle (synchronized
        after each), as in the timed rounds. The GPU time is taken between CUDA events before and after the
        call's work on its stream, with each call queued behind a kernel that sleeps longer than the call's
        host time (torch.cuda._sleep), so all of the call's work is queued before any of it runs: the GPU
        time holds no launch gap and no wait of the host's. A sleep the host outlasts is doubled and the
        GPU time measured again, up to 64 times the first sleep; a call that outlasts even that (one that
        waits for its own GPU work) has no GPU time (None). (Host times taken behind the sleeping kernel
        come out longer, on both sides, than the same calls' with the GPU idle: they only size the sleep.)"""
        torch = pytest.importorskip("torch", reason="KERNELS_BENCH_PARTS times with torch's events")
        hosts = []
        for _ in range(calls):
            begin = time.perf_counter()
            function()
            hosts.append(time.perf_counter() - begin)
            self.sync()
        host = statistics.median(hosts)
        if self.impl == "torch":
            stream = torch.cuda.current_stream()
        else:  # our stream, as torch sees it: the events and the sleep go where our kernels go
            stream = torch.cuda.ExternalStream(self.stream.ptr, device=torch.device("cuda", self.stream.device))
        cycles = SLEEP_CYCLES
        with torch.cuda.stream(stream):
            while True:
                queued, devices, slept = [], [], []
                for _ in range(calls):
                    before, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                    before.record(stream)
                    torch.cuda._sleep(cycles)
                    start.record(stream)
                    begin = time.perf_counter()
                    function()
                    queued.append(time.perf_counter() - begin)
                    end.record(stream)
                    end.synchronize()
                    slept.append(before.elapsed_time(start) * 1e-3)
                    devices.append(start.elapsed_time(end) * 1e-3)
                if max(queued) < 0.5 * min(slept):
                    return host, statistics.median(devices)
                if cycles >= 64 * SLEEP_CYCLES:
                    return host, None
                cycles *= 2

    def close(self):
        self.handle.close()


@pytest.fixture(params=IMPLS)
def bench(request):
    impl, device = request.param
    b = Bench(impl, device)
    yield b
    b.close()


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's own tables
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After the run: our summary (tools/bench_summary.py), and the same as JSON in
    $BENCH_SUMMARY_JSON or .benchmarks/summary.json for tools/bench_table.py."""
    session = getattr(config, "_benchmarksession", None)
    records = summary.records_from_benchmarks(getattr(session, "benchmarks", None) or [])
    if not records:
        return
    terminalreporter.write_sep("-", summary.TITLE)
    threads = cpu_threads_used()
    terminalreporter.write_line(summary.threads_line(threads))
    for line in summary.format_text(summary.summarize(records)):
        terminalreporter.write_line(line)
    path = Path(os.environ.get("BENCH_SUMMARY_JSON") or config.rootpath / ".benchmarks" / "summary.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary.to_json(records, threads), indent=1) + "\n")
    terminalreporter.write_line(f"summary JSON: {path} (python3 tools/bench_table.py {path})")
