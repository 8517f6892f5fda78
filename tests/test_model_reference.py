"""The PyTorch reference of YOLOv10 (conformance/models/reference.py) against ultralytics' recorded
architecture (tests/data/yolov10/): state_dict names, order and shapes, every layer's module tree,
parameter counts; weight transfer both ways; and the head's decode and top-k selection on values
worked out by hand."""

import os

import numpy as np
import pytest
import torch

from conformance.models import reference

DATA = os.path.join(os.path.dirname(__file__), "data", "yolov10")

# ultralytics 8.4.190's DetectionModel parameter counts (tests/data/yolov10/README.md).
PARAMETER_COUNTS = {"n": 2_775_520, "s": 8_128_272, "m": 16_576_768, "b": 20_574_384, "l": 25_888_688, "x": 31_808_960}


def tsv(variant, kind):
    with open(os.path.join(DATA, f"yolov10{variant}_{kind}.tsv"), encoding="utf-8") as file:
        rows = [line.rstrip("\n").split("\t") for line in file]
    return rows[1:]


@pytest.fixture(scope="module", params=reference.VARIANTS)
def built(request):
    torch.manual_seed(0)
    return request.param, reference.build(request.param)


def test_state_dict_names_order_and_shapes_match_ultralytics(built):
    variant, model = built
    expected = [(name, shape) for name, shape in tsv(variant, "state_dict")]
    got = [(name, str(tuple(tensor.shape))) for name, tensor in model.state_dict().items()]
    assert len(got) == len(expected)
    for index, (mine, theirs) in enumerate(zip(got, expected)):
        assert mine == theirs, f"entry {index}"


def test_every_layer_matches_ultralytics_module_tree(built):
    variant, model = built
    rows = tsv(variant, "layers")
    assert len(model.model) == len(rows) == 24
    for layer, (index, source, type_name, params, tree) in zip(model.model, rows):
        where = f"yolov10{variant} layer {index}"
        assert layer.i == int(index), where
        assert str(layer.f if isinstance(layer.f, int) else list(layer.f)) == source, where
        assert type(layer).__name__ == type_name.rsplit(".", 1)[1], where
        assert sum(p.numel() for p in layer.parameters()) == int(params), where
        # The one-line repr: every conv's channels, kernel, stride, padding, groups and bias, every
        # BatchNorm's eps and momentum, every activation.
        assert " ".join(repr(layer).split()) == " ".join(tree.split()), where


def test_parameter_count(built):
    variant, model = built
    assert reference.parameter_count(model) == PARAMETER_COUNTS[variant]


def test_batch_norms_are_ultralytics_and_dfl_is_fixed():
    model = reference.build("n")
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(m.eps == 1e-3 and m.momentum == 0.03 for m in norms)
    dfl = model.model[23].dfl.conv.weight
    assert not dfl.requires_grad
    assert torch.equal(dfl.view(-1), torch.arange(16, dtype=torch.float32))


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="unknown YOLOv10 variant 'q'"):
        reference.build("q")


def test_transfer_round_trip_in_both_dtypes():
    torch.manual_seed(1)
    source = reference.build("n")
    state = reference.to_numpy(source)
    rng = np.random.default_rng(0)
    changed = {name: (rng.standard_normal(a.shape).astype(a.dtype) if a.dtype.kind == "f" else a + 3)
               for name, a in state.items()}
    for dtype in (torch.float32, torch.float64):
        target = reference.build("n", dtype=dtype)
        reference.load_numpy(target, changed)
        back = reference.to_numpy(target)
        assert list(back) == list(changed)
        for name, array in changed.items():
            expected = array.astype(np.float64) if dtype == torch.float64 and array.dtype.kind == "f" else array
            assert back[name].dtype == expected.dtype, name
            assert np.array_equal(back[name], expected), name
    assert int(back["model.0.bn.num_batches_tracked"]) == 3
    # to_numpy copies: changing the model later leaves the arrays as they were.
    with torch.no_grad():
        target.model[0].conv.weight.add_(1.0)
    assert np.array_equal(back["model.0.conv.weight"], changed["model.0.conv.weight"].astype(np.float64))


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("model.5.cv1.bn.running_var"), "missing model.5.cv1.bn.running_var"),
    (lambda s: s.update({"model.24.weight": np.zeros(3)}), "unexpected model.24.weight"),
    (lambda s: s.update({"model.0.conv.weight": np.zeros((16, 3, 3, 2), np.float32)}),
     r"misshapen model.0.conv.weight \(16, 3, 3, 2\) \(expected \(16, 3, 3, 3\)\)"),
])
def test_transfer_refuses_a_bad_state_naming_it_and_writes_nothing(change, message):
    torch.manual_seed(2)
    model = reference.build("n")
    before = reference.to_numpy(model)
    state = {name: np.ones_like(a) for name, a in before.items()}
    change(state)
    with pytest.raises(ValueError, match=message):
        reference.load_numpy(model, state)
    after = reference.to_numpy(model)
    assert all(np.array_equal(after[name], before[name]) for name in before)


