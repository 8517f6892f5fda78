"""What kernels.torch adds per call over kernels.functional: `python3 tools/torch_bridge_overhead.py [--device cuda]`.

For small tensors (where the op itself costs little), the median time per call of
  functional    F.<op>(arrays) and, for the backward rows, F.<op>_backward on its Context;
  bridge        kernels.torch.<op>(torch tensors): the DLPack views in and out (and on CUDA the
                TorchStream lookup), plus, with requires_grad, the autograd.Function and its saved tensors;
and the difference, the bridge's overhead. On CUDA every timed loop ends with a synchronize (host time
of the enqueueing dominates at these sizes either way).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone, as the other tools
from functional_overhead import array_of, median_us  # noqa: E402  (tools/, this script's folder)

import kernels.functional as F  # noqa: E402
import kernels.torch as KT  # noqa: E402


def _timed(function, runs: int, sync) -> float:
    return median_us(function, runs, sync, warmup=3, loops=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--runs", type=int, default=200)
    arguments = parser.parse_args()
    # torch's own work here (ones_like, accumulating .grad) on one thread: on a small host its threads
    # beside the kernels' made the timing of the conv rows swing 10-fold.
    torch.set_num_threads(1)
    device = torch.device(arguments.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    array = array_of(device)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 32, 32, generator=generator).to(device)
    w = torch.randn(16, 16, 3, 3, generator=generator).to(device)
    xa, wa, g = array(x), array(w), array(torch.ones_like(x))
    cases = {
        "relu": (lambda: F.relu(xa), lambda: KT.relu(x)),
        "add": (lambda: F.add(xa, xa), lambda: KT.add(x, x)),
        "conv2d 3x3": (lambda: F.conv2d(xa, wa, padding=1), lambda: KT.conv2d(x, w, padding=1)),
    }
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()

    def functional_step(forward, backward):
        def run():
            ctx = F.Context()
            forward(ctx)
            backward(ctx)
        return run

    grads = {
        "relu": (functional_step(lambda c: F.relu(xa, ctx=c), lambda c: F.relu_backward(g, c)),
                 lambda: KT.relu(xg).backward(torch.ones_like(xg))),
        "add": (functional_step(lambda c: F.add(xa, xa, ctx=c), lambda c: F.add_backward(g, c)),
                lambda: KT.add(xg, xg).backward(torch.ones_like(xg))),
        "conv2d 3x3": (functional_step(lambda c: F.conv2d(xa, wa, padding=1, ctx=c), lambda c: F.conv2d_backward(g, c)),
                       lambda: KT.conv2d(xg, wg, padding=1).backward(torch.ones_like(xg))),
    }
    print(f"device {device}, input 1x16x32x32 float32, median us per call of {arguments.runs}")
    print(f"{'':<30}{'functional':>12}{'bridge':>10}{'overhead':>10}")
    for label, table in (("forward, no grad", cases), ("forward + backward", grads)):
        for name, (plain, bridged) in table.items():
            ours, theirs = _timed(plain, arguments.runs, sync), _timed(bridged, arguments.runs, sync)
            print(f"{label + ' ' + name:<30}{ours:>12.1f}{theirs:>10.1f}{theirs - ours:>10.1f}")


if __name__ == "__main__":
    main()
