"""The ours-beside-PyTorch summary of a benchmark run, in one place: tests/bench/conftest.py
prints it (and writes it as JSON), tools/bench_table.py turns that JSON into Markdown.
Standard library only, so the tool runs without the project installed.

A record is one timed benchmark (our kernel or its PyTorch twin). A row is one benchmark:
one group (op and shapes), one test variant (the test's name without the implementation and
device) and one device, with our median and PyTorch's. A variant without its own twin (the
GPU method variants of concat and split) is compared with the group's PyTorch record on that
device when there is exactly one. Rows are grouped by op (the group's first word); each op
closes with the geometric mean of its ratios. The bandwidth file's op also shows each row's
GB/s as a % of a plain device copy (its `bandwidth copy` group, the faster of the two copies).

Where a run measured them (KERNELS_BENCH_PARTS=1, tests/bench/conftest.py), a GPU record also holds the
parts of one call: its host time (the call alone, returning before its GPU work has run) and its GPU
time (the call's work on the device, timed by two events with all of it queued beforehand). The rows
then show both parts on both sides, so a ratio above 1 says whether the host or the kernels lose it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Record:
    group: str
    name: str  # the test's name, e.g. "test_softmax[ours-cpu-psa_1x5x400x400_dim-1-forward]"
    impl: str  # "ours" or "torch"
    device: str  # "cpu" or "gpu"
    median_s: float
    bytes: int = 0  # bytes each call must move
    flops: int = 0  # 0: not known
    host_s: float | None = None  # one call's host time (KERNELS_BENCH_PARTS runs only)
    device_s: float | None = None  # one call's GPU time (KERNELS_BENCH_PARTS runs only)


@dataclass(frozen=True)
class Row:
    op: str
    group: str
    variant: str
    device: str
    ours_us: float | None
    torch_us: float | None
    ratio: float | None  # ours / PyTorch: below 1, ours is faster
    gbps: float | None  # ours
    tflops: float | None  # ours, where flops are known
    copy_pct: float | None = None  # ours GB/s as a % of the device copy's, where a copy row exists
    ours_host_us: float | None = None  # the parts of one call, where the run measured them
    torch_host_us: float | None = None
    ours_device_us: float | None = None
    torch_device_us: float | None = None


@dataclass(frozen=True)
class OpSummary:
    op: str
    rows: list[Row]
    geomean: float | None  # of the rows' ratios
    count: int  # rows with a ratio


def records_from_benchmarks(benchmarks) -> list[Record]:
    """pytest-benchmark's benchmarks (the session's, or --benchmark-json's dicts) as records."""
    records = []
    for bench in benchmarks:
        if isinstance(bench, dict):
            group, name, info, median = bench.get("group"), bench["name"], bench.get("extra_info", {}), \
                bench.get("stats", {}).get("median")
        else:
            stats = bench.stats
            if not stats or not stats.rounds:
                continue
            group, name, info, median = bench.group, bench.name, bench.extra_info, stats.median
        if not median:
            continue
        host, device = info.get("host_us"), info.get("device_us")
        records.append(Record(group or "", name, info.get("impl", "ours"), info.get("device", "cpu"), float(median),
                              int(info.get("bytes", 0)), int(info.get("flops", 0)),
                              None if host is None else float(host) * 1e-6,
                              None if device is None else float(device) * 1e-6))
    return records


def variant_of(name: str, impl: str, device: str) -> str:
    """The test's name without the implementation and device ids: test_x[ours-cpu-a-b] -> test_x[a-b]."""
    test, bracket, params = name.partition("[")
    if not bracket:
        return name
    parts = params.removesuffix("]").split("-")
    for drop in (impl, device):
        if drop in parts:
            parts.remove(drop)
    return f"{test}[{'-'.join(parts)}]" if parts else test


def op_of(group: str) -> str:
    return group.split(" ", 1)[0]


