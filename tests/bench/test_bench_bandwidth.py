"""The memory-bound kernels on large tensors (256 MB a tensor), GPU only, each beside
PyTorch and beside a plain device-to-device copy of the same bytes: the project's target
is 75% of the device's copy bandwidth. Bytes are what each call must move (inputs read once,
outputs written once).

float32 rows: 64 Mi elements a tensor. float16 rows (the ops that take half precision here;
their groups end in "float16"): 128 Mi elements a tensor, the same 256 MB."""

import numpy as np
import pytest

import kernels as k
from kernels import TensorShape
from kernels.runtime import gpu

from .conftest import Bench

C, H, W = 64, 256, 256
F32 = np.dtype(np.float32)
BATCH = {np.dtype(np.float32): 16, np.dtype(np.float16): 32}  # 256 MB a tensor in either dtype


def _ours(bench, module, attrs, ins, outs, shapes_in, shapes_out, extra=()):
    state = module.init_kernel(bench.handle, attrs, *shapes_in, *shapes_out)
    return lambda: module.forward_kernel(bench.stream, bench.handle, state, attrs, *ins, *extra, *outs)


def _case(name, bench, dtype=F32):
    """(our call or torch's, bytes) for one op on large tensors of `dtype` (256 MB each)."""
    t = bench.impl == "torch"
    n = BATCH[dtype]
    dims = (n, C, H, W)
    words = n * C * H * W * dtype.itemsize // 4  # a tensor's bytes / 4: the byte counts below are multiples of it
    x = bench.array(dims, dtype)
    out = bench.empty(dims, dtype)
    s = TensorShape(dims, dtype)
    if name == "copy":
        if t:
            return lambda: out.copy_(x), 2 * 4 * words
        return lambda: gpu.copy_async(bench.stream, out, x), 2 * 4 * words
    if name == "reshape":
        if t:
            return lambda: out.view(n * C, H * W).copy_(x.view(n * C, H * W)), 2 * 4 * words
        o = bench.empty((n * C, H * W), dtype)
        return _ours(bench, k.reshape, k.ReshapeAttrs((n * C, H * W)), [x], [o], [s], [TensorShape.of(o)]), 8 * words
    if name == "transpose_last_two":
        if t:
            return lambda: out.copy_(x.transpose(2, 3)), 8 * words
        return _ours(bench, k.transpose, k.TransposeAttrs((0, 1, 3, 2)), [x], [out], [s], [s]), 8 * words
    if name == "concat_4_channels":
        parts = [bench.array((n, C // 4, H, W), dtype, seed=i) for i in range(4)]
        if t:
            return lambda: bench.torch.cat(parts, 1, out=out), 8 * words
        shapes = [TensorShape.of(p) for p in parts]
        state = k.concat.init_kernel(bench.handle, k.ConcatAttrs(1, 4), shapes, s)
        return lambda: k.concat.forward_kernel(bench.stream, bench.handle, state, k.ConcatAttrs(1, 4), parts, out), \
            8 * words
    if name == "split_4_channels":
        outs = [bench.empty((n, C // 4, H, W), dtype) for _ in range(4)]
        if t:
            return lambda: [o.copy_(p) for o, p in zip(outs, x.split(C // 4, 1))], 8 * words
        attrs = k.SplitAttrs((C // 4,) * 4, 1)
        state = k.split.init_kernel(bench.handle, attrs, s, [TensorShape.of(o) for o in outs])
        return lambda: k.split.forward_kernel(bench.stream, bench.handle, state, attrs, x, outs), 8 * words
    if name == "upsample_nearest_x2":
        small = bench.array((n, C, H // 2, W // 2), dtype)
        if t:
            interpolate = bench.torch.nn.functional.interpolate
            return lambda: out.copy_(interpolate(small, scale_factor=2, mode="nearest")), 5 * words
        attrs = k.UpsampleAttrs(2, "NEAREST")
        return _ours(bench, k.upsample, attrs, [small], [out], [TensorShape.of(small)], [s]), 5 * words
    if name == "silu":
        if t:
            return lambda: bench.torch.nn.functional.silu(x, inplace=False).data_ptr(), 8 * words
        attrs = k.ElementUnaryAttrs("SILU")
        return _ours(bench, k.element_unary, attrs, [x], [out], [s], [s]), 8 * words
    if name == "add":
        y = bench.array(dims, dtype, seed=1)
        if t:
            return lambda: bench.torch.add(x, y, out=out), 12 * words
        attrs = k.ElementBinaryAttrs("ADD")
        return _ours(bench, k.element_binary, attrs, [x, y], [out], [s, s], [s]), 12 * words
    if name == "softmax_last_dim_1024":
        rows = x.reshape(-1, 1024)
        o = out.reshape(-1, 1024)
        if t:
            return lambda: bench.torch.softmax(rows, -1, out=o), 8 * words
        r = TensorShape(tuple(rows.shape), dtype)
        return _ours(bench, k.softmax, k.SoftmaxAttrs(-1), [rows], [o], [r], [r]), 8 * words
    if name == "max_pool_3x3_s1":
        if t:
            pool = bench.torch.nn.functional.max_pool2d
            return lambda: out.copy_(pool(x, 3, 1, 1)), 8 * words
        attrs = k.Pool2DAttrs(kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, padding_h=1, padding_w=1, pool_type="MAX")
        return _ours(bench, k.pool_2d, attrs, [x], [out], [s], [s]), 8 * words
    if name == "batch_norm_inference":
        gamma, beta = bench.array((C,), seed=2), bench.array((C,), seed=3)
        if t:
            mean, var = bench.torch.zeros(C, device="cuda"), bench.torch.ones(C, device="cuda")
            bn = bench.torch.nn.functional.batch_norm
            return lambda: bn(x, mean, var, gamma, beta, False, 0.03, 1e-3), 8 * words
        attrs = k.BatchNormAttrs(eps=1e-3, momentum=0.03)
        state = k.batch_norm.init_kernel(bench.handle, attrs, s, s)
        return lambda: k.batch_norm.forward_kernel(bench.stream, bench.handle, state, attrs, x, gamma, beta, out,
                                                   training=False), 8 * words
    if name == "gradient_reduction_2":
        y = bench.array(dims, dtype, seed=1)
        if t:
            return lambda: bench.torch.add(x, y, out=out), 12 * words
        attrs = k.GradientReductionAttrs()
        state = k.gradient_reduction.init_kernel(bench.handle, attrs, [s, s], s)
        return lambda: k.gradient_reduction.forward_kernel(bench.stream, bench.handle, state, attrs, [x, y], out), \
            12 * words
    raise ValueError(name)


OPS = ["copy", "reshape", "transpose_last_two", "concat_4_channels", "split_4_channels", "upsample_nearest_x2",
       "silu", "add", "softmax_last_dim_1024", "max_pool_3x3_s1", "batch_norm_inference", "gradient_reduction_2"]


# The ops with float16 rows: those whose half precision is in this library's own kernels (pool_2d's
# and batch_norm's join them with their half-precision code).
HALF_OPS = ["copy", "reshape", "transpose_last_two", "concat_4_channels", "split_4_channels", "upsample_nearest_x2",
            "silu", "add", "softmax_last_dim_1024", "gradient_reduction_2"]


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["ours", "torch"])
@pytest.mark.parametrize("op", OPS)
def test_large(benchmark, op, impl):
    bench = Bench(impl, "gpu")
    try:
        function, bytes_moved = _case(op, bench)
        bench.run(benchmark, function, bytes_moved, f"bandwidth {op} (256 MB tensors)")
    finally:
        bench.close()


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["ours", "torch"])
@pytest.mark.parametrize("op", HALF_OPS)
def test_large_float16(benchmark, op, impl):
    bench = Bench(impl, "gpu")
    try:
        function, bytes_moved = _case(op, bench, np.dtype(np.float16))
        bench.run(benchmark, function, bytes_moved, f"bandwidth {op} (256 MB tensors) float16")
    finally:
        bench.close()
