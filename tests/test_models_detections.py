"""YOLOv10's detections through the top_k op (kernels.models.detections): the same bits as the stable
argsorts the model ran before (postprocess_reference) on the CPU, in every dtype and with ties; the same
bits on the GPU as on the CPU; made from buffers of the plan, so that a CUDA graph of an eval plan
replays them (tests/test_models_graph.py checks the whole network's replay)."""

from __future__ import annotations

import numpy as np
import pytest

import kernels
from kernels.models import YOLOv10
from kernels.models import yolov10 as y10
from kernels.models.detections import Detections
from kernels.runtime.core import BFLOAT16

DTYPES = (np.float32, np.float64, np.float16, BFLOAT16)


def _decoded(rng, batch, nc, anchors, dtype, levels=64):
    """Boxes anywhere, scores on a grid of 1/levels in [0, 1]: ties between anchors and between classes."""
    decoded = rng.standard_normal((batch, 4 + nc, anchors)) * 100
    decoded[:, 4:, :] = rng.integers(0, levels + 1, (batch, nc, anchors)) / levels
    return decoded.astype(dtype)


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("batch, nc, anchors", [(2, 3, 126), (1, 80, 8400), (3, 80, 2100), (1, 2, 2016), (2, 5, 40)])
def test_cpu_detections_are_the_stable_argsorts_bits(dtype, batch, nc, anchors):
    decoded = _decoded(np.random.default_rng(batch * anchors + nc), batch, nc, anchors, dtype)
    got = y10.postprocess(np, decoded, nc)
    assert got.shape == (batch, min(300, anchors), 6)
    assert _same_bits(got, y10.postprocess_reference(np, decoded, nc))


def test_max_det_and_all_equal_scores_keep_index_order():
    decoded = np.zeros((1, 6, 10), np.float32)
    decoded[0, :4] = np.arange(40).reshape(4, 10)
    decoded[0, 4:] = 0.5  # every score equal: anchors 0, 1, 2 then classes 0, 1 of each
    got = y10.postprocess(np, decoded, 2, max_det=3)
    assert got[0, :, 5].tolist() == [0, 1, 0] and got[0, :, 0].tolist() == [0, 0, 1]
    assert _same_bits(got, y10.postprocess_reference(np, decoded, 2, max_det=3))


def test_a_nan_score_counts_as_the_largest():
    decoded = _decoded(np.random.default_rng(3), 1, 3, 20, np.float32)
    decoded[0, 5, 7] = np.nan
    got = y10.postprocess(np, decoded, 3, max_det=4)
    assert np.isnan(got[0, 0, 4]) and got[0, 0, 5] == 1 and np.array_equal(got[0, 0, :4], decoded[0, :4, 7])


def test_the_model_writes_its_detections_into_a_buffer_of_the_plan():
    with YOLOv10("n") as model:
        x = np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)
        out = model.eval()(x)
        plan = model.plan(x.shape)
        assert out["detections"] is plan.after.rows
        expected = y10.postprocess_reference(np, out["decoded"], 80)
        assert _same_bits(out["detections"], expected)
        first = out["detections"].copy()
        out = model(x * 0.5)  # the next call overwrites the same buffer
        assert out["detections"] is plan.after.rows
        assert _same_bits(out["detections"], y10.postprocess_reference(np, out["decoded"], 80))
        assert not _same_bits(out["detections"], first)
        assert len(plan.after.states) == 2  # the two top_k states, cleaned up with the plan


def test_decoded_of_another_class_count_is_refused():
    with pytest.raises(ValueError, match="decoded has 7 channels, expected 4 \\+ 80"):
        Detections(np.zeros((1, 7, 40), np.float32), 80, 300, np, kernels.cpu_stream(), kernels.cpu_handle())


def test_a_training_plan_has_no_detection_stage_to_run():
    with YOLOv10("n") as model:
        plan = model.train().plan((1, 3, 64, 64))
        assert plan.training and plan.after is None
        plan.run_after()  # nothing to run: no error, no outputs added
        assert "detections" not in plan.outputs


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("batch, nc, anchors", [(1, 80, 8400), (16, 80, 8400), (2, 80, 2100), (2, 5, 40)])
def test_gpu_detections_equal_cpu_bits(dtype, batch, nc, anchors):
    reason = kernels.gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    import cupy

    decoded = _decoded(np.random.default_rng(batch + nc + anchors), batch, nc, anchors, dtype)
    expected = y10.postprocess(np, decoded, nc)
    got = cupy.asnumpy(y10.postprocess(cupy, cupy.asarray(decoded), nc))
    assert _same_bits(got, expected)
    assert _same_bits(got, y10.postprocess_reference(np, decoded, nc))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_model_detections_replay_in_a_graph_bit_for_bit(dtype):
    """An eval plan's CUDA graph writes the detections; its replay equals the eager call and the CPU model."""
    reason = kernels.gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    import cupy

    dims = (2, 3, 96, 128)
    x = np.random.default_rng(5).standard_normal(dims).astype(dtype)
    with YOLOv10("n", device="gpu", dtype=dtype) as model:
        model.eval()
        with model.stream:
            x_gpu = cupy.asarray(x)
        out = model(x_gpu)
        model.stream.synchronize()
        eager = cupy.asnumpy(out["detections"])
        decoded = cupy.asnumpy(out["decoded"])
        assert _same_bits(eager, y10.postprocess(np, decoded, 80))  # the GPU's detections are the CPU's bits
        plan = model.plan(dims)
        with model.stream:
            out["detections"].fill(np.nan)
        graph = plan.capture()
        model.stream.synchronize()
        assert np.isnan(cupy.asnumpy(out["detections"])).all(), "capturing ran work"
        graph.launch(model.stream.cupy_stream)
        model.stream.synchronize()
        assert _same_bits(cupy.asnumpy(plan.after.rows), eager)
