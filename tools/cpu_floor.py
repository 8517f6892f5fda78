"""Which CPU benchmark rows the NumPy design can bring within the targets (3x PyTorch on the host's
cores, 2x on 2 threads), from three summaries of `pytest tests/bench -k cpu --benchmark-only`
($BENCH_SUMMARY_JSON) on one host: KERNELS_BENCH_THREADS=1, =2, and unset (all cores):

    python3 tools/cpu_floor.py one.json two.json all.json [hand_off_us] [--ceiling ceiling.json]

A SUMMARY may be several runs of one setting joined by commas (one.json,one_b.json): each row, ours and
PyTorch's alike, takes its least median over them. On a shared host, where the same row moves by half
between runs, the best of two runs is the steadier estimate of what the code can do.

The floor of a row on p parts is W1 / p + h * (p - 1): W1 our one-thread time (NumPy's passes, one
after another, the GIL released inside each), h the calling thread's cost of handing one part to
a pool thread (default 18 us, the 16-core H200 host's; about 80 us on a 2-vCPU VM, so pass that there:
docs/performance.md#pool-hand-off-and-part-count), and
no memory-bandwidth limit (so the floor is optimistic). Its minimum over p up to the
threads is what any sharing of these passes into parts can reach; a row whose floor is over the
target cannot reach it without fusing passes, which NumPy's one-pass-per-ufunc model does not do.

With `--ceiling ceiling.json` (tools/cpu_ceiling.py's JSON from the same host) each column gains a
measured bound: the least time one NumPy pass over the row's bytes (the summary's "bytes": what any
implementation must read and write) can take there, the best over the part counts the ceiling measured
up to the column's threads of bytes / its copy bandwidth (largest tensor) + its hand-off (the empty
split). A row that misses its target and whose bound is over it too is "bound over": no NumPy code
that reads its inputs and writes its outputs even once gets there on that host.
"""

import argparse
import json
import sys
from typing import Any, Callable


def _records(summary: dict[str, Any]) -> dict[tuple[str, str], float]:
    return {(r["group"], r["impl"]): r["median_s"] * 1e6 for r in summary["records"] if r["device"] == "cpu"}


def _best(summaries: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """Each row's least median over several runs of one setting (rows missing from a run are skipped there)."""
    best: dict[tuple[str, str], float] = {}
    for summary in summaries:
        for key, us in _records(summary).items():
            best[key] = min(us, best.get(key, us))
    return best


def floor(one_thread_us: float, threads: int, hand_off_us: float) -> float:
    """min over p in 1..threads of W1 / p + h * (p - 1): the best any split of the passes into p parts can do."""
    return min(one_thread_us / p + hand_off_us * (p - 1) for p in range(1, threads + 1))


def one_pass_bound(ceiling: dict[str, Any]) -> Callable[[float, int], float]:
    """bound(nbytes, threads): the least us one NumPy pass over nbytes takes on the ceiling's host, split
    into any part count it measured up to threads (its copy bandwidth at its largest size, plus the
    hand-off of that many parts)."""
    numpy = [r for r in ceiling["records"] if r["impl"] == "numpy"]
    largest = max(r["elements"] for r in numpy if r["pass"] == "copy")
    gbps = {r["threads"]: r["gbps"] for r in numpy if r["pass"] == "copy" and r["elements"] == largest}
    hand_off = {r["threads"]: r["median_us"] for r in numpy if r["pass"] == "empty"}

    def bound(nbytes: float, threads: int) -> float:
        return min(nbytes / (gbps[p] * 1e3) + hand_off[p] for p in gbps if p <= threads)

    return bound


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cpu_floor.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("summaries", nargs=3, metavar="SUMMARY", help="one.json two.json all.json (each: runs joined by commas)")
    parser.add_argument("hand_off_us", nargs="?", type=float, default=18.0)
    parser.add_argument("--ceiling", help="tools/cpu_ceiling.py --json output of the same host")
    args = parser.parse_args(argv[1:])
    runs = [[json.load(open(path)) for path in paths.split(",")] for paths in args.summaries]
    one, two, every = (_best(setting) for setting in runs)
    summaries = [setting[0] for setting in runs]
    cores = summaries[2]["threads"]["ours"]
    hand_off = args.hand_off_us
    bound = one_pass_bound(json.load(open(args.ceiling))) if args.ceiling else None
    nbytes = {r["group"]: r.get("bytes") for r in summaries[2]["records"] if r["impl"] == "ours"}
    print(f"hand-off {hand_off:.0f} us a part; all cores = {cores} threads\n")
    extra, rule = (" | one-pass bound", "---:|") if bound else ("", "")
    print(f"| benchmark | 1 thr ours µs | {cores} thr ours / torch µs | ratio | floor ratio{extra} "
          f"| 2 thr ours / torch µs | ratio | floor ratio{extra} |")
    print("|---|---:|---:|---:|---:|" + rule + "---:|---:|---:|" + rule)
    counts = {"met": [0, 0], "bound over": [0, 0], "floor over": [0, 0], "floor under": [0, 0]}
    for group in sorted({g for g, _ in every}):
        try:
            w1 = one[(group, "ours")]
            ours, torch = every[(group, "ours")], every[(group, "torch")]
            ours2, torch2 = two[(group, "ours")], two[(group, "torch")]
        except KeyError:
            continue
        cells = []
        for column, (o, t, threads, target) in enumerate(((ours, torch, cores, 3.0), (ours2, torch2, 2, 2.0))):
            ratio, floor_ratio = o / t, floor(w1, threads, hand_off) / t
            bound_ratio = bound(nbytes[group], threads) / t if bound and nbytes.get(group) else None
            if ratio <= target:
                verdict = "met"
            elif bound_ratio is not None and bound_ratio > target:
                verdict = "bound over"
            else:
                verdict = "floor over" if floor_ratio > target else "floor under"
            counts[verdict][column] += 1
            mark = {"met": "", "floor under": " ✗"}.get(verdict, f" ({verdict})")
            cell = f"{o:.0f} / {t:.0f} | {ratio:.2f}{mark} | {floor_ratio:.2f}"
            if bound:
                cell += " | -" if bound_ratio is None else f" | {bound_ratio:.2f}"
            cells.append(cell)
        print(f"| {group} | {w1:.0f} | " + " | ".join(cells) + " |")
    print()
    for verdict, (all_cores, two_threads) in counts.items():
        if bound or verdict != "bound over":
            print(f"{verdict}: {all_cores} rows on {cores} threads, {two_threads} on 2")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
