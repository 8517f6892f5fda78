"""How fast ONE NumPy elementwise pass can go on this host when it is split over p Python threads, beside
PyTorch's CPU doing the same pass on p threads: the ceiling of kernels.runtime.cpu.cpu_parallel's design (one
NumPy call per part, the GIL released inside it), for the report of which CPU benchmark rows NumPy
cannot bring within 3x of PyTorch. Run from the repository root (torch is optional):

    python3 tools/cpu_ceiling.py [--threads 1,2,4,8,16] [--json FILE] [--block ELEMENTS]

Default threads: 1, 2, 4, 8, ... up to the cores this process may run on (os.sched_getaffinity), and
that core count itself. Each pass runs over a float32 tensor of 80*320*320 elements (YOLOv10's
largest SiLU row) and of 256*20*20 (a small deep layer):

    copy  np.copyto(out, x)                                  torch out.copy_(x)
    add   np.add(x, y, out=out)                              torch.add(x, y, out=out)
    exp   float64 scratch = x; np.exp(scratch, out=scratch);  torch.exp(x, out=out) (float32)
          out = scratch (one rounding)
    silu  float64 scratch = x; t = exp(-scratch); t += 1;     torch.ops.aten.silu.out(x, out=out)
          scratch /= t; out = scratch (one rounding)          (else out.copy_(F.silu(x)); the header says which)

NumPy on p threads: the tensor is cut into p disjoint contiguous parts (arrays and inner borders on
64-byte lines), each with its own slice of two float64 scratch arrays as long as the tensor (made once per
size, so nothing is allocated in the timed loop and no part writes another's lines); the library's own
pool runs them (kernels.runtime.cpu.cpu_parallel on a handle of p threads, one part a job: parts 1..p-1 on its
pool threads while the calling thread runs part 0); p = 1 is a direct call.
--block ELEMENTS (default 0: whole parts) walks each part in blocks of that many elements, reusing a
block-long scratch, as kernels.activation.blockwise does. Every p must write the same bits as the
first (checked). PyTorch: torch.set_num_threads(p), tensors made with torch.from_numpy of the same
arrays; all NumPy cells run before the first torch cell, so torch's idle OpenMP threads do not spin
beside NumPy's. A cell is the median of at least 7 calls and at least 0.2 s of them (at most 10000),
after a warm-up of 3 calls and at least 0.1 s (on some hosts, such as a 2-core VM, a pass over fresh
arrays runs 2x slow for its first ~0.1 s); its GB/s counts the float32 bytes the pass must read and
write (copy and exp 8 an element, add 12, silu 8). "empty" is a split into p parts that do nothing:
the hand-off alone.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

sys.path.insert(0, ".")
from kernels.runtime import cpu  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

SIZES = {"80x320x320": 80 * 320 * 320, "256x20x20": 256 * 20 * 20}
PASS_BYTES = {"copy": 8, "add": 12, "exp": 8, "silu": 8}  # float32 bytes read + written per element
WARMUP, WARMUP_SECONDS, MIN_REPS, MAX_REPS, MIN_SECONDS = 3, 0.1, 7, 10000, 0.2
LINE_BYTES = 64
LINE_ELEMENTS = LINE_BYTES // 4  # float32 elements in a cache line

Call = Callable[[], Any]
Block = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # x, y, out, float64 scratch and temp


@dataclass
class Buffers:
    """One tensor size's arrays, made and written once (fresh memory runs slow on some hosts for its
    first ~0.1 s of use): inputs x and y, NumPy's out, and two float64 scratch arrays as long, of which
    each part uses its own slice (the same slice whatever the pass)."""

    x: np.ndarray
    y: np.ndarray
    out: np.ndarray
    wide: np.ndarray
    temp: np.ndarray


def line_aligned_zeros(elements: int, dtype: type) -> np.ndarray:
    """A zeroed 1-D array starting on a 64-byte cache line (NumPy's own start only on 16 bytes)."""
    raw = np.zeros(elements * np.dtype(dtype).itemsize + LINE_BYTES, np.uint8)
    start = -raw.ctypes.data % LINE_BYTES
    return raw[start:start + elements * np.dtype(dtype).itemsize].view(dtype)


def make_buffers(elements: int, rng: np.random.Generator) -> Buffers:
    x, y = line_aligned_zeros(elements, np.float32), line_aligned_zeros(elements, np.float32)
    rng.standard_normal(out=x, dtype=np.float32)
    rng.standard_normal(out=y, dtype=np.float32)
    wide, temp = line_aligned_zeros(elements, np.float64), line_aligned_zeros(elements, np.float64)
    return Buffers(x, y, line_aligned_zeros(elements, np.float32), wide, temp)


@dataclass
class Cell:
    """One measurement: a pass over `elements` on `threads` threads by `impl` (numpy or torch)."""

    name: str
    elements: int
    threads: int
    impl: str
    median_us: float
    gbps: float | None
    reps: int


# --------------------------------------------------------------------------- NumPy passes on one block


def _copy(x: np.ndarray, y: np.ndarray, out: np.ndarray, wide: np.ndarray, temp: np.ndarray) -> None:
    np.copyto(out, x)


def _add(x: np.ndarray, y: np.ndarray, out: np.ndarray, wide: np.ndarray, temp: np.ndarray) -> None:
    np.add(x, y, out=out)


def _exp64(x: np.ndarray, y: np.ndarray, out: np.ndarray, wide: np.ndarray, temp: np.ndarray) -> None:
    np.copyto(wide, x)
    np.exp(wide, out=wide)
    np.copyto(out, wide)


def _silu64(x: np.ndarray, y: np.ndarray, out: np.ndarray, wide: np.ndarray, temp: np.ndarray) -> None:
    np.copyto(wide, x)
    np.negative(wide, out=temp)
    np.exp(temp, out=temp)
    np.add(temp, 1.0, out=temp)
    np.divide(wide, temp, out=wide)
    np.copyto(out, wide)


KERNELS: dict[str, Callable[..., None]] = {"copy": _copy, "add": _add, "exp": _exp64, "silu": _silu64}


# --------------------------------------------------------------------------- splitting and timing


def part_bounds(count: int, parts: int) -> list[int]:
    """p + 1 bounds of p contiguous parts of range(count), inner ones on cache-line multiples."""
    inner = [count * i // parts // LINE_ELEMENTS * LINE_ELEMENTS for i in range(1, parts)]
    return [0, *inner, count]


def part_blocks(buffers: Buffers, first: int, last: int, block: int) -> list[Block]:
    """The blocks of the part [first, last) of x, y and out, each with the part's own float64 scratch:
    views of wide and temp from `first` on, a block long (the part's length with block 0)."""
    step = block or max(last - first, 1)
    blocks = []
    for start in range(first, last, step):
        length = min(step, last - start)
        scratch = (buffers.wide[first:first + length], buffers.temp[first:first + length])
        blocks.append((buffers.x[start:start + length], buffers.y[start:start + length],
                       buffers.out[start:start + length], *scratch))
    return blocks


def part_job(kernel: Callable[..., None], blocks: list[Block]) -> Call:
    """A call running kernel over a part's blocks, one after another."""

    def job() -> None:
        for args in blocks:
            kernel(*args)

    return job


class Split:
    """p parts run by the library's own pool: kernels.runtime.cpu.cpu_parallel on a handle of p threads, one job
    a part (part 0 in the calling thread), its pool threads made before the first timed call."""

    def __init__(self, parts: int):
        self.handle, self.jobs = cpu.cpu_handle(parts), [lambda: None] * parts

        @cpu.cpu_kernel
        def split(stream: Any, handle: Any) -> None:
            cpu.cpu_parallel(self._part, len(self.jobs))

        self._split = split
        self._split(None, self.handle)  # the pool's threads, made now

    def _part(self, first: int, last: int) -> None:
        for job in self.jobs[first:last]:
            job()

    def run(self, jobs: list[Call]) -> None:
        """Every job, one a part, jobs[0] in the calling thread; returns when all are done."""
        self.jobs = jobs
        self._split(None, self.handle)


def _seconds(call: Call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def median_us(call: Call) -> tuple[float, int]:
    """The median of a call in microseconds after a warm-up (WARMUP calls and WARMUP_SECONDS at least),
    and the repetitions it took."""
    warmup = [_seconds(call) for _ in range(WARMUP)]
    while sum(warmup) < WARMUP_SECONDS:
        warmup.append(_seconds(call))
    estimate = min(warmup)
    reps = min(MAX_REPS, max(MIN_REPS, math.ceil(MIN_SECONDS / max(estimate, 1e-9))))
    return statistics.median(_seconds(call) for _ in range(reps)) * 1e6, reps


def make_cell(name: str, elements: int, threads: int, impl: str, call: Call) -> Cell:
    us, reps = median_us(call)
    gbps = PASS_BYTES[name] * elements / (us * 1e3) if name in PASS_BYTES else None
    return Cell(name, elements, threads, impl, us, gbps, reps)


# --------------------------------------------------------------------------- the two sides


def numpy_cells(buffers: Buffers, threads: list[int], block: int) -> list[Cell]:
    """Every NumPy pass at every thread count; each p's output checked against the first p's."""
    out = buffers.out
    cells, first_bits = [], {}
    for p in threads:
        split = Split(p)
        bounds = part_bounds(out.size, p)
        parts = [part_blocks(buffers, bounds[i], bounds[i + 1], block) for i in range(p)]
        for name, kernel in KERNELS.items():
            jobs = [part_job(kernel, blocks) for blocks in parts]
            out.fill(np.nan)
            cells.append(make_cell(name, out.size, p, "numpy", functools.partial(split.run, jobs)))
            reference = first_bits.setdefault(name, out.copy())
            if np.isnan(out).any() or not np.array_equal(out, reference):
                raise AssertionError(f"numpy {name} on {p} threads differs from 1 thread")
    return cells


def empty_cells(threads: list[int]) -> list[Cell]:
    """The hand-off alone: p parts that do nothing."""
    cells = []
    for p in threads:
        split = Split(p)
        jobs: list[Call] = [lambda: None] * p
        cells.append(make_cell("empty", 0, p, "numpy", functools.partial(split.run, jobs)))
    return cells


def torch_silu_label() -> str:
    try:
        torch.ops.aten.silu.out  # noqa: B018 - the lookup is the test
        return "torch.ops.aten.silu.out(x, out=out)"
    except (AttributeError, RuntimeError):
        return "out.copy_(torch.nn.functional.silu(x))"


def torch_calls(buffers: Buffers) -> dict[str, Call]:
    """The torch twin of each pass, on tensors sharing x's and y's memory (out: a new array)."""
    tx, ty = torch.from_numpy(buffers.x), torch.from_numpy(buffers.y)
    out = torch.from_numpy(line_aligned_zeros(buffers.out.size, np.float32))
    if torch_silu_label().startswith("torch.ops"):
        silu: Call = lambda: torch.ops.aten.silu.out(tx, out=out)  # noqa: E731
    else:
        silu = lambda: out.copy_(torch.nn.functional.silu(tx))  # noqa: E731
    return {"copy": lambda: out.copy_(tx), "add": lambda: torch.add(tx, ty, out=out),
            "exp": lambda: torch.exp(tx, out=out), "silu": silu}


def torch_cells(buffers: Buffers, threads: list[int]) -> list[Cell]:
    """Every torch pass at every thread count (torch.set_num_threads(p)); torch's count restored after."""
    cells = []
    default = torch.get_num_threads()
    calls = torch_calls(buffers)
    for p in threads:
        torch.set_num_threads(p)
        cells += [make_cell(name, buffers.x.size, p, "torch", call) for name, call in calls.items()]
    torch.set_num_threads(default)
    return cells


# --------------------------------------------------------------------------- report


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")
    except OSError:
        return "?"


def host_info() -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"cores": cores, "numpy": np.__version__,
            "torch": torch.__version__ if torch is not None else None,
            "torch_default_threads": torch.get_num_threads() if torch is not None else None,
            "torch_silu": torch_silu_label() if torch is not None else None,
            "processor": platform.processor(), "cpu_model": cpu_model(), "python": platform.python_version()}


def default_threads(cores: int) -> list[int]:
    powers = [1 << k for k in range(cores.bit_length()) if 1 << k <= cores]
    return sorted({*powers, cores})


def _cell_text(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    return f"{cell.median_us:.1f}" + (f" ({cell.gbps:.1f})" if cell.gbps is not None else "")


def _ratio(a: Cell | None, b: Cell | None) -> str:
    return f"{a.median_us / b.median_us:.2f}" if a is not None and b is not None else "-"


def print_table(label: str, elements: int, threads: list[int], found: dict[tuple, Cell]) -> None:
    print(f"\n### {label}: {elements} float32 elements; median us (effective GB/s)\n")
    print("| pass | " + " | ".join(f"{p} thr numpy us | {p} thr torch us" for p in threads) + " |")
    print("|---|" + "---:|" * (2 * len(threads)))
    for name in KERNELS:
        row = [_cell_text(found.get((name, elements, p, impl))) for p in threads for impl in ("numpy", "torch")]
        print(f"| {name} | " + " | ".join(row) + " |")
    print()
    for name in KERNELS:
        one = found.get((name, elements, threads[0], "numpy"))
        speedups = ", ".join(f"{p} thr {_ratio(one, found.get((name, elements, p, 'numpy')))}x" for p in threads[1:])
        ratios = ", ".join(f"{p} thr {_ratio(found.get((name, elements, p, 'numpy')), found.get((name, elements, p, 'torch')))}"
                           for p in threads)
        print(f"- {name}: numpy speedup vs {threads[0]} thr: {speedups or '-'}; numpy / torch: {ratios}")


def report(host: dict[str, Any], threads: list[int], block: int, cells: list[Cell]) -> None:
    found = {(c.name, c.elements, c.threads, c.impl): c for c in cells}
    print(f"\n{host['cores']} cores available; numpy {host['numpy']}; torch {host['torch'] or '-'} "
          f"(default {host['torch_default_threads'] or '-'} threads); python {host['python']}")
    print(f"processor: {host['processor'] or '?'}; model name: {host['cpu_model']}")
    print(f"torch silu: {host['torch_silu'] or '-'}; numpy blocks: {block or 'whole parts'}")
    print("empty split (hand-off only): " + ", ".join(f"{p} thr {_cell_text(found.get(('empty', 0, p, 'numpy')))} us"
                                                     for p in threads))
    for label, elements in SIZES.items():
        print_table(label, elements, threads, found)


def thread_counts(text: str) -> list[int]:
    """--threads: comma-separated positive counts."""
    counts = [int(count) for count in text.split(",")]
    if min(counts) < 1:
        raise ValueError(text)
    return counts


def record(cell: Cell) -> dict[str, Any]:
    """A cell as a JSON record (its name under "pass")."""
    fields = asdict(cell)
    return {"pass": fields.pop("name"), **fields}


def parse_arguments(argv: list[str], cores: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=thread_counts, default=default_threads(cores),
                        help="comma-separated thread counts (default: 1, 2, 4, ... up to the cores, and the cores)")
    parser.add_argument("--json", metavar="FILE", help="write every cell to FILE as JSON")
    parser.add_argument("--block", type=int, default=0, metavar="ELEMENTS",
                        help="walk each part in blocks of ELEMENTS with block-sized scratch (default 0: whole parts)")
    arguments = parser.parse_args(argv)
    if arguments.block < 0:
        parser.error("--block takes a count >= 0")
    arguments.threads = sorted(set(arguments.threads))
    return arguments


def main(argv: list[str]) -> int:
    host = host_info()
    arguments = parse_arguments(argv, host["cores"])
    threads = arguments.threads
    rng = np.random.default_rng(0)
    cells = empty_cells(threads)
    sizes = [make_buffers(elements, rng) for elements in SIZES.values()]
    for buffers in sizes:
        cells += numpy_cells(buffers, threads, arguments.block)
    if torch is not None:
        for buffers in sizes:
            cells += torch_cells(buffers, threads)
    report(host, threads, arguments.block, cells)
    if arguments.json:
        with open(arguments.json, "w") as file:
            json.dump({"host": host, "threads": threads, "block": arguments.block,
                       "records": [record(c) for c in cells]}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
