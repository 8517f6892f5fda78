"""kernels.functional refuses what it cannot run, before any kernel runs, with the error class and a
message naming the function and the argument (the per-op tables check the kernels below it).
CPU inputs; objects on another device are stand-ins (a DLPack producer, a GPU stream, a CuPy
array), so that the refusals run without one."""

from __future__ import annotations

import types

import numpy as np
import pytest

import kernels.functional as F
from kernels import AttrsError, DeviceError, KernelError, ShapeError, StateError

X = (np.arange(2 * 3 * 6 * 5) % 9 - 4).reshape(2, 3, 6, 5) * 0.25
W = (np.arange(4 * 3 * 3 * 3) % 5 - 2).reshape(4, 3, 3, 3) * 0.5


class _DLPackProducer:
    """An object on a DLPack device other than the CPU."""

    def __init__(self, kind, index=0):
        self.kind, self.index = kind, index

    def __dlpack__(self, stream=None):
        raise AssertionError("a refused tensor must not be read")

    def __dlpack_device__(self):
        return self.kind, self.index


class _GpuStream:
    """A stream of GPU 0 as core's checks see one."""

    device = 0

    def synchronize(self):
        pass


class _CupyArray:
    def __init__(self, device_id):
        self.device = types.SimpleNamespace(id=device_id)


def _ctx(forward, *args, **kwargs):
    ctx = F.Context()
    forward(*args, ctx=ctx, **kwargs)
    return ctx


def _released(ctx):
    ctx.release()
    return ctx


def _cupy_grad_output():
    """relu_backward of a CPU forward given a CuPy array (of GPU 0)."""
    ctx = _ctx(F.relu, X)
    return F.relu_backward(_CupyArray(0), ctx)


