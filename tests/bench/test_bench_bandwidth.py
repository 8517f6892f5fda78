"""The memory-bound kernels on large tensors (256 MB of float32 a tensor), GPU only, each beside
PyTorch and beside a plain device-to-device copy of the same bytes: DESIGN.md section 7's target
is 75% of the device's copy bandwidth. Bytes are what each call must move (inputs read once,
outputs written once)."""

import numpy as np
import pytest

import kernels as k
from kernels import TensorShape

from .conftest import Bench

N, C, H, W = 16, 64, 256, 256  # 64 Mi elements: 256 MB of float32
DIMS = (N, C, H, W)
F32 = np.float32
COUNT = N * C * H * W


def _ours(bench, module, attrs, ins, outs, shapes_in, shapes_out, extra=()):
    state = module.init_kernel(bench.handle, attrs, *shapes_in, *shapes_out)
    return lambda: module.forward_kernel(bench.stream, bench.handle, state, attrs, *ins, *extra, *outs)


def _case(name, bench):
    """(our call, torch call, bytes) for one op on large tensors."""
    t = bench.impl == "torch"
    x = bench.array(DIMS)
    out = bench.empty(DIMS)
    s = TensorShape(DIMS, F32)
    if name == "copy":
        if t:
            return lambda: out.copy_(x), 2 * 4 * COUNT
        return lambda: k.gpu.copy_async(bench.stream, out, x), 2 * 4 * COUNT
    if name == "reshape":
        if t:
            return lambda: out.view(N * C, H * W).copy_(x.view(N * C, H * W)), 2 * 4 * COUNT
        o = bench.empty((N * C, H * W))
        return _ours(bench, k.reshape, k.ReshapeAttrs((N * C, H * W)), [x], [o], [s], [TensorShape.of(o)]), 8 * COUNT
    if name == "transpose_last_two":
        if t:
            return lambda: out.copy_(x.transpose(2, 3)), 8 * COUNT
        return _ours(bench, k.transpose, k.TransposeAttrs((0, 1, 3, 2)), [x], [out], [s], [s]), 8 * COUNT
    if name == "concat_4_channels":
        parts = [bench.array((N, C // 4, H, W), seed=i) for i in range(4)]
        if t:
            return lambda: bench.torch.cat(parts, 1, out=out), 8 * COUNT
        shapes = [TensorShape.of(p) for p in parts]
        state = k.concat.init_kernel(bench.handle, k.ConcatAttrs(1, 4), shapes, s)
        return lambda: k.concat.forward_kernel(bench.stream, bench.handle, state, k.ConcatAttrs(1, 4), parts, out), \
            8 * COUNT
    if name == "split_4_channels":
        outs = [bench.empty((N, C // 4, H, W)) for _ in range(4)]
        if t:
            return lambda: [o.copy_(p) for o, p in zip(outs, x.split(C // 4, 1))], 8 * COUNT
        attrs = k.SplitAttrs((C // 4,) * 4, 1)
        state = k.split.init_kernel(bench.handle, attrs, s, [TensorShape.of(o) for o in outs])
        return lambda: k.split.forward_kernel(bench.stream, bench.handle, state, attrs, x, outs), 8 * COUNT
    if name == "upsample_nearest_x2":
        small = bench.array((N, C, H // 2, W // 2))
        if t:
            interpolate = bench.torch.nn.functional.interpolate
            return lambda: out.copy_(interpolate(small, scale_factor=2, mode="nearest")), 5 * COUNT
        attrs = k.UpsampleAttrs(2, "NEAREST")
        return _ours(bench, k.upsample, attrs, [small], [out], [TensorShape.of(small)], [s]), 5 * COUNT
    if name == "silu":
        if t:
            return lambda: bench.torch.nn.functional.silu(x, inplace=False).data_ptr(), 8 * COUNT
        attrs = k.ElementUnaryAttrs("SILU")
        return _ours(bench, k.element_unary, attrs, [x], [out], [s], [s]), 8 * COUNT
    if name == "add":
        y = bench.array(DIMS, seed=1)
        if t:
            return lambda: bench.torch.add(x, y, out=out), 12 * COUNT
        attrs = k.ElementBinaryAttrs("ADD")
        return _ours(bench, k.element_binary, attrs, [x, y], [out], [s, s], [s]), 12 * COUNT
    if name == "softmax_last_dim_1024":
        rows = x.reshape(COUNT // 1024, 1024)
        o = out.reshape(COUNT // 1024, 1024)
        if t:
            return lambda: bench.torch.softmax(rows, -1, out=o), 8 * COUNT
        r = TensorShape(rows.shape, F32)
        return _ours(bench, k.softmax, k.SoftmaxAttrs(-1), [rows], [o], [r], [r]), 8 * COUNT
    if name == "max_pool_3x3_s1":
        if t:
            pool = bench.torch.nn.functional.max_pool2d
            return lambda: out.copy_(pool(x, 3, 1, 1)), 8 * COUNT
        attrs = k.Pool2DAttrs(kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, padding_h=1, padding_w=1, pool_type="MAX")
        return _ours(bench, k.pool_2d, attrs, [x], [out], [s], [s]), 8 * COUNT
    if name == "batch_norm_inference":
        gamma, beta = bench.array((C,), seed=2), bench.array((C,), seed=3)
        if t:
            mean, var = bench.torch.zeros(C, device="cuda"), bench.torch.ones(C, device="cuda")
            bn = bench.torch.nn.functional.batch_norm
            return lambda: bn(x, mean, var, gamma, beta, False, 0.03, 1e-3), 8 * COUNT
        attrs = k.BatchNormAttrs(eps=1e-3, momentum=0.03)
        state = k.batch_norm.init_kernel(bench.handle, attrs, s, s)
        return lambda: k.batch_norm.forward_kernel(bench.stream, bench.handle, state, attrs, x, gamma, beta, out,
                                                   training=False), 8 * COUNT
    if name == "gradient_reduction_2":
        y = bench.array(DIMS, seed=1)
        if t:
            return lambda: bench.torch.add(x, y, out=out), 12 * COUNT
        attrs = k.GradientReductionAttrs()
        state = k.gradient_reduction.init_kernel(bench.handle, attrs, [s, s], s)
        return lambda: k.gradient_reduction.forward_kernel(bench.stream, bench.handle, state, attrs, [x, y], out), \
            12 * COUNT
    raise ValueError(name)


OPS = ["copy", "reshape", "transpose_last_two", "concat_4_channels", "split_4_channels", "upsample_nearest_x2",
       "silu", "add", "softmax_last_dim_1024", "max_pool_3x3_s1", "batch_norm_inference", "gradient_reduction_2"]


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
