"""Per-layer GPU time of the whole YOLOv10 network, ours beside PyTorch, per ultralytics layer index
(model.0 ... model.23): ours ms, PyTorch ms, ratio, and our most expensive op calls in each layer.
Run on the GPU machine from the repository root:

    python3 tools/yolov10_profile.py [--configs n:1:eval,n:16:eval,x:16:eval,x:16:train,n:1:fused]
                                     [--runs 5] [--top 3] [--json FILE] [--dtype float16|bfloat16]
                                     [--by-op]

--by-op adds, per configuration, our time summed by kind of call over the whole network (a conv's kind:
its kernel, stride, depthwise or dense, and fused activation; channels left out), most expensive first.

A config is variant:batch:mode, mode eval (the eval forward), fused (ours model.fuse() beside PyTorch's
unfused eval) or train (a training step: forward + backward from gradients of ones). fp32, TF32 off,
640x640; or, with --dtype float16 / bfloat16, eval and fused in that dtype (ours YOLOv10(..., dtype=...),
PyTorch's reference `.to(dtype)` as tools/yolov10_speed.py times it).

Method (GPU time, host launch cost excluded):
- Ours: the plan's op calls run eagerly on the model's stream with a CUDA event recorded before the first
  call and after each call (the time of call k is event k to event k + 1). All of it is enqueued behind a
  spin kernel that holds the stream ~`--gate-ms` ms, so that the GPU runs the calls back to back rather
  than waiting on the host between them. Each call's time is the median over `runs` runs; a layer's time
  is the sum of its calls' (Node.layer says which layer traced a call; a training step's backward calls
  are counted in the layer of the forward call they differentiate, gradient sums in the layer of the
  value summed).
- PyTorch: the reference program (conformance/models/reference.py), CUDA events recorded by a forward
  pre-hook and a forward hook on each top-level layer (model.<i>), behind torch.cuda._sleep. For the
  training step's backward, a tensor hook on each layer's outputs records an event when the first
  gradient of one of them is computed (the layer's backward begins); a layer's backward time is from its
  event to the next such event (autograd runs the layers in about reverse order; where branches join,
  the split between layers is approximate). PyTorch's layer 23 in eval includes the top-k selection
  (ours leaves it out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from typing import Any, Callable, Sequence

sys.path.insert(0, ".")

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


def describe(node: Any) -> str:
    """A short name for an op call: the op and, for a conv, its kernel, stride, groups and widths."""
    name = node.module.__name__.rsplit(".", 1)[-1]
    attrs = node.attrs
    if name == "conv_2d":
        groups = f" g{attrs.groups}" if attrs.groups > 1 else ""
        act = f"+{attrs.activation.name.lower()}" if attrs.activation is not None else ""
        return f"conv {attrs.kernel_h}x{attrs.kernel_w} s{attrs.stride_h}{groups} ->{attrs.out_channels}{act}"
    if name == "batch_norm":
        return "batch_norm" + (f"+{attrs.activation.name.lower()}" if attrs.activation is not None else "")
    return name


def layer_table(ours: dict[str, float], theirs: dict[str, float], top: dict[str, list[tuple[float, str]]],
                count: int) -> list[dict[str, Any]]:
    """Rows model.0 .. model.<count - 1> and a total: ours ms, PyTorch ms, ratio, our top calls."""
    rows = []
    for i in range(count):
        layer = f"model.{i}"
        a, b = ours.get(layer, 0.0), theirs.get(layer, 0.0)
        rows.append({"layer": layer, "ours": a, "torch": b, "ratio": a / b if b > 0 else None,
                     "top": [f"{name} {ms:.3f}" for ms, name in sorted(top.get(layer, []), reverse=True)]})
    a, b = sum(ours.values()), sum(theirs.values())
    rows.append({"layer": "total", "ours": a, "torch": b, "ratio": a / b if b > 0 else None, "top": []})
    return rows


def op_kind(name: str) -> str:
    """A call's description (describe) without its channel counts: 'conv 3x3 s1 g640 ->640' is 'conv 3x3 s1 dw'."""
    if not name.startswith("conv "):
        return name
    words = name.split()
    kind = " ".join(words[:3]) + (" dw" if any(w.startswith("g") for w in words[3:]) else "")
    return kind + ("+" + name.rsplit("+", 1)[1] if "+" in name else "")


