"""The GPU hot paths keep launch plans in the state (kernel, grid, scalar arguments,
buffers), keyed by what can change between calls: which gradients are None and the
arrays' address alignment. Without a device: each call through a kept plan must
launch exactly what a fresh state launches for the same arrays, whatever the calls
before it (aligned, then misaligned, then aligned again; a gradient dropped).
Launches are recorded on a fake device whose arrays are only addresses. And gpu.launch's rule for
dynamic shared memory, on a fake driver: a kernel is opted in where its static and dynamic shared memory
together pass the 48 KiB a block gets unasked."""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

from kernels import (
    BinaryOpType,
    ConcatAttrs,
    Conv2DAttrs,
    ElementBinaryAttrs,
    ElementUnaryAttrs,
    GradientReductionAttrs,
    Pool2DAttrs,
    PoolOp,
    SoftmaxAttrs,
    SplitAttrs,
    TransposeAttrs,
    UnaryOpType,
    UpsampleAttrs,
    UpsampleMode,
    activation,
    concat,
    conv_2d,
    element_binary,
    element_unary,
    gradient_reduction,
    pool_2d,
    softmax,
    split,
    transpose,
    upsample,
)
from kernels.runtime import core, cublas, gpu
from kernels.runtime.core import TensorShape

from .conftest import packed_launch_through


class FakeArray:
    def __init__(self, ptr, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes, self.ndim = self.size * self.dtype.itemsize, len(self.shape)
        self.data, self._c_contiguous, self.strides = types.SimpleNamespace(ptr=ptr, device_id=0), True, ()
        self.device = types.SimpleNamespace(id=0)  # what an op reads to allocate beside it (a carry buffer)


class FakeStream:
    """A GPU stream and handle of device 0."""

    device, ptr = 0, 0

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "FakeStream":
        return self

    def __exit__(self, *exc) -> None:
        pass


class Recorder:
    def __init__(self):
        self.top, self.calls = 1 << 20, []
        self.buffers: set[int] = set()  # addresses of the buffers states made

    def array(self, shape, dtype=np.float32, misalign=0):
        self.top = -(-self.top // 256) * 256 + misalign
        array = FakeArray(self.top, shape, dtype)
        self.top += array.nbytes + 256
        return array

    def empty(self, dims, dtype):
        array = self.array(dims if isinstance(dims, tuple) else (dims,), dtype)
        self.buffers.add(array.data.ptr)
        return array

    def encode(self, arg):
        if isinstance(arg, FakeArray):  # a state's buffer by its kind (each state has its own), the caller's by address
            if arg.data.ptr in self.buffers:
                return ("buffer", arg.shape, arg.dtype.name)
            return ("array", arg.data.ptr)
        if isinstance(arg, np.void):
            return ("ints", tuple(int(v) for v in arg["v"]))
        assert isinstance(arg, np.generic), type(arg)
        return (type(arg).__name__, arg.item())

    def launch(self, stream, kernel, grid, block, args, shared_mem=0):
        self.calls.append(("launch", kernel, grid, block, shared_mem, tuple(self.encode(a) for a in args)))


@pytest.fixture
def device(monkeypatch):
    recorder = Recorder()
    runtime = types.SimpleNamespace(
        memcpyAsync=lambda *args: recorder.calls.append(("memcpy",) + args),
        memsetAsync=lambda *args: recorder.calls.append(("memset",) + args),
        memcpyDeviceToDevice=3, CUDARuntimeError=RuntimeError)
    monkeypatch.setattr(gpu, "launch", recorder.launch)
    monkeypatch.setattr(gpu, "PackedLaunch", packed_launch_through(recorder.launch))
    monkeypatch.setattr(gpu, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)))
    monkeypatch.setattr(gpu, "device_empty", lambda dims, dtype, device: recorder.empty(tuple(dims), dtype))
    monkeypatch.setattr(gpu, "sm_count", lambda device: 132)  # an H200
    monkeypatch.setattr(gpu, "shared_memory_optin", lambda device: 227 * 1024)  # an H200's opt-in shared memory

    def function(module, name, device=None):
        assert name in module.name_expressions, name
        return name

    monkeypatch.setattr(gpu.CudaModule, "function", function)
    monkeypatch.setattr(activation.gpu, "_PLANS", {})  # plans of fake kernels must not outlive the test
    real_module = core._array_module
    monkeypatch.setattr(core, "_array_module", lambda a: "cupy" if isinstance(a, FakeArray) else real_module(a))
    return recorder


