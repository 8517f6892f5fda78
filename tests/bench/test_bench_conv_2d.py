"""conv_2d on YOLOv10n's convolutions at a 640x640 input: the stem (3x3 stride 2,
1x3x640x640 -> 16), a C2f 3x3 (1x32x160x160 -> 32), SCDown's depthwise 3x3 stride 2
(1x64x80x80, groups 64) and a head 1x1 with bias (1x64x80x80 -> 64), and on the GPU
yolov10x's batch-16 depthwise 3x3s (16x640x40x40, SCDown's 16x320x80x80 stride 2) and a
7x7 (16x256x20x20); forward and
backward (input, filter and, with a bias, bias gradients), beside F.conv2d and
aten.convolution_backward. TF32 is off on both sides (cuDNN FMA math; torch's
allow_tf32 false), so the TFLOP/s compare like for like.

Half precision (float16, bfloat16) rows, on the GPU only (half precision is a GPU matter, and
the CPU twins would take minutes at these sizes): the same shapes and random values rounded to
the dtype, beside PyTorch's F.conv2d and convolution_backward in the same dtype (cuDNN with
tensor cores on both sides, float32 sums); their groups end in the dtype's name.

Bytes are what any implementation must move: forward reads input and filter and
writes the output; backward reads output_grad, input and filter and writes their
gradients. Flops count a multiply-add as 2; backward does twice the forward's.
"""

import numpy as np
import pytest

from kernels import Conv2DAttrs, TensorShape, conv_2d

from .conftest import DTYPES, half_rows_on_gpu_only

SHAPES = [
    pytest.param((1, 3, 640, 640), Conv2DAttrs(16, 3, 3, 2, 2, 1, 1), id="stem_3x3s2_1x3x640x640_16"),
    pytest.param((1, 32, 160, 160), Conv2DAttrs(32, 3, 3, 1, 1, 1, 1), id="c2f_3x3_1x32x160x160_32"),
    pytest.param((1, 64, 80, 80), Conv2DAttrs(64, 3, 3, 2, 2, 1, 1, groups=64), id="scdown_dw3x3s2_1x64x80x80"),
    pytest.param((1, 64, 80, 80), Conv2DAttrs(64, 1, 1, use_bias=True), id="head_1x1_bias_1x64x80x80_64"),
    # yolov10x's depthwise convolutions at batch 16 (C2fCIB's 3x3, SCDown's 3x3 stride 2) and a 7x7 of the n and
    # s variants' C2fCIB at batch 16: the depthwise rows kernels' shapes (docs/performance.md#depthwise-rows).
    # On the GPU only (_gpu_only_at_batch_16): the CPU's smoke run would take minutes over them.
    pytest.param((16, 640, 40, 40), Conv2DAttrs(640, 3, 3, 1, 1, 1, 1, groups=640), id="cib_dw3x3_16x640x40x40"),
    pytest.param((16, 320, 80, 80), Conv2DAttrs(320, 3, 3, 2, 2, 1, 1, groups=320), id="scdown_dw3x3s2_16x320x80x80"),
    pytest.param((16, 256, 20, 20), Conv2DAttrs(256, 7, 7, 1, 1, 3, 3, groups=256), id="cib_dw7x7_16x256x20x20"),
]


def _gpu_only_at_batch_16(bench, dims) -> None:
    if dims[0] == 16 and bench.device == "cpu":
        pytest.skip("the batch-16 depthwise rows run on the GPU only")


FLOAT32 = np.dtype(np.float32)
def _describe(dims, attrs, dtype=FLOAT32):
    return (f"{attrs.kernel_h}x{attrs.kernel_w} s{attrs.stride_h} p{attrs.padding_h} g{attrs.groups}"
            f"{' bias' if attrs.use_bias else ''} {dims}->{attrs.out_channels}"
            f"{'' if dtype == np.float32 else ' ' + dtype.name}")


