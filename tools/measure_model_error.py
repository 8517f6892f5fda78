"""Measure what the whole-network comparison's bounds (conformance/models/comparison.py) rest on:
python3 tools/measure_model_error.py [--variant n ...] [--size 64x64 ...] [--batch 1] [--seeds 2]
[--dtype float32 ...].

For every variant, size, seed and dtype it runs `python -m conformance.models`' comparison with a
stand-in for our model: the PyTorch reference itself with oneDNN off, so that its convolutions
run PyTorch's own im2col and GEMM and sum in another order, much as a NumPy implementation does
(conformance/models/twin.py). Per kind
of tensor it prints the worst relative L2 error of that second float32 (or float64) program
against the reference, the worst spread of the reference itself on the tensor (float32: its
float32 run against its float64 run; float64: two float64 runs in two memory layouts), and the
worst ratio of the two: CONDITION_FACTOR must sit above that ratio, and each kind's floor in
BOUNDS above the errors of the tensors whose spread is tiny.
"""

import argparse
import functools
import sys

import numpy as np

sys.path.insert(0, ".")
from conformance.models.comparison import KINDS  # noqa: E402
from conformance.models.session import Settings, run  # noqa: E402
from conformance.models.twin import TorchTwin  # noqa: E402


def size(text: str) -> tuple[int, int]:
    height, _, width = text.partition("x")
    return int(height), int(width or height)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", action="append", choices=("n", "s", "m", "b", "l", "x"))
    parser.add_argument("--size", action="append", type=size)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--dtype", action="append", choices=("float32", "float64"))
    arguments = parser.parse_args()
    worst: dict[tuple[str, str], dict[str, tuple[float, str]]] = {}
    for dtype in arguments.dtype or ["float32", "float64"]:
        for variant in arguments.variant or ["n", "s", "m", "b", "l", "x"]:
            for height, width in arguments.size or [(64, 64)]:
                for seed in range(arguments.seeds):
                    settings = Settings(variant, dtype=dtype, batch=arguments.batch, height=height, width=width,
                                        seed=seed, timing_runs=0)
                    report = run(settings, functools.partial(TorchTwin, native_conv=True))
                    where = f"{variant} {arguments.batch}x3x{height}x{width} seed {seed}"
                    for row in report.rows:
                        entry = worst.setdefault((dtype, row.kind), {})
                        spread = row.reference_spread
                        values = {"rel_l2": row.rel_l2, "spread": spread,
                                  "ratio": row.rel_l2 / spread if spread > 0 else float("nan")}
                        for key, value in values.items():
                            if np.isfinite(value) and value > entry.get(key, (-1.0, ""))[0]:
                                entry[key] = (value, f"{where}: {row.name}")
                    print(f"{settings.describe()}: {sum(not r.ok for r in report.rows)} of {len(report.rows)} over bound",
                          file=sys.stderr, flush=True)
    for (dtype, kind), entry in sorted(worst.items(), key=lambda item: (item[0][0], KINDS.index(item[0][1]))):
        print(f"{dtype} {kind}")
        for key in ("rel_l2", "spread", "ratio"):
            if key in entry:
                print(f"  worst {key:<8} {entry[key][0]:.3e}  at {entry[key][1]}")


if __name__ == "__main__":
    main()