ROWS = [
    # (id, call, error, pattern)
    ("ctx_not_a_context", lambda: F.relu(X, ctx=object()), StateError,
     r"^relu: ctx: expected a kernels.functional.Context or None, found object"),
    ("backward_ctx_not_a_context", lambda: F.relu_backward(X, object()), StateError,
     r"^relu_backward: ctx: expected the Context a forward recorded into, found object"),
    ("any_backward_ctx_not_a_context", lambda: F.backward("ctx", X), StateError,
     r"^backward: ctx: expected a Context a forward recorded into, found 'ctx'"),
    ("grad_output_on_another_device", _cupy_grad_output, DeviceError,
     r"^relu_backward: grad_output: expected a tensor on the forward's device \(cpu\), found GPU 0"),
    ("other_on_a_cuda_device", lambda: F.add(X, _DLPackProducer(2)), DeviceError,
     r"^add: other: expected a CPU tensor \(as the input\), found GPU 0"),
    ("other_on_managed_memory", lambda: F.add(X, _DLPackProducer(13, 1)), DeviceError,
     r"^add: other: expected a CPU tensor \(as the input\), found GPU 1"),
    ("other_on_an_unknown_device", lambda: F.add(X, _DLPackProducer(14)), DeviceError,
     r"^add: other: expected a CPU or CUDA tensor, found DLPack device type 14"),
    ("stream_of_another_device", lambda: F.relu(X, stream=_GpuStream()), DeviceError,
     r"^relu: stream: expected a stream of the input's device \(cpu\), found GPU 0"),
    ("needs_unknown_name", lambda: F.add_backward(X, _ctx(F.add, X, X), needs=("input", "weight")), AttrsError,
     r"^add_backward: needs: expected names among \('input', 'other'\), found \['weight'\]"),
    ("kernel_size_not_ints", lambda: F.max_pool2d(X, "3"), AttrsError,
     r"^max_pool2d: kernel_size: expected an int or a pair of ints, found '3'"),
    ("kernel_size_of_bools", lambda: F.avg_pool2d(X, (True, 2)), AttrsError,
     r"^avg_pool2d: kernel_size: expected an int or a pair of ints"),
    # A dim that is not an integer: refused as an AttrsError naming it, not a TypeError from indexing by it.
    ("transpose_dim_not_an_int", lambda: F.transpose(X, 0, 1.5), AttrsError,
     r"^transpose: dim1: expected an integer, found 1\.5$"),
    ("split_dim_not_an_int", lambda: F.split(X, 2, dim=1.5), AttrsError, r"^split: dim: expected an integer, found 1\.5$"),
    ("softmax_dim_a_bool", lambda: F.softmax(X, True), AttrsError, r"^softmax: dim: expected an integer, found True$"),
    ("permute_dims_not_ints", lambda: F.permute(X, (0, 1.5, 2, 3)), AttrsError,
     r"^permute: dims\[1\]: expected an integer, found 1\.5$"),
    ("split_size_not_an_int", lambda: F.split(X, 1.5, 1), AttrsError,
     r"^split: split_size_or_sections: expected an int or a sequence of ints, found 1\.5$"),
    ("conv_weight_rank", lambda: F.conv2d(X, W[0]), ShapeError,
     r"^conv2d: weight: expected rank 4 \(out_channels, in_channels / groups, kH, kW\), found rank 3"),
    ("conv_same_with_stride", lambda: F.conv2d(X, W, stride=2, padding="same"), AttrsError,
     r"^conv2d: padding: expected 'same' only with stride 1 \(as torch\), found stride \(2, 2\)"),
    ("conv_same_with_odd_total_padding", lambda: F.conv2d(X, W[:, :, :2, :], padding="same"), AttrsError,
     r"^conv2d: padding: expected 'same' with an even total padding .*found total 1"),
    ("conv_padding_unknown_word", lambda: F.conv2d(X, W, padding="full"), AttrsError,
     r"^conv2d: padding: expected an int, a pair, 'valid' or 'same', found 'full'"),
    ("batch_norm_momentum_none", lambda: F.batch_norm(X, None, None, training=True, momentum=None), AttrsError,
     r"^batch_norm: momentum: expected a number"),
    ("batch_norm_rank_1", lambda: F.batch_norm(X[0, 0, 0], None, None, training=True), ShapeError,
     r"^batch_norm: input: expected rank >= 2 \(N, C, \*spatial\), found rank 1"),
    ("interpolate_mode", lambda: F.interpolate(X, scale_factor=2, mode="bicubic"), AttrsError,
     r"^interpolate: mode: expected 'nearest' or 'bilinear', found 'bicubic'"),
    ("interpolate_align_corners", lambda: F.interpolate(X, scale_factor=2, mode="bilinear", align_corners=True),
     AttrsError, r"^interpolate: align_corners: expected False or None"),
    ("interpolate_size_and_scale", lambda: F.interpolate(X, size=(12, 10), scale_factor=2), AttrsError,
     r"^interpolate: size/scale_factor: expected exactly one of them"),
    ("interpolate_neither_size_nor_scale", lambda: F.interpolate(X), AttrsError,
     r"^interpolate: size/scale_factor: expected exactly one of them"),
    ("interpolate_size_not_a_multiple", lambda: F.interpolate(X, size=(12, 15)), AttrsError,
     r"^interpolate: size: expected one integer multiple of \(H, W\) = \(6, 5\) for both, found \(12, 15\)"),
    ("interpolate_size_not_whole", lambda: F.interpolate(X, size=(13, 10)), AttrsError,
     r"^interpolate: size: expected one integer multiple"),
    ("interpolate_scale_not_whole", lambda: F.interpolate(X, scale_factor=2.5), AttrsError,
     r"^interpolate: scale_factor: expected one integer >= 2 for H and W, found 2.5"),
    ("interpolate_scales_differ", lambda: F.interpolate(X, scale_factor=(2, 3)), AttrsError,
     r"^interpolate: scale_factor: expected one integer >= 2 for H and W, found \(2, 3\)"),
    ("cat_not_a_list", lambda: F.cat(X), ShapeError, r"^cat: tensors: expected a non-empty list of tensors, found ndarray"),
    ("cat_empty_list", lambda: F.cat([]), ShapeError, r"^cat: tensors: expected a non-empty list of tensors"),
    ("cat_backward_needs_count", lambda: F.cat_backward(np.concatenate([X, X]), _ctx(F.cat, [X, X]), needs=[True]),
     AttrsError, r"^cat_backward: needs: expected 2 flags, one per tensor, found 1"),
    ("split_rank_0", lambda: F.split(np.array(1.0), 1), ShapeError, r"^split: tensor: expected rank >= 1, found rank 0"),
    ("split_size_0", lambda: F.split(X, 0, dim=1), AttrsError, r"^split: split_size_or_sections: expected a size >= 1, found 0"),
    ("split_backward_no_tensor", lambda: F.split_backward([None, None], _ctx(F.split, X, 3, dim=2)), ShapeError,
     r"^split_backward: grad_outputs: expected a list with at least one tensor, found \[None, None\]"),
    ("split_backward_not_a_list", lambda: F.split_backward(X, _ctx(F.split, X, 3, dim=2)), ShapeError,
     r"^split_backward: grad_outputs: expected a list with at least one tensor"),
    ("split_backward_count", lambda: F.split_backward([X[:, :, :3]], _ctx(F.split, X, 3, dim=2)), ShapeError,
     r"^split_backward: grad_outputs: expected a list of 2, found a list of 1"),
    ("permute_dims_count", lambda: F.permute(X, (1, 0)), ShapeError,
     r"^permute: dims: expected 4 dims \(the input's rank\), found 2"),
    ("matmul_input_rank_2", lambda: F.matmul(X[0, 0], X[0]), ShapeError,
     r"^matmul: input: expected rank >= 3 \(batched, identical leading dims\), found rank 2 \(6, 5\)"),
    ("matmul_other_rank_2", lambda: F.matmul(X[0], X[0, 0].T.copy()), ShapeError,
     r"^matmul: other: expected rank >= 3 .*found rank 2 \(5, 6\)"),
    ("maximum_with_a_number", lambda: F.maximum(X, 0.5), AttrsError,
     r"^maximum: other: expected a tensor \(no scalar form of this op\), found 0.5"),
    ("gradient_reduction_empty", lambda: F.gradient_reduction([]), ShapeError,
     r"^gradient_reduction: tensors: expected a non-empty list of tensors, found list"),
    ("pow_tensor_exponent", lambda: F.pow(X, X), AttrsError,
     r"^pow: exponent: expected a number \(no tensor exponents\), found ndarray"),
    ("pow_bool_exponent", lambda: F.pow(X, True), AttrsError, r"^pow: exponent: expected a number"),
    ("topk_k_0", lambda: F.topk(X, 0), AttrsError, r"^topk: k: expected an integer >= 1, found 0"),
    ("topk_k_bool", lambda: F.topk(X, True), AttrsError, r"^topk: k: expected an integer, found True"),
    ("topk_dim_not_last", lambda: F.topk(X, 2, 1), AttrsError,
     r"^topk: dim: expected the last dim \(-1 or 3\): the kernel selects along the last dim \(move the dim there "
     r"first, with permute or transpose\), found 1"),
    ("topk_dim_out_of_range", lambda: F.topk(X, 2, 4), AttrsError, r"^topk: dim: expected an axis in \[-4, 4\), found 4"),
    ("topk_dim_not_an_int", lambda: F.topk(X, 2, -1.0), AttrsError, r"^topk: dim: expected an integer, found -1.0"),
    ("topk_smallest", lambda: F.topk(X, 2, largest=False), AttrsError,
     r"^topk: largest: expected True \(the kernel keeps the largest\), found False"),
    ("topk_sorted_not_a_bool", lambda: F.topk(X, 2, sorted="no"), AttrsError, r"^topk: sorted: expected a bool, found 'no'"),
    ("topk_rank_0", lambda: F.topk(np.array(1.0), 1), ShapeError,
     r"^topk: input: expected rank >= 1 \(rows along the last dim\), found rank 0"),
    ("topk_ctx_not_a_context", lambda: F.topk(X, 2, ctx=object()), StateError,
     r"^topk: ctx: expected a kernels.functional.Context or None, found object"),
    ("topk_backward_ctx_of_another_op", lambda: F.topk_backward(X, _ctx(F.relu, X)), StateError,
     r"^topk_backward: ctx: expected a context of topk, found one of relu"),
    ("topk_backward_released_ctx", lambda: F.topk_backward(X, _released(_ctx(F.topk, X, 2))), StateError,
     r"^topk_backward: ctx: expected a context holding a topk forward, found an empty or released context"),
    ("topk_backward_grad_values_on_another_device", lambda: F.topk_backward(_CupyArray(0), _ctx(F.topk, X, 2)),
     DeviceError, r"^topk_backward: grad_values: expected a tensor on the forward's device \(cpu\), found GPU 0"),
]


@pytest.fixture(autouse=True)
def _cupy_module(monkeypatch):
    """A stand-in CuPy that knows _CupyArray as its ndarray (the CPU inputs stay NumPy arrays)."""
    monkeypatch.setattr(F, "_cupy_module", lambda: types.SimpleNamespace(ndarray=_CupyArray))


@pytest.mark.parametrize("call, error, pattern", [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_refused(call, error, pattern):
    with pytest.raises(error, match=pattern) as raised:
        call()
    assert isinstance(raised.value, KernelError)

