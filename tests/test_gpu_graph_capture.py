"""Every op can be captured in a CUDA graph on its stream, forward and backward, and the graph's
replay writes the same bits as the eager calls (docs/conformance.md; the model layer captures
whole networks out of these calls).

Capturable means: no host synchronisation, no allocation and no blocking copy inside a
forward_kernel or backward_kernel once its state has run once. Each test makes a state, runs
forward then backward eagerly (which also makes what a state builds on first use), keeps the
bits, poisons every written tensor with NaN, captures the same calls into a graph (checking
that capturing ran nothing), replays it and compares every written tensor bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import kernels
from kernels import (
    BatchMatmulAttrs,
    BatchNormAttrs,
    BinaryOpType,
    ConcatAttrs,
    Conv2DAttrs,
    ElementBinaryAttrs,
    ElementUnaryAttrs,
    GradientReductionAttrs,
    Pool2DAttrs,
    PoolOp,
    ReshapeAttrs,
    SoftmaxAttrs,
    SplitAttrs,
    TensorShape,
    TopKAttrs,
    TransposeAttrs,
    UnaryOpType,
    UpsampleAttrs,
)

from .conftest import require

pytestmark = pytest.mark.gpu


class Calls:
    """An op's state and its forward and backward calls on preallocated device tensors."""

    def __init__(self, xp, stream, handle, seed):
        self.xp, self.stream, self.handle = xp, stream, handle
        self.rng = np.random.default_rng(seed)
        self.written: list = []
        self.calls: list = []
        self.states: list = []

    def data(self, *dims, dtype=np.float32):
        with self.stream:
            return self.xp.asarray(self.rng.standard_normal(dims).astype(dtype))

    def out(self, *dims, dtype=np.float32):
        with self.stream:
            array = self.xp.empty(dims, dtype=dtype)
        self.written.append(array)
        return array

    def init(self, module, attrs, *shapes):
        state = module.init_kernel(self.handle, attrs, *shapes)
        self.states.append((module, state))
        return state

    def run(self):
        for call in self.calls:
            call()

    def cleanup(self):
        for module, state in self.states:
            module.cleanup_kernel(self.handle, state)


def shape(array):
    return TensorShape.of(array)