def _concat(device, dtype, misalign, drop):
    dims = [(1, 8, 4, 4), (1, 4, 4, 4), (1, 8, 4, 4)]
    attrs = ConcatAttrs(1, 3)
    xs = [device.array(d, dtype, misalign) for d in dims]
    y = device.array((1, 20, 4, 4), dtype)
    grads = [None if drop and i == 1 else device.array(d, dtype, misalign) for i, d in enumerate(dims)]
    shapes = ([TensorShape(d, dtype) for d in dims], TensorShape((1, 20, 4, 4), dtype))
    return concat, attrs, shapes, (xs, y), (None, y, None, grads)


def _split(device, dtype, misalign, drop):
    attrs = SplitAttrs((4, 4, 8), 2)
    dims = (2, 5, 16, 10)
    outs = split.output_dims(attrs, dims)
    x, ys = device.array(dims, dtype, misalign), [device.array(d, dtype) for d in outs]
    shapes = (TensorShape(dims, dtype), [TensorShape(d, dtype) for d in outs])
    return split, attrs, shapes, (x, ys), (None, ys, None, None if drop else device.array(dims, dtype, misalign))


def _gradient_reduction(device, dtype, misalign, drop):
    dims = (1, 8, 5, 5)
    xs = [device.array(dims, dtype, misalign if i == 2 else 0) for i in range(14)]
    y = device.array(dims, dtype)
    grads = [None if drop and i % 3 == 0 else device.array(dims, dtype, misalign) for i in range(14)]
    return (gradient_reduction, GradientReductionAttrs(), ([TensorShape(dims, dtype)] * 14, TensorShape(dims, dtype)),
            (xs, y), (None, y, None, grads))


def _pool(attrs, dims):
    def make(device, dtype, misalign, drop):
        out = pool_2d.output_dims(attrs, dims)
        x, y = device.array(dims, dtype, misalign), device.array(out, dtype)
        shapes = (TensorShape(dims, dtype), TensorShape(out, dtype))
        return (pool_2d, attrs, shapes, (x, y),
                (y, device.array(out, dtype, misalign), x, None if drop else device.array(dims, dtype)))
    return make


def _binary(op_type, lhs_dims, rhs_dims):
    def make(device, dtype, misalign, drop):
        out = element_binary.broadcast_dims(lhs_dims, rhs_dims)
        lhs, rhs, y = device.array(lhs_dims, dtype, misalign), device.array(rhs_dims, dtype), device.array(out, dtype)
        shapes = (TensorShape(lhs_dims, dtype), TensorShape(rhs_dims, dtype), TensorShape(out, dtype))
        return (element_binary, ElementBinaryAttrs(op_type), shapes, (lhs, rhs, y),
                (y, device.array(out, dtype), lhs, None if drop else device.array(lhs_dims, dtype), rhs,
                 device.array(rhs_dims, dtype, misalign)))
    return make


def _unary(op_type, scalar=None):
    def make(device, dtype, misalign, drop):
        dims = (1, 8, 33)
        x = device.array(dims, dtype, misalign)
        shapes = (TensorShape(dims, dtype), TensorShape(dims, dtype))
        return (element_unary, ElementUnaryAttrs(op_type, scalar), shapes, (x, device.array(dims, dtype)),
                (None, device.array(dims, dtype), x, None if drop else device.array(dims, dtype)))
    return make


def _softmax(dims, dim):
    def make(device, dtype, misalign, drop):
        x, y = device.array(dims, dtype, misalign), device.array(dims, dtype)
        shapes = (TensorShape(dims, dtype), TensorShape(dims, dtype))
        return (softmax, SoftmaxAttrs(dim), shapes, (x, y),
                (y, device.array(dims, dtype), None, None if drop else device.array(dims, dtype)))
    return make


