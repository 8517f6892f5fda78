"""TF32's error on the GPU (a handle made with allow_tf32=True): python3 tools/measure_tf32.py [--seeds 2]

1. Every float32 conformance case of conv_2d and batch_matmul, run with a TF32 handle: per case
   and tensor, the worst relative error against the golden (|got - golden| / max |golden|), its
   ulps (conformance.compare.needed_ulps) and the case's stated tolerance. The cases' values have
   a few bits each, exact in TF32, so their sums stay exact: 0 is expected.
2. Random normal float32 inputs at YOLOv10's shapes (conformance.tf32.PROBLEMS): per tensor, the
   worst |error| / S in units of 2^-11 (S = sum |a||b| of each result, the error against float64),
   with TF32 and without, beside the bound tests/test_tf32.py asserts (conformance.tf32.bound_units).
"""

import argparse
import sys

import numpy as np

sys.path.insert(0, ".")
import kernels  # noqa: E402
from conformance import tf32  # noqa: E402
from conformance.cases import all_cases  # noqa: E402
from conformance.compare import needed_ulps  # noqa: E402
from conformance.golden import GoldenStore  # noqa: E402

OPS = ("conv_2d", "batch_matmul")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=2)
    arguments = parser.parse_args()
    reason = kernels.gpu_unavailable_reason()
    if reason:
        sys.exit(f"no GPU: {reason}")
    store = GoldenStore()
    print("1. float32 conformance cases with allow_tf32=True")
    print(f"{'case':<52}{'tensor':<14}{'max rel':>12}{'ulps':>6}{'stated':>8}")
    for case in all_cases():
        if case.op not in OPS or np.dtype(case.dtype) != np.float32:
            continue
        golden = store.get(case)
        produced = tf32.run_case(case, golden)
        for name, expected in golden.expected.items():
            got = produced[name]
            scale = float(np.max(np.abs(expected))) if expected.size else 0.0
            error = float(np.max(np.abs(got.astype(np.float64) - expected))) if expected.size else 0.0
            relative = error / scale if scale else error
            print(f"{case.key:<52.52}{name:<14}{relative:>12.3e}{needed_ulps(got, expected):>6.0f}"
                  f"{case.tolerance_for(name).ulps:>8}")
    print("\n2. random normal inputs: worst |error| / sum|a||b| in units of 2^-11 (bound: 4 + K 2^-12)")
    print(f"{'problem':<40}{'tensor':<13}{'tf32':>8}{'fp32':>8}{'bound':>8}")
    for problem in tf32.PROBLEMS:
        worst: dict[str, list[float]] = {}
        for seed in range(arguments.seeds):
            with_tf32 = tf32.measure(problem, True, seed)
            without = tf32.measure(problem, False, seed)
            for name, (units, bound) in with_tf32.items():
                row = worst.setdefault(name, [0.0, 0.0, bound])
                row[0], row[1] = max(row[0], units), max(row[1], without[name][0])
        for name, (units, plain, bound) in worst.items():
            print(f"{problem.name:<40.40}{name:<13}{units:>8.3f}{plain:>8.4f}{bound:>8.2f}")


if __name__ == "__main__":
    main()