def _is_copy(group: str) -> bool:
    return group.split()[:2] == ["bandwidth", "copy"]


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _us(record: Record | None, part: str) -> float | None:
    value = None if record is None else getattr(record, part)
    return None if value is None else value * 1e6


def summarize(records: list[Record]) -> list[OpSummary]:
    """One row per (group, variant, device), grouped by op (sorted), each op with its geomean ratio."""
    by_key: dict[tuple[str, str, str], dict[str, Record]] = {}
    torch_in_group: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        by_key.setdefault((r.group, variant_of(r.name, r.impl, r.device), r.device), {})[r.impl] = r
        if r.impl == "torch":
            torch_in_group.setdefault((r.group, r.device), []).append(r)
    copy_gbps: dict[tuple[str, str], float] = {}
    for r in records:
        if _is_copy(r.group) and r.bytes:
            key = (op_of(r.group), r.device)
            copy_gbps[key] = max(copy_gbps.get(key, 0.0), r.bytes / r.median_s / 1e9)

    ops: dict[str, list[Row]] = {}
    for (group, variant, device), impls in sorted(by_key.items()):
        ours, torch = impls.get("ours"), impls.get("torch")
        if ours is not None and torch is None and len(torch_in_group.get((group, device), [])) == 1:
            torch = torch_in_group[(group, device)][0]
        op = op_of(group)
        gbps = ours.bytes / ours.median_s / 1e9 if ours and ours.bytes else None
        copy = copy_gbps.get((op, device))
        ops.setdefault(op, []).append(Row(
            op, group, variant, device,
            ours_us=ours.median_s * 1e6 if ours else None,
            torch_us=torch.median_s * 1e6 if torch else None,
            ratio=ours.median_s / torch.median_s if ours and torch else None,
            gbps=gbps,
            tflops=ours.flops / ours.median_s / 1e12 if ours and ours.flops else None,
            copy_pct=100 * gbps / copy if gbps is not None and copy else None,
            ours_host_us=_us(ours, "host_s"), torch_host_us=_us(torch, "host_s"),
            ours_device_us=_us(ours, "device_s"), torch_device_us=_us(torch, "device_s")))
    summaries = []
    for op, rows in sorted(ops.items()):
        ratios = [row.ratio for row in rows if row.ratio is not None]
        summaries.append(OpSummary(op, rows, geomean(ratios), len(ratios)))
    return summaries


HEADER = ("group", "variant", "device", "ours µs", "PyTorch µs", "ours/PyTorch", "GB/s", "TFLOP/s")
COPY_HEADER = ("% copy",)
PARTS_HEADER = ("ours host µs", "PyTorch host µs", "ours GPU µs", "PyTorch GPU µs")
TITLE = "ours vs PyTorch: median µs, ratio ours/PyTorch (below 1: ours faster), our GB/s and TFLOP/s"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _columns(summaries: list[OpSummary]) -> tuple[bool, bool]:
    """Whether the table has the % copy column, and the parts columns: each only where a row has it."""
    rows = [row for s in summaries for row in s.rows]
    parts = ("ours_host_us", "torch_host_us", "ours_device_us", "torch_device_us")
    return (any(row.copy_pct is not None for row in rows),
            any(getattr(row, name) is not None for row in rows for name in parts))


def _header(with_copy: bool, with_parts: bool) -> list[str]:
    return list(HEADER) + list(COPY_HEADER if with_copy else ()) + list(PARTS_HEADER if with_parts else ())


def _cells(row: Row, with_copy: bool, with_parts: bool = False) -> list[str]:
    cells = [row.group, row.variant, row.device, _fmt(row.ours_us, ".1f"), _fmt(row.torch_us, ".1f"),
             _fmt(row.ratio, ".2f"), _fmt(row.gbps, ".1f"), _fmt(row.tflops, ".2f")]
    if with_copy:
        cells.append(_fmt(row.copy_pct, ".0f"))
    if with_parts:
        cells += [_fmt(value, ".1f") for value in (row.ours_host_us, row.torch_host_us, row.ours_device_us,
                                                    row.torch_device_us)]
    return cells


