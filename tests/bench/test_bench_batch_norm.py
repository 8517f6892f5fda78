"""batch_norm on YOLOv10's first BatchNorm + SiLU (1x16x320x320 float32, eps 1e-3,
momentum 0.03): training forward, backward and inference forward, beside
F.batch_norm + F.silu and their autograd backward; and a deep, small layer
(1x256x20x20) where per-call overhead dominates.

Bytes are what any implementation must move: forward reads the input and writes
the output; backward reads output_grad, the input and what the activation's
derivative needs (the pre-activation or the output) and writes input_grad.

Half precision (float16, bfloat16) rows, on the GPU only: the same random values rounded to the
dtype, gamma, beta and the running statistics float32 on both sides (PyTorch's mixed precision:
F.batch_norm on half input with float32 weights, then F.silu in the dtype); their groups end in
the dtype's name.
"""

import numpy as np
import pytest

from kernels import BatchNormAttrs, TensorShape, batch_norm

from .conftest import DTYPES, dtype_suffix, half_rows_on_gpu_only

ATTRS = BatchNormAttrs(eps=1e-3, momentum=0.03, activation="SILU")
SHAPES = [
    pytest.param((1, 16, 320, 320), id="v10_stem_1x16x320x320"),
    pytest.param((1, 256, 20, 20), id="v10n_deep_1x256x20x20"),
]


def _torch_forward(bench, input, gamma, beta, running_mean, running_var, training):
    F = bench.torch.nn.functional
    return F.silu(F.batch_norm(input, running_mean, running_var, gamma, beta, training=training,
                               momentum=ATTRS.momentum, eps=ATTRS.eps))


def _setup(bench, dims, dtype):
    channels = (dims[1],)
    # gamma and beta float32 (for half data too: mixed precision)
    input, gamma, beta = bench.array(dims, dtype), bench.array(channels, seed=1), bench.array(channels, seed=2)
    if bench.impl == "torch":
        torch = bench.torch
        device = "cuda" if bench.device == "gpu" else "cpu"
        running = (torch.zeros(channels, device=device), torch.ones(channels, device=device))
        return input, gamma, beta, running
    state = batch_norm.init_kernel(bench.handle, ATTRS, TensorShape(dims, dtype), TensorShape(dims, dtype))
    return input, gamma, beta, state


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("training", [pytest.param(True, id="training"), pytest.param(False, id="inference")])
@pytest.mark.parametrize("dims", SHAPES)
def test_batch_norm_silu_forward(benchmark, bench, dims, training, dtype):
    half_rows_on_gpu_only(bench, dtype)
    group = f"batch_norm+silu forward {'training' if training else 'inference'} {dims}{dtype_suffix(dtype)}"
    bytes_moved = 2 * int(np.prod(dims)) * dtype.itemsize
    input, gamma, beta, extra = _setup(bench, dims, dtype)
    if bench.impl == "torch":
        bench.run(benchmark, lambda: _torch_forward(bench, input, gamma, beta, *extra, training), bytes_moved, group)
        return
    output = bench.empty(dims, dtype)
    bench.run(benchmark, lambda: batch_norm.forward_kernel(bench.stream, bench.handle, extra, ATTRS, input, gamma, beta,
                                                           output, training=training), bytes_moved, group)
    batch_norm.cleanup_kernel(bench.handle, extra)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", SHAPES)
def test_batch_norm_silu_backward(benchmark, bench, dims, dtype):
    half_rows_on_gpu_only(bench, dtype)
    group = f"batch_norm+silu backward training {dims}{dtype_suffix(dtype)}"
    bytes_moved = 4 * int(np.prod(dims)) * dtype.itemsize
    input, gamma, beta, extra = _setup(bench, dims, dtype)
    output_grad = bench.array(dims, dtype, seed=3)
    if bench.impl == "torch":
        torch = bench.torch
        for tensor in (input, gamma, beta):
            tensor.requires_grad_()
        output = _torch_forward(bench, input, gamma, beta, *extra, True)
        bench.run(benchmark, lambda: torch.autograd.grad(output, [input, gamma, beta], output_grad, retain_graph=True),
                  bytes_moved, group)
        return
    output, input_grad = bench.empty(dims, dtype), bench.empty(dims, dtype)
    gamma_grad, beta_grad = bench.empty((dims[1],)), bench.empty((dims[1],))  # float32
    batch_norm.forward_kernel(bench.stream, bench.handle, extra, ATTRS, input, gamma, beta, output)
    bench.run(benchmark, lambda: batch_norm.backward_kernel(bench.stream, bench.handle, extra, ATTRS, output, output_grad,
                                                            input, input_grad, gamma, beta, gamma_grad, beta_grad),
              bytes_moved, group)
    batch_norm.cleanup_kernel(bench.handle, extra)
