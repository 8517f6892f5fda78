"""load_state_dict takes what users have: torch tensors, checkpoint wrappers and prefixed keys (each loaded
against the PyTorch reference's own state dict), strict=False with torch's semantics, and says why when
no key matches; YOLOv10 takes the variant as the CLI names it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kernels
from conformance.models import reference
from kernels.models import StateDictError, YOLOv10
from kernels.models.checkpoint import IncompatibleKeys


@pytest.fixture(scope="module")
def torch_model():
    torch.manual_seed(0)
    model = reference.build("n").to(torch.float64)
    with torch.no_grad():  # running statistics and counts away from their defaults, so that loading shows
        for name, buffer in model.named_buffers():
            buffer.copy_(torch.rand_like(buffer.double()).to(buffer.dtype) + 0.5 if "running" in name else 7)
    return model


@pytest.fixture(scope="module")
def model():
    return YOLOv10("n", dtype="float64")


def _assert_loaded(model, torch_model):
    state = model.state_dict()
    for name, value in torch_model.state_dict().items():
        np.testing.assert_array_equal(np.asarray(state[name]), value.numpy(), err_msg=name)


class _Wrapper(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.model = inner


def _prefixed(state, prefix):
    return {prefix + name: value for name, value in state.items()}


WRAPPINGS = [
    ("plain", lambda m: m.state_dict()),
    ("module_object", lambda m: m),
    ("data_parallel_prefix", lambda m: _prefixed(m.state_dict(), "module.")),
    ("compiled_prefix", lambda m: _prefixed(m.state_dict(), "_orig_mod.")),
    ("wrapper_module", lambda m: _Wrapper(m)),  # keys model.model.0...
    ("inner_sequential", lambda m: m.model.state_dict()),  # keys 0.conv.weight...: "model." added
    ("ultralytics_checkpoint", lambda m: {"epoch": 3, "model": torch.nn.Linear(1, 1), "ema": m, "optimizer": None}),
    ("ultralytics_checkpoint_without_ema", lambda m: {"epoch": -1, "model": m, "ema": None}),
    ("state_dict_key", lambda m: {"state_dict": _prefixed(m.state_dict(), "module.")}),
    ("model_state_dict_key", lambda m: {"model_state_dict": m.state_dict(), "step": 1}),
]


@pytest.mark.parametrize("wrap", [w[1] for w in WRAPPINGS], ids=[w[0] for w in WRAPPINGS])
def test_checkpoint_forms_load(model, torch_model, wrap):
    model.init_random(1)
    assert model.load_state_dict(wrap(torch_model)) is model
    _assert_loaded(model, torch_model)


def test_torch_bfloat16_tensors_load_exactly():
    ours = YOLOv10("n", dtype="bfloat16")
    values = {name: torch.from_numpy(np.asarray(v).astype(np.float32)).bfloat16() if v.dtype != np.int64 else
              torch.tensor(int(v)) for name, v in YOLOv10("n", dtype="float32").init_random(2).state_dict().items()}
    ours.load_state_dict(values)
    state = ours.state_dict()
    for name, value in values.items():
        # bfloat16 values, widened exactly to the float32 BatchNorm entries or stored as they are.
        np.testing.assert_array_equal(np.asarray(state[name]).astype(np.float64), value.double().numpy(), err_msg=name)


def test_no_matching_key_says_why(model):
    with pytest.raises(StateDictError, match=r"none of the mapping's 2 keys is a name of the model \(its first keys: "
                                             r"'foo.bar', 'baz'; the model's first names: 'model.0.conv.weight'.*no "
                                             r"checkpoint wrapper .* or common key prefix was recognised"):
        model.load_state_dict({"foo.bar": np.zeros(3), "baz": np.zeros(2)})
    with pytest.raises(StateDictError, match=r"first keys: 'foo'; .* after unwrapped \['model'\]\['state_dict'\]$"):
        model.load_state_dict({"model": {"state_dict": {"foo": np.zeros(1)}}})
    with pytest.raises(StateDictError, match=r"^YOLOv10: load_state_dict: expected a mapping of names to arrays"):
        model.load_state_dict([1, 2])


def test_partial_match_after_a_prefix_names_what_was_done(model, torch_model):
    state = _prefixed(torch_model.state_dict(), "module.")
    del state["module.model.0.conv.weight"]
    with pytest.raises(StateDictError, match=r"missing: model\.0\.conv\.weight \(after the prefix 'module\.' stripped"):
        model.load_state_dict(state)


def test_strict_false_as_torch(model, torch_model):
    """strict=False loads what is there and returns the missing and unexpected keys, as torch's load_state_dict
    on the reference does."""
    model.init_random(1)
    before = {name: np.array(value) for name, value in model.state_dict().items()}
    state = dict(torch_model.state_dict())
    del state["model.0.conv.weight"], state["model.23.dfl.conv.weight"]
    state["extra.weight"] = torch.zeros(1)
    result = model.load_state_dict(state, strict=False)
    expected = torch_model.load_state_dict(state, strict=False)
    assert isinstance(result, IncompatibleKeys)
    assert result.missing_keys == expected.missing_keys and result.unexpected_keys == expected.unexpected_keys
    np.testing.assert_array_equal(model.state_dict()["model.0.conv.weight"], before["model.0.conv.weight"])
    np.testing.assert_array_equal(model.state_dict()["model.0.bn.weight"], state["model.0.bn.weight"].numpy())
    bad = dict(state, **{"model.0.bn.bias": torch.zeros(5)})  # misshapen: refused even so, as torch does
    with pytest.raises(StateDictError, match=r"misshapen: model\.0\.bn\.bias \(expected \(16,\), found \(5,\)\)"):
        model.load_state_dict(bad, strict=False)
    with pytest.raises(RuntimeError, match="size mismatch"):
        torch_model.load_state_dict(bad, strict=False)


@pytest.mark.parametrize("name", ["n", "yolov10n"])
def test_variant_names_as_the_cli_takes_them(name):
    model = YOLOv10(name)
    assert model.variant == "n"
    assert [n for n in model.state_dict()] == list(reference.build("n").state_dict())


def test_unknown_variant_lists_both_forms():
    with pytest.raises(kernels.AttrsError, match=r"variant: expected one of n, s, m, b, l, x \(or yolov10n, .*yolov10x\), "
                                                 r"found 'yolov10q'"):
        YOLOv10("yolov10q")