def _upsample(mode, scale):
    def make(device, dtype, misalign, drop):
        attrs, dims = UpsampleAttrs(scale, mode), (1, 3, 5, 6)
        out = upsample.output_dims(attrs, dims)
        shapes = (TensorShape(dims, dtype), TensorShape(out, dtype))
        return (upsample, attrs, shapes, (device.array(dims, dtype), device.array(out, dtype, misalign)),
                (None, device.array(out, dtype, misalign), None, None if drop else device.array(dims, dtype)))
    return make


def _transpose(permutation, dims):
    def make(device, dtype, misalign, drop):
        attrs = TransposeAttrs(permutation)
        out = tuple(dims[p] for p in permutation)
        shapes = (TensorShape(dims, dtype), TensorShape(out, dtype))
        return (transpose, attrs, shapes, (device.array(dims, dtype, misalign), device.array(out, dtype)),
                (None, device.array(out, dtype, misalign), None, None if drop else device.array(dims, dtype)))
    return make


CALLS = {
    "concat": _concat, "split": _split, "gradient_reduction": _gradient_reduction,
    "pool_max_sppf": _pool(Pool2DAttrs(5, 5, 1, 1, 2, 2, PoolOp.MAX), (1, 8, 20, 20)),
    "pool_max_silu_direct": _pool(Pool2DAttrs(31, 31, 1, 1, 15, 15, PoolOp.MAX, activation="SILU"), (1, 2, 40, 40)),
    "pool_avg_relu": _pool(Pool2DAttrs(2, 2, 2, 2, 0, 0, PoolOp.AVG, count_include_pad=False, activation="RELU"),
                           (1, 3, 8, 8)),
    "binary_add_same": _binary(BinaryOpType.ADD, (1, 8, 16, 16), (1, 8, 16, 16)),
    "binary_mul_channel": _binary(BinaryOpType.MUL, (1, 8, 16, 16), (1, 8, 1, 1)),
    "binary_div_rows": _binary(BinaryOpType.DIV, (2, 1, 64), (3, 1)),
    "binary_mul_channel_rows": _binary(BinaryOpType.MUL, (1, 4, 32, 40), (1, 4, 1, 1)),
    "binary_add_rows_no_vectors": _binary(BinaryOpType.ADD, (2, 1, 1037), (1, 3, 1037)),
    "binary_max_chunks": _binary(BinaryOpType.MAX, (4, 256, 40), (1,)),
    "binary_sub_empty": _binary(BinaryOpType.SUB, (0, 3), (1, 3)),
    "unary_silu": _unary(UnaryOpType.SILU), "unary_pow": _unary(UnaryOpType.POW, 3.0),
    "unary_identity": _unary(UnaryOpType.IDENTITY), "unary_scalar_add": _unary(UnaryOpType.SCALAR_ADD, 2.5),
    "softmax_rows": _softmax((1, 5, 40, 40), -1), "softmax_columns": _softmax((2, 3000, 2), 1),
    "upsample_nearest_x2": _upsample(UpsampleMode.NEAREST, 2), "upsample_bilinear_x3": _upsample(UpsampleMode.BILINEAR, 3),
    "transpose_tiled": _transpose((0, 2, 3, 1), (1, 5, 12, 40)), "transpose_gather": _transpose((1, 2, 0, 3), (3, 4, 5, 6)),
    "transpose_copy": _transpose((0, 2, 1), (3, 1, 7)),
}


def _call(device, module, attrs, state, forward_args, backward_args):
    stream = FakeStream()
    start = len(device.calls)
    module.forward_kernel(stream, stream, state, attrs, *forward_args)
    module.backward_kernel(stream, stream, state, attrs, *backward_args)
    return device.calls[start:]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(CALLS))
