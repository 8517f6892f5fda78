"""Regenerate goldens.h5 from the PyTorch program of every declared case.

    python generate_goldens.py [--output goldens.h5]
"""

import argparse

from conformance.golden import DEFAULT_PATH, pin_cpu_capability, write_goldens

pin_cpu_capability()  # before anything imports torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=DEFAULT_PATH, help="where to write (default: goldens.h5 at the root)")
    arguments = parser.parse_args()
    count = write_goldens(arguments.output)
    print(f"wrote {count} cases to {arguments.output}")


if __name__ == "__main__":
    main()
