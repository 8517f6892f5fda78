"""conv_2d's GPU GEMM paths checked without a GPU: each plan (the cuBLAS calls with their
sizes, leading dimensions, strides, offsets and betas, and the im2col/col2im folds) is run
by a NumPy emulator of column-major strided batched GEMM over flat buffers and of the
folds' CUDA index math, and must give what the CPU kernels give. On the GPU the same plans
run through cuBLAS (the GPU rows compare those paths with the CPU and check determinism)."""

import numpy as np
import pytest

from kernels import Conv2DAttrs, TensorShape, conv_2d
from kernels.runtime.core import BFLOAT16

from .conftest import Dev, require

_ITEM = 1  # the emulator's offsets are in elements


def _matrix(flat, offset, rows, cols, ld):
    """The column-major (rows x cols) matrix with leading dimension ld at flat[offset:], as a view."""
    assert ld >= max(1, rows), (ld, rows)
    assert offset + (cols - 1) * ld + rows <= flat.size, "reads or writes past the buffer's end"
    return np.lib.stride_tricks.as_strided(flat[offset:], shape=(rows, cols),
                                           strides=(flat.itemsize, ld * flat.itemsize))


def _gemm(step, buffers):
    """cublas<t>gemmStridedBatched's semantics: C_i = op(A_i) @ op(B_i) + beta * C_i for i < batch."""
    a_rows, a_cols = (step.k, step.m) if step.trans_a else (step.m, step.k)
    b_rows, b_cols = (step.n, step.k) if step.trans_b else (step.k, step.n)
    for i in range(step.batch):
        a = _matrix(buffers[step.a[0]], step.a[1] + i * step.stride_a, a_rows, a_cols, step.lda)
        b = _matrix(buffers[step.b[0]], step.b[1] + i * step.stride_b, b_rows, b_cols, step.ldb)
        c = _matrix(buffers[step.c[0]], step.c[1] + i * step.stride_c, step.m, step.n, step.ldc)
        product = (a.T if step.trans_a else a) @ (b.T if step.trans_b else b)
        c[...] = product + (step.beta * c if step.beta else 0)


def _fold(step, buffers, state):
    """conv_im2col / conv_col2im of conv_2d.cu: the same per-thread index math, vectorized over threads."""
    a = state.attrs
    _, c, h, w = state.shapes["input_shape"].dims
    _, _, out_h, out_w = state.shapes["output_shape"].dims
    images = step.stop - step.first
    kh, kw = a.kernel_h, a.kernel_w
    columns = buffers["workspace"]
    if step.kind == "sum":
        size = buffers["filter_grad"].size
        partials = columns[state.partials_at:state.partials_at + images * size].reshape(images, size)
        total = buffers["filter_grad"].copy() if step.first > 0 else np.zeros(size)
        for image in partials:  # image order
            total = total + image
        buffers["filter_grad"][:] = total
    elif step.kind == "im2col":
        image = buffers["input"][step.first * c * h * w:step.stop * c * h * w]
        index = np.arange(images * c * kh * kw * out_h * out_w)
        ow = index % out_w
        rest = index // out_w
        oh = rest % out_h
        rest //= out_h
        j = rest % kw
        rest //= kw
        i = rest % kh
        rest //= kh
        ch = rest % c
        n = rest // c
        y = oh * a.stride_h - a.padding_h + i * a.dilation_h
        x = ow * a.stride_w - a.padding_w + j * a.dilation_w
        inside = (y >= 0) & (y < h) & (x >= 0) & (x < w)
        source = ((n * c + ch) * h + np.clip(y, 0, h - 1)) * w + np.clip(x, 0, w - 1)
        columns[:index.size] = np.where(inside, image[source], 0)
    else:
        target = buffers["input_grad"][step.first * c * h * w:step.stop * c * h * w]
        index = np.arange(images * c * h * w)
        x0 = index % w
        rest = index // w
        y0 = rest % h
        rest //= h
        ch = rest % c
        n = rest // c
        plane = (n * c + ch) * kh * kw * out_h * out_w
        total = np.zeros(index.size, dtype=target.dtype)
        for i in range(kh):  # the kernel's tap order
            y = y0 + a.padding_h - i * a.dilation_h
            oh = np.where(y >= 0, y, 0) // a.stride_h
            row_ok = (y >= 0) & (y % a.stride_h == 0) & (oh < out_h)
            for j in range(kw):
                x = x0 + a.padding_w - j * a.dilation_w
                ow = np.where(x >= 0, x, 0) // a.stride_w
                ok = row_ok & (x >= 0) & (x % a.stride_w == 0) & (ow < out_w)
                where = plane + (i * kw + j) * out_h * out_w + np.where(ok, oh * out_w + ow, 0)
                total += np.where(ok, columns[np.where(ok, where, 0)], 0)
        target[:] = total