def test_kept_plans_launch_what_a_fresh_state_does(device, name, dtype):
    kept = None
    for misalign, drop in ((0, False), (0, False), (4, False), (0, True), (4, True), (0, False)):
        module, attrs, shapes, forward_args, backward_args = CALLS[name](device, dtype, misalign, drop)
        if kept is None:
            kept = module.init_kernel(FakeStream(), attrs, *shapes)
        got = _call(device, module, attrs, kept, forward_args, backward_args)
        fresh = module.init_kernel(FakeStream(), attrs, *shapes)
        expected = _call(device, module, attrs, fresh, forward_args, backward_args)
        assert got, "nothing launched"
        assert got == expected, f"misalign {misalign}, drop {drop}"


@pytest.mark.parametrize("name", ["transpose_tiled", "transpose_gather", "transpose_copy"])
def test_transpose_launches_its_plan(device, name):
    """Each direction launches what transpose.plan.gpu_plan says (kernel, grid, block, source, destination,
    then the plan's arguments), or copies where the plan is a copy: the packed launch keeps the plan's order."""
    module, attrs, shapes, forward_args, backward_args = CALLS[name](device, np.float32, 0, False)
    state = module.init_kernel(FakeStream(), attrs, *shapes)
    calls = _call(device, module, attrs, state, forward_args, backward_args)
    expected = []
    for dims, permutation, (source, destination) in (
            (shapes[0].dims, attrs.permutation, forward_args), (shapes[1].dims, attrs.inverse, backward_args[1::2])):
        plan = transpose.plan.gpu_plan(dims, permutation, np.dtype(np.float32), 132)
        if plan[0] == "copy":
            assert calls[len(expected)][0] == "memcpy"
            expected.append(calls[len(expected)])
            continue
        _, kernel, grid, block, args = plan
        expected.append(("launch", kernel, grid, block, 0,
                         tuple(device.encode(a) for a in (source, destination) + tuple(args))))
    assert calls == expected


def _carry_out_rows(kernel, grid, args, memory, itemsize):
    """binary_rows or binary_grad_along_rows of element_binary.cu, carried out in NumPy from a recorded launch
    (arrays encoded by address, `memory` their float32 host values by address; each result rounded to the
    dtype, as narrow<T> does): the launch's arguments in the kernel's order, its rows' offsets through the
    outer dims (sizes innermost first, each dim's divider that of plan.divider), and the vector flag set
    exactly where the row length is a multiple of a 16-byte vector and every address is aligned to one."""
    along = kernel.startswith("binary_grad_along_rows")
    count = 4 if along else 3
    pointers = [a[1] for a in args[:count]]
    rows, inner, op = (a[1] for a in args[count:count + 3])
    rest = args[count + 3:]
    side, need_lhs, need_rhs = (a[1] for a in rest[:3]) if along else (None, 1, 1)
    rest = rest[3:] if along else rest
    lhs_inner, rhs_inner, rank = (a[1] for a in rest[:3])
    sizes, divs, out_strides, lhs_strides, rhs_strides = (a[1][:rank] for a in rest[3:8])
    (_, vectorized), = rest[8:]
    assert len(rest) == 9
    assert divs == tuple(element_binary.plan.divider(size) for size in sizes)
    per = 16 // itemsize
    assert vectorized == int(inner % per == 0 and all(ptr % 16 == 0 for ptr in pointers))
    assert grid[1] == min(rows, gpu.MAX_GRID_YZ) and grid[0] >= 1
    lhs, rhs = memory[pointers[0]], memory[pointers[1]]
    within = np.arange(inner)
    for row in range(rows):
        offsets, rest_of_row = [0, 0, 0], row
        for size, strides in zip(sizes, zip(out_strides, lhs_strides, rhs_strides)):  # innermost first
            rest_of_row, coordinate = divmod(rest_of_row, size)
            offsets = [o + coordinate * s for o, s in zip(offsets, strides)]
        out0, lhs0, rhs0 = offsets
        l = lhs[lhs0 + within * lhs_inner] if need_lhs else 0
        r = rhs[rhs0 + within * rhs_inner] if need_rhs else 0
        if along:
            g = memory[pointers[2]][out0 + within]
            value = g if op in (BinaryOpType.ADD.value, BinaryOpType.SUB.value) and side == 0 else \
                -g if op == BinaryOpType.SUB.value else g * (r if side == 0 else l)
            assert op in (BinaryOpType.ADD.value, BinaryOpType.SUB.value, BinaryOpType.MUL.value)
        else:
            value = {BinaryOpType.ADD.value: np.add, BinaryOpType.SUB.value: np.subtract,
                     BinaryOpType.MUL.value: np.multiply}[op](l, r)
        memory[pointers[-1]][out0 + within] = value