def conv(c, groups=1, activation="SILU", use_bias=False):
    x, w = c.data(2, 8, 10, 12), c.data(16, 8 // groups, 3, 3)
    b = c.data(16) if use_bias else None
    y = c.out(2, 16, 5, 6)
    attrs = Conv2DAttrs(16, 3, 3, stride_h=2, stride_w=2, padding_h=1, padding_w=1, groups=groups,
                        use_bias=use_bias, activation=activation)
    state = c.init(kernels.conv_2d, attrs, shape(x), shape(y))
    dy, dx, dw = c.data(*y.shape), c.out(*x.shape), c.out(*w.shape)
    db = c.out(16) if use_bias else None
    c.calls += [lambda: kernels.conv_2d.forward_kernel(c.stream, c.handle, state, attrs, x, w, b, y),
                lambda: kernels.conv_2d.backward_kernel(c.stream, c.handle, state, attrs, y, dy, x, dx, w, dw, db)]


def batch_norm(c, training=True):
    x, gamma, beta = c.data(2, 8, 5, 7), c.data(8), c.data(8)
    y = c.out(*x.shape)
    attrs = BatchNormAttrs(eps=1e-3, momentum=0.03, activation="SILU")
    state = c.init(kernels.batch_norm, attrs, shape(x), shape(y))
    dy, dx, dgamma, dbeta = c.data(*x.shape), c.out(*x.shape), c.out(8), c.out(8)
    if not training:  # inference reads running statistics: make them non-trivial
        with c.stream:
            state.running_mean[...] = c.data(8)
            state.running_var[...] = c.xp.abs(c.data(8)) + 0.5
    c.calls += [lambda: kernels.batch_norm.forward_kernel(c.stream, c.handle, state, attrs, x, gamma, beta, y,
                                                          training=training),
                lambda: kernels.batch_norm.backward_kernel(c.stream, c.handle, state, attrs, y, dy, x, dx, gamma,
                                                           beta, dgamma, dbeta)]


def pool(c, pool_type):
    x = c.data(2, 4, 9, 11)
    y = c.out(*x.shape)
    attrs = Pool2DAttrs(5, 5, 1, 1, 2, 2, pool_type)
    state = c.init(kernels.pool_2d, attrs, shape(x), shape(y))
    dy, dx = c.data(*x.shape), c.out(*x.shape)
    c.calls += [lambda: kernels.pool_2d.forward_kernel(c.stream, c.handle, state, attrs, x, y),
                lambda: kernels.pool_2d.backward_kernel(c.stream, c.handle, state, attrs, y, dy, x, dx)]


def unary_like(c, module, attrs, x, y):
    state = c.init(module, attrs, shape(x), shape(y))
    dy, dx = c.data(*y.shape), c.out(*x.shape)
    c.calls += [lambda: module.forward_kernel(c.stream, c.handle, state, attrs, x, y),
                lambda: module.backward_kernel(c.stream, c.handle, state, attrs, y, dy, x, dx)]


def binary_like(c, module, attrs, lhs, rhs, y):
    state = c.init(module, attrs, shape(lhs), shape(rhs), shape(y))
    dy, dl, dr = c.data(*y.shape), c.out(*lhs.shape), c.out(*rhs.shape)
    c.calls += [lambda: module.forward_kernel(c.stream, c.handle, state, attrs, lhs, rhs, y),
                lambda: module.backward_kernel(c.stream, c.handle, state, attrs, y, dy, lhs, dl, rhs, dr)]


def many_to_one(c, module, attrs, inputs, y):
    state = c.init(module, attrs, [shape(a) for a in inputs], shape(y))
    dy, dxs = c.data(*y.shape), [c.out(*a.shape) for a in inputs]
    c.calls += [lambda: module.forward_kernel(c.stream, c.handle, state, attrs, inputs, y),
                lambda: module.backward_kernel(c.stream, c.handle, state, attrs, y, dy, inputs, dxs)]


def split(c):
    x = c.data(2, 12, 5, 3)
    ys = [c.out(2, 4, 5, 3), c.out(2, 8, 5, 3)]
    attrs = SplitAttrs((4, 8), 1)
    state = c.init(kernels.split, attrs, shape(x), [shape(y) for y in ys])
    dys, dx = [c.data(*y.shape) for y in ys], c.out(*x.shape)
    c.calls += [lambda: kernels.split.forward_kernel(c.stream, c.handle, state, attrs, x, ys),
                lambda: kernels.split.backward_kernel(c.stream, c.handle, state, attrs, ys, dys, x, dx)]


def top_k(c, k):
    """Both GPU paths: k candidates in shared memory, and k past it (the state's scratch, made by the eager
    call: the captured one allocates nothing)."""
    x = c.data(3, 1500)
    with c.stream:
        x[1, ::7] = x[1, 3]  # ties, broken by the lower index
    values, indices = c.out(3, k), c.out(3, k, dtype=np.int64)
    attrs = TopKAttrs(k)
    state = c.init(kernels.top_k, attrs, shape(x), shape(values), shape(indices))
    dv, dx = c.data(3, k), c.out(*x.shape)
    c.calls += [lambda: kernels.top_k.forward_kernel(c.stream, c.handle, state, attrs, x, values, indices),
                lambda: kernels.top_k.backward_kernel(c.stream, c.handle, state, attrs, values, dv, indices, x, dx)]


def poison(array):
    """NaN in a float array, the largest value in an integer one (which holds no NaN)."""
    array.fill(np.nan if array.dtype.kind == "f" else np.iinfo(array.dtype).max)


def poisoned(host):
    return np.isnan(host) if host.dtype.kind == "f" else host == np.iinfo(host.dtype).max


BUILDERS = {
    "conv_2d": lambda c: conv(c),
    "conv_2d_depthwise_bias": lambda c: conv(c, groups=8, activation=None, use_bias=True),
    "batch_norm_training": lambda c: batch_norm(c, True),
    "batch_norm_inference": lambda c: batch_norm(c, False),
    "pool_2d_max": lambda c: pool(c, PoolOp.MAX),
    "pool_2d_avg": lambda c: pool(c, PoolOp.AVG),
    "batch_matmul": lambda c: binary_like(c, kernels.batch_matmul, BatchMatmulAttrs(), c.data(2, 3, 16, 8),
                                          c.data(2, 3, 8, 20), c.out(2, 3, 16, 20)),
    "element_binary_broadcast": lambda c: binary_like(c, kernels.element_binary, ElementBinaryAttrs(BinaryOpType.MUL),
                                                      c.data(2, 8, 6, 7), c.data(1, 8, 1, 1), c.out(2, 8, 6, 7)),
    "softmax": lambda c: unary_like(c, kernels.softmax, SoftmaxAttrs(-1), c.data(2, 3, 40), c.out(2, 3, 40)),
    "element_unary": lambda c: unary_like(c, kernels.element_unary, ElementUnaryAttrs(UnaryOpType.SIGMOID),
                                          c.data(3, 50), c.out(3, 50)),
    "transpose": lambda c: unary_like(c, kernels.transpose, TransposeAttrs((0, 1, 3, 2)), c.data(2, 3, 5, 7),
                                      c.out(2, 3, 7, 5)),
    "reshape": lambda c: unary_like(c, kernels.reshape, ReshapeAttrs((6, 35)), c.data(2, 3, 5, 7), c.out(6, 35)),
    "upsample": lambda c: unary_like(c, kernels.upsample, UpsampleAttrs(2), c.data(2, 3, 5, 7), c.out(2, 3, 10, 14)),
    "concat": lambda c: many_to_one(c, kernels.concat, ConcatAttrs(1, 3), [c.data(2, k, 4, 5) for k in (3, 1, 4)],
                                    c.out(2, 8, 4, 5)),
    "gradient_reduction": lambda c: many_to_one(c, kernels.gradient_reduction, GradientReductionAttrs(),
                                                [c.data(4, 33) for _ in range(3)], c.out(4, 33)),
    "split": split,
    "top_k_shared": lambda c: top_k(c, 300),
    "top_k_scratch": lambda c: top_k(c, 1500),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_graph_replay_writes_the_eager_bits(name):
    require("gpu")
    import cupy

    stream, handle = kernels.gpu_stream(0), kernels.gpu_handle(0)
    c = Calls(cupy, stream, handle, seed=len(name))
    try:
        BUILDERS[name](c)
        c.run()  # eager: also makes what states build on their first call
        stream.synchronize()
        eager = [cupy.asnumpy(a) for a in c.written]
        assert all(np.isfinite(e).all() for e in eager), "the eager run wrote a non-finite value"
        with stream:
            for array in c.written:
                poison(array)
        cs = stream.cupy_stream
        cs.begin_capture()
        try:
            c.run()
        finally:
            graph = cs.end_capture()
        stream.synchronize()
        for array in c.written:  # capturing records the calls; it runs nothing
            assert poisoned(cupy.asnumpy(array)).all()
        graph.launch(cs)
        stream.synchronize()
        for index, (array, expected) in enumerate(zip(c.written, eager, strict=True)):
            replayed = cupy.asnumpy(array)
            assert np.array_equal(replayed.view(np.uint8), expected.view(np.uint8)), (
                f"{name}: written tensor {index} differs after replay "
                f"({int(np.count_nonzero(replayed != expected))} of {expected.size} values)")
        graph.launch(cs)  # a second replay: nothing the first one consumed
        stream.synchronize()
        for array, expected in zip(c.written, eager, strict=True):
            assert np.array_equal(cupy.asnumpy(array).view(np.uint8), expected.view(np.uint8))
    finally:
        stream.synchronize()
        c.cleanup()
        handle.close()
