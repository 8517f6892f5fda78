"""The whole YOLOv10 network on the GPU, ours beside PyTorch in one run (fp32, TF32 off on both sides):
eval forward eager and as a CUDA graph replay, the same for our fused inference (model.fuse(): BatchNorms
folded, the one-to-many head dropped) beside PyTorch's unfused network (rows fused_eager, fused_graph), a
training step (forward + backward) eager, and peak device memory of the eval forward (ours: CuPy's pool
after the run, which keeps every block it ever held, plus the states' own allocations; PyTorch:
torch.cuda.max_memory_allocated plus the weights), with our plan's own bytes (Plan.memory()). Run on the
GPU machine from the repository root:

    python3 tools/yolov10_speed.py [--variants n,x] [--batches 1,16] [--runs 20] [--json FILE]
    python3 tools/yolov10_speed.py --dtype float16 [--train ""]     # and --dtype bfloat16

--dtype float16 / bfloat16: ours YOLOv10(v, device="gpu", dtype=...) (half activations and conv weights,
float32 BatchNorms); PyTorch's eval twin is ultralytics' half deployment, the reference with
`model.half()` (`.to(torch.bfloat16)`: every tensor in the half dtype, BatchNorms too), cudnn.benchmark
off; its training twin the mixed-precision reference (float32 BatchNorm modules), as ours. The PyTorch
times the half-precision work was set against are in docs/performance.md#pytorchs-half-precision-times.

Ours: YOLOv10(v, device="gpu"), eval calls with detections=False (the top-k is left out; PyTorch's
eval includes ultralytics' top-k selection), graph = Plan.capture() replayed with Graph.launch (the
graph includes the detections: Plan.capture captures an eval plan's detection stage after the forward).
PyTorch: the reference program (conformance/models/reference.py), eval under no_grad, graph =
torch.cuda.CUDAGraph of the same call. Times are medians of `runs` calls, each synchronized.

train_step times PyTorch as it runs by default (cudnn.benchmark off, cudnn.deterministic off: cuDNN
may pick algorithms whose sums are not reproducible); train_det times the same step with
torch.backends.cudnn.deterministic = True, beside our same step: ours is always deterministic."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, ".")
import cupy  # noqa: E402
import torch  # noqa: E402

from conformance.models import reference  # noqa: E402
from kernels.models import YOLOv10  # noqa: E402
from kernels.runtime import gpu  # noqa: E402

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.benchmark = False


def median_ms(call, sync, runs):
    call()
    sync()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def ours(variant, batch, runs, train, fused=True, dtype="float32"):
    row = {}
    cupy.get_default_memory_pool().free_all_blocks()
    before = gpu.live_allocations().get("bytes", 0)
    with YOLOv10(variant, device="gpu", dtype=dtype) as model:
        dims = (batch, 3, 640, 640)
        with model.stream:
            x = cupy.asarray(np.random.default_rng(0).standard_normal(dims).astype(dtype))
        model.eval()
        sync = model.stream.synchronize
        row["eager"] = median_ms(lambda: model(x, detections=False), sync, runs)
        plan = model.plan(dims)
        graph = plan.capture()
        cs = model.stream.cupy_stream
        row["graph"] = median_ms(lambda: graph.launch(cs), sync, runs)
        sync()
        pool = cupy.get_default_memory_pool().total_bytes()
        kept = (gpu.live_allocations().get("bytes", 0)) - before
        row["eval_memory_mib"] = (pool + kept) / 2**20
        row["plan_mib"] = plan.memory()["total"] / 2**20
        graph = None
        if fused:
            model.fuse()
            row["fused_eager"] = median_ms(lambda: model(x, detections=False), sync, runs)
            graph = model.plan(dims).capture()
            row["fused_graph"] = median_ms(lambda: graph.launch(cs), sync, runs)
            graph = None
            model.fuse(False)
        if train:
            model.train()
            out = model(x)
            with model.stream:
                grads = {k: [cupy.ones_like(a) for a in out[k]] for k in ("one2many", "one2one")}

            def step():
                model(x)
                model.backward(grads)
            row["train_step"] = median_ms(step, sync, max(3, runs // 4))
            row["train_det"] = row["train_step"]  # ours is always deterministic
    return row


def theirs(variant, batch, runs, train, dtype="float32"):
    row = {}
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch_dtype = getattr(torch, dtype)
    model = reference.build(variant).cuda().eval().to(torch_dtype)  # half: model.half(), as deployed
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((batch, 3, 640, 640)).astype(np.float32)).cuda()
    x = x.to(torch_dtype)
    sync = torch.cuda.synchronize
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        row["eager"] = median_ms(lambda: model(x), sync, runs)
        row["eval_memory_mib"] = (torch.cuda.max_memory_allocated() - base + sum(
            p.numel() * p.element_size() for p in model.parameters())) / 2**20
        graph = reference.cuda_graph(model, x)
        row["graph"] = median_ms(graph.replay, sync, runs)
        row["fused_eager"], row["fused_graph"] = row["eager"], row["graph"]  # our fused rows' twin: unfused
        graph = None
    if train:
        if torch_dtype in reference.HALF_DTYPES:  # mixed-precision training: float32 BatchNorm modules
            model = reference.build(variant, dtype=torch_dtype, device="cuda")
        model.train()
        out = model(x)
        feats = out["one2many"] + out["one2one"] if isinstance(out, dict) else None
        grads = [torch.ones_like(t) for t in feats]

        def step():
            model.zero_grad(set_to_none=True)
            o = model(x)
            torch.autograd.backward(o["one2many"] + o["one2one"], grads)
        row["train_step"] = median_ms(step, sync, max(3, runs // 4))
        # Ours is deterministic (bit-identical runs, the library's contract); PyTorch's default cuDNN
        # algorithms need not be. The train_det row times PyTorch's step with deterministic ones.
        deterministic, torch.backends.cudnn.deterministic = torch.backends.cudnn.deterministic, True
        try:
            row["train_det"] = median_ms(step, sync, max(3, runs // 4))
        finally:
            torch.backends.cudnn.deterministic = deterministic
    model = None
    torch.cuda.empty_cache()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="n,x")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--train", default="n:1,x:16", help="variant:batch pairs that also time a training step")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument("--json")
    args = parser.parse_args()
    train = {tuple(p.split(":")) for p in args.train.split(",") if p}
    rows = []
    print(f"dtype {args.dtype}")
    print(f"{'model':8} {'batch':>5} {'what':12} {'ours ms':>9} {'torch ms':>9} {'ratio':>6}")
    for variant in args.variants.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            t = (variant, str(batch)) in train
            try:
                a = ours(variant, batch, args.runs, t, dtype=args.dtype)
                b = theirs(variant, batch, args.runs, t, dtype=args.dtype)
            except Exception as error:  # report and go on with the next configuration
                print(f"yolov10{variant} batch {batch}: {type(error).__name__}: {error}")
                continue
            print(f"yolov10{variant:2} {batch:5} plan bytes (activations + gradients + states): "
                  f"{a['plan_mib']:.1f} MiB; peak: ours {a['eval_memory_mib']:.0f} MiB (pool + kept), "
                  f"torch.cuda.max_memory_allocated {b['eval_memory_mib']:.0f} MiB (+ weights)")
            for what in ("eager", "graph", "fused_eager", "fused_graph", "train_step", "train_det", "eval_memory_mib"):
                if what in a and what in b:
                    ratio = a[what] / b[what]
                    print(f"yolov10{variant:2} {batch:5} {what:12} {a[what]:9.2f} {b[what]:9.2f} {ratio:6.2f}")
                    rows.append(dict(variant=variant, batch=batch, dtype=args.dtype, what=what, ours=a[what], torch=b[what],
                                     ratio=ratio))
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
