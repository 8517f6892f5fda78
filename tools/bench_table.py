"""Ours beside PyTorch as Markdown, one table per op with its geometric-mean ratio, from the JSON
that `pytest tests/bench --benchmark-only` writes (.benchmarks/summary.json, or $BENCH_SUMMARY_JSON)
or from pytest-benchmark's --benchmark-json file:
python3 tools/bench_table.py .benchmarks/summary.json"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_summary as summary  # noqa: E402  (beside this file)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    data = json.loads(Path(argv[1]).read_text())
    records = summary.records_from_json(data)
    if "threads" in data:
        print(summary.threads_line(data["threads"]) + "\n")
    print("\n".join(summary.format_markdown(summary.summarize(records))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
