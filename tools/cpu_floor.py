"""Which CPU benchmark rows the NumPy design can bring within the targets (3x PyTorch on the host's
cores, 2x on 2 threads), from three summaries of `pytest tests/bench -k cpu --benchmark-only`
($BENCH_SUMMARY_JSON) on one host: KERNELS_BENCH_THREADS=1, =2, and unset (all cores):

    python3 tools/cpu_floor.py one.json two.json all.json [hand_off_us]

The floor of a row on p parts is W1 / p + h * p: W1 our one-thread time (NumPy's passes, one
after another, the GIL released inside each), h the calling thread's cost of handing one part to
a pool thread (about 18 us on the 16-core H200 host: an empty cpu_parallel of 16 parts took 286
us), and no memory-bandwidth limit (so the floor is optimistic). Its minimum over p up to the
threads is what any sharing of these passes into parts can reach; a row whose floor is over the
target cannot reach it without fusing passes, which NumPy's one-pass-per-ufunc model does not do.
"""

import json
import sys


def _records(path: str) -> dict[tuple[str, str], float]:
    return {(r["group"], r["impl"]): r["median_s"] * 1e6 for r in json.load(open(path))["records"] if r["device"] == "cpu"}


def floor(one_thread_us: float, threads: int, hand_off_us: float) -> float:
    """min over p in 1..threads of W1 / p + h * (p - 1): the best any split of the passes into p parts can do."""
    return min(one_thread_us / p + hand_off_us * (p - 1) for p in range(1, threads + 1))


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    one, two, every = (_records(p) for p in argv[1:4])
    cores = json.load(open(argv[3]))["threads"]["ours"]
    hand_off = float(argv[4]) if len(argv) == 5 else 18.0
    print(f"hand-off {hand_off:.0f} us a part; all cores = {cores} threads\n")
    print(f"| benchmark | 1 thr ours µs | {cores} thr ours / torch µs | ratio | floor ratio "
          "| 2 thr ours / torch µs | ratio | floor ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    counts = {"met": [0, 0], "floor over": [0, 0], "floor under": [0, 0]}
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
            verdict = "met" if ratio <= target else ("floor over" if floor_ratio > target else "floor under")
            counts[verdict][column] += 1
            mark = "" if verdict == "met" else (" (floor over)" if verdict == "floor over" else " ✗")
            cells.append(f"{o:.0f} / {t:.0f} | {ratio:.2f}{mark} | {floor_ratio:.2f}")
        print(f"| {group} | {w1:.0f} | " + " | ".join(cells) + " |")
    print()
    for verdict, (all_cores, two_threads) in counts.items():
        print(f"{verdict}: {all_cores} rows on {cores} threads, {two_threads} on 2")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
