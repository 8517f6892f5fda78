"""Train YOLOv10 built from the kernels under torch's loss and optimizer: a few SGD steps on a synthetic batch.

    python examples/train_torch.py                          # yolov10n, CPU, float32, 3 steps of 2x3x64x64
    python examples/train_torch.py --device cuda --steps 5 --batch 4 --size 160 --variant s

The model is kernels.models.torch.YOLOv10 (docs/models.md#training-under-torch): a torch module whose
forward and backward run the kernels and whose parameters are the kernel model's arrays. The loss is
ultralytics' own YOLOv10 detection loss (v10DetectLoss: the one-to-many and one-to-one heads' box, class
and DFL terms with the task-aligned assigner) where ultralytics is installed, against synthetic boxes;
otherwise (or with --plain-loss) a plain torch loss of the raw heads (mean squared distance to fixed
random targets), which exercises the same backward. torch.optim.SGD with momentum and weight decay.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a clone's kernels, where it is not installed
from kernels.models.torch import YOLOv10  # noqa: E402


def plain_loss(out: dict, targets: list[torch.Tensor]) -> torch.Tensor:
    """Mean squared distance of each raw head (both branches, three levels) to its target, summed."""
    return sum(((head - target) ** 2).mean() for head, target in zip(out["one2many"] + out["one2one"], targets))


def ultralytics_loss(model: YOLOv10, batch: int, generator: torch.Generator):
    """ultralytics' v10DetectLoss for `model` and a synthetic batch of boxes (one to three per image), or None
    where ultralytics is not installed."""
    try:
        from ultralytics.utils.loss import v10DetectLoss
    except ImportError:
        return None
    # What ultralytics' loss reads of a model: its hyperparameters (the default box, cls, dfl gains), its last
    # layer (nc, no, reg_max, stride) and a parameter (the device).
    head = SimpleNamespace(nc=model.num_classes, no=model.num_classes + 64, reg_max=16,
                           stride=torch.tensor([8.0, 16.0, 32.0]))
    device = next(model.parameters()).device
    holder = SimpleNamespace(args=SimpleNamespace(box=7.5, cls=0.5, dfl=1.5), model=[head],
                             parameters=lambda: iter([torch.zeros(1, device=device)]))
    criterion = v10DetectLoss(holder)
    counts = torch.randint(1, 4, (batch,), generator=generator)
    index = torch.repeat_interleave(torch.arange(batch), counts).float()
    centres = torch.rand(len(index), 2, generator=generator) * 0.6 + 0.2
    sides = torch.rand(len(index), 2, generator=generator) * 0.3 + 0.1
    classes = torch.randint(0, model.num_classes, (len(index), 1), generator=generator).float()
    labels = {"batch_idx": index.to(device), "cls": classes.to(device),
              "bboxes": torch.cat([centres, sides], 1).to(device)}  # normalized xywh, as ultralytics' dataloader

    def loss(out: dict) -> torch.Tensor:
        total, _ = criterion({"one2many": out["one2many"], "one2one": out["one2one"]}, labels)
        return total.sum()

    return loss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="n", help="n, s, m, b, l, x (or yolov10n ...); default n")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]; default cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=64, help="a multiple of 32; default 64")
    parser.add_argument("--plain-loss", action="store_true", help="the plain torch loss even where ultralytics is installed")
    arguments = parser.parse_args(argv)
    dtype = getattr(torch, arguments.dtype)
    generator = torch.Generator().manual_seed(0)
    model = YOLOv10(arguments.variant, device=arguments.device, dtype=dtype).train()
    device = next(model.parameters()).device
    x = torch.rand(arguments.batch, 3, arguments.size, arguments.size, generator=generator, dtype=dtype).to(device)
    loss_fn = None if arguments.plain_loss else ultralytics_loss(model, arguments.batch, generator)
    if loss_fn is None:
        with torch.no_grad():
            targets = [torch.randn(h.shape, generator=generator, dtype=dtype).to(device)
                       for h in (lambda out: out["one2many"] + out["one2one"])(model(x))]

        def loss_fn(out: dict) -> torch.Tensor:
            return plain_loss(out, targets)
        print("loss: plain torch MSE of the raw heads" + ("" if arguments.plain_loss else " (ultralytics not installed)"))
    else:
        print("loss: ultralytics v10DetectLoss on synthetic boxes")
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9,
                                weight_decay=5e-4)
    for step in range(arguments.steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(x))
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.6f} ({time.perf_counter() - start:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