def print_by_op(top: dict[str, list[tuple[float, str]]]) -> None:
    """Our ms summed per kind of call (op_kind) over every layer, with the call count and share of the total."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for calls in top.values():
        for ms, name in calls:
            entry = totals[op_kind(name)]
            entry[0] += ms
            entry[1] += 1
    whole = sum(ms for ms, _ in totals.values()) or 1.0
    print(f"{'kind of call':34} {'calls':>5} {'ours ms':>9} {'share':>6}")
    for kind, (ms, count) in sorted(totals.items(), key=lambda item: -item[1][0]):
        print(f"{kind:34} {count:5d} {ms:9.3f} {ms / whole:6.1%}")
    sys.stdout.flush()


def print_table(title: str, rows: Sequence[dict[str, Any]], top: int) -> None:
    print(f"\n{title}")
    print(f"{'layer':9} {'ours ms':>9} {'torch ms':>9} {'ratio':>6}  our top calls (ms)")
    for row in rows:
        ratio = f"{row['ratio']:6.2f}" if row["ratio"] is not None else "     -"
        print(f"{row['layer']:9} {row['ours']:9.3f} {row['torch']:9.3f} {ratio}  {'; '.join(row['top'][:top])}")
    sys.stdout.flush()


def _median_times(runs: int, once: Callable[[], list[float]]) -> list[float]:
    samples = [once() for _ in range(runs)]
    return [statistics.median(column) for column in zip(*samples)]


def profile_ours(variant: str, batch: int, mode: str, runs: int, gate_ms: float, dtype: str = "float32"):
    """Per layer: our ms, and each call's (ms, description)."""
    import cupy
    import numpy as np

    from kernels.models import YOLOv10

    spin = cupy.RawKernel(SPIN, "spin")
    dims = (batch, 3, 640, 640)
    clock_khz = cupy.cuda.Device().attributes.get("ClockRate", 2_000_000)
    cycles = np.int64(gate_ms * clock_khz)  # ms x cycles per ms
    with YOLOv10(variant, device="gpu", dtype=dtype) as model:
        with model.stream:
            x = cupy.asarray(np.random.default_rng(0).standard_normal(dims).astype(np.float32).astype(model.dtype))
        if mode == "train":
            out = model.train()(x)
            with model.stream:
                grads = {k: [cupy.ones_like(a) for a in out[k]] for k in ("one2many", "one2one")}
            model.backward(grads)
        else:
            (model.fuse() if mode == "fused" else model.eval())(x, detections=False)
        plan = model.plan(dims)
        calls = list(plan.forward_calls)
        layers = [node.layer for node in plan.graph.nodes]
        names = [describe(node) for node in plan.graph.nodes]
        if mode == "train":
            nodes_of = {}  # the backward call's node, by its state
            for node, state in zip(plan.graph.nodes, plan.node_states):
                nodes_of[id(state)] = node
            calls += plan.backward_calls
            layers += plan.backward_layers
            names += ["grad " + (describe(nodes_of[id(args[2])]) if id(args[2]) in nodes_of else "gradient_reduction")
                      for _, args in plan.backward_calls]
        stream = model.stream.cupy_stream

        def once() -> list[float]:
            events = [cupy.cuda.Event() for _ in range(len(calls) + 1)]
            with model.stream:
                spin((1,), (1,), (cycles,))
                events[0].record(stream)
                for k, (function, args) in enumerate(calls):
                    function(*args)
                    events[k + 1].record(stream)
            model.stream.synchronize()
            return [cupy.cuda.get_elapsed_time(events[k], events[k + 1]) for k in range(len(calls))]

        once()
        times = _median_times(runs, once)
    per_layer: dict[str, float] = defaultdict(float)
    top: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for ms, layer, name in zip(times, layers, names):
        per_layer[layer] += ms
        top[layer].append((ms, name))
    return dict(per_layer), dict(top)


