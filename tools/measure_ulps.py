"""The ulps each inexact conformance case needs on each device, beside the bound it states:
python3 tools/measure_ulps.py [--device cpu|gpu ...]. A bound far above both devices' need is wider
than measured; one below either fails the suite."""

import argparse
import sys

sys.path.insert(0, ".")
from conformance.cases import all_cases  # noqa: E402
from conformance.compare import needed_ulps  # noqa: E402
from conformance.golden import GoldenStore  # noqa: E402
from conformance.harness import device_unavailable  # noqa: E402
from conformance.runner import produce  # noqa: E402


def measure(case, golden, device):
    produced, _, _ = produce(case, golden, device)  # the conformance run's own first run (random poison, plain)
    return {name: needed_ulps(produced[name], expected) for name, expected in golden.expected.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", action="append", choices=("cpu", "gpu"))
    devices = [d for d in (parser.parse_args().device or ["cpu", "gpu"]) if device_unavailable(d) is None]
    store = GoldenStore()
    print(f"{'case':<48}{'tensor':<22}{'stated':>7}" + "".join(f"{d:>6}" for d in devices))
    for case in all_cases():
        tolerances = {name: case.tolerance_for(name) for name in store.get(case).expected}
        if all(t.exact for t in tolerances.values()):
            continue
        needs = {device: measure(case, store.get(case), device) for device in devices}
        for name, tolerance in tolerances.items():
            row = "".join(f"{needs[d][name]:>6.0f}" for d in devices)
            print(f"{case.key:<48.48}{name:<22.22}{tolerance.ulps:>7}{row}")


if __name__ == "__main__":
    main()
