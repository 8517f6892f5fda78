"""TF32's error on conv_2d and batch_matmul: what tools/measure_tf32.py prints and tests/test_tf32.py
bounds (a GPU handle made with allow_tf32=True; see docs/api.md#tf32).

TF32 keeps float32's exponent and 10 of its 23 mantissa bits: each input of a product is rounded
to TF32 (a relative error of at most 2^-11 when rounded to nearest, 2^-10 when truncated), the
product and the sum are float32. So each result c = sum over K terms a_k b_k is off by at most

    |c_tf32 - c| <= (2 * 2^-10 + K * 2^-23) * S,    S = sum |a_k| |b_k|

(two truncations, each 2^-10, and float32 sums of K terms with room for a tensor core's
accumulation; the first term dominates up to K ~ 8000). This is `bound_units(K) * 2^-11 * S`;
measure() reports each tensor's worst |error| / S in units of 2^-11 next to it.

Two kinds of input: the float32 conformance cases (values of a few bits, exact in TF32: their
sums stay exact, so they must still match their goldens), and random normal inputs at YOLOv10's
shapes, where TF32 shows (a float32 GEMM's error is about 2^-24 K S at most, TF32's around 2^-11 S).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np

import kernels
from kernels import BatchMatmulAttrs, Conv2DAttrs, TensorShape, batch_matmul, conv_2d

UNIT = 2.0 ** -11


def bound_units(k: int) -> float:
    """The bound on |error| / S in units of 2^-11 for sums of k terms (see the module's docstring)."""
    return 4.0 + k * 2.0 ** -12


@dataclass(frozen=True)
class Problem:
    """A random-input problem: a conv_2d (attrs, input dims) or a batch_matmul (lhs and rhs dims)."""

    name: str
    op: str
    attrs: Any
    dims: tuple[tuple[int, ...], ...]


# YOLOv10's convolutions and PSA products at sizes of its small variants' later stages.
PROBLEMS = (
    Problem("conv_k1_c64_40x40", "conv_2d", Conv2DAttrs(64, 1, 1), ((2, 64, 40, 40),)),
    Problem("conv_k3_s1_c64_20x20", "conv_2d", Conv2DAttrs(64, 3, 3, 1, 1, 1, 1), ((2, 64, 20, 20),)),
    Problem("conv_k3_s2_c32_to_64_40x40", "conv_2d", Conv2DAttrs(64, 3, 3, 2, 2, 1, 1), ((2, 32, 40, 40),)),
    Problem("conv_stem_k3_s2_c3_64x64", "conv_2d", Conv2DAttrs(16, 3, 3, 2, 2, 1, 1), ((2, 3, 64, 64),)),
    Problem("conv_depthwise_k7_c64_20x20", "conv_2d", Conv2DAttrs(64, 7, 7, 1, 1, 3, 3, groups=64),
            ((2, 64, 20, 20),)),
    Problem("matmul_psa_scores_2x400x32_32x400", "batch_matmul", BatchMatmulAttrs(), ((1, 2, 400, 32), (1, 2, 32, 400))),
    Problem("matmul_psa_values_2x64x400_400x400", "batch_matmul", BatchMatmulAttrs(),
            ((1, 2, 64, 400), (1, 2, 400, 400))),
)


def _on(stream: Any, xp: Any) -> Any:
    """The block in which a problem's arrays are made: on the GPU, inside the kernels' stream, so that the
    uploads and the pool's memory are ordered with the kernels (made on CuPy's current stream instead, an
    upload may land after a kernel has read it: it did on a busy H200)."""
    return contextlib.nullcontext() if xp is np else stream


def _host(stream: Any, xp: Any, array: Any) -> np.ndarray:
    """A host copy of a result, read on the kernels' stream (after its synchronization)."""
    return array if xp is np else xp.asnumpy(array, stream=stream.cupy_stream)


def _conv(handle: Any, stream: Any, xp: Any, problem: Problem, input: np.ndarray, filter: np.ndarray,
          grad: np.ndarray) -> dict[str, np.ndarray]:
    """forward and backward of a conv_2d problem (no bias) on (handle, stream); the results on the host."""
    attrs = problem.attrs
    out_dims = conv_2d.output_dims(attrs, input.shape)
    dtype = input.dtype
    state = conv_2d.init_kernel(handle, attrs, TensorShape(input.shape, dtype), TensorShape(out_dims, dtype))
    with _on(stream, xp):
        arrays = {name: xp.asarray(value) for name, value in (("input", input), ("filter", filter), ("grad", grad))}
        output = xp.empty(out_dims, dtype)
        input_grad, filter_grad = xp.empty(input.shape, dtype), xp.empty(filter.shape, dtype)
    try:
        conv_2d.forward_kernel(stream, handle, state, attrs, arrays["input"], arrays["filter"], None, output)
        conv_2d.backward_kernel(stream, handle, state, attrs, output, arrays["grad"], arrays["input"], input_grad,
                                arrays["filter"], filter_grad, None)
        stream.synchronize()
    finally:
        conv_2d.cleanup_kernel(handle, state)
    return {"output": _host(stream, xp, output), "input_grad": _host(stream, xp, input_grad),
            "filter_grad": _host(stream, xp, filter_grad)}


def _matmul(handle: Any, stream: Any, xp: Any, lhs: np.ndarray, rhs: np.ndarray,
            grad: np.ndarray) -> dict[str, np.ndarray]:
    attrs = BatchMatmulAttrs()
    out_dims = batch_matmul.output_dims(lhs.shape, rhs.shape)
    dtype = lhs.dtype
    state = batch_matmul.init_kernel(handle, attrs, TensorShape(lhs.shape, dtype), TensorShape(rhs.shape, dtype),
                                     TensorShape(out_dims, dtype))
    with _on(stream, xp):
        a, b, g = xp.asarray(lhs), xp.asarray(rhs), xp.asarray(grad)
        output, lhs_grad, rhs_grad = xp.empty(out_dims, dtype), xp.empty(lhs.shape, dtype), xp.empty(rhs.shape, dtype)
    try:
        batch_matmul.forward_kernel(stream, handle, state, attrs, a, b, output)
        batch_matmul.backward_kernel(stream, handle, state, attrs, output, g, a, lhs_grad, b, rhs_grad)
        stream.synchronize()
    finally:
        batch_matmul.cleanup_kernel(handle, state)
    return {"output": _host(stream, xp, output), "lhs_grad": _host(stream, xp, lhs_grad),
            "rhs_grad": _host(stream, xp, rhs_grad)}


def _sum_lengths(problem: Problem) -> dict[str, int]:
    """K of each result tensor: the number of products each of its elements sums."""
    if problem.op == "batch_matmul":
        (*_, m, k), (*_, n) = problem.dims
        return {"output": k, "lhs_grad": n, "rhs_grad": m}
    a = problem.attrs
    n, c, _, _ = problem.dims[0]
    _, o, out_h, out_w = conv_2d.output_dims(a, problem.dims[0])
    taps = a.kernel_h * a.kernel_w
    return {"output": c // a.groups * taps, "input_grad": o // a.groups * taps, "filter_grad": n * out_h * out_w}


def _torch_reference(problem: Problem, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The problem's forward and backward by PyTorch in float64 on the CPU (an independent program, not our
    kernels): inputs (input, filter, grad) or (lhs, rhs, grad), float64; the results as _conv/_matmul name them."""
    import torch

    first, second, grad = (torch.from_numpy(x) for x in inputs)
    first.requires_grad_(True)
    second.requires_grad_(True)
    if problem.op == "batch_matmul":
        output = torch.matmul(first, second)
        names = ("output", "lhs_grad", "rhs_grad")
    else:
        a = problem.attrs
        output = torch.nn.functional.conv2d(first, second, None, (a.stride_h, a.stride_w), (a.padding_h, a.padding_w),
                                            (a.dilation_h, a.dilation_w), a.groups)
        names = ("output", "input_grad", "filter_grad")
    output.backward(grad)
    return dict(zip(names, (t.detach().numpy() for t in (output, first.grad, second.grad)), strict=True))


def _device(device: str, allow_tf32: bool) -> tuple[Any, Any, Any]:
    if device == "cpu":
        return kernels.cpu_stream(), kernels.cpu_handle(), np
    import cupy

    return kernels.gpu_stream(0), kernels.gpu_handle(0, allow_tf32=allow_tf32), cupy


def measure(problem: Problem, allow_tf32: bool, seed: int = 0, device: str = "gpu") -> dict[str, tuple[float, float]]:
    """Each result tensor's (worst |error| / S in units of 2^-11, bound_units(K)) for random normal
    float32 inputs on `device` (GPU 0 with a handle of that allow_tf32; the CPU has no TF32); the
    reference and S = sum |a||b| come from PyTorch in float64 (on the same float32 inputs, and their
    absolute values)."""
    rng = np.random.default_rng(seed)
    lengths = _sum_lengths(problem)
    stream, handle, xp = _device(device, allow_tf32)
    with handle:
        if problem.op == "batch_matmul":
            lhs, rhs = (rng.standard_normal(d).astype(np.float32) for d in problem.dims)
            grad = rng.standard_normal(batch_matmul.output_dims(*problem.dims)).astype(np.float32)
            got = _matmul(handle, stream, xp, lhs, rhs, grad)
            inputs = [lhs, rhs, grad]
        else:
            attrs = problem.attrs
            input = rng.standard_normal(problem.dims[0]).astype(np.float32)
            filter = rng.standard_normal(conv_2d.filter_dims(attrs, input.shape[1])).astype(np.float32)
            grad = rng.standard_normal(conv_2d.output_dims(attrs, input.shape)).astype(np.float32)
            got = _conv(handle, stream, xp, problem, input, filter, grad)
            inputs = [input, filter, grad]
    wide = [x.astype(np.float64) for x in inputs]
    exact = _torch_reference(problem, wide)
    scale = _torch_reference(problem, [np.abs(x) for x in wide])
    results = {}
    for name, value in got.items():
        error = np.abs(value.astype(np.float64) - exact[name])
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(scale[name] > 0, error / scale[name], np.where(error > 0, np.inf, 0.0))
        results[name] = (float(ratio.max()) / UNIT if ratio.size else 0.0, bound_units(lengths[name]))
    return results


def run_case(case: Any, golden: Any) -> dict[str, np.ndarray]:
    """A conformance case's results (written and observed tensors, on the host) on GPU 0 with a handle
    made with allow_tf32=True: what tests/test_tf32.py compares with the goldens and
    tools/measure_tf32.py reports."""
    from .harness import Env, execute

    env = Env(case, golden, "gpu", "random")
    env.handle.close()
    env.handle = kernels.gpu_handle(0, allow_tf32=True)
    try:
        execute(case, env)
        env.stream.synchronize()
        produced = {name: env.to_host(array) for name, array in env.writes.items()}
        produced.update(env.observed)
        return produced
    finally:
        env.close()