def _tensors(value: Any) -> list[Any]:
    """The tensors in a module's output (a tensor, or lists, tuples and dicts of them)."""
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return [value] if hasattr(value, "register_hook") else []


def profile_torch(variant: str, batch: int, mode: str, runs: int, gate_ms: float,
                  dtype: str = "float32") -> dict[str, float]:
    """Per layer: PyTorch's ms (forward, and for a training step forward + backward)."""
    import numpy as np
    import torch

    from conformance.models import reference

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model = reference.build(variant).cuda().to(getattr(torch, dtype))
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((batch, 3, 640, 640)).astype(np.float32)).cuda()
    x = x.to(getattr(torch, dtype))
    marks: list[tuple[str, str, Any]] = []  # (layer, "start" / "end" / "grad", event), in record order
    started: set[str] = set()  # layers whose backward has begun, this run

    def mark(layer: str, what: str) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        marks.append((layer, what, event))

    def on_grad(layer: str) -> None:
        if layer not in started:  # the first gradient of one of the layer's outputs: its backward begins
            started.add(layer)
            mark(layer, "grad")

    def forward_hook(module: Any, inputs: Any, output: Any, name: str) -> None:
        mark(name, "end")
        if mode == "train":
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(lambda grad, name=name: on_grad(name))

    handles = []
    for i, layer in enumerate(model.model):
        name = f"model.{i}"
        handles.append(layer.register_forward_pre_hook(lambda m, a, name=name: mark(name, "start")))
        handles.append(layer.register_forward_hook(lambda m, a, o, name=name: forward_hook(m, a, o, name)))
    cycles = int(gate_ms * 2e6)  # about gate_ms at the H200's ~2 GHz

    def once() -> dict[str, float]:
        marks.clear()
        started.clear()
        torch.cuda._sleep(cycles)
        if mode == "train":
            model.train()
            model.zero_grad(set_to_none=True)
            out = model(x)
            heads = out["one2many"] + out["one2one"]
            torch.autograd.backward(heads, [torch.ones_like(t) for t in heads])
            mark("", "done")
        else:
            model.eval()
            with torch.no_grad():
                model(x)
        torch.cuda.synchronize()
        result: dict[str, float] = defaultdict(float)
        open_at: dict[str, Any] = {}
        grads = [(layer, event) for layer, what, event in marks if what in ("grad", "done")]
        for layer, what, event in marks:
            if what == "start":
                open_at[layer] = event
            elif what == "end" and layer in open_at:
                result[layer] += open_at.pop(layer).elapsed_time(event)
        # Backward: from one layer's first output gradient to the next layer's (autograd runs the layers
        # in about reverse order; the time between is given to the layer that began it).
        for (layer, event), (_, following) in zip(grads, grads[1:]):
            result[layer] += event.elapsed_time(following)
        return result

    once()
    samples = [once() for _ in range(runs)]
    for handle in handles:
        handle.remove()
    return {layer: statistics.median(s.get(layer, 0.0) for s in samples) for layer in samples[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="n:1:eval,n:16:eval,x:16:eval,x:16:train,n:1:fused")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--gate-ms", type=float, default=50.0, help="the spin that holds the stream, ms")
    parser.add_argument("--json")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument("--by-op", action="store_true", help="also our time summed by kind of call")
    args = parser.parse_args()
    results = {}
    for config in args.configs.split(","):
        variant, batch, mode = config.split(":")
        try:
            if mode == "train" and args.dtype != "float32":
                raise ValueError("the half dtypes are profiled in eval and fused only")
            ours, top = profile_ours(variant, int(batch), mode, args.runs, args.gate_ms, args.dtype)
            theirs = profile_torch(variant, int(batch), "train" if mode == "train" else "eval", args.runs,
                                   args.gate_ms, args.dtype)
        except Exception as error:  # report and go on with the next configuration
            print(f"{config}: {type(error).__name__}: {error}")
            continue
        rows = layer_table(ours, theirs, top, 24)
        against = "unfused eval" if mode == "fused" else mode
        print_table(f"yolov10{variant} {args.dtype} batch {batch} {mode} (PyTorch: {against})", rows, args.top)
        if args.by_op:
            print_by_op(top)
        results[config] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