def closing_line(summary: OpSummary) -> str:
    without = len(summary.rows) - summary.count
    tail = f" ({without} without a PyTorch twin)" if without else ""
    if summary.geomean is None:
        return f"{summary.op}: no ratios over {len(summary.rows)} rows{tail}"
    rows = "row" if summary.count == 1 else "rows"
    return f"{summary.op}: geomean ours/PyTorch {summary.geomean:.2f} over {summary.count} {rows}{tail}"


def format_text(summaries: list[OpSummary]) -> list[str]:
    """Plain columns sized to the longest names (never cut); a closing geomean line per op."""
    with_copy, with_parts = _columns(summaries)
    header = _header(with_copy, with_parts)
    table = [_cells(row, with_copy, with_parts) for s in summaries for row in s.rows]
    widths = [max(len(cells[i]) for cells in [header, *table]) for i in range(len(header))]

    def line(cells):
        left = [c.ljust(w) for c, w in zip(cells[:3], widths)]
        right = [c.rjust(w) for c, w in zip(cells[3:], widths[3:])]
        return "  ".join(left + right).rstrip()

    lines = [line(header)]
    for s in summaries:
        lines += [line(_cells(row, with_copy, with_parts)) for row in s.rows]
        lines += [closing_line(s), ""]
    return lines[:-1]


def format_markdown(summaries: list[OpSummary]) -> list[str]:
    """One Markdown table per op, closed by its geomean line."""
    with_copy, with_parts = _columns(summaries)
    header = _header(with_copy, with_parts)
    lines = []
    for s in summaries:
        lines += [f"### {s.op}", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join(["---"] * 3 + ["---:"] * (len(header) - 3)) + "|"]
        lines += ["| " + " | ".join(_cells(row, with_copy, with_parts)) + " |" for row in s.rows]
        lines += ["", closing_line(s), ""]
    return lines[:-1]


def threads_line(threads: dict) -> str:
    """The header line saying how many CPU threads each side ran on: ours (the handle's count, and
    NumPy's BLAS as threadpoolctl reports it) and PyTorch's (torch.get_num_threads()); the kernels'
    constants the run set ($KERNELS_BENCH_SET), and the thread pools' environment variables set, if any."""
    blas = ", ".join(f"{b.get('internal_api', '?')} {b.get('version', '?')}, {b.get('num_threads', '?')} by default"
                     for b in threads.get("blas", [])) or "not found"
    line = (f"CPU threads: ours {threads.get('ours', '?')}, GEMMs included (NumPy's BLAS: {blas}); "
            f"PyTorch {threads.get('torch', '?')}; {threads.get('cores', '?')} cores available")
    if threads.get("set"):  # $KERNELS_BENCH_SET
        line += "; set: " + ", ".join(f"{name}={value}" for name, value in threads["set"].items())
    if threads.get("environment"):  # the thread pools' environment variables (conftest.THREAD_ENVIRONMENT)
        line += "; environment: " + ", ".join(f"{name}={value}" for name, value in threads["environment"].items())
    return line


def to_json(records: list[Record], threads: dict | None = None) -> dict:
    """The records (what tools/bench_table.py reads back), the rows built from them and, where
    known, the CPU threads of each side (threads_line)."""
    data = {"records": [asdict(r) for r in records],
            "ops": [{"op": s.op, "geomean": s.geomean, "count": s.count, "rows": [asdict(r) for r in s.rows]}
                    for s in summarize(records)]}
    if threads is not None:
        data["threads"] = threads
    return data


def records_from_json(data: dict) -> list[Record]:
    """Our summary JSON, or pytest-benchmark's --benchmark-json file."""
    if "records" in data:
        return [Record(**r) for r in data["records"]]
    return records_from_benchmarks(data["benchmarks"])
