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
        model.graphs = False  # every call makes its op calls: the replaying path, not a CUDA graph
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


def _gpu_calls(model, x, **options):
    """model(x, **options), and how many GPU kernel calls of the library it made (core.before_gpu_call)."""
    calls = []
    with kernels.runtime.core.before_gpu_call(calls.append):
        out = model(x, **options)
    return out, len(calls)


def _eval_arrays(out):
    return [a for key in ("one2many", "one2one") if key in out for a in out[key]] + [out["decoded"]] + (
        [out["detections"]] if "detections" in out else [])  # (a fused model has no one-to-many head)


@pytest.mark.parametrize("fused", [False, True])
def test_model_calls_replay_a_cuda_graph_from_the_second_call_with_the_eager_bits(fused):
    """model(x) on the GPU in eval: the first call of a shape makes its op calls; the second captures a CUDA
    graph of them (its op calls are captured, not run), with the detections or, for detections=False,
    without (a graph each), and replays it, as every later call does, making no op call of its own. Every
    call writes the bits of a model that makes its op calls every time (graphs=False), on inputs that
    change between the calls, into outputs poisoned first.
    New weights (init_random: in place, the folded ones too) show in the next replay."""
    reason = kernels.gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    import cupy

    dims = (2, 3, 64, 96)
    with YOLOv10("n", device="gpu") as model, YOLOv10("n", device="gpu") as eager:
        eager.graphs = False
        for m in (model, eager):
            m.init_random(2)
            m.fuse() if fused else m.eval()
        with model.stream:
            xs = [cupy.asarray(np.random.default_rng(i).standard_normal(dims).astype(np.float32)) for i in range(3)]
        model.stream.synchronize()  # the inputs are read on the other model's stream too
        plan = model.plan(dims)
        steps = [(0, {}), (1, {}), (2, {}), (0, {"detections": False}), (1, {"detections": False}),
                 (2, {"detections": False}), (1, {})]
        for step, (i, options) in enumerate(steps):
            if step == len(steps) - 1:  # new weights: written in place, so the graph reads them
                for m in (model, eager):
                    m.init_random(7)
            expected = _host(eager, _eval_arrays(eager(xs[i], **options)))
            with model.stream:  # every output buffer of the plan, the detections too
                for a in _eval_arrays(dict(plan.outputs, detections=plan.after.rows)):
                    a.fill(np.nan)
            out, calls = _gpu_calls(model, xs[i], **options)
            after = options.get("detections", True)
            assert ("detections" in out) == after
            _same_bits(_host(model, _eval_arrays(out)), expected, f"call {step + 1} {options}")
            if step in (0, 1, 3):  # the first call's op calls; then the capture of each graph (captured, not run)
                assert calls > 0, f"call {step + 1}"
            else:
                assert calls == 0, f"call {step + 1} made {calls} op calls, not a graph replay"
            assert (after in plan.graphs) == (step > 0)
        assert set(plan.graphs) == {True, False}


def test_training_calls_and_graphs_false_make_their_op_calls():
    """Only inference calls replay a graph: a training forward makes its op calls every time (its backward
    follows it, eagerly), and so does every call of a model with graphs=False."""
    reason = kernels.gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    import cupy

    dims = (1, 3, 64, 64)
    with YOLOv10("n", device="gpu") as model:
        with model.stream:
            x = cupy.asarray(np.random.default_rng(0).standard_normal(dims).astype(np.float32))
        model.train()
        assert all(_gpu_calls(model, x)[1] > 0 for _ in range(3))
        assert model.plan(dims).graphs == {}
        model.eval()
        model.graphs = False
        assert all(_gpu_calls(model, x)[1] > 0 for _ in range(3))
        assert model.plan(dims).graphs == {}
        model.graphs = True  # the plan's forward has run: this call captures, the next replays
        assert _gpu_calls(model, x)[1] > 0 and set(model.plan(dims).graphs) == {True}
        assert _gpu_calls(model, x)[1] == 0