def _tensors(bench, dims, attrs, dtype=FLOAT32):
    input = bench.array(dims, dtype)
    filter = bench.array(conv_2d.filter_dims(attrs, dims[1]), dtype, seed=1)
    bias = bench.array((attrs.out_channels,), dtype, seed=2) if attrs.use_bias else None
    return input, filter, bias


def _sizes(dims, attrs, dtype=FLOAT32):
    out_dims = conv_2d.output_dims(attrs, dims)
    filter_count = int(np.prod(conv_2d.filter_dims(attrs, dims[1])))
    data = int(np.prod(dims)) + int(np.prod(out_dims)) + filter_count + (attrs.out_channels if attrs.use_bias else 0)
    return out_dims, data * dtype.itemsize


def _torch_args(attrs):
    return (attrs.stride_h, attrs.stride_w), (attrs.padding_h, attrs.padding_w), (attrs.dilation_h, attrs.dilation_w)


def _state(bench, dims, out_dims, attrs, dtype=FLOAT32):
    return conv_2d.init_kernel(bench.handle, attrs, TensorShape(dims, dtype), TensorShape(out_dims, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims, attrs", SHAPES)
def test_conv_2d_forward(benchmark, bench, dims, attrs, dtype):
    half_rows_on_gpu_only(bench, dtype)
    _gpu_only_at_batch_16(bench, dims)
    out_dims, bytes_moved = _sizes(dims, attrs, dtype)
    group = f"conv_2d forward {_describe(dims, attrs, dtype)}"
    flops = conv_2d.flops(attrs, dims)
    input, filter, bias = _tensors(bench, dims, attrs, dtype)
    if bench.impl == "torch":
        conv2d = bench.torch.nn.functional.conv2d
        stride, padding, dilation = _torch_args(attrs)
        bench.run(benchmark, lambda: conv2d(input, filter, bias, stride, padding, dilation, attrs.groups),
                  bytes_moved, group, flops=flops)
        return
    output = bench.empty(out_dims, dtype)
    state = _state(bench, dims, out_dims, attrs, dtype)
    bench.run(benchmark, lambda: conv_2d.forward_kernel(bench.stream, bench.handle, state, attrs, input, filter, bias,
                                                        output), bytes_moved, group, flops=flops)
    conv_2d.cleanup_kernel(bench.handle, state)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims, attrs", SHAPES)
def test_conv_2d_backward(benchmark, bench, dims, attrs, dtype):
    half_rows_on_gpu_only(bench, dtype)
    _gpu_only_at_batch_16(bench, dims)
    out_dims, bytes_moved = _sizes(dims, attrs, dtype)
    group = f"conv_2d backward {_describe(dims, attrs, dtype)}"
    flops = 2 * conv_2d.flops(attrs, dims)
    input, filter, bias = _tensors(bench, dims, attrs, dtype)
    output_grad = bench.array(out_dims, dtype, seed=3)
    if bench.impl == "torch":
        backward = bench.torch.ops.aten.convolution_backward
        stride, padding, dilation = _torch_args(attrs)
        bias_sizes = [attrs.out_channels] if attrs.use_bias else None
        mask = [True, True, attrs.use_bias]
        bench.run(benchmark, lambda: backward(output_grad, input, filter, bias_sizes, list(stride), list(padding),
                                              list(dilation), False, [0, 0], attrs.groups, mask),
                  bytes_moved, group, flops=flops)
        return
    input_grad, filter_grad = bench.empty(dims, dtype), bench.empty(tuple(filter.shape), dtype)
    bias_grad = bench.empty((attrs.out_channels,), dtype) if attrs.use_bias else None
    state = _state(bench, dims, out_dims, attrs, dtype)
    bench.run(benchmark, lambda: conv_2d.backward_kernel(bench.stream, bench.handle, state, attrs, None, output_grad,
                                                         input, input_grad, filter, filter_grad, bias_grad),
              bytes_moved, group, flops=flops)
    conv_2d.cleanup_kernel(bench.handle, state)
