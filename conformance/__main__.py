"""`python -m conformance`: run every case on every device and print, per op and
device, how many passed, failed and were skipped; exit 1 on any failure."""

from __future__ import annotations

import argparse
import fnmatch
import sys

from .cases import all_cases
from .golden import DEFAULT_PATH, GoldenStore
from .runner import DEVICES, run_case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=DEVICES, action="append", help="only this device (repeatable)")
    parser.add_argument("--op", action="append", help="only this op (repeatable)")
    parser.add_argument("-k", dest="pattern", help="only cases whose op/name matches this glob or substring")
    parser.add_argument("--goldens", default=DEFAULT_PATH, help="the golden file (default: goldens.h5)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case's result")
    arguments = parser.parse_args(argv)

    store = GoldenStore(arguments.goldens)
    devices = arguments.device or list(DEVICES)
    cases = [c for c in all_cases() if not arguments.op or c.op in arguments.op]
    for op in sorted({c.op for c in cases}):
        stale = store.staleness(op)
        if stale:
            print(f"error: {stale}", file=sys.stderr)
            return 2
    if arguments.pattern:
        p = arguments.pattern
        cases = [c for c in cases if p in c.key or fnmatch.fnmatch(c.key, p)]
    if not cases:
        print("error: no case matches the filters", file=sys.stderr)
        return 2

    total = len(cases) * len(devices)
    results = []
    for device in devices:
        for case in cases:
            result = run_case(case, store.get(case), device)
            results.append(result)
            if sys.stderr.isatty():
                print(f"\r[{len(results)}/{total}] {result.key:<70.70}", end="", file=sys.stderr, flush=True)
            elif len(results) % 50 == 0 or len(results) == total:
                print(f"[{len(results)}/{total}] {result.key}", file=sys.stderr, flush=True)
            if arguments.verbose:
                print(f"{result.status.upper():7} {result.key}" + (f"  ({result.message})" if result.status == "skipped" else ""))
    if sys.stderr.isatty():
        print(file=sys.stderr)

    for result in results:
        if result.status == "failed":
            print(f"FAILED {result.key}\n{result.message}\n")
    skipped_reasons = sorted({f"{r.device}: {r.message}" for r in results if r.status == "skipped"})

    table: dict[tuple[str, str], dict[str, int]] = {}
    for result in results:
        row = table.setdefault((result.op, result.device), {"passed": 0, "failed": 0, "skipped": 0})
        row[result.status] += 1
    print(f"{'op':<22}{'device':<8}{'passed':>8}{'failed':>8}{'skipped':>9}")
    for (op, device), row in sorted(table.items()):
        print(f"{op:<22}{device:<8}{row['passed']:>8}{row['failed']:>8}{row['skipped']:>9}")
    for reason in skipped_reasons:
        print(f"skipped {reason}")
    passed = sum(r.status == "passed" for r in results)
    failed = sum(r.status == "failed" for r in results)
    skipped = sum(r.status == "skipped" for r in results)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
