"""Ours beside PyTorch from a benchmark log (tests/bench/conftest.py's summary table):
python3 tools/bench_table.py gpu_bench.log"""

import re
import sys

rows: dict[tuple[str, str], dict[str, tuple[float, float, float]]] = {}
in_table = False
for line in open(sys.argv[1], errors="replace"):
    if "median time, achieved bandwidth" in line:
        in_table = True
        continue
    if in_table and not line.strip():
        break
    match = re.match(r"^(.{44})(test_\w+)\[(ours|torch)-(cpu|gpu)-?(\S*)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
    large = re.match(r"^(.{44})(test_large)\[(\w+)-(ours|torch)\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
    if in_table and match:
        group, test, impl, device, _, median, gbps, tflops = match.groups()
        rows.setdefault((group.strip(), f"{test}-{device}"), {})[impl] = (float(median), float(gbps), float(tflops))
    elif in_table and large:
        group, test, op, impl, median, gbps, tflops = large.groups()
        rows.setdefault((f"bandwidth {op}", "test_large-gpu"), {})[impl] = (float(median), float(gbps), float(tflops))
print(f"| {'group':<46} | ours us | torch us | ours/torch | ours GB/s | ours TFLOP/s |")
print(f"|{'-' * 48}|---------|----------|------------|-----------|--------------|")
for (group, test), impls in sorted(rows.items()):
    ours, torch = impls.get("ours"), impls.get("torch")
    if ours is None:
        continue
    ratio = f"{ours[0] / torch[0]:.2f}" if torch else "-"
    torch_us = f"{torch[0]:.1f}" if torch else "-"
    label = group + (" [" + test.rsplit("-", 1)[0] + "]" if "method" in test or "memcpy2d" in test else "")
    print(f"| {label:<46} | {ours[0]:7.1f} | "
          f"{torch_us:>8} | {ratio:>10} | {ours[1]:9.1f} | {ours[2]:12.2f} |")
