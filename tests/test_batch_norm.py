"""batch_norm behaviour beyond the golden cases: the running statistics as a caller
sees them, gradients skipped with None, the cumulative average over more steps,
zero-size batches, and (on the GPU) agreement with the CPU and run-to-run
determinism on shapes that the GPU reduces in many parts."""

import numpy as np
import pytest

from conformance.case import pattern, ulp
from conformance.compare import compare
from kernels import BatchNormAttrs, BatchNormMode, StateError, TensorShape, batch_norm
from kernels.runtime.core import BFLOAT16, compute_dtype

from .conftest import DEVICE_PARAMS, Dev, require


def _shape(dims, dtype=np.float32):
    return TensorShape(dims, dtype)


def _reference_forward(x, mean, var, eps, gamma, beta):
    """(x - mean) / sqrt(var + eps) * gamma + beta per channel (axis 1), in float64."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    x = x.astype(np.float64)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * gamma.reshape(shape) + beta.reshape(shape)


def test_running_statistics_read_and_overwritten(dev):
    attrs = BatchNormAttrs(eps=0.25, momentum=0.5)
    dims = (2, 3, 2, 4)
    state = batch_norm.init_kernel(dev.handle, attrs, _shape(dims), _shape(dims))
    assert np.array_equal(dev.host(state.running_mean), np.zeros(3, np.float32))
    assert np.array_equal(dev.host(state.running_var), np.ones(3, np.float32))
    x = pattern(dims, 13, 0.5).astype(np.float32)
    gamma, beta = np.array([1, -0.5, 2], np.float32), np.array([0.25, 0, -1], np.float32)
    output = dev.array(np.zeros(dims, np.float32))
    args = (dev.array(x), dev.array(gamma), dev.array(beta), output)
    # in place
    dev.assign(state.running_mean, np.array([0.5, -1, 2], np.float32))
    dev.assign(state.running_var, np.array([0.75, 3.75, 15.75], np.float32))
    batch_norm.forward_kernel(dev.stream, dev.handle, state, attrs, *args, training=False)
    dev.stream.synchronize()
    expected = _reference_forward(x, np.array([0.5, -1, 2]), np.array([0.75, 3.75, 15.75]), 0.25, gamma, beta)
    assert np.array_equal(dev.host(output), expected.astype(np.float32))  # var + eps = 1, 4, 16: all exact
    # by assignment: the new arrays are used, and a training step updates them
    state.running_mean = dev.array(np.zeros(3, np.float32))
    state.running_var = dev.array(np.full(3, 2, np.float32))
    batch_norm.forward_kernel(dev.stream, dev.handle, state, attrs, *args, training=True)
    dev.stream.synchronize()
    channels = x.transpose(1, 0, 2, 3).reshape(3, -1).astype(np.float64)
    assert np.array_equal(dev.host(state.running_mean), (0.5 * channels.mean(1)).astype(np.float32))
    assert np.array_equal(dev.host(state.running_var), (0.5 * channels.var(1, ddof=1) + 1.0).astype(np.float32))
    assert state.num_batches_tracked == 1
    batch_norm.cleanup_kernel(dev.handle, state)
    assert state.running_mean is None and state.closed


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16], ids=["f16", "bf16"])
def test_half_data_with_float32_statistics_and_parameters(dev, dtype):
    """Half input and output, float32 gamma, beta, running statistics and parameter gradients (mixed
    precision); values near 65504 whose sum and squares overflow in half arithmetic: the running variance
    (about 4.5e9) is float32, the output is the float64 normalization rounded once to the dtype."""
    attrs = BatchNormAttrs(eps=0.25, momentum=0.5)
    dims = (2, 2, 2, 4)
    state = batch_norm.init_kernel(dev.handle, attrs, _shape(dims, dtype), _shape(dims, dtype))
    assert state.running_mean.dtype == state.running_var.dtype == np.float32
    x = np.array([65280.0, -65280.0, 60160.0, -60160.0] * 8).reshape(dims)  # channel 0: mean 0, var 3.9e9
    x[:, 1] = np.abs(x[:, 1])  # channel 1: all positive, a sum of 16 near 65504 (1e6: inf in half)
    gamma, beta = np.array([1, -0.5], np.float32), np.array([0.25, 0], np.float32)
    output = dev.array(np.zeros(dims, dtype))
    batch_norm.forward_kernel(dev.stream, dev.handle, state, attrs, dev.array(x.astype(dtype)), dev.array(gamma),
                              dev.array(beta), output)
    gamma_grad, beta_grad = dev.array(np.zeros(2, np.float32)), dev.array(np.zeros(2, np.float32))
    input_grad = dev.array(np.zeros(dims, dtype))
    output_grad = np.ones(dims, dtype)
    batch_norm.backward_kernel(dev.stream, dev.handle, state, attrs, output, dev.array(output_grad),
                               dev.array(x.astype(dtype)), input_grad, dev.array(gamma), dev.array(beta), gamma_grad,
                               beta_grad)
    dev.stream.synchronize()
    channels = x.transpose(1, 0, 2, 3).reshape(2, -1)
    mean, var = channels.mean(1), channels.var(1)
    assert np.array_equal(dev.host(state.running_mean), (0.5 * mean).astype(np.float32))
    assert np.array_equal(dev.host(state.running_var), (0.5 * channels.var(1, ddof=1) + 0.5).astype(np.float32))
    got = dev.host(output)
    assert got.dtype == dtype and np.isfinite(got.astype(np.float32)).all()
    expected = _reference_forward(x, mean, var, 0.25, gamma, beta).astype(dtype)
    assert compare(got, expected, ulp(1)) is None
    assert np.array_equal(dev.host(beta_grad), np.full(2, 16, np.float32))  # a sum of 16 ones
    assert dev.host(gamma_grad).dtype == np.float32 and dev.host(input_grad).dtype == dtype
    batch_norm.cleanup_kernel(dev.handle, state)


@pytest.mark.parametrize("mode", [BatchNormMode.SPATIAL, BatchNormMode.PER_ACTIVATION])
@pytest.mark.parametrize("training", [True, False])
def test_none_gradients_are_skipped(dev, mode, training):
    attrs = BatchNormAttrs(eps=1e-3, momentum=0.03, mode=mode, activation="SILU")
    dims = (4, 3, 2, 5)
    stat_dims = (3,) if mode is BatchNormMode.SPATIAL else dims[1:]
    x, g = dev.array(pattern(dims, 13, 0.5).astype(np.float32)), dev.array(pattern(dims, 11, 0.25, 3).astype(np.float32))
    gamma = dev.array(pattern(stat_dims, 9, 0.5, 5).astype(np.float32))
    beta = dev.array(pattern(stat_dims, 5, 0.25).astype(np.float32))
    state = batch_norm.init_kernel(dev.handle, attrs, _shape(dims), _shape(dims))
    output = dev.array(np.zeros(dims, np.float32))
    batch_norm.forward_kernel(dev.stream, dev.handle, state, attrs, x, gamma, beta, output, training=training)

    def backward(with_input, with_gamma, with_beta):
        grads = [dev.array(np.full(d, np.nan, np.float32)) if w else None
                 for w, d in ((with_input, dims), (with_gamma, stat_dims), (with_beta, stat_dims))]
        batch_norm.backward_kernel(dev.stream, dev.handle, state, attrs, output, g, x, grads[0], gamma, beta,
                                   grads[1], grads[2])
        dev.stream.synchronize()
        return [None if a is None else dev.host(a) for a in grads]

    full = backward(True, True, True)
    for flags in ((True, False, False), (False, True, False), (False, False, True), (False, False, False)):
        partial = backward(*flags)
        for got, want in zip(partial, full):
            if got is not None:
                assert np.array_equal(got, want)
    batch_norm.cleanup_kernel(dev.handle, state)


def test_inference_backward_is_the_fixed_statistics_gradient(dev):
    attrs = BatchNormAttrs(eps=0.5, momentum=0.25)
    dims = (2, 2, 2, 4)
    x, g = pattern(dims, 13, 0.5).astype(np.float32), pattern(dims, 11, 0.25, 3).astype(np.float32)
    gamma, beta = np.array([2, -0.5], np.float32), np.array([1, 0.5], np.float32)
    state = batch_norm.init_kernel(dev.handle, attrs, _shape(dims), _shape(dims))
    dev.assign(state.running_var, np.array([3.5, 0.5], np.float32))  # var + eps = 4 and 1: invstd 0.5 and 1
    output = dev.array(np.zeros(dims, np.float32))
    batch_norm.forward_kernel(dev.stream, dev.handle, state, attrs, dev.array(x), dev.array(gamma), dev.array(beta),
                              output, training=False)
    input_grad = dev.array(np.zeros(dims, np.float32))
    gamma_grad, beta_grad = dev.array(np.zeros(2, np.float32)), dev.array(np.zeros(2, np.float32))
    batch_norm.backward_kernel(dev.stream, dev.handle, state, attrs, output, dev.array(g), dev.array(x), input_grad,
                               dev.array(gamma), dev.array(beta), gamma_grad, beta_grad)
    dev.stream.synchronize()
    invstd = np.array([0.5, 1.0], np.float32).reshape(1, 2, 1, 1)
    assert np.array_equal(dev.host(input_grad), g * invstd * gamma.reshape(1, 2, 1, 1))
    assert np.array_equal(dev.host(gamma_grad), (g * x * invstd).sum(axis=(0, 2, 3)))
    assert np.array_equal(dev.host(beta_grad), g.sum(axis=(0, 2, 3)))
    assert np.array_equal(dev.host(state.running_mean), np.zeros(2, np.float32))  # inference updates nothing
    batch_norm.cleanup_kernel(dev.handle, state)


def test_cumulative_average_over_four_steps(dev):
    attrs = BatchNormAttrs(affine=False, momentum=None, mode=BatchNormMode.PER_ACTIVATION)
    dims = (4, 2, 3)
    state = batch_norm.init_kernel(dev.handle, attrs, _shape(dims, np.float64), _shape(dims, np.float64))
    output = dev.array(np.zeros(dims))
    batches = [pattern(dims, 13, 0.5, offset) for offset in range(4)]
    for batch in batches:
        batch_norm.forward_kernel(dev.stream, dev.handle, state, attrs, dev.array(batch), None, None, output)
    dev.stream.synchronize()
    assert state.num_batches_tracked == 4
    np.testing.assert_allclose(dev.host(state.running_mean), np.mean([b.mean(0) for b in batches], 0), rtol=1e-15,
                               atol=1e-15)
    np.testing.assert_allclose(dev.host(state.running_var), np.mean([b.var(0, ddof=1) for b in batches], 0),
                               rtol=1e-15)
    batch_norm.cleanup_kernel(dev.handle, state)


def test_zero_batch_does_nothing(dev):
    attrs = BatchNormAttrs()
    dims = (0, 3, 2, 2)
    state = batch_norm.init_kernel(dev.handle, attrs, _shape(dims), _shape(dims))
    empty = dev.array(np.zeros(dims, np.float32))
    gamma, beta = dev.array(np.ones(3, np.float32)), dev.array(np.zeros(3, np.float32))
    batch_norm.forward_kernel(dev.stream, dev.handle, state, attrs, empty, gamma, beta, empty)
    gamma_grad, beta_grad = dev.array(np.full(3, np.nan, np.float32)), dev.array(np.full(3, np.nan, np.float32))
    batch_norm.backward_kernel(dev.stream, dev.handle, state, attrs, empty, empty, empty, empty, gamma, beta,
                               gamma_grad, beta_grad)
    dev.stream.synchronize()
    assert state.num_batches_tracked == 0
    assert np.array_equal(dev.host(state.running_mean), np.zeros(3, np.float32))
    assert np.array_equal(dev.host(gamma_grad), np.zeros(3, np.float32))  # sums over no values
    assert np.array_equal(dev.host(beta_grad), np.zeros(3, np.float32))
    batch_norm.cleanup_kernel(dev.handle, state)


@pytest.mark.parametrize("dims", [(1, 3, 8, 8), (2, 3, 40, 60), (4, 5)], ids=["one_part", "partials", "rank2"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_state_without_backward_keeps_nothing_and_writes_the_same_bits(dev, dims, training, dtype):
    """attrs.backward=False (inference only): the forward's output and running statistics are the bits of a
    state made for a backward, no pre-activation is kept, and a backward is refused with StateError."""
    stat_dims = (dims[1],)
    x = dev.array(pattern(dims, 13, 0.75).astype(dtype))
    gamma = dev.array(pattern(stat_dims, 9, 0.5, 5).astype(dtype))
    beta = dev.array(pattern(stat_dims, 7, 0.25).astype(dtype))
    results = []
    for backward in (True, False):
        attrs = BatchNormAttrs(eps=1e-3, momentum=0.03, activation="SILU", backward=backward)
        state = batch_norm.init_kernel(dev.handle, attrs, _shape(dims, dtype), _shape(dims, dtype))
        dev.assign(state.running_mean, np.array([0.5, -0.25, 0.125][:dims[1]] + [0.0] * (dims[1] - 3), dtype))
        dev.assign(state.running_var, np.linspace(0.5, 2, dims[1]).astype(dtype))
        output = dev.array(np.full(dims, np.nan, dtype))
        for _ in range(2):
            batch_norm.forward_kernel(dev.stream, dev.handle, state, attrs, x, gamma, beta, output, training=training)
        dev.stream.synchronize()
        results.append([dev.host(output), dev.host(state.running_mean), dev.host(state.running_var)])
        assert (state.pre is None) is (not backward)
        if not backward:
            g = dev.array(np.ones(dims, dtype))
            with pytest.raises(StateError, match=r"batch_norm: state: expected a state made for a backward"):
                batch_norm.backward_kernel(dev.stream, dev.handle, state, attrs, output, g, x, g, gamma, beta,
                                           None, None)
        batch_norm.cleanup_kernel(dev.handle, state)
    for kept, alone in zip(*results):
        assert np.array_equal(kept.view(np.uint8), alone.view(np.uint8))
    assert np.isfinite(results[1][0]).all()


def _run_all(device, attrs, dims, dtype, steps=2):
    """Training forward and backward, `steps` times, on a device; everything written, on the host."""
    dev = Dev(device)
    stat_dims = (dims[1],) if attrs.mode is BatchNormMode.SPATIAL else dims[1:]
    state = batch_norm.init_kernel(dev.handle, attrs, _shape(dims, dtype), _shape(dims, dtype))
    param = compute_dtype(dtype)  # float32 gamma, beta and their gradients for half data
    gamma = dev.array(pattern(stat_dims, 9, 0.5, 5).astype(param))
    beta = dev.array(pattern(stat_dims, 5, 0.25).astype(param))
    results = []
    for step in range(steps):
        x = dev.array(pattern(dims, 13, 0.5, step).astype(dtype))
        g = dev.array(pattern(dims, 11, 0.25, step + 3).astype(dtype))
        output, input_grad = dev.array(np.zeros(dims, dtype)), dev.array(np.zeros(dims, dtype))
        gamma_grad, beta_grad = dev.array(np.zeros(stat_dims, param)), dev.array(np.zeros(stat_dims, param))
        batch_norm.forward_kernel(dev.stream, dev.handle, state, attrs, x, gamma, beta, output)
        batch_norm.backward_kernel(dev.stream, dev.handle, state, attrs, output, g, x, input_grad, gamma, beta,
                                   gamma_grad, beta_grad)
        results += [output, input_grad, gamma_grad, beta_grad]
    results += [state.running_mean, state.running_var]
    dev.stream.synchronize()
    host = [dev.host(a) for a in results]
    dev.handle.close()
    return host


GPU_SHAPES = [
    pytest.param(BatchNormAttrs(eps=1e-3, momentum=0.03, activation="SILU"), (1, 16, 80, 100),
                 id="spatial_silu_1x16x80x100_four_parts_a_row"),
    pytest.param(BatchNormAttrs(eps=1e-3, momentum=0.03, activation="SILU"), (1, 24, 20, 20),
                 id="spatial_silu_1x24x20x20_one_part_a_channel"),  # statistics and apply in one launch
    pytest.param(BatchNormAttrs(eps=1e-3, momentum=0.03), (8, 5, 3, 7), id="spatial_8x5x3x7_short_rows"),
    pytest.param(BatchNormAttrs(momentum=None, mode=BatchNormMode.PER_ACTIVATION), (16, 4, 9, 11), id="per_activation"),
    pytest.param(BatchNormAttrs(), (64, 33), id="rank2"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BFLOAT16], ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("attrs, dims", GPU_SHAPES)
def test_gpu_matches_cpu_and_is_deterministic(attrs, dims, dtype):
    """Two GPU runs give the same bits; the GPU is close to the CPU (the same float64 operations; only
    the order of the sums differs, and where a channel's count is no power of two the mean is inexact,
    so the sums of squares round differently).

    float32 results are within 2 ulps, and so are half data (rounded once from the same float64
    values) and their float32 parameters' gradients and running statistics. float64 results are
    compared normwise: sums of up to 8000
    terms that mostly cancel (gamma_grad, beta_grad and the input_grad built from them) differ by
    summation order alone by hundreds of ulps of a small result (measured on the H200: 684 ulps,
    1.4e-13 absolute, under 2e-14 of the tensor's largest value), so the bound is 1e-13 of it."""
    require("gpu")
    cpu = _run_all("cpu", attrs, dims, dtype)
    first, second = _run_all("gpu", attrs, dims, dtype), _run_all("gpu", attrs, dims, dtype)
    for index, (a, b, c) in enumerate(zip(cpu, first, second)):
        assert np.array_equal(b.view(np.uint8), c.view(np.uint8)), f"tensor {index}: two GPU runs differ"
        if dtype != np.float64:  # half data: 2 ulps of each tensor's dtype too (passes on the H200, 2026-12-01)
            report = compare(b, a, ulp(2))
            assert report is None, f"tensor {index}: {report}"
        else:
            error = float(np.max(np.abs(b - a))) / max(float(np.max(np.abs(a))), np.finfo(np.float64).tiny)
            assert error <= 1e-13, f"tensor {index}: GPU differs from CPU by {error:.3g} of the largest value"


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_two_states_keep_their_own_statistics(device):
    require(device)
    dev = Dev(device)
    attrs = BatchNormAttrs(affine=False, momentum=1.0)
    dims = (2, 2, 4)
    states = [batch_norm.init_kernel(dev.handle, attrs, _shape(dims), _shape(dims)) for _ in range(2)]
    output = dev.array(np.zeros(dims, np.float32))
    batch_norm.forward_kernel(dev.stream, dev.handle, states[0], attrs, dev.array(pattern(dims, 13, 0.5).astype(np.float32)),
                              None, None, output)
    dev.stream.synchronize()
    assert not np.array_equal(dev.host(states[0].running_mean), dev.host(states[1].running_mean))
    assert np.array_equal(dev.host(states[1].running_var), np.ones(2, np.float32))
    dev.handle.close()


@pytest.mark.parametrize("mode, dims, expected", [
    # SPATIAL, a short plane: one partial sum per (image, channel); the apply is (N*C) rows of H*W.
    (BatchNormMode.SPATIAL, (2, 3, 4, 5), (False, 20, 1, 2, 6, 20)),
    # SPATIAL, a plane longer than a chunk: ceil(10000 / 2048) = 5 partial sums per row.
    (BatchNormMode.SPATIAL, (1, 2, 100, 100), (False, 2048, 5, 5, 2, 10000)),
    # PER_ACTIVATION: one thread per statistic reducing over N; the apply is N rows of C*H*W.
    (BatchNormMode.PER_ACTIVATION, (2, 3, 4, 5), (True, 1, 1, 1, 2, 60)),
])
def test_gpu_plan_of_each_layout(mode, dims, expected):
    """The GPU's split of the work (pure Python): partial sums per channel and the apply's grid."""
    from kernels.batch_norm import plan

    got = plan.gpu_plan(batch_norm.layout_of(BatchNormAttrs(mode=mode), dims))
    assert (got.by_feature, got.chunk, got.parts_per_row, got.parts, got.rows, got.cols) == expected
    assert (got.index, got.scalar) == ("int", np.int32)


@pytest.mark.parametrize("dims, index", [
    # total + the largest grid-stride step (65535 blocks x 256 threads x a pack of 8) just below 2^31
    ((1, 983040, 2048, 1), "int"),
    ((1, 983041, 2048, 1), "long long"),  # exactly 2^31: a column could reach it
])
def test_gpu_plan_index_type_covers_the_largest_step(dims, index):
    """The apply kernels' index type: 32-bit only where a block's last grid-stride step stays below 2^31."""
    from kernels.batch_norm import plan

    got = plan.gpu_plan(batch_norm.layout_of(BatchNormAttrs(), dims))
    assert int(np.prod(dims)) + 65535 * plan.BLOCK * max(plan.APPLY_UNROLL, plan.MAX_PACK) - 2**31 == (
        -2048 if index == "int" else 0)
    assert (got.index, got.scalar) == (index, np.int32 if index == "int" else np.int64)


@pytest.mark.parametrize("mode, dims, itemsize, expected", [
    (BatchNormMode.SPATIAL, (16, 80, 320, 320), 2, 8),  # YOLOv10's planes: 16-byte packs of 8 halves
    (BatchNormMode.SPATIAL, (16, 640, 20, 20), 4, 4),  # 400 columns: 100 packs of 4 floats
    (BatchNormMode.SPATIAL, (2, 3, 20, 20), 8, 2),
    (BatchNormMode.SPATIAL, (2, 3, 4, 5), 2, 1),  # 20 columns: not a whole number of 8-half packs
    (BatchNormMode.SPATIAL, (2, 3, 4, 5), 4, 4),  # but of 4-float ones
    (BatchNormMode.SPATIAL, (2, 3, 3, 5), 8, 1),  # 15: odd
    (BatchNormMode.PER_ACTIVATION, (2, 3, 4, 4), 2, 8),  # rows of C*H*W = 48
    (BatchNormMode.PER_ACTIVATION, (2, 3, 1, 1), 4, 1),
])
def test_inference_pack_width(mode, dims, itemsize, expected):
    """The inference apply moves 16-byte packs only where every row of it is a whole number of them (a
    pack never straddles two rows, whose statistics differ); the call also needs its tensors aligned."""
    from kernels.batch_norm import plan

    got = plan.gpu_plan(batch_norm.layout_of(BatchNormAttrs(mode=mode), dims))
    assert plan.pack_width(got, itemsize) == expected
    assert expected == 1 or got.cols % expected == 0


@pytest.mark.parametrize("mode, dims, itemsize, expected", [
    # YOLOv10x's first BN at batch 16 in float16: 12800 packs of 8 a row, 50 blocks of 256 along it
    (BatchNormMode.SPATIAL, (16, 80, 320, 320), 2, (8, 256, (50, 1280))),
    # a 20x20 plane: 50 packs of 8 halves, one block of 64 threads a row (14 idle, not 206)
    (BatchNormMode.SPATIAL, (16, 640, 20, 20), 2, (8, 64, (1, 10240))),
    (BatchNormMode.SPATIAL, (16, 640, 20, 20), 4, (4, 128, (1, 10240))),
    (BatchNormMode.SPATIAL, (1, 2, 4, 4), 8, (2, 32, (1, 2))),
    # more rows than a grid's y: the kernel strides over them
    (BatchNormMode.SPATIAL, (300, 256, 4, 4), 2, (8, 32, (1, 65535))),
    (BatchNormMode.SPATIAL, (2, 3, 4, 5), 2, None),  # rows of 20 halves are not whole packs
    (BatchNormMode.PER_ACTIVATION, (2, 3, 4, 4), 2, None),  # a statistic a column: bn_forward_apply
])
def test_inference_launch(mode, dims, itemsize, expected):
    """bn_inference_apply's launch: a pack a thread, blocks of as many threads as a row's packs need (a
    multiple of 32, at most BLOCK), enough blocks to cover every pack of a row, a row of blocks a row."""
    from kernels.batch_norm import plan

    layout = plan.gpu_plan(batch_norm.layout_of(BatchNormAttrs(mode=mode), dims))
    got = plan.inference_launch(layout, itemsize)
    assert got == expected
    if got is not None:
        pack, threads, (blocks, rows) = got
        assert threads % 32 == 0 and threads <= plan.BLOCK and blocks * threads * pack >= layout.cols
        assert (blocks - 1) * threads * pack < layout.cols  # no block without a pack of the row


def test_cpu_passes_run_longer_blocks_in_parts_beside_each_other(monkeypatch):
    """Where a pass's parts run beside each other its blocks are PARALLEL_BLOCK_ELEMENTS long, alone
    CPU_BLOCK_ELEMENTS: an apply's blocks are longer; a sums pass's hold more rows, each row still summed
    in parts of CPU_BLOCK_ELEMENTS (their bits depend on it). Every output, gradient and running
    statistic has the same bits on one thread and three."""
    import kernels
    from kernels.batch_norm import cpu as bn_cpu

    monkeypatch.setattr(kernels.runtime.cpu, "PIECE_BYTES", 1)  # one part a thread
    cuts, real = [], bn_cpu._blocks

    def spy(layout, elements=bn_cpu.CPU_BLOCK_ELEMENTS, row=None):
        blocks, inner_parts = real(layout, elements, row)
        cuts.append((len(blocks), inner_parts))
        return blocks, inner_parts

    monkeypatch.setattr(bn_cpu, "_blocks", spy)
    attrs = BatchNormAttrs(eps=1e-3, momentum=0.03, activation="SILU")
    dims = (1, 8, 400, 400)  # rows of 160000: 3 parts along a row (2 full, 1 of 28928)
    rng = np.random.default_rng(5)
    x, dy = (rng.standard_normal(dims).astype(np.float32) for _ in range(2))
    gamma, beta = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    results, seen = {}, {}
    for threads in (1, 3):
        handle, stream = kernels.cpu_handle(threads), kernels.cpu_stream()
        state = batch_norm.init_kernel(handle, attrs, _shape(dims), _shape(dims))
        y, dx = np.full(dims, np.nan, np.float32), np.full(dims, np.nan, np.float32)
        dgamma, dbeta = np.full(8, np.nan, np.float32), np.full(8, np.nan, np.float32)
        cuts.clear()
        batch_norm.forward_kernel(stream, handle, state, attrs, x, gamma, beta, y, training=True)
        batch_norm.backward_kernel(stream, handle, state, attrs, y, dy, x, dx, gamma, beta, dgamma, dbeta)
        seen[threads] = list(cuts)
        results[threads] = [y, dx, dgamma, dbeta, state.running_mean.copy(), state.running_var.copy()]
    # (blocks, parts along a row): forward's sums then its apply, backward's the same
    alone = (8 * 3, 3)  # a row's part a block
    beside_sums = (2 * 3, 3)  # 4 rows' part a block (4 * 65536 = PARALLEL_BLOCK_ELEMENTS)
    beside_apply = (8, 1)  # a whole row a block (160000 < PARALLEL_BLOCK_ELEMENTS)
    assert seen == {1: [alone] * 4, 3: [beside_sums, beside_apply] * 2}
    for one, three in zip(results[1], results[3]):
        assert not np.isnan(one).any()
        assert one.tobytes() == three.tobytes()


@pytest.mark.parametrize("dims, threads, blocks", [
    ((1, 16, 320, 40), 2, 2),  # 204800 elements: blocks of 8 rows, not one block of all 16 (then one part)
    ((1, 16, 320, 40), 5, 4),  # 40960 a part is under CPU_BLOCK_ELEMENTS: blocks of 5 rows (65536 // 12800)
    ((2, 16, 320, 320), 3, 16),  # blocks of PARALLEL_BLOCK_ELEMENTS: 2 rows of 102400 each, 8 an image
])
def test_cpu_long_blocks_leave_a_block_for_every_part(monkeypatch, dims, threads, blocks):
    """The blocks of parts beside each other are at most PARALLEL_BLOCK_ELEMENTS, and short enough that
    every part gets one: a tensor of a few such blocks is not run as one block in one part."""
    import kernels

    monkeypatch.setattr(kernels.runtime.cpu, "PIECE_BYTES", 1)  # one part a thread
    calls, real = [], kernels.runtime.cpu.cpu_parallel

    def spy(function, count, nbytes=None):
        calls.append(count)
        real(function, count, nbytes)

    monkeypatch.setattr(kernels.runtime.cpu, "cpu_parallel", spy)
    attrs = BatchNormAttrs(eps=1e-3, momentum=0.03)
    handle, stream = kernels.cpu_handle(threads), kernels.cpu_stream()
    state = batch_norm.init_kernel(handle, attrs, _shape(dims), _shape(dims))
    x = np.random.default_rng(2).standard_normal(dims).astype(np.float32)
    y = np.full(dims, np.nan, np.float32)
    batch_norm.forward_kernel(stream, handle, state, attrs, x, np.ones(dims[1], np.float32),
                              np.zeros(dims[1], np.float32), y, training=False)
    assert calls == [blocks]  # the apply's blocks (inference: no sums pass)
    assert not np.isnan(y).any()
