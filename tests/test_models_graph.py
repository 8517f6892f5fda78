"""The whole YOLOv10 network captured in a CUDA graph (Plan.capture): a replay writes the same bits as
the eager calls, for the eval forward with its detections and for a training step (forward and backward), and a training
replay updates the running statistics exactly as an eager step does. Capturing runs nothing."""

from __future__ import annotations

import numpy as np
import pytest

import kernels
from kernels.models import YOLOv10

pytestmark = pytest.mark.gpu


def _host(model, arrays):
    model.stream.synchronize()
    return [model.xp.asnumpy(a) for a in arrays]


def _same_bits(got, expected, what):
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.shape == e.shape
        assert np.array_equal(g.view(np.uint8), e.view(np.uint8)), (
            f"{what} {i}: {int(np.count_nonzero(g != e))} of {e.size} values differ after replay")


@pytest.mark.parametrize("variant,dims", [("n", (2, 3, 128, 160)), ("s", (1, 3, 96, 96))])
def test_graph_replay_equals_eager(variant, dims):
    reason = kernels.gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    import cupy

    with YOLOv10(variant, device="gpu") as model:
        with model.stream:
            x = cupy.asarray(np.random.default_rng(1).standard_normal(dims).astype(np.float32))
        cs = model.stream.cupy_stream

        # eval: the heads, the decoded boxes and scores, and the detections (the top_k op inside the graph)
        model.eval()
        out = model(x)
        plan = model.plan(dims)
        assert out["detections"] is plan.after.rows
        written = [a for key in ("one2many", "one2one") for a in out[key]] + [out["decoded"], out["detections"]]
        eager = _host(model, written)
        assert all(np.isfinite(e).all() for e in eager)
        with model.stream:
            for a in written:
                a.fill(np.nan)
        graph = plan.capture()
        assert all(np.isnan(h).all() for h in _host(model, written)), "capturing ran work"
        graph.launch(cs)
        _same_bits(_host(model, written), eager, "eval output")

        # training: forward and backward; running statistics from the same start
        model.train()
        with model.stream:  # the running statistics before the eager training forward updates them
            start = {k: v.copy() for k, v in model.state_dict().items()
                     if k.endswith(("running_mean", "running_var"))}
        out = model(x)
        with model.stream:
            grads = {k: [cupy.asarray(np.random.default_rng(i).standard_normal(a.shape).astype(np.float32))
                         for i, a in enumerate(out[k])] for k in ("one2many", "one2one")}
        model.backward(grads)
        plan = model.plan(dims)
        names = sorted(plan.grads)
        written = [a for k in ("one2many", "one2one") for a in out[k]] + [plan.grads[n] for n in names] + [plan.input_grad]
        eager = _host(model, written)
        stats_after = {k: cupy.asnumpy(v) for k, v in model.state_dict().items() if k in start}
        with model.stream:
            for k, v in model.state_dict().items():
                if k in start:
                    v[...] = start[k]
            for a in written:
                a.fill(np.nan)
        graph = plan.capture(backward=True)
        graph.launch(cs)
        _same_bits(_host(model, written), eager, "training output or gradient")
        replayed = {k: cupy.asnumpy(v) for k, v in model.state_dict().items() if k in start}
        _same_bits([replayed[k] for k in sorted(start)], [stats_after[k] for k in sorted(start)], "running statistic")


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_later_runs_equal_the_checked_first_run_also_on_a_delayed_stream(mode):
    """A plan's later runs (core.replaying: no array checks, the stream entered once) write the bits of its
    first, fully checked run, also with every call behind a spin on its stream (the delayed schedule:
    work enqueued anywhere but the plan's stream would run early and show)."""
    reason = kernels.gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    import cupy

    from conformance.harness import spin

    with YOLOv10("n", device="gpu") as model:
        model.init_random(3)
        with model.stream:
            x = cupy.asarray(np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32))
        getattr(model, mode)()
        runs = []
        for i in range(3):
            with kernels.runtime.core.before_gpu_call(spin if i == 2 else None):
                out = model(x, detections=False) if mode == "eval" else model(x)
                arrays = [a for key in ("one2many", "one2one") for a in out[key]]
                if mode == "train":
                    with model.stream:  # the gradients filled on the stream that backward reads them on
                        grads = {k: [cupy.ones_like(a) for a in out[k]] for k in ("one2many", "one2one")}
                    model.backward(grads)
                    arrays += [model.grads[n] for n in sorted(model.grads)]
            runs.append(_host(model, arrays))
        assert all(np.isfinite(a).all() for a in runs[0])
        _same_bits(runs[1], runs[0], f"{mode} run 2")
        _same_bits(runs[2], runs[0], f"{mode} run 3 (delayed)")
