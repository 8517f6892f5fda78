"""Which NumPy calls of the CPU kernels gain from threads on this host: each call, on 2^16-element
arrays of its own (a cache-sized block, as the kernels' blocks are), run `calls` times in each of p
threads at once, against the same p * calls one after another in one thread. A speedup near p: the
call releases the GIL and its threads run side by side; near 1 (or under): the threads queue, on the
GIL the call holds, or on handing the GIL from one thread to another at each call's start and end when
the call is short. Run from the repository root:

    python3 tools/cpu_gil.py [--threads 2,8] [--calls 200]

The calls (float32 unless named; NumPy's BLAS held to one thread, so that a GEMM's threads are ours):

    add.at             np.add.at(block, sorted targets, values)     the max-pool backward's scatter
    take               np.take(table, indices, out=, mode="clip")   the max-pool backward's offsets
    copyto int8->intp  the max-pool backward's taps widened
    copyto f32->f64    batch_norm's block widened to float64
    fill               a block zeroed
    exp, add           one ufunc pass (SiLU, softmax, element_binary)
    max, sum axis 1    softmax's reductions along rows of 400
    einsum rows        softmax backward's dot along rows of 400
    subtract rows      softmax's x - max along rows
    im2col             conv_2d's strided-view copy (16 channels, 3x3 taps, 64x64)
    matmul             a (32, 288) x (288, 2048) GEMM
    where              np.where(x > 0, x, 0) copied out (two passes and a temporary)

Each row prints one call's time alone and the speedup of p threads; --json FILE writes
{threads: {call: speedup}}."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any, Callable

import numpy as np

ELEMENTS = 1 << 16
ROW = 400


def arrays(seed: int) -> dict[str, np.ndarray]:
    """One thread's arrays: every call reads and writes its own."""
    rng = np.random.default_rng(seed)
    rows = ELEMENTS // ROW
    return {
        "x": rng.standard_normal(ELEMENTS).astype(np.float32), "y": np.zeros(ELEMENTS, np.float32),
        "x2": rng.standard_normal((rows, ROW)).astype(np.float32), "g2": rng.standard_normal((rows, ROW)).astype(np.float32),
        "y2": np.empty((rows, ROW), np.float32), "wide": np.empty(ELEMENTS, np.float64),
        "targets": np.sort(rng.integers(0, ELEMENTS, ELEMENTS)).astype(np.intp),
        "taps": rng.integers(0, 25, ELEMENTS).astype(np.int8), "offsets": rng.integers(0, 25, ELEMENTS).astype(np.intp),
        "table": np.arange(25, dtype=np.intp),
        "padded": rng.standard_normal((16, 66, 66)).astype(np.float32), "columns": np.empty((16, 3, 3, 64, 64), np.float32),
        "w": rng.standard_normal((32, 288)).astype(np.float32), "c": rng.standard_normal((288, 2048)).astype(np.float32),
        "o": np.empty((32, 2048), np.float32),
    }


def _im2col(d: dict[str, np.ndarray]) -> None:
    padded = d["padded"]
    channel, row, column = padded.strides
    view = np.lib.stride_tricks.as_strided(padded, (16, 3, 3, 64, 64), (channel, row, column, row, column))
    np.copyto(d["columns"], view)


CALLS: dict[str, Callable[[dict[str, np.ndarray]], Any]] = {
    "add.at": lambda d: np.add.at(d["y"], d["targets"], d["x"]),
    "take": lambda d: np.take(d["table"], d["offsets"], out=d["offsets"], mode="clip"),
    "copyto int8->intp": lambda d: np.copyto(d["offsets"], d["taps"], casting="unsafe"),
    "copyto f32->f64": lambda d: np.copyto(d["wide"], d["x"]),
    "fill": lambda d: d["y"].fill(0),
    "exp": lambda d: np.exp(d["x"], out=d["y"]),
    "add": lambda d: np.add(d["x"], d["x"], out=d["y"]),
    "max axis 1": lambda d: np.max(d["x2"], axis=1, keepdims=True),
    "sum axis 1": lambda d: np.sum(d["x2"], axis=1, keepdims=True),
    "einsum rows": lambda d: np.einsum("ab,ab->a", d["x2"], d["g2"]),
    "subtract rows": lambda d: np.subtract(d["x2"], d["x2"][:, :1], out=d["y2"]),
    "im2col": _im2col,
    "matmul": lambda d: np.matmul(d["w"], d["c"], out=d["o"]),
    "where": lambda d: np.copyto(d["y"], np.where(d["x"] > 0, d["x"], 0)),
}


def measure(threads: int, calls: int, names: list[str] | None = None) -> dict[str, tuple[float, float]]:
    """{call: (seconds of one call alone, speedup of `threads` threads)}."""
    data = [arrays(i) for i in range(threads)]
    results = {}
    with np.errstate(all="ignore"):
        for name in names or list(CALLS):
            call = CALLS[name]

            def loop(i: int, call: Callable[[dict[str, np.ndarray]], Any] = call) -> None:
                for _ in range(calls):
                    call(data[i])

            for i in range(threads):
                loop(i)  # warm: pages, caches
            start = time.perf_counter()
            for i in range(threads):
                loop(i)
            serial = time.perf_counter() - start
            workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
            start = time.perf_counter()
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            side_by_side = time.perf_counter() - start
            results[name] = (serial / (threads * calls), serial / side_by_side)
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cpu_gil.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="2,8", help="comma-separated thread counts (default 2,8)")
    parser.add_argument("--calls", type=int, default=200, help="calls per thread (default 200)")
    parser.add_argument("--json", help="write {threads: {call: speedup}} here")
    args = parser.parse_args(argv[1:])
    from threadpoolctl import threadpool_limits

    report: dict[int, dict[str, float]] = {}
    with threadpool_limits(1, user_api="blas"):
        for p in (int(t) for t in args.threads.split(",")):
            rows = measure(p, args.calls)
            report[p] = {name: round(speedup, 2) for name, (_, speedup) in rows.items()}
            print(f"\n{p} threads ({ELEMENTS} elements a call)\n\n| call | one call alone us | speedup of {p} threads |")
            print("|---|---:|---:|")
            for name, (alone, speedup) in rows.items():
                print(f"| {name} | {alone * 1e6:.1f} | {speedup:.2f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
