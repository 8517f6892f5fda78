"""The functional layer's cost per call on tiny tensors, against torch's: `python3 tools/functional_overhead.py [--device cuda]`.

For tensors of 16 to 64 elements (4x4, or 1x4x4x4), where the op itself costs next to nothing, the
median time per call of
  ours     kernels.functional.<name>(arrays) on NumPy arrays (CPU) or CuPy arrays (cuda), no ctx;
  torch    its torch twin on torch tensors of the same values (torch.nn.functional, torch.cat, ...);
and ours / torch. On CUDA every timed loop ends with a synchronize (host time of the enqueueing
dominates at these sizes either way). Issue 27's target is a ratio of at most 5 on every row.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as TF

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone, as the other tools
import kernels.functional as F  # noqa: E402


def median_us(function, runs: int, sync, warmup: int = 20, loops: int = 7) -> float:
    """The median over `loops` loops of `runs` calls of `function` (after `warmup` calls), in us a call; each
    loop ends with `sync()` (torch.cuda.synchronize on CUDA). tools/torch_bridge_overhead.py times with it too."""
    for _ in range(warmup):
        function()
    sync()
    samples = []
    for _ in range(loops):
        start = time.perf_counter()
        for _ in range(runs):
            function()
        sync()
        samples.append((time.perf_counter() - start) / runs * 1e6)
    return statistics.median(samples)


def array_of(device: torch.device):
    """The function that gives a torch tensor of `device` as our array of the same memory (CuPy on cuda,
    NumPy on the CPU). tools/torch_bridge_overhead.py makes its arrays with it too."""
    if device.type == "cuda":
        import cupy

        return cupy.from_dlpack
    return torch.Tensor.numpy


def cases(device: torch.device) -> dict:
    """name -> (ours, torch's): calls of no argument, on tensors made once, for the device given."""
    array = array_of(device)
    generator = torch.Generator().manual_seed(0)

    def randn(*dims):
        return torch.randn(*dims, generator=generator).to(device)

    m, n, x4, w = randn(4, 4), randn(4, 4), randn(1, 4, 4, 4), randn(4, 4, 3, 3)
    b3 = randn(1, 4, 4)
    mean, var = randn(4), randn(4).abs() + 0.5
    ma, na, x4a, wa, b3a, meana, vara = (array(t) for t in (m, n, x4, w, b3, mean, var))
    return {
        "relu 4x4": (lambda: F.relu(ma), lambda: TF.relu(m)),
        "silu 4x4": (lambda: F.silu(ma), lambda: TF.silu(m)),
        "sigmoid 4x4": (lambda: F.sigmoid(ma), lambda: torch.sigmoid(m)),
        "add 4x4": (lambda: F.add(ma, na), lambda: torch.add(m, n)),
        "mul 4x4": (lambda: F.mul(ma, na), lambda: torch.mul(m, n)),
        "mul 4x4 by 2.0": (lambda: F.mul(ma, 2.0), lambda: torch.mul(m, 2.0)),
        "softmax 4x4 dim 1": (lambda: F.softmax(ma, 1), lambda: TF.softmax(m, 1)),
        "conv2d 1x4x4x4 3x3": (lambda: F.conv2d(x4a, wa, padding=1), lambda: TF.conv2d(x4, w, padding=1)),
        "max_pool2d 1x4x4x4 2": (lambda: F.max_pool2d(x4a, 2), lambda: TF.max_pool2d(x4, 2)),
        "batch_norm eval 1x4x4x4": (lambda: F.batch_norm(x4a, meana, vara),
                                    lambda: TF.batch_norm(x4, mean, var)),
        "cat 2x 4x4 dim 0": (lambda: F.cat([ma, na]), lambda: torch.cat([m, n])),
        "split 4x4 by 2": (lambda: F.split(ma, 2), lambda: torch.split(m, 2)),
        "reshape 4x4 to 16": (lambda: F.reshape(ma, (16,)), lambda: torch.reshape(m, (16,))),
        "transpose 4x4": (lambda: F.transpose(ma, 0, 1), lambda: torch.transpose(m, 0, 1)),
        "permute 1x4x4x4": (lambda: F.permute(x4a, (0, 2, 3, 1)), lambda: torch.permute(x4, (0, 2, 3, 1))),
        "matmul 1x4x4": (lambda: F.matmul(b3a, b3a), lambda: torch.bmm(b3, b3)),
        "interpolate nearest x2": (lambda: F.interpolate(x4a, scale_factor=2),
                                   lambda: TF.interpolate(x4, scale_factor=2)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--only", default=None, help="rows whose name contains this")
    arguments = parser.parse_args()
    torch.set_num_threads(1)  # as tools/torch_bridge_overhead.py: torch's threads beside ours swing the timing
    device = torch.device(arguments.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"device {device}, float32, median us per call of {arguments.runs} (of 7 loops)")
    print(f"{'':<26}{'ours_us':>10}{'torch_us':>10}{'ratio':>8}")
    ratios = []
    for name, (ours, theirs) in cases(device).items():
        if arguments.only and arguments.only not in name:
            continue
        a, b = median_us(ours, arguments.runs, sync), median_us(theirs, arguments.runs, sync)
        ratios.append(a / b)
        print(f"{name:<26}{a:>10.1f}{b:>10.1f}{a / b:>8.1f}")
    print(f"{'geometric mean':<26}{'':>20}{statistics.geometric_mean(ratios):>8.1f}")


if __name__ == "__main__":
    main()