def _emulate(state, steps, buffers):
    for step in steps:
        if isinstance(step, conv_2d.plan.Gemm):
            _gemm(step, buffers)
        else:
            _fold(step, buffers, state)


_CONFIGS = [
    ((3, 5, 6, 7), Conv2DAttrs(4, 1, 1)),  # pointwise, batch 3
    ((1, 64, 4, 5), Conv2DAttrs(8, 1, 1)),  # pointwise, the head's 64 channels
    ((2, 3, 9, 10), Conv2DAttrs(4, 3, 3, 2, 2, 1, 1)),  # the stem: 3x3 s2 p1
    ((3, 4, 7, 6), Conv2DAttrs(5, 3, 3, 1, 1, 1, 1)),  # C2f 3x3
    ((2, 3, 9, 8), Conv2DAttrs(2, 3, 3, 1, 1, 2, 2, 2, 2)),  # dilation 2
    ((2, 3, 7, 5), Conv2DAttrs(4, 3, 2, 2, 1, 1, 0)),  # asymmetric kernel and stride
    ((1, 2, 4, 11), Conv2DAttrs(3, 1, 5, 1, 3, 0, 2)),  # 1x5, stride 3 across
    ((2, 2, 5, 4), Conv2DAttrs(3, 3, 3, 1, 2, 2, 3)),  # padding wider than half the kernel
    ((2, 3, 5, 6), Conv2DAttrs(2, 1, 1, 2, 2)),  # 1x1 stride 2: not pointwise, columns
    ((2, 3, 5, 6), Conv2DAttrs(2, 1, 1, padding_h=1)),  # 1x1 padded: columns
    ((2, 2, 3, 4), Conv2DAttrs(3, 3, 4)),  # kernel covers the input
    ((4, 2, 6, 5), Conv2DAttrs(3, 3, 3, 2, 1, 1, 2, 1, 2)),  # chunked below
]


