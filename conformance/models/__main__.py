"""`python -m conformance.models yolov10n --device gpu --batch 8`: our YOLOv10 (kernels.models)
against the PyTorch reference (conformance/models/reference.py), tensor by tensor, with timing.
See DESCRIPTION."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import re
import sys
from typing import Any, Callable

from kernels.models.yolov10 import VARIANTS

from .comparison import BOUNDS, CONDITION_FACTOR, HEADER, KINDS

try:  # the PyTorch reference program: torch is the `models` extra's, not a runtime dependency
    from .session import HEADROOM, Report, Settings, run
except ModuleNotFoundError as error:
    if error.name != "torch":
        raise
    TORCH_MISSING: str | None = ("python -m conformance.models compares with a PyTorch program and needs torch, which "
                                 "is not installed: pip install 'yolov10-kernels[models]' (torch==2.13.0)")
else:
    TORCH_MISSING = None

MODELS = tuple(f"yolov10{v}" for v in VARIANTS)

DESCRIPTION = """\
Compare our YOLOv10 (kernels.models, built from the kernels) with a plain PyTorch
program of the same network (conformance/models/reference.py), from one seeded
random initialisation copied from ours to PyTorch: the training-forward outputs
of both heads, the input's and every parameter's gradient (backward from a
seeded random gradient of the outputs) and the BatchNorm running statistics
after --steps training steps; then an eval forward's raw heads and top-300
detections. One line per tensor: its largest distance in ulps of the dtype, its
relative L2 error ||ours - PyTorch|| / ||PyTorch||, PyTorch's own float32 error
on it (its float32 run against its float64 run), the bound and whether it holds.
In float16, where a gradient of the reference would overflow (or come within
1/16 of 65504), a step's output gradients are loss-scaled by 1/16, 1/256, ...
for both models, and the report says by how much.
Then a timing of ours beside PyTorch (on a GPU with TF32 off).

Needs PyTorch (the `models` extra: pip install 'yolov10-kernels[models]').

Exit status: 0 when every tensor is within its bound; 1 when one is not; 2 when
the comparison could not start (a bad option, an unknown model, a device that
cannot run here, no kernel model, no torch)."""

EPILOG = f"""\
models: {", ".join(MODELS)} (or --variant {"|".join(VARIANTS)}|all)

bounds (relative L2, per kind of tensor; docs/conformance.md says why):
{chr(10).join(f"  {kind:<13} float32 {BOUNDS['float32'][kind]:<7.0e} float64 {BOUNDS['float64'][kind]:<7.0e} "
              f"float16 {BOUNDS['float16'][kind]:<7.1e} bfloat16 {BOUNDS['bfloat16'][kind]:.1e}" for kind in KINDS)}
  raised, per tensor, to {CONDITION_FACTOR:g} x PyTorch's own float32 error on it (scaled to the
  dtype's epsilon): a badly conditioned tensor (BatchNorm over a 2x2 level, a gradient
  that is zero in exact arithmetic) differs between any two float32 programs.
  Detections: (anchor, class) pairs as sets, where near-tied pairs may swap order,
  and swap in and out at the 300th score when within twice the largest score
  difference of it; scores and boxes of the pairs both sides detected.

examples:
  python -m conformance.models yolov10n --device cpu --size 64 --dtype float64
  python -m conformance.models yolov10n --device cpu --batch 2 --size 96x128 --dtype float16
  python -m conformance.models yolov10n --device gpu --batch 8
  python -m conformance.models --variant all --device gpu --size 640 --json report.json
  python -m conformance.models yolov10x --device gpu:1 --batch 16 --quiet
