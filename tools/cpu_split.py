"""Where a CPU kernel's split loses its time on this host: each kernel below forced to p parts (every
kernels.runtime.cpu.cpu_parallel call cut into one part per thread of a handle of p threads, whatever its bytes:
cpu.PIECE_BYTES = 1), and, for each top-level cpu_parallel call it makes, the call's wall time beside the
sum and the largest of its parts' own times. Run from the repository root:

    python3 tools/cpu_split.py [--threads 1,2,4,8,16] [--runs 9] [--scale 1]

Read it so:
- busy (the sum of the parts' times) against the one-part time: if it grows with p, each part runs slower
  beside the others than alone (the GIL, which every NumPy call takes to begin and to end; or the memory
  bandwidth the parts share);
- wall against the largest part: the hand-off to the pool threads and the wait for the last one.

Kernels (the YOLOv10 benchmark rows of tests/bench), float32:
    batch_norm+SiLU training forward (1, 16, 320, 320): its sums passes and its apply pass
    element_unary SiLU forward (1, 80, 320, 320)
    softmax forward (1, 5, 400, 400) along the last dim
    element_binary ADD (1, 80, 160, 160) + (1, 80, 160, 160)
--scale N divides the last dim of each shape by N (a quick run; the tests use it). A row is the median
call of `runs` (after one warm-up), with that call's cpu_parallel records. One thread makes no
cpu_parallel call for the add (the whole call is one NumPy call)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, Iterator

import numpy as np

sys.path.insert(0, ".")
import kernels  # noqa: E402
from kernels import TensorShape, batch_norm, element_binary, element_unary, softmax
from kernels.runtime import cpu  # noqa: E402

Record = tuple[float, float, float, int]  # wall, busy (sum of parts), largest part (s), parts


def recording(records: list[Record]) -> Callable[..., None]:
    """A cpu_parallel that records each top-level call (nested ones run inline in a part, as always)."""
    real = cpu.cpu_parallel

    def spy(function: Callable[[int, int], None], count: int, nbytes: int | None = None) -> None:
        if getattr(cpu._CPU_WORKER, "busy", False):  # inside a part: runs inline, counted in that part
            real(function, count, nbytes)
            return
        parts: list[float] = []

        def timed(first: int, last: int) -> None:
            start = time.perf_counter()
            function(first, last)
            parts.append(time.perf_counter() - start)  # list.append is atomic under the GIL

        start = time.perf_counter()
        real(timed, count, nbytes)
        records.append((time.perf_counter() - start, sum(parts), max(parts), len(parts)))

    return spy


def cases(handle: Any, scale: int) -> Iterator[tuple[str, Callable[[], None]]]:
    """(name, call) of each kernel on `handle`, its arrays made once."""
    rng = np.random.default_rng(0)
    stream, f32 = kernels.cpu_stream(), np.float32

    def dims(*shape: int) -> tuple[int, ...]:
        return shape[:-1] + (max(1, shape[-1] // scale),)

    x = rng.standard_normal(dims(1, 16, 320, 320)).astype(f32)
    y = np.empty_like(x)
    gamma, beta = np.ones(16, f32), np.zeros(16, f32)
    bn = batch_norm.BatchNormAttrs(eps=1e-3, momentum=0.03, activation="SILU")
    bn_state = batch_norm.init_kernel(handle, bn, TensorShape(x.shape, f32), TensorShape(x.shape, f32))
    yield (f"batch_norm+SiLU training forward {x.shape}",
           lambda: batch_norm.forward_kernel(stream, handle, bn_state, bn, x, gamma, beta, y))
    u = rng.standard_normal(dims(1, 80, 320, 320)).astype(f32)
    v = np.empty_like(u)
    silu = element_unary.ElementUnaryAttrs(op_type="SILU")
    silu_state = element_unary.init_kernel(handle, silu, TensorShape(u.shape, f32), TensorShape(u.shape, f32))
    yield f"element_unary SiLU forward {u.shape}", lambda: element_unary.forward_kernel(stream, handle, silu_state,
                                                                                        silu, u, v)
    m = rng.standard_normal(dims(1, 5, 400, 400)).astype(f32)
    n = np.empty_like(m)
    rows = softmax.SoftmaxAttrs(-1)
    rows_state = softmax.init_kernel(handle, rows, TensorShape(m.shape, f32), TensorShape(m.shape, f32))
    yield f"softmax forward {m.shape} dim -1", lambda: softmax.forward_kernel(stream, handle, rows_state, rows, m, n)
    a = rng.standard_normal(dims(1, 80, 160, 160)).astype(f32)
    b = rng.standard_normal(a.shape).astype(f32)
    out = np.empty_like(a)
    add = element_binary.ElementBinaryAttrs(element_binary.BinaryOpType.ADD)
    add_state = element_binary.init_kernel(handle, add, TensorShape(a.shape, f32), TensorShape(b.shape, f32),
                                           TensorShape(out.shape, f32))
    yield f"element_binary ADD {a.shape}", lambda: element_binary.forward_kernel(stream, handle, add_state, add,
                                                                                 a, b, out)


def measure(threads: list[int], runs: int, scale: int) -> list[tuple[str, int, float, list[Record]]]:
    """(kernel, p, median call s, that call's records) for each p and kernel, parts forced to p."""
    rows = []
    records: list[Record] = []
    real, pieces = cpu.cpu_parallel, cpu.PIECE_BYTES
    cpu.cpu_parallel, cpu.PIECE_BYTES = recording(records), 1
    try:
        for p in threads:
            handle = kernels.cpu_handle(p)
            for name, call in cases(handle, scale):
                call()  # warm-up: scratch buffers, the pool's threads
                calls = []
                for _ in range(runs):
                    records.clear()
                    start = time.perf_counter()
                    call()
                    calls.append((time.perf_counter() - start, list(records)))
                calls.sort(key=lambda c: c[0])
                seconds, made = calls[len(calls) // 2]
                rows.append((name, p, seconds, made))
    finally:
        cpu.cpu_parallel, cpu.PIECE_BYTES = real, pieces
    return rows


def report(rows: list[tuple[str, int, float, list[Record]]]) -> None:
    print("| kernel | p | call us | each cpu_parallel call: wall / busy (sum of parts) / largest part us (parts) |")
    print("|---|---:|---:|---|")
    for name, p, seconds, made in rows:
        calls = "; ".join(f"{w * 1e6:.0f} / {b * 1e6:.0f} / {m * 1e6:.0f} ({k})" for w, b, m, k in made) or "-"
        print(f"| {name} | {p} | {seconds * 1e6:.0f} | {calls} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cpu_split.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cores = cpu.available_cores()
    default = ",".join(str(p) for p in (1, 2, 4, 8, 16) if p <= cores)
    parser.add_argument("--threads", default=default, help=f"comma-separated part counts (default {default})")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--scale", type=int, default=1, help="divide each shape's last dim by this")
    args = parser.parse_args(argv[1:])
    threads = [int(p) for p in args.threads.split(",")]
    print(f"{cores} cores available; parts forced to p (runtime.cpu.PIECE_BYTES = 1)\n")
    report(measure(threads, args.runs, args.scale))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
