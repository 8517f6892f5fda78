"""Scaling of the data-parallel YOLOv10 training step (kernels.models.parallel over NCCL): the step time
(forward, backward and the gradients' all-reduce, synchronized) at 1 GPU and at N GPUs, with a batch of
`--batch-per-gpu` images on every GPU (weak scaling, as DDP is used). Run on the GPU machine from the
repository root:

    python3 tools/yolov10_parallel.py [--variants n,x] [--gpus 1,2,4,8] [--batch-per-gpu 16] [--size 640]
                                      [--steps 10] [--sync-batch-norm] [--json FILE]

For each variant and GPU count N (counts past the visible GPUs are skipped with the reason), N processes
are launched as torchrun launches them (RANK, WORLD_SIZE, LOCAL_RANK, and KERNELS_NCCL_ID_FILE a new
file), each rank on GPU LOCAL_RANK. "1 plain" is the model's own step without DataParallel; "1" is the
data-parallel step over a communicator of one rank (its all-reduce is a copy). A rank's step time is the
median of `--steps` steps after 2 warm-up steps (the first compiles the plan); the table shows the
slowest rank's (every rank waits for it in the all-reduce), the images per second of the whole step, and
the efficiency: images per second at N over N times those of "1 plain"."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, ".")


def rank_main(arguments: argparse.Namespace) -> int:
    """One rank (launched by main): its median step time in ms, printed as JSON."""
    import cupy

    from kernels.models import YOLOv10, nccl, parallel

    launch = parallel.launch_environment()
    plain = arguments.plain
    communicator = None if plain else nccl.connect()
    device = launch.local_rank
    with YOLOv10(arguments.variant, device=f"gpu:{device}") as model:
        trainer = model if plain else parallel.DataParallel(model, communicator, sync_batch_norm=arguments.sync)
        rng = np.random.default_rng(launch.rank)
        with model.stream:
            x = cupy.asarray(rng.standard_normal((arguments.batch, 3, arguments.size, arguments.size), np.float32))
            out = trainer(x)
            grads = {key: [cupy.asarray(rng.standard_normal(a.shape, np.float32) * 0.01) for a in out[key]]
                     for key in ("one2many", "one2one")}
        times = []
        for step in range(arguments.steps + 2):
            model.stream.synchronize()
            start = time.perf_counter()
            trainer(x)
            trainer.backward(grads)
            model.stream.synchronize()
            if step >= 2:
                times.append((time.perf_counter() - start) * 1e3)
        peak = cupy.cuda.runtime.memGetInfo()
    if communicator is not None:
        communicator.close()
    print("RESULT " + json.dumps({"rank": launch.rank, "median_ms": statistics.median(times),
                                  "used_gib": (peak[1] - peak[0]) / 2**30}), flush=True)
    return 0


def launch(variant: str, gpus: int, arguments: argparse.Namespace, plain: bool) -> dict:
    """`gpus` ranks of this script, with torchrun's variables; the slowest rank's median step."""
    id_file = os.path.join(tempfile.mkdtemp(prefix="yolov10_parallel_"), "nccl_id.json")
    processes = []
    for rank in range(gpus):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(gpus), LOCAL_RANK=str(rank), KERNELS_NCCL_ID_FILE=id_file)
        command = [sys.executable, __file__, "--rank-worker", "--variant", variant, "--batch", str(arguments.batch_per_gpu),
                   "--size", str(arguments.size), "--steps", str(arguments.steps)]
        command += ["--plain"] if plain else []
        command += ["--sync-batch-norm"] if arguments.sync else []
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    for rank, process in enumerate(processes):
        output = process.communicate()[0]
        lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
        if process.returncode != 0 or not lines:
            raise SystemExit(f"{variant} on {gpus} GPUs, rank {rank} failed:\n{output[-4000:]}")
        results.append(json.loads(lines[-1][7:]))
    step = max(r["median_ms"] for r in results)
    return {"variant": variant, "gpus": gpus, "plain": plain, "batch": gpus * arguments.batch_per_gpu,
            "step_ms": step, "images_per_s": gpus * arguments.batch_per_gpu / step * 1e3,
            "ranks_ms": [r["median_ms"] for r in results], "used_gib": max(r["used_gib"] for r in results)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="n,x")
    parser.add_argument("--gpus", default="1,2,4,8", help="GPU counts, comma-separated (those past the visible skipped)")
    parser.add_argument("--batch-per-gpu", type=int, default=16)
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--sync-batch-norm", dest="sync", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    # one rank, as launched by main
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.rank_worker:
        return rank_main(arguments)

    import cupy

    from kernels.models import nccl

    visible = cupy.cuda.runtime.getDeviceCount()
    no_nccl = nccl.nccl_unavailable_reason()
    rows = []
    print(f"{'variant':<8}{'GPUs':>8}{'batch':>7}{'step ms':>10}{'images/s':>10}{'efficiency':>11}{'GiB':>7}  ranks ms")
    for variant in arguments.variants.split(","):
        base = None
        for gpus, plain in [(1, True)] + [(int(g), False) for g in arguments.gpus.split(",")]:
            if gpus > visible or (no_nccl and not plain):
                print(f"{variant:<8}{gpus:>8}  skipped: " + (no_nccl if gpus <= visible else f"{visible} GPUs visible"))
                continue
            row = launch(variant, gpus, arguments, plain)
            base = row if plain else base
            row["efficiency"] = row["images_per_s"] / (gpus * base["images_per_s"])
            rows.append(row)
            label = f"{gpus} plain" if plain else str(gpus)
            print(f"{variant:<8}{label:>8}{row['batch']:>7}{row['step_ms']:>10.1f}{row['images_per_s']:>10.1f}"
                  f"{row['efficiency']:>11.2f}{row['used_gib']:>7.1f}  " + " ".join(f"{t:.1f}" for t in row["ranks_ms"]),
                  flush=True)
    if arguments.json:
        with open(arguments.json, "w") as file:
            json.dump({"sync_batch_norm": arguments.sync, "size": arguments.size, "steps": arguments.steps,
                       "batch_per_gpu": arguments.batch_per_gpu, "rows": rows}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