"""


def _size(text: str) -> tuple[int, int]:
    """--size 640 or HxW, each a positive multiple of 32 (the P5 stride)."""
    match = re.fullmatch(r"(\d+)(?:x(\d+))?", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: expected N or HxW, as 640 or 96x128")
    height, width = int(match[1]), int(match[2] or match[1])
    if height <= 0 or width <= 0 or height % 32 or width % 32:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: height and width must be positive multiples of 32 (YOLOv10's largest stride)")
    return height, width


def _device(text: str) -> str:
    if text == "cpu" or re.fullmatch(r"gpu(:\d+)?", text):
        return text
    raise argparse.ArgumentTypeError(f"invalid device {text!r}: expected cpu, gpu or gpu:N (N a CUDA ordinal)")


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid count {text!r}: expected an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"invalid count {value}: at least {minimum}")
        return value
    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m conformance.models", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", metavar="MODEL", help="yolov10n, yolov10s, yolov10m, yolov10b, yolov10l or yolov10x")
    parser.add_argument("--variant", action="append", metavar="V",
                        help=f"a variant by its letter ({', '.join(VARIANTS)}) or all (repeatable)")
    parser.add_argument("--device", type=_device, default="cpu", help="our model's device: cpu, gpu or gpu:N (default cpu)")
    parser.add_argument("--batch", type=_count(1), default=1, help="images per batch (default 1)")
    parser.add_argument("--size", type=_size, default=(640, 640), metavar="N|HxW", help="input size (default 640)")
    parser.add_argument("--dtype", choices=("float32", "float64", "float16", "bfloat16"), default="float32",
                        help="default float32; float16 and bfloat16 are mixed precision (float32 BatchNorms)")
    parser.add_argument("--steps", type=_count(1), default=2,
                        help="training steps before the running statistics are compared (default 2)")
    parser.add_argument("--seed", type=_count(0), default=0,
                        help="of the initialisation, inputs and output gradients (default 0)")
    parser.add_argument("--timing-runs", type=_count(0), default=5, metavar="N",
                        help="timed runs of each measurement, after one warm-up (median; 0: no timing; default 5)")
    parser.add_argument("--json", metavar="FILE", help="also write every row, the timing and a summary as JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the tensors over their bound, and the summaries")
    return parser


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _unknown(name: str) -> str:
    nearest = difflib.get_close_matches(name, MODELS + VARIANTS + ("all",), n=1)
    hint = f" (did you mean {nearest[0]!r}?)" if nearest else ""
    return f"unknown model {name!r}{hint}; the models are {', '.join(MODELS)} (or --variant {'|'.join(VARIANTS)}|all)"


def _variants(arguments: argparse.Namespace) -> tuple[list[str], str | None]:
    """The variants asked for, in order, once each; or an error message."""
    chosen: list[str] = []
    for name in arguments.models:
        if name not in MODELS:
            return [], _unknown(name)
        chosen.append(name[len("yolov10"):])
    for name in arguments.variant or []:
        if name == "all":
            chosen += VARIANTS
        elif name in VARIANTS:
            chosen.append(name)
        else:
            return [], _unknown(name)
    if not chosen:
        return [], f"no model named: give one ({', '.join(MODELS)}) or --variant all"
    return list(dict.fromkeys(chosen)), None


def _model_class():
    """kernels.models.YOLOv10, or None and why it cannot be imported."""
    try:
        from kernels.models import YOLOv10
    except ImportError as error:
        return None, f"the kernel model (kernels.models.YOLOv10) cannot be imported: {error}"
    return YOLOv10, None


def main(argv: list[str] | None = None, model_class: Callable[..., Any] | None = None) -> int:
    """The command line, `argv` without the program name; returns the exit status. `model_class`
    stands in for kernels.models.YOLOv10 (tests)."""
    arguments = _parser().parse_args(argv)
    if TORCH_MISSING:
        return _error(TORCH_MISSING)
    variants, problem = _variants(arguments)
    if problem:
        return _error(problem)
    from ..harness import device_unavailable  # the conformance runner's reasons (no CuPy, no device N)

    reason = device_unavailable(arguments.device)
    if reason is not None:
        return _error(f"--device {arguments.device} cannot run here: {reason}")
    if model_class is None:
        model_class, problem = _model_class()
        if problem:
            return _error(problem)
    height, width = arguments.size
    reports = []
    for variant in variants:
        settings = Settings(variant, arguments.device, arguments.dtype, arguments.batch, height, width,
                            arguments.steps, arguments.seed, arguments.timing_runs)
        print(f"== {settings.describe()}", flush=True)
        report = run(settings, model_class)
        _print_report(report, arguments.quiet)
        reports.append(report)
    if len(reports) > 1:
        failed = [f"yolov10{r.settings.variant}" for r in reports if not r.ok]
        print(f"== {len(reports)} models: " + (f"{', '.join(failed)} over bound" if failed else "all within bounds"))
    if arguments.json:
        write_json(arguments.json, reports)
    return 0 if all(r.ok for r in reports) else 1


def _print_report(report: Report, quiet: bool) -> None:
    print(HEADER)
    for row in report.rows:
        if not quiet or not row.ok:
            print(row.line())
    failed = sum(not row.ok for row in report.rows)
    print(f"-- yolov10{report.settings.variant}: {len(report.rows)} tensors compared, {failed} over bound "
          f"({report.seconds:.1f} s). Worst per kind (rel L2 / bound):")
    for kind, row in sorted(report.worst().items(), key=lambda item: KINDS.index(item[0])):
        print(f"   {kind:<13} {row.rel_l2:.3e} / {row.bound:.2e}  {'ok' if row.ok else 'FAIL'}  {row.name}")
    if report.loss_scales:
        scales = ", ".join(f"train.{step} 2^{int(math.log2(scale))}" for step, scale in sorted(report.loss_scales.items()))
        print(f"-- output gradients scaled (loss scaling: at 1 a reference gradient overflows or comes within "
              f"1/{HEADROOM:g} of the dtype's largest value): {scales}")
    if report.timing:
        runs = report.settings.timing_runs
        print(f"-- timing, median of {runs} run{'s' if runs != 1 else ''} after a warm-up (ms):")
        print(f"   {'':<16}{'ours':>12}{'PyTorch':>12}{'ratio':>9}")
        for name, entry in report.timing.items():
            print(f"   {name.replace('_', ' '):<16}{entry['ours_ms']:>12.2f}{entry['torch_ms']:>12.2f}{entry['ratio']:>9.2f}")


def _plain(value: Any) -> Any:
    """JSON has no inf or NaN: inf as the string "inf", NaN as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def write_json(path: str, reports: list[Report]) -> None:
    """{"ok", "runs": [{"settings", "ok", "seconds", "rows": [Row...], "timing", "loss_scales"}]}."""
    document = {
        "ok": all(r.ok for r in reports),
        "runs": [{"settings": dataclasses.asdict(r.settings),
                  "ok": r.ok, "seconds": r.seconds, "rows": [row.as_dict() for row in r.rows], "timing": r.timing,
                  "loss_scales": {str(step): scale for step, scale in r.loss_scales.items()}}
                 for r in reports],
    }
    with open(path, "w", encoding="utf-8") as file:
        json.dump(_plain(document), file, indent=1)
        file.write("\n")


if __name__ == "__main__":
    sys.exit(main())