@pytest.mark.parametrize("op_type, lhs_dims, rhs_dims, dtype, misalign", [
    (BinaryOpType.MUL, (2, 4, 8, 130), (2, 4, 1, 1), np.float32, 0),  # vectors: rows of 1040
    (BinaryOpType.MUL, (2, 4, 8, 130), (2, 4, 1, 1), np.float32, 4),  # a misaligned lhs: elements
    (BinaryOpType.MUL, (3, 2, 1024), (1, 2, 1024), np.float16, 0),  # both sides along the rows, halves
    (BinaryOpType.ADD, (2, 3, 1037), (1, 3, 1037), np.float32, 0),  # no vector divides the rows: elements
    (BinaryOpType.SUB, (3, 1), (3, 1100), np.float32, 0),  # the lhs one value a row; rhs_grad along rows
])
def test_element_binary_rows_launches_carry_out_the_broadcast(device, op_type, lhs_dims, rhs_dims, dtype, misalign):
    """The launches of binary_rows and binary_grad_along_rows, carried out from their recorded arguments
    (_carry_out_rows), give NumPy's broadcast and its gradient of the side broadcast along nothing: the
    arguments in the kernels' order, the outer dims' offsets and the vector flag. Without a device."""
    out_dims = element_binary.broadcast_dims(lhs_dims, rhs_dims)
    shapes = (TensorShape(lhs_dims, dtype), TensorShape(rhs_dims, dtype), TensorShape(out_dims, dtype))
    rng = np.random.default_rng(3)
    arrays, memory = {}, {}
    for name, dims, shift in (("lhs", lhs_dims, misalign), ("rhs", rhs_dims, 0), ("output", out_dims, 0),
                              ("grad", out_dims, 0), ("lhs_grad", lhs_dims, misalign), ("rhs_grad", rhs_dims, 0)):
        arrays[name] = device.array(dims, dtype, shift)
        values = rng.standard_normal(dims).astype(dtype) if name in ("lhs", "rhs", "grad") else np.full(dims, np.nan)
        memory[arrays[name].data.ptr] = values.astype(np.float32).reshape(-1)
    host = {name: memory[a.data.ptr].reshape(a.shape) for name, a in arrays.items()}
    attrs = ElementBinaryAttrs(op_type)
    state = element_binary.init_kernel(FakeStream(), attrs, *shapes)
    along = 0 if lhs_dims == out_dims else 1  # the side broadcast along nothing
    gradients = [None, None]
    gradients[along] = arrays[("lhs_grad", "rhs_grad")[along]]
    calls = _call(device, element_binary, attrs, state, (arrays["lhs"], arrays["rhs"], arrays["output"]),
                  (arrays["output"], arrays["grad"], arrays["lhs"], gradients[0], arrays["rhs"], gradients[1]))
    kernels = [call[1].split("<")[0] for call in calls]
    assert kernels == ["binary_rows", "binary_grad_along_rows"], kernels
    for _, kernel, grid, _, _, args in calls:
        _carry_out_rows(kernel, grid, args, memory, np.dtype(dtype).itemsize)
    narrow = lambda a: a.astype(dtype).astype(np.float32)  # noqa: E731  (narrow<T> of a float32 result)
    lhs, rhs, grad = host["lhs"], host["rhs"], host["grad"]
    expected = {BinaryOpType.ADD: np.add, BinaryOpType.SUB: np.subtract, BinaryOpType.MUL: np.multiply}[op_type](
        lhs, rhs)
    got = narrow(host["output"])
    assert np.array_equal(got, narrow(expected))
    if op_type is BinaryOpType.MUL:
        expected_grad = grad * (rhs if along == 0 else lhs)
    else:
        expected_grad = grad if along == 0 or op_type is BinaryOpType.ADD else -grad
    assert np.array_equal(narrow(host[("lhs_grad", "rhs_grad")[along]]), narrow(np.broadcast_to(expected_grad, out_dims)))


