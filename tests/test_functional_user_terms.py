"""kernels.functional speaks the caller's terms: a kernel's error names the function called and the
argument passed (kernels/functional_errors.py), and torch's bfloat16 tensors pass through DLPack
(kernels/runtime/dlpack.py), both ways, without a copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kernels
import kernels.functional as F
from kernels import functional_errors

from .conftest import DEVICE_PARAMS, require

A = np.arange(6.0).reshape(2, 3)

ROWS = [
    # (id, call, error class, the message, the kernel's message it came from)
    ("conv_filter", lambda: F.conv2d(np.zeros((1, 3, 4, 4)), np.zeros((2, 4, 3, 3))), kernels.ShapeError,
     "conv2d: weight: expected dims (2, 3, 3, 3), found (2, 4, 3, 3)", "conv_2d: filter:"),
    ("binary_rhs_dtype", lambda: F.mul(A, A.astype(np.float32)), kernels.DTypeError,
     "mul: other: expected dtype float64 (as input), found float32", "element_binary: rhs_shape:"),
    ("matmul_inner", lambda: F.matmul(np.zeros((1, 2, 3)), np.zeros((1, 4, 3))), kernels.ShapeError,
     "matmul: other: expected dim -2 equal to input's inner dim K = 3, found (1, 4, 3)", "batch_matmul: rhs_shape:"),
    ("cat_indexed", lambda: F.cat([A, np.zeros((3, 4))], 0), kernels.ShapeError,
     "cat: tensors[1]: expected dims ('any', 3) (as tensors[0] but along axis 0), found (3, 4)",
     "concat: input_shapes[1]:"),
    ("batch_norm_running", lambda: F.batch_norm(np.zeros((2, 3, 4, 4)), np.zeros(4), np.ones(4)), kernels.ShapeError,
     "batch_norm: running_mean: expected dims (3,), found (4,)", "batch_norm: state.running_mean:"),
    ("split_sections", lambda: F.split(np.zeros((4, 3)), [1, 2]), kernels.AttrsError,
     "split: split_size_or_sections: expected sizes adding up to the input's dim 0 (4), found (1, 2) (sum 3)",
     "split: splits:"),
    ("backward_grad_output", lambda: F.relu_backward(np.zeros(4), _ctx(F.relu, np.zeros(3))), kernels.ShapeError,
     "relu_backward: grad_output: expected dims (3,), found (4,)", "element_unary: output_grad:"),
    ("split_backward_indexed", lambda: F.split_backward([np.zeros((1, 3)), np.zeros((2, 3))],
                                                       _ctx(F.split, np.zeros((4, 3)), 2)), kernels.ShapeError,
     "split_backward: grad_outputs[0]: expected dims (2, 3), found (1, 3)", "split: output_grads[0]:"),
    ("pow_scalar", lambda: F.pow(A, float("nan")), kernels.AttrsError, "pow: exponent: ", "element_unary: scalar:"),
    # The kernels' per-axis attrs are one entry of the function's pair (kernel_size, stride, padding, dilation).
    ("pool_kernel_size", lambda: F.max_pool2d(np.zeros((1, 1, 4, 4)), 0), kernels.AttrsError,
     "max_pool2d: kernel_size[0]: expected an integer >= 1, found 0", "pool_2d: kernel_h:"),
    ("pool_padding_past_half", lambda: F.max_pool2d(np.zeros((1, 1, 4, 4)), 3, padding=(1, 2)), kernels.AttrsError,
     "max_pool2d: padding[1]: expected at most half of kernel_size[1] (1), found 2", "pool_2d: padding_w:"),
    ("pool_stride", lambda: F.avg_pool2d(np.zeros((1, 1, 4, 4)), 2, stride=(1, 0)), kernels.AttrsError,
     "avg_pool2d: stride[1]: expected an integer >= 1, found 0", "pool_2d: stride_w:"),
    ("conv_stride", lambda: F.conv2d(np.zeros((1, 1, 4, 4)), np.zeros((1, 1, 3, 3)), stride=0), kernels.AttrsError,
     "conv2d: stride[0]: expected an integer >= 1, found 0", "conv_2d: stride_h:"),
    ("conv_padding", lambda: F.conv2d(np.zeros((1, 1, 4, 4)), np.zeros((1, 1, 3, 3)), padding=(0, -1)),
     kernels.AttrsError, "conv2d: padding[1]: expected an integer >= 0, found -1", "conv_2d: padding_w:"),
    ("conv_dilation", lambda: F.conv2d(np.zeros((1, 1, 4, 4)), np.zeros((1, 1, 3, 3)), dilation=(1, 0)),
     kernels.AttrsError, "conv2d: dilation[1]: expected an integer >= 1, found 0", "conv_2d: dilation_w:"),
    ("split_sections_indexed", lambda: F.split(np.zeros((4, 3)), [1, 1.5]), kernels.AttrsError,
     "split: split_size_or_sections[1]: expected an integer, found 1.5", "split: splits[1]:"),
    ("topk_k_past_the_row", lambda: F.topk(A, 4), kernels.AttrsError,
     "topk: k: expected at most the last dim of input (3), found 4", "top_k: k:"),
    ("topk_dtype", lambda: F.topk(A.astype(np.int32), 1), kernels.DTypeError,
     "topk: input: expected one of float16, bfloat16, float32, float64, found int32", "top_k: input_shape:"),
    ("topk_backward_grad_values_dims", lambda: F.topk_backward(np.zeros((2, 2)), _ctx(F.topk, A, 1)), kernels.ShapeError,
     "topk_backward: grad_values: expected dims (2, 1), found (2, 2)", "top_k: values_grad:"),
    ("topk_backward_grad_values_dtype", lambda: F.topk_backward(np.zeros((2, 1), np.float32), _ctx(F.topk, A, 1)),
     kernels.DTypeError, "topk_backward: grad_values: expected dtype float64, found float32", "top_k: values_grad:"),
]


def _ctx(forward, *args):
    ctx = F.Context()
    forward(*args, ctx=ctx)
    return ctx


@pytest.mark.parametrize("call, error, message, kernel", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_kernel_errors_name_the_function_and_argument(call, error, message, kernel):
    with pytest.raises(error) as raised:
        call()
    assert type(raised.value) is error and str(raised.value).startswith(message)
    assert str(raised.value.__cause__).startswith(kernel)


def test_errors_already_in_the_callers_terms_are_left():
    # Raised by the functional layer itself (its function's own name and argument): not rewritten, no cause.
    with pytest.raises(kernels.ShapeError, match=r"^batch_norm: input: expected rank >= 2") as raised:
        F.batch_norm(np.zeros(3), None, None, training=True)
    assert raised.value.__cause__ is None
    ops = frozenset({"conv_2d"})
    # A library failure, a message of another form, an op that is not a kernel's: None (let through as it is).
    assert functional_errors.in_user_terms(kernels.CudaError("cuDNN", "CUDNN_STATUS_BAD_PARAM"), "conv2d", ops) is None
    assert functional_errors.in_user_terms(kernels.ShapeError("no argument here"), "conv2d", ops) is None
    assert functional_errors.in_user_terms(kernels.ShapeError("other: input: x"), "conv2d", ops) is None
    renamed = functional_errors.in_user_terms(kernels.ShapeError("conv_2d: input_shape: x"), "conv2d", ops)
    assert type(renamed) is kernels.ShapeError and str(renamed) == "conv2d: input: x"


# --------------------------------------------------------------------------- bfloat16 through DLPack


def _bits(tensor):
    return tensor.view(torch.uint16).cpu().numpy()


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_bfloat16_torch_tensors_in_and_out(device):
    """F.conv2d of torch bfloat16 tensors (torch's own error before) returns a torch bfloat16 tensor, equal to
    the same op on the same values as ml_dtypes' bfloat16 arrays (the kernel's own result: same bits)."""
    require(device)
    torch_device = "cpu" if device == "cpu" else "cuda"
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 8, 8, generator=generator).bfloat16().to(torch_device)
    w = torch.randn(2, 3, 3, 3, generator=generator).bfloat16().to(torch_device)
    y = F.conv2d(x, w, padding=1)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.device == x.device
    if device == "cpu":
        place, host = np.asarray, np.asarray
    else:
        import cupy

        place, host = cupy.asarray, cupy.asnumpy
    # The same op on the same device, given arrays of the same bits (the kernel's own result: the same bits).
    as_arrays = F.conv2d(place(_bits(x).view(kernels.runtime.core.BFLOAT16)), place(_bits(w).view(kernels.runtime.core.BFLOAT16)),
                         padding=1)
    np.testing.assert_array_equal(_bits(y), host(as_arrays.view(np.uint16)))
    # Against torch in float32 from the same bfloat16 values: one rounding of the result to bfloat16,
    # at most half a unit (2^-8 relative) of the largest value (measured: 0.4 of that at this size).
    reference = torch.nn.functional.conv2d(x.float(), w.float(), padding=1)
    assert (y.float() - reference).abs().max() <= 2.0 ** -8 * reference.abs().max()


def test_bfloat16_exchange_shares_memory():
    from kernels.runtime import dlpack

    x = torch.arange(6, dtype=torch.float32).bfloat16()
    array = dlpack.from_dlpack(x, np)
    assert array.dtype == kernels.runtime.core.BFLOAT16 and array.ctypes.data == x.data_ptr()
    back = dlpack.to_torch(array)
    assert back.dtype == torch.bfloat16 and back.data_ptr() == x.data_ptr()
    assert torch.equal(back, x)
    plain = torch.arange(3.0)
    assert dlpack.from_dlpack(plain, np).ctypes.data == plain.data_ptr() and dlpack.producer(plain) is plain
    # A read-only array (NumPy before 2.1 makes every DLPack import one) goes back sharing its memory too.
    for fixed in (np.arange(4.0), np.arange(4.0).astype(kernels.runtime.core.BFLOAT16)):
        fixed.flags.writeable = False
        shared = dlpack.to_torch(fixed)
        assert shared.data_ptr() == fixed.ctypes.data and shared.tolist() == [0.0, 1.0, 2.0, 3.0]
    # running statistics given as torch tensors to a bfloat16 batch_norm: float32, updated in place.
    mean, var = torch.zeros(3), torch.ones(3)
    F.batch_norm(torch.randn(2, 3, 4, 4).bfloat16(), mean, var, training=True)
    assert mean.abs().sum() > 0 and not torch.equal(var, torch.ones(3))
