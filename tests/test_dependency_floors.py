"""What broke at the floors pyproject.toml declares (the `lowest` nox session runs the whole suite there):
each behaviour that once needed a newer NumPy or ml_dtypes than the floor, pinned on the CPU here."""

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import kernels.functional as F
from conformance.case import ulp
from conformance.compare import compare
from conformance.models.session import HEADROOM, gradient_limit
from kernels.runtime import dlpack
from kernels.runtime.core import BFLOAT16


@pytest.mark.parametrize("dtype, largest", [
    (np.dtype(np.float16), 65504.0),
    (BFLOAT16, 3.3895313892515355e38),  # (2 - 2**-7) * 2**127
    (np.dtype(np.float32), 3.4028234663852886e38),
    (np.dtype(np.float64), 1.7976931348623157e308),
])
def test_whole_network_gradient_limit_of_every_float_dtype(dtype, largest):
    # np.finfo refuses ml_dtypes' bfloat16 before ml_dtypes 0.7, which crashed
    # `python -m conformance.models yolov10n --dtype bfloat16` before its first step.
    assert gradient_limit(dtype) == largest / HEADROOM
    assert gradient_limit(np.dtype(ml_dtypes.bfloat16)) == gradient_limit(BFLOAT16)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_torch_running_statistics_are_updated_in_place_when_dlpack_imports_are_read_only(monkeypatch, dtype):
    # NumPy before 2.2.5 marks every array it imports through DLPack read-only, torch's writable
    # tensors too; the functional layer's batch_norm must still write the caller's running statistics.
    dlpack_import = np.from_dlpack

    def read_only_import(obj, *args, **kwargs):
        array = dlpack_import(obj, *args, **kwargs)
        array.flags.writeable = False
        return array

    monkeypatch.setattr(np, "from_dlpack", read_only_import)
    # (bfloat16: torch has no NumPy view of it, so the layer's own view goes through uint16)
    x = torch.tensor((np.arange(48.0).reshape(4, 3, 2, 2) * 7 % 17 - 8) / 4, dtype=dtype)
    mean, var = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
    F.batch_norm(x, mean, var, training=True, momentum=0.5)
    torch_mean, torch_var = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
    TF.batch_norm(x, torch_mean, torch_var, training=True, momentum=0.5)
    ours, theirs = [dlpack.from_dlpack(t) for t in (mean, var)], [dlpack.from_dlpack(t) for t in (torch_mean, torch_var)]
    assert not np.array_equal(ours[0], np.zeros(3))
    # 1 ulp of the dtype: PyTorch's bfloat16 CPU statistics are 1 ulp off where ours are correctly rounded
    # (docs/backends.md's CPU table), as in the conformance run
    assert compare(ours[0], theirs[0], ulp(1)) is None
    assert compare(ours[1], theirs[1], ulp(1)) is None


def test_a_drawn_sample_without_an_optional_tensor_prints():
    # hypothesis at its floor prints every drawn value's repr, not only a falsifying one's: a
    # convolution drawn without a bias (None) must print too.
    from .properties import Sample

    sample = Sample("conv_2d", "attrs", {"input": np.zeros((1, 2, 3, 4)), "bias": None, "parts": [np.zeros(2), np.zeros(3)]},
                    np.dtype(np.float64), dyadic=True)
    assert repr(sample) == ("Sample(conv_2d, 'attrs', dtype=float64, dyadic=True, "
                            "shapes={'input': (1, 2, 3, 4), 'bias': None, 'parts': [(2,), (3,)]}, extra={})")



@pytest.mark.parametrize("stride", [(1, 2), (2, 1), (1, 1)])
def test_a_convolution_of_an_empty_batch_over_wide_rows(stride):
    # hypothesis at its floor drew this one (zero images, output rows 64 wide or more, im2col copied):
    # zero-size tensors are legal and do nothing, and the filter's gradient over no images is zero.
    x = np.zeros((0, 2, 3, 129), np.float32)
    weight = np.ones((4, 2, 3, 3), np.float32)
    ctx = F.Context()
    y = F.conv2d(x, weight, padding=1, stride=stride, ctx=ctx)
    assert y.shape == (0, 4, (3 - 1) // stride[0] + 1, (129 - 1) // stride[1] + 1)
    grads = F.conv2d_backward(y, ctx)
    assert grads.input.shape == x.shape
    assert np.array_equal(grads.weight, np.zeros_like(weight))