def test_select_detections_two_stage_top_k_by_hand():
    # 4 anchors, 2 classes, k = 3. Anchor best scores 0.9, 0.8, 0.3, 0.6: stage one keeps anchors
    # 0, 1, 3; stage two takes the 3 best of their 6 scores: (0, class 1) 0.9, (1, class 0) 0.8,
    # (1, class 1) 0.7; anchor 3's 0.6 misses, anchor 2 never competes.
    boxes = torch.tensor([[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5], [6, 6, 7, 7]], dtype=torch.float64)
    scores = torch.tensor([[0.1, 0.9], [0.8, 0.7], [0.2, 0.3], [0.6, 0.05]], dtype=torch.float64)
    preds = torch.cat([boxes, scores], 1)[None]
    detections, anchors = reference.select_detections(preds, max_det=3, nc=2)
    assert anchors.tolist() == [[0, 1, 1]]
    assert detections.tolist() == [[[0, 0, 1, 1, 0.9, 1], [2, 2, 3, 3, 0.8, 0], [2, 2, 3, 3, 0.7, 1]]]
    # Fewer anchors than max_det: k is the anchor count.
    detections, _ = reference.select_detections(preds, max_det=300, nc=2)
    assert detections.shape == (1, 4, 6)


def test_decode_of_flat_box_logits_is_the_anchor_grid_plus_minus_7_5_cells():
    # Equal logits over the 16 bins: the DFL expectation is 7.5 cells on every side.
    head = reference.build("n", nc=3, dtype=torch.float64).model[23]
    feats = [torch.zeros(1, 64 + 3, 64 // s, 96 // s, dtype=torch.float64) for s in (8, 16, 32)]
    feats[0][0, 64 + 1, 2, 5] = 2.0  # class 1 at P3 row 2 column 5
    preds = reference.decode(head, feats)
    assert preds.shape == (1, 8 * 12 + 4 * 6 + 2 * 3, 4 + 3)
    anchor = 2 * 12 + 5
    centre_x, centre_y = (5 + 0.5) * 8, (2 + 0.5) * 8
    assert preds[0, anchor, :4].tolist() == pytest.approx(
        [centre_x - 60, centre_y - 60, centre_x + 60, centre_y + 60], abs=1e-12)
    last = preds.shape[1] - 1  # P5's last cell: row 1, column 2 of 2x3
    assert preds[0, last, :4].tolist() == pytest.approx([2.5 * 32 - 240, 1.5 * 32 - 240, 2.5 * 32 + 240, 1.5 * 32 + 240])
    assert float(preds[0, anchor, 5]) == pytest.approx(1 / (1 + np.exp(-2.0)), abs=1e-15)
    assert float(preds[0, 0, 5]) == 0.5


def test_forward_modes_and_the_detached_one_to_one_branch():
    torch.manual_seed(3)
    model = reference.build("n", dtype=torch.float64)
    x = torch.rand(2, 3, 64, 96, dtype=torch.float64, requires_grad=True)
    out = model(x)  # training
    assert [tuple(t.shape) for t in out["one2many"]] == [(2, 144, 8, 12), (2, 144, 4, 6), (2, 144, 2, 3)]
    assert [tuple(t.shape) for t in out["one2one"]] == [(2, 144, 8, 12), (2, 144, 4, 6), (2, 144, 2, 3)]
    # A loss on the one-to-one head alone trains that head only: nothing reaches the input or the backbone.
    sum(t.square().sum() for t in out["one2one"]).backward()
    assert x.grad is None
    assert model.model[0].conv.weight.grad is None
    assert model.model[23].one2one_cv2[0][0].conv.weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        detections, heads = model(x)
    assert detections.shape == (2, 8 * 12 + 4 * 6 + 2 * 3, 6)
    assert set(heads) == {"one2many", "one2one"}
    scores = detections[..., 4]
    assert torch.all(scores[:, :-1] >= scores[:, 1:])  # descending


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_reference_keeps_batch_norms_float32_and_transfers_through_numpy(dtype):
    from kernels.models import YOLOv10

    model = reference.build("n", dtype=dtype)
    for name, tensor in model.state_dict().items():
        if name.endswith("num_batches_tracked"):
            assert tensor.dtype == torch.int64
        else:
            assert tensor.dtype == (torch.float32 if ".bn." in name else dtype), name
    ours = YOLOv10("n", dtype=str(dtype).removeprefix("torch.")).init_random(4)
    state = ours.state_dict()
    reference.load_numpy(model, state)  # bfloat16 through float32: exact
    back = reference.to_numpy(model)
    for name, array in state.items():
        assert back[name].dtype == array.dtype, name
        assert back[name].tobytes() == np.asarray(array).tobytes(), name
    # A half input through float32 BatchNorms: the outputs in the half dtype (PyTorch's CPU takes it).
    x = reference.tensor(np.random.default_rng(0).random((1, 3, 64, 64)).astype(ours.dtype))
    assert x.dtype == dtype
    out = model.train()(x)
    assert all(t.dtype == dtype for t in out["one2many"] + out["one2one"])
    ours.close()