def _state(dims, attrs, dtype=np.float64, chunk=None):
    state = conv_2d.init_kernel(Dev("cpu").handle, attrs, TensorShape(dims, dtype),
                                TensorShape(conv_2d.output_dims(attrs, dims), dtype))
    conv_2d.plan.choose_paths(state)
    if chunk is not None:
        state.chunk = chunk
        if state.paths["backward_filter"] == "columns":
            _, _, _, p, k = conv_2d.plan._sizes(state)
            state.partials_at = -(-chunk * k * p // 64) * 64
    return state


@pytest.mark.parametrize("chunk", [None, 1, 2, 3])
@pytest.mark.parametrize("index", range(len(_CONFIGS)))
def test_plans_match_the_cpu(index, chunk):
    dims, attrs = _CONFIGS[index]
    state = _state(dims, attrs, chunk=chunk)
    expected_path = "gemm" if conv_2d.plan.pointwise(attrs) else "columns"
    assert state.paths["backward_data"] == state.paths["backward_filter"] == expected_path
    assert state.paths["forward"] == ("gemm" if expected_path == "gemm" else "cudnn")
    rng = np.random.default_rng(index)
    input = rng.integers(-8, 9, dims).astype(np.float64)
    filter = rng.integers(-8, 9, conv_2d.filter_dims(attrs, dims[1])).astype(np.float64)
    output_dims = conv_2d.output_dims(attrs, dims)
    grad = rng.integers(-8, 9, output_dims).astype(np.float64)
    expected = {"output": np.empty(output_dims), "input_grad": np.empty(dims), "filter_grad": np.empty(filter.shape)}
    cpu = Dev("cpu")
    conv_2d.cpu_forward_kernel(cpu.stream, cpu.handle, state, attrs, input, filter, None, expected["output"])
    conv_2d.cpu_backward_kernel(cpu.stream, cpu.handle, state, attrs, None, grad, input, expected["input_grad"],
                                filter, expected["filter_grad"], None)
    n, c, o, p, k = conv_2d.plan._sizes(state)
    # Garbage everywhere the plans write: every element must be overwritten (beta 0 first).
    buffers = {"input": input.ravel().copy(), "filter": filter.ravel().copy(), "grad": grad.ravel().copy(),
               "output": np.full(grad.size, np.nan), "input_grad": np.full(input.size, np.nan),
               "filter_grad": np.full(filter.size, np.nan),
               "workspace": np.full(conv_2d.plan.workspace_elements(state), np.nan)}
    plans = {"input_grad": conv_2d.plan.plan_backward_data(state), "filter_grad": conv_2d.plan.plan_backward_filter(state)}
    if state.paths["forward"] == "gemm":
        plans["output"] = conv_2d.plan.plan_forward(state)
    for name, steps in plans.items():
        _emulate(state, steps, buffers)
        np.testing.assert_array_equal(buffers[name].reshape(expected[name].shape), expected[name], err_msg=name)
    gemms = [s for s in plans["filter_grad"] if isinstance(s, conv_2d.plan.Gemm)]
    sums = [(s.first, s.stop) for s in plans["filter_grad"] if isinstance(s, conv_2d.plan.Fold) and s.kind == "sum"]
    if state.chunk == 1:  # one GEMM per image, accumulating in cuBLAS
        assert [s.beta for s in gemms] == [0.0] + [1.0] * (n - 1) and not sums
    else:  # one batched GEMM and one ordered sum per chunk
        assert [s.batch for s in gemms] == [stop - first for first, stop in conv_2d.plan._chunks(state)]
        assert sums == conv_2d.plan._chunks(state)


def test_grouped_stays_on_cudnn_and_depthwise_takes_its_kernels():
    for attrs in (Conv2DAttrs(4, 1, 1, groups=2), Conv2DAttrs(6, 3, 3, groups=2)):
        assert set(_state((1, 4, 5, 5), attrs).paths.values()) == {"cudnn"}
    for attrs in (Conv2DAttrs(4, 3, 3, groups=4), Conv2DAttrs(8, 1, 1, groups=4)):
        state = _state((1, 4, 5, 5), attrs)
        assert state.paths == {"forward": "depthwise", "backward_data": "depthwise", "backward_filter": "depthwise"}


def _depthwise_emulated(state, input, filter, grad):
    """conv_depthwise_input_grad and conv_depthwise_filter_grad of conv_2d.cu: the same per-thread
    index math, vectorized over threads (and over a block's positions)."""
    a = state.attrs
    n_images, c, h, w = input.shape
    _, o, out_h, out_w = grad.shape
    m, kh, kw = o // c, a.kernel_h, a.kernel_w
    grad_flat, filter_flat, input_flat = grad.ravel(), filter.ravel(), input.ravel()
    index = np.arange(input.size)
    x0 = index % w
    rest = index // w
    y0 = rest % h
    rest //= h
    ch = rest % c
    n = rest // c
    input_grad = np.zeros(input.size)
    for q in range(m):
        oc = ch * m + q
        for i in range(kh):
            y = y0 + a.padding_h - i * a.dilation_h
            oh = np.where(y >= 0, y, 0) // a.stride_h
            row_ok = (y >= 0) & (y % a.stride_h == 0) & (oh < out_h)
            for j in range(kw):
                x = x0 + a.padding_w - j * a.dilation_w
                ow = np.where(x >= 0, x, 0) // a.stride_w
                ok = row_ok & (x >= 0) & (x % a.stride_w == 0) & (ow < out_w)
                at = np.where(ok, (n * o + oc) * out_h * out_w + oh * out_w + ow, 0)
                input_grad += np.where(ok, grad_flat[at] * filter_flat[oc * kh * kw + i * kw + j], 0)
    item = np.arange(o * kh * kw)
    oc, tap = item // (kh * kw), item % (kh * kw)
    i, j, ch = tap // kw, tap % kw, oc // m
    p = np.arange(out_h * out_w)
    filter_grad = np.zeros(item.size)
    for n in range(n_images):
        y = (p[None] // out_w) * a.stride_h - a.padding_h + i[:, None] * a.dilation_h
        x = (p[None] % out_w) * a.stride_w - a.padding_w + j[:, None] * a.dilation_w
        ok = (y >= 0) & (y < h) & (x >= 0) & (x < w)
        plane = grad_flat[(n * o + oc[:, None]) * out_h * out_w + p[None]]
        pixel = input_flat[np.where(ok, (n * c + ch[:, None]) * h * w + y * w + x, 0)]
        filter_grad += np.where(ok, plane * pixel, 0).sum(axis=1)
    # conv_depthwise_forward, one thread per output element (conv_depthwise_forward_tiled: the same
    # operations per output, from the values staged in shared memory)
    output = np.zeros(grad.size)
    index = np.arange(grad.size)
    ow = index % out_w
    rest = index // out_w
    oh = rest % out_h
    rest //= out_h
    oc = rest % o
    n = rest // o
    for i in range(kh):
        y = oh * a.stride_h - a.padding_h + i * a.dilation_h
        for j in range(kw):
            x = ow * a.stride_w - a.padding_w + j * a.dilation_w
            ok = (y >= 0) & (y < h) & (x >= 0) & (x < w)
            pixel = input_flat[np.where(ok, (n * c + oc // m) * h * w + y * w + x, 0)]
            output += np.where(ok, pixel * filter_flat[oc * kh * kw + i * kw + j], 0)
    return input_grad.reshape(input.shape), filter_grad.reshape(filter.shape), output.reshape(grad.shape)


# Depthwise geometries whose GPU kernels are emulated on the CPU (input, attrs).
_DEPTHWISE_GEOMETRIES = [
    ((2, 4, 9, 8), Conv2DAttrs(4, 3, 3, 2, 2, 1, 1, groups=4)),  # SCDown: depthwise 3x3 s2
    ((1, 3, 9, 10), Conv2DAttrs(3, 7, 7, 1, 1, 3, 3, groups=3)),  # 7x7
    ((2, 3, 6, 5), Conv2DAttrs(6, 3, 3, 1, 1, 1, 1, groups=3)),  # 2 filters per channel
    ((2, 2, 9, 7), Conv2DAttrs(6, 3, 2, 2, 1, 2, 0, 2, 1, groups=2)),  # asymmetric, dilated, 3 per channel
    ((1, 2, 5, 4), Conv2DAttrs(2, 3, 3, 1, 2, 2, 3, groups=2)),  # padding wider than half the kernel
]


@pytest.mark.parametrize("dims, attrs", _DEPTHWISE_GEOMETRIES)
def test_depthwise_kernels_match_the_cpu(dims, attrs):
    state = _state(dims, attrs)
    assert state.paths["backward_data"] == "depthwise"
    rng = np.random.default_rng(7)
    input = rng.integers(-8, 9, dims).astype(np.float64)
    filter = rng.integers(-8, 9, conv_2d.filter_dims(attrs, dims[1])).astype(np.float64)
    grad = rng.integers(-8, 9, conv_2d.output_dims(attrs, dims)).astype(np.float64)
    input_grad, filter_grad, output = np.empty(dims), np.empty(filter.shape), np.empty(grad.shape)
    cpu = Dev("cpu")
    conv_2d.cpu_forward_kernel(cpu.stream, cpu.handle, state, attrs, input, filter, None, output)
    conv_2d.cpu_backward_kernel(cpu.stream, cpu.handle, state, attrs, None, grad, input, input_grad, filter,
                                filter_grad, None)
    emulated = _depthwise_emulated(state, input, filter, grad)
    np.testing.assert_array_equal(emulated[0], input_grad)
    np.testing.assert_array_equal(emulated[1], filter_grad)
    np.testing.assert_array_equal(emulated[2], output)


def _depthwise_tiled_emulated(state, input, filter):
    """conv_depthwise_forward_tiled of conv_2d.cu, block by block (float64, no bias or activation): each
    block stages its tile's input region (zeros outside the input), then each of the tile's outputs sums
    its taps inside the input in (i, j) order, reading them from the region. Asserts that every tap read
    lies inside the region and that every output is written by exactly one block."""
    a = state.attrs
    tile_h, tile_w, shared = state.tile if state.tile is not None else conv_2d.plan.depthwise_tile(state)
    n_images, c, h, w = input.shape
    o = a.out_channels
    out_h, out_w = conv_2d.output_dims(a, input.shape)[2:]
    region_h = (tile_h - 1) * a.stride_h + (a.kernel_h - 1) * a.dilation_h + 1
    region_w = (tile_w - 1) * a.stride_w + (a.kernel_w - 1) * a.dilation_w + 1
    assert shared == (a.kernel_h * a.kernel_w + region_h * region_w) * 8  # float64: doubles
    output = np.zeros((n_images, o, out_h, out_w))
    writes = np.zeros(output.shape, np.int64)
    for plane in range(n_images * o):
        n, oc = divmod(plane, o)
        image, taps = input[n, oc // (o // c)], filter[oc, 0]
        for oh0 in range(0, out_h, tile_h):
            for ow0 in range(0, out_w, tile_w):
                h0, w0 = oh0 * a.stride_h - a.padding_h, ow0 * a.stride_w - a.padding_w
                rows, cols = np.arange(region_h)[:, None] + h0, np.arange(region_w)[None, :] + w0
                inside = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
                region = np.where(inside, image[np.clip(rows, 0, h - 1), np.clip(cols, 0, w - 1)], 0.0)
                k = np.arange(tile_h * tile_w)
                oh, ow = oh0 + k // tile_w, ow0 + k % tile_w
                kept = (oh < out_h) & (ow < out_w)
                oh, ow = oh[kept], ow[kept]
                total = np.zeros(oh.size)
                for i in range(a.kernel_h):
                    y = oh * a.stride_h - a.padding_h + i * a.dilation_h
                    for j in range(a.kernel_w):
                        x = ow * a.stride_w - a.padding_w + j * a.dilation_w
                        ok = (y >= 0) & (y < h) & (x >= 0) & (x < w)
                        r, q = y - h0, x - w0
                        assert np.all((r[ok] >= 0) & (r[ok] < region_h) & (q[ok] >= 0) & (q[ok] < region_w))
                        read = region[np.clip(r, 0, region_h - 1), np.clip(q, 0, region_w - 1)]
                        total += np.where(ok, read * taps[i, j], 0.0)
                output[n, oc, oh, ow] = total
                writes[n, oc, oh, ow] += 1
    assert np.all(writes == 1)
    return output


@pytest.mark.parametrize("shared_limit", [None, 1000], ids=["tiles", "small_tiles"])
@pytest.mark.parametrize("dims, attrs", _DEPTHWISE_GEOMETRIES + [
    ((1, 2, 37, 150), Conv2DAttrs(2, 3, 3, 1, 1, 1, 1, groups=2)),  # 150 columns: two tiles of 75 a row
    ((1, 2, 70, 41), Conv2DAttrs(2, 5, 3, 2, 1, 2, 1, 2, 3, groups=2)),  # stride 2x1, dilation 2x3
])
def test_tiled_depthwise_forward_reads_its_region_and_matches_the_cpu(dims, attrs, shared_limit, monkeypatch):
    """The tiled depthwise forward's indexing (tile, region, the taps each output reads), emulated block by
    block against the CPU's convolution: exact (small integers); with a tiny shared-memory limit the tiles
    shrink to a few outputs, so most outputs sit at a tile's edge."""
    if shared_limit is not None:
        monkeypatch.setattr(conv_2d.plan, "DEPTHWISE_SHARED_LIMIT", shared_limit)
    state = _state(dims, attrs)
    assert state.paths["forward"] == "depthwise"
    tile = conv_2d.plan.depthwise_tile(state)
    assert tile is not None and (shared_limit is None or tile[0] * tile[1] < 64)
    rng = np.random.default_rng(8)
    input = rng.integers(-8, 9, dims).astype(np.float64)
    filter = rng.integers(-8, 9, conv_2d.filter_dims(attrs, dims[1])).astype(np.float64)
    output = np.empty(conv_2d.output_dims(attrs, dims))
    cpu = Dev("cpu")
    conv_2d.cpu_forward_kernel(cpu.stream, cpu.handle, state, attrs, input, filter, None, output)
    np.testing.assert_array_equal(_depthwise_tiled_emulated(state, input, filter), output)


def test_columns_too_large_fall_back_to_cudnn(monkeypatch):
    dims, attrs = (3, 4, 8, 8), Conv2DAttrs(2, 3, 3, padding_h=1, padding_w=1)
    per_image = 4 * 9 * 64 * 4  # float32 columns of one image
    monkeypatch.setattr(conv_2d.plan, "COLUMN_LIMIT", per_image - 1)
    assert _state(dims, attrs, np.float32).paths["backward_data"] == "cudnn"
    partial = 2 * 4 * 9 * 4  # float32 filter gradient of one image
    monkeypatch.setattr(conv_2d.plan, "COLUMN_LIMIT", 2 * (per_image + partial) + 7)
    state = _state(dims, attrs, np.float32)
    assert state.paths["backward_filter"] == "columns" and state.chunk == 2
    assert conv_2d.plan._chunks(state) == [(0, 2), (2, 3)]
    assert state.partials_at >= 2 * 4 * 9 * 64 and state.partials_at % 64 == 0
    assert conv_2d.plan.workspace_elements(state) == state.partials_at + 2 * 2 * 4 * 9


# ------------------------------------------------------------------ GPU: the paths against the CPU


def _random_run(dev, dims, attrs, dtype, seed):
    rng = np.random.default_rng(seed)
    input = rng.standard_normal(dims).astype(dtype)
    filter = rng.standard_normal(conv_2d.filter_dims(attrs, dims[1])).astype(dtype)
    bias = rng.standard_normal(attrs.out_channels).astype(dtype) if attrs.use_bias else None
    grad = rng.standard_normal(conv_2d.output_dims(attrs, dims)).astype(dtype)
    from .test_conv_2d import _run

    return _run(dev, attrs, input, filter, bias, grad)


_GPU_CONFIGS = [
    ((3, 64, 20, 20), Conv2DAttrs(64, 1, 1, use_bias=True)),  # pointwise, batch 3
    ((2, 32, 40, 40), Conv2DAttrs(32, 3, 3, 1, 1, 1, 1)),  # C2f 3x3
    ((2, 3, 64, 64), Conv2DAttrs(16, 3, 3, 2, 2, 1, 1)),  # stem 3x3 s2
    ((2, 8, 17, 15), Conv2DAttrs(6, 3, 3, 1, 1, 2, 2, 2, 2)),  # dilation 2
    ((2, 5, 13, 11), Conv2DAttrs(7, 3, 2, 2, 1, 1, 0)),  # asymmetric
    ((2, 64, 40, 40), Conv2DAttrs(64, 3, 3, 2, 2, 1, 1, groups=64, use_bias=True)),  # SCDown depthwise
    ((2, 16, 21, 19), Conv2DAttrs(32, 7, 7, 1, 1, 3, 3, groups=16)),  # depthwise 7x7, 2 filters per channel
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index", range(len(_GPU_CONFIGS)))
def test_gpu_paths_match_cpu_and_repeat_bitwise(index, dtype):
    """Each GEMM path on random data: within a normwise bound of the CPU result (float32 1e-5,
    float64 1e-12, relative to the norm of the result), and the same bits on a second run."""
    require("gpu")
    dims, attrs = _GPU_CONFIGS[index]
    dev = Dev("gpu")
    try:
        state = _state(dims, attrs, dtype)
        assert state.paths["backward_filter"] in ("gemm", "columns", "depthwise")
        first = _random_run(dev, dims, attrs, dtype, seed=index)
        second = _random_run(dev, dims, attrs, dtype, seed=index)
        expected = _random_run(Dev("cpu"), dims, attrs, dtype, seed=index)
        bound = 1e-5 if dtype == np.float32 else 1e-12
        for name, a, b, e in zip(("output", "input_grad", "filter_grad", "bias_grad"), first, second, expected):
            if e is None:
                continue
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=f"{name}: not deterministic")
            error = np.linalg.norm((a.astype(np.float64) - e).ravel()) / max(np.linalg.norm(e.ravel()), 1e-300)
            assert error < bound, (name, error)
    finally:
        dev.handle.close()


@pytest.mark.parametrize("dims, attrs, dtype, flops, limit_mib", [
    # 2 N O Ho Wo (C / g) kh kw; twice input + filter + output bytes, at least 256 MiB
    ((1, 32, 160, 160), Conv2DAttrs(32, 3, 3, 1, 1, 1, 1), np.float32, 2 * 32 * 160 * 160 * 32 * 9, 256),
    ((1, 32, 20, 20), Conv2DAttrs(32, 3, 3, 1, 1, 1, 1), np.float32, 2 * 32 * 20 * 20 * 32 * 9, 256),  # below 20M
    ((1, 64, 20, 20), Conv2DAttrs(64, 3, 3, 1, 1, 1, 1), np.float32, 2 * 64 * 20 * 20 * 64 * 9, 256),  # above
    ((16, 160, 80, 80), Conv2DAttrs(160, 3, 3, 1, 1, 1, 1), np.float32, 2 * 16 * 160 * 6400 * 160 * 9, 256),
    ((16, 80, 320, 320), Conv2DAttrs(160, 3, 3, 2, 2, 1, 1), np.float16, 2 * 16 * 160 * 25600 * 80 * 9,
     2 * (16 * 80 * 102400 + 160 * 80 * 9 + 16 * 160 * 25600) * 2 / 2**20),
    ((2, 64, 40, 40), Conv2DAttrs(64, 3, 3, 2, 2, 1, 1, groups=64), np.float32, 2 * 2 * 64 * 400 * 9, 256),
])
def test_forward_flops_and_workspace_limit(dims, attrs, dtype, flops, limit_mib):
    """What decides cuDNN's forward algorithm (IMPLICIT_GEMM below 20 MFLOP in float32) and the workspace an
    algorithm may ask for (twice the convolution's tensors where that passes 256 MiB: the NHWC copies of a
    half tensor-core algorithm)."""
    state = _state(dims, attrs, dtype)
    assert conv_2d.plan.forward_flops(state) == flops
    assert conv_2d.plan.workspace_limit(state) == round(limit_mib * 2**20)
    assert (flops < conv_2d.plan.IMPLICIT_GEMM_BELOW_FLOPS) == (flops < 2 * 10**7)


@pytest.mark.parametrize("dims, attrs, dtype, tile", [
    # yolov10x's C2fCIB depthwise 3x3 at 40x40: the whole plane (1600 outputs); its region 42 x 42 and
    # the 9 taps in float for float16
    ((16, 640, 40, 40), Conv2DAttrs(640, 3, 3, 1, 1, 1, 1, groups=640), np.float16, (40, 40, (42 * 42 + 9) * 4)),
    # SCDown's 3x3 s2 to 40x40: the region 81 x 81
    ((16, 640, 80, 80), Conv2DAttrs(640, 3, 3, 2, 2, 1, 1, groups=640), np.float32, (40, 40, (81 * 81 + 9) * 4)),
    # 7x7 at 20x20: the whole plane, the region 26 x 26
    ((1, 256, 20, 20), Conv2DAttrs(256, 7, 7, 1, 1, 3, 3, groups=256), np.float32, (20, 20, (26 * 26 + 49) * 4)),
    # 160x160 in float64: two halves of a row (80 wide); 2048 // 80 = 25 rows at most, so 7 parts of 23
    ((2, 32, 160, 160), Conv2DAttrs(32, 3, 3, 1, 1, 1, 1, groups=32), np.float64, (23, 80, (25 * 82 + 9) * 8)),
    # dilation 40 at 64x64: 32 x 64 (region 112 x 144 floats) passes 48 KiB; so does 32 x 32 (112 x 112);
    # 16 x 32 (96 x 112) fits
    ((1, 2, 64, 64), Conv2DAttrs(2, 3, 3, 1, 1, 40, 40, 40, 40, groups=2), np.float32, (16, 32, (96 * 112 + 9) * 4)),
    # dilation 56: one output's region is 113 x 113 floats: untiled
    ((1, 2, 120, 120), Conv2DAttrs(2, 3, 3, 1, 1, 56, 56, 56, 56, groups=2), np.float32, None),
    # 2e8 output rows of one column: 97657 tiles of 2048 rows, more than a grid's y takes
    ((1, 2, 200_000_000, 1), Conv2DAttrs(2, 1, 1, groups=2), np.float32, None),
])
def test_depthwise_tile(dims, attrs, dtype, tile):
    """The tiled depthwise forward's tile: rows and columns of outputs a block computes and the shared
    memory of their input region and the taps (None: the untiled kernel)."""
    state = _state(dims, attrs, dtype)
    assert state.paths["forward"] == "depthwise"
    assert conv_2d.plan.depthwise_tile(state) == tile
    if tile is not None:
        assert tile[2] <= conv_2d.plan.DEPTHWISE_SHARED_LIMIT


@pytest.mark.gpu
def test_gpu_init_picks_the_paths_and_implicit_gemm(monkeypatch):
    """On the GPU: groups-1 convolutions take the GEMM paths, depthwise ones their kernels (grouped: cuDNN);
    the forward algorithm of the others is IMPLICIT_GEMM (cheapest per call on the H200) below
    IMPLICIT_GEMM_BELOW_FLOPS, cuDNN's heuristics' choice from it; the workspace holds a chunk's columns."""
    require("gpu")
    from kernels.runtime import cudnn

    asked = []  # (direction, workspace limit, preferred) of each find_algorithm call
    find_algorithm = cudnn.find_algorithm

    def recording(direction, handle, descriptors, conv, dtype, limit, preferred=None, tensor_ops=False):
        asked.append((direction, limit, preferred))
        return find_algorithm(direction, handle, descriptors, conv, dtype, limit, preferred, tensor_ops)

    monkeypatch.setattr(cudnn, "find_algorithm", recording)
    dev = Dev("gpu")
    large = ((4, 160, 40, 40), Conv2DAttrs(160, 3, 3, 1, 1, 1, 1))  # 1.47 GFLOP
    above = [large, _GPU_CONFIGS[1]]  # at or above IMPLICIT_GEMM_BELOW_FLOPS: 1.47 GFLOP, and the C2f 3x3's 59 MFLOP
    try:
        for dims, attrs in _GPU_CONFIGS + [((1, 8, 20, 20), Conv2DAttrs(12, 3, 3, 2, 2, 1, 1, groups=4)), large]:
            for dtype in (np.float32, np.float64):
                asked.clear()
                state = conv_2d.init_kernel(dev.handle, attrs, TensorShape(dims, dtype),
                                            TensorShape(conv_2d.output_dims(attrs, dims), dtype))
                expected = _state(dims, attrs, dtype)
                assert state.paths == expected.paths and state.chunk == expected.chunk
                if state.paths["forward"] == "cudnn":
                    small = conv_2d.plan.forward_flops(state) < conv_2d.plan.IMPLICIT_GEMM_BELOW_FLOPS
                    assert ("forward", conv_2d.plan.workspace_limit(state),
                            cudnn.FWD_ALGO_IMPLICIT_GEMM if small else None) in asked
                    assert small == ((dims, attrs) not in above)
                    if small:
                        assert state.algorithms["forward"].algo == cudnn.FWD_ALGO_IMPLICIT_GEMM
                    assert state.algorithms["forward"].algo in cudnn.EXACT_FWD_ALGOS
                if state.paths["backward_data"] == "columns":
                    _, _, _, p, k = conv_2d.plan._sizes(state)
                    assert state.workspace_size >= state.chunk * k * p * np.dtype(dtype).itemsize
                conv_2d.cleanup_kernel(dev.handle, state)
    finally:
        dev.handle.close()


def test_no_gemm_path_needs_no_workspace():
    """Grouped (not depthwise) convolutions stay on cuDNN in every direction: the GEMM workspace is empty."""
    state = _state((2, 4, 6, 6), Conv2DAttrs(6, 3, 3, groups=2))
    assert set(state.paths.values()) == {"cudnn"}
    assert conv_2d.plan.workspace_elements(state) == 0


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16])
def test_half_precision_paths(dtype):
    """Half dtypes: a pointwise forward and input gradient are one cuBLAS GEMM each (a float32 sum rounded
    once); its filter gradient too for one image, but for a batch cuDNN, which sums the whole batch in
    float32 where the per-image GEMMs would round each image's part; other groups-1 convolutions in cuDNN
    throughout; depthwise convolutions keep their own kernels; the plans then match the CPU's sums."""
    for n in (1, 2):
        state = _state((n, 5, 6, 7), Conv2DAttrs(3, 1, 1), dtype)
        assert state.paths == {"forward": "gemm", "backward_data": "gemm",
                               "backward_filter": "gemm" if n == 1 else "cudnn"}
        assert state.chunk == 1 and conv_2d.plan.workspace_elements(state) == 0
        assert [(s.batch, s.beta) for s in conv_2d.plan.plan_forward(state)] == [(n, 0.0)]
        if n == 1:
            assert [(s.batch, s.beta) for s in conv_2d.plan.plan_backward_filter(state)] == [(1, 0.0)]
    state = _state((2, 3, 9, 8), Conv2DAttrs(4, 3, 3, 2, 2, 1, 1), dtype)
    assert state.paths == dict.fromkeys(conv_2d.plan.DIRECTIONS, "cudnn")
    assert conv_2d.plan.workspace_elements(state) == 0
    state32 = _state((2, 3, 9, 8), Conv2DAttrs(4, 3, 3, 2, 2, 1, 1), np.float32)
    assert "cudnn" not in (state32.paths["backward_data"], state32.paths["backward_filter"])
    depthwise = _state((2, 4, 9, 8), Conv2DAttrs(4, 3, 3, 2, 2, 1, 1, groups=4), dtype)
    assert depthwise.paths == dict.fromkeys(conv_2d.plan.DIRECTIONS, "depthwise")