# --------------------------------------------------------------------------- conv_2d


class FakeHandle(FakeStream):
    """A GPU handle of device 0 whose workspace is one buffer, the same at each call."""

    def __init__(self, recorder):
        self.recorder, self.buffer = recorder, None

    def workspace(self, size):
        if self.buffer is None:
            self.buffer = self.recorder.array((max(size, 1),), np.uint8)
        return self.buffer


def _conv_init(handle, state):
    """conv_2d.gpu.init without cuDNN: the paths and the depthwise plans (cuDNN's descriptors and algorithms
    are never used by the paths these cases take)."""
    conv_plan = conv_2d.plan
    conv_plan.choose_paths(state)
    if state.paths["forward"] == "depthwise":
        conv_plan.plan_depthwise(state, gpu.sm_count(state.device))


# (attrs, input dims, dtypes): each of the depthwise forward's three kernels and the backward's, the epilogue
# of a state without backward, and the half bias (conv_bias_activation without an activation) with bias_grad.
CONV_CASES = {
    "depthwise_rows_3x3_silu": (Conv2DAttrs(8, 3, 3, padding_h=1, padding_w=1, groups=8, use_bias=True,
                                            activation="SILU"), (2, 8, 12, 12),
                                (np.float32, np.float64, np.float16)),
    "depthwise_rows_7x7": (Conv2DAttrs(6, 7, 7, padding_h=3, padding_w=3, groups=6, use_bias=True), (2, 6, 9, 10),
                           (np.float32, np.float16)),
    "depthwise_rows_3x3_s2_taps": (Conv2DAttrs(66, 3, 3, 2, 2, 1, 1, groups=66, use_bias=True), (1, 66, 9, 9),
                                   (np.float32,)),
    "depthwise_tiled_5x5_relu_inference": (Conv2DAttrs(8, 5, 5, padding_h=2, padding_w=2, groups=8, use_bias=True,
                                                       activation="RELU", backward=False), (1, 8, 9, 9),
                                           (np.float32, np.float64)),
    "depthwise_untiled_dilation_55": (Conv2DAttrs(2, 3, 3, dilation_h=55, dilation_w=55, groups=2, use_bias=True),
                                      (1, 2, 111, 112), (np.float32,)),
    "pointwise_epilogue_silu": (Conv2DAttrs(16, 1, 1, use_bias=True, activation="SILU", backward=False), (2, 8, 6, 6),
                                (np.float32, np.float64)),
    "pointwise_half_bias": (Conv2DAttrs(16, 1, 1, use_bias=True), (1, 8, 6, 6), (np.float16,)),
}


@pytest.mark.parametrize("name, dtype", [(name, dtype) for name, (_, _, dtypes) in CONV_CASES.items()
                                         for dtype in dtypes])
def test_conv_2d_kept_launches_launch_what_a_fresh_state_does(device, monkeypatch, name, dtype):
    """conv_2d keeps its launches in state.launches, keyed by the bias given and the activation fused: each
    call through a kept state, with new arrays, misaligned or not, the bias given or not (inside
    core.arrays_checked, where a use_bias state may be called without one), gradients dropped, launches
    exactly what a fresh state launches for the same arrays."""
    monkeypatch.setattr(conv_2d.gpu, "init", _conv_init)
    monkeypatch.setattr(cublas, "gemm_strided_batched",
                        lambda stream, handle, *args: device.calls.append(("gemm",) + args))
    attrs, dims, _ = CONV_CASES[name]
    out = conv_2d.output_dims(attrs, dims)
    shapes = (TensorShape(dims, dtype), TensorShape(out, dtype))
    handle = FakeHandle(device)
    kept = conv_2d.init_kernel(handle, attrs, *shapes)
    for misalign, with_bias, drop in ((0, True, False), (0, True, False), (4, False, False), (0, True, True),
                                      (4, False, True), (0, True, False)):
        x, w = device.array(dims, dtype, misalign), device.array(conv_2d.filter_dims(attrs, dims[1]), dtype)
        bias = device.array((attrs.out_channels,), dtype, misalign) if with_bias else None
        forward_args = (x, w, bias, device.array(out, dtype))
        backward_args = (None, device.array(out, dtype), x, device.array(dims, dtype, misalign), w,
                         None if drop else device.array(w.shape, dtype),
                         None if drop or bias is None else device.array(bias.shape, dtype))
        got = _conv_call(device, handle, kept, attrs, forward_args, backward_args)
        fresh = conv_2d.init_kernel(handle, attrs, *shapes)
        expected = _conv_call(device, handle, fresh, attrs, forward_args, backward_args)
        assert got, "nothing launched"
        assert got == expected, f"misalign {misalign}, bias {with_bias}, drop {drop}"
    assert len(kept.launches) >= 2  # with the bias and without it, or the backward's too


def _conv_call(device, handle, state, attrs, forward_args, backward_args):
    """A forward (and, for a state made for one, a backward) of conv_2d; without a bias inside
    core.arrays_checked, where a use_bias state takes None. The calls recorded."""
    stream = FakeStream()
    start = len(device.calls)
    with core.arrays_checked() if forward_args[2] is None else contextlib.nullcontext():
        conv_2d.forward_kernel(stream, handle, state, attrs, *forward_args)
        if attrs.backward:
            conv_2d.backward_kernel(stream, handle, state, attrs, *backward_args)
    return device.calls[start:]


# --------------------------------------------------------------------------- dynamic shared memory


@pytest.mark.parametrize("static, dynamic, opted_in", [
    (0, 0, False), (3 * 1024, 44 * 1024, False),  # together within the 48 KiB a block gets unasked
    (3 * 1024, 45 * 1024 + 1, True),  # together past it, the dynamic part alone not (top_k's float64 sort of 2000)
    (0, 48 * 1024 + 1, True), (9484, 11000 * 4, True),  # a float32 top_k row of 11000 cached keys beside 9.3 KiB
])
def test_launch_opts_a_kernel_in_by_its_static_and_dynamic_shared_memory(monkeypatch, static, dynamic, opted_in):
    """A block gets gpu.SHARED_MEMORY_LIMIT of shared memory unasked, static and dynamic together: launch lets a
    kernel use `dynamic` bytes (cuFuncSetAttribute) where the two pass it, once per kernel and larger size, and
    then launches with that much. Without a device: CuPy's driver calls and the kernel are recorded."""
    calls = []
    driver = types.SimpleNamespace(
        CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES="static", CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="max dynamic",
        CUDADriverError=RuntimeError,
        funcGetAttribute=lambda attribute, ptr: calls.append(("get", attribute, ptr)) or static,
        funcSetAttribute=lambda ptr, attribute, value: calls.append(("set", ptr, attribute, value)))
    monkeypatch.setattr(gpu, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(driver=driver)))
    monkeypatch.setattr(gpu, "_LAUNCHABLE", {})

    class Kernel:
        ptr = 0x1234

        def __call__(self, grid, block, args, shared_mem, stream):
            calls.append(("launch", grid, block, shared_mem))

    stream = types.SimpleNamespace(cupy_stream="the stream")
    for _ in range(2):  # the second launch of the same size asks nothing
        gpu.launch(stream, Kernel(), 3, 256, (), shared_mem=dynamic)
    asked = [("get", "static", 0x1234)] if dynamic else []
    set_ = [("set", 0x1234, "max dynamic", dynamic)] if opted_in else []
    assert calls == asked + set_ + [("launch", (3,), (256,), dynamic)] * 2
