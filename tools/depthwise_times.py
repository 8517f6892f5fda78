# ruff: noqa: B023  (each lambda is timed at once, inside the iteration that made it)
"""Device time of the depthwise rows kernels on YOLOv10's depthwise shapes, for several shares of a thread
(R rows x Q columns of outputs), beside the general gather and PyTorch. Run on the GPU machine:

    python3 tools/depthwise_times.py [--variants 4x1,8x1,4x2,8x2,2x4] [--dtype float16 --dtype float32]
                                     [--count N]

Per shape and dtype, in microseconds a call (CUDA events around N calls enqueued behind a spin kernel, so the
device's time, not the host's pace):
- forward: conv_depthwise_forward_rows with bias and SiLU in the kernel (a state without backward);
- input gradient: at stride 1 the turned forward (path conv_2d.depthwise.input_grad_rows), at stride 2 the
  compiled gather; "general" is conv_depthwise_input_grad's general form (the state's rows taken away);
- PyTorch: F.silu(F.conv2d(x, w, b, groups=C)), and aten.convolution_backward for the input gradient alone;
- the filter gradient alone (no share changes it): the state's kernel (conv_depthwise_filter_grad_taps, a block
  a channel, where the state has filter_taps), a block a tap (conv_depthwise_filter_grad), their bits compared,
  and PyTorch's (aten.convolution_backward for the filter gradient alone).
The library's own share for the dtype (plan.DEPTHWISE_SHARES) comes first; each other share's outputs are
compared with it bit for bit ("same" or "DIFFERENT"; tests/test_conv_2d.py asserts it). The variants are
compiled with NVRTC first (seconds each): kernels/conv_2d/gpu.py's rows_variant.
docs/performance.md#depthwise-rows has the results."""

import argparse
import sys
import time

import numpy as np

sys.path.insert(0, ".")
import cupy  # noqa: E402
import torch  # noqa: E402

import kernels  # noqa: E402
from conformance.harness import spin  # noqa: E402
from kernels import Activation, Conv2DAttrs, TensorShape, conv_2d  # noqa: E402
from kernels.conv_2d import gpu as conv_gpu  # noqa: E402
from tools.conv_algos import torch_timed  # noqa: E402

# (input dims, kernel, stride): yolov10x's C2fCIB 3x3 at 40x40 and 20x20, SCDown's stride 2, the n and s
# variants' 7x7, and a batch-1 shape.
SHAPES = [((16, 640, 40, 40), 3, 1), ((16, 1280, 20, 20), 3, 1), ((16, 320, 80, 80), 3, 2),
          ((16, 128, 40, 40), 7, 1), ((1, 64, 80, 80), 3, 1)]
DTYPES = {"float16": np.float16, "float32": np.float32}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="4x1,8x1,4x2,8x2,2x4", help="ROWSxCOLUMNS, comma separated")
    parser.add_argument("--dtype", action="append", choices=sorted(DTYPES), help="float16 and float32 by default")
    parser.add_argument("--count", type=int, default=20)
    arguments = parser.parse_args()
    shares = [tuple(int(v) for v in share.split("x")) for share in arguments.variants.split(",")]
    begun = time.perf_counter()
    variants = {share: conv_gpu.rows_variant(*share) for share in shares}
    stream, handle = kernels.gpu_stream(), kernels.gpu_handle()
    cupy_stream = stream.cupy_stream

    def timed(function) -> float:
        function()
        stream.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        spin(stream, arguments.count * 500_000)  # 500 us a call: longer than any call's host time here
        start.record(cupy_stream)
        for _ in range(arguments.count):
            function()
        end.record(cupy_stream)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) * 1e3 / arguments.count

    def torch_device(function) -> float:  # 500 us of sleep a call (1e6 cycles), as above
        return torch_timed(function, arguments.count, 1_000_000)[1]

    first = True
    for name in arguments.dtype or ["float16", "float32"]:
        dtype = DTYPES[name]
        for dims, k, s in SHAPES:
            c = dims[1]
            library = conv_gpu.DEPTHWISE_SHARES[(np.dtype(dtype).itemsize, k)]
            modules = {library: conv_gpu._CUDA} | {share: module for share, module in variants.items()
                                                   if share != library}
            forward_attrs = Conv2DAttrs(c, k, k, s, s, k // 2, k // 2, groups=c, use_bias=True,
                                        activation=Activation.SILU, backward=False)
            backward_attrs = Conv2DAttrs(c, k, k, s, s, k // 2, k // 2, groups=c)
            out_dims = conv_2d.output_dims(backward_attrs, dims)
            rng = np.random.default_rng(0)
            with stream:
                x, w, b, g = (cupy.asarray(rng.standard_normal(d).astype(np.float32).astype(dtype))
                              for d in (dims, (c, 1, k, k), (c,), out_dims))
                y, dx, dw = cupy.empty(out_dims, dtype), cupy.empty(dims, dtype), cupy.empty((c, 1, k, k), dtype)
            cells, mine, dws = [], None, []
            for share, module in modules.items():
                saved = conv_gpu._CUDA, conv_gpu.DEPTHWISE_SHARES
                conv_gpu._CUDA, conv_gpu.DEPTHWISE_SHARES = module, conv_gpu.variant_shares(*share)
                try:
                    fs = conv_2d.init_kernel(handle, forward_attrs, TensorShape(dims, dtype), TensorShape(out_dims, dtype))
                    bs = conv_2d.init_kernel(handle, backward_attrs, TensorShape(dims, dtype), TensorShape(out_dims, dtype))
                    forward = timed(lambda: conv_2d.forward_kernel(stream, handle, fs, forward_attrs, x, w, b, y))
                    # At stride 2 the input gradient is the compiled gather, which no share changes (and which a
                    # variant's module, the rows kernels alone, does not hold): the library's share times it.
                    grad = None
                    if s == 1 or share == library:
                        grad = timed(lambda: conv_2d.backward_kernel(stream, handle, bs, backward_attrs, y, g, x, dx,
                                                                     w, None, None))
                    stream.synchronize()
                    got = (cupy.asnumpy(y), cupy.asnumpy(dx)) if grad is not None else (cupy.asnumpy(y),)
                    if mine is None:
                        mine = got
                        # The filter gradient alone (no share changes it): the state's kernel (a block a channel
                        # for all taps where the state has filter_taps), then a block a tap.
                        filters = []
                        for taps in (bs.filter_taps, False):
                            bs.filter_taps = taps
                            bs.launches.pop(("depthwise_filter",), None)
                            filters.append(timed(lambda: conv_2d.backward_kernel(
                                stream, handle, bs, backward_attrs, y, g, x, None, w, dw, None)))
                            stream.synchronize()
                            dws.append(cupy.asnumpy(dw))
                        bs.rows = None  # the general gather: its own launch, not the rows' kept one
                        bs.launches.pop(("depthwise_input",), None)
                        general = timed(lambda: conv_2d.backward_kernel(stream, handle, bs, backward_attrs, y, g, x, dx,
                                                                        w, None, None))
                    same = all(np.array_equal(a.view(np.uint8), b_.view(np.uint8)) for a, b_ in zip(mine, got))
                    grad_cell = "      -" if grad is None else f"{grad:7.1f}"
                    cells.append(f"{share[0]}x{share[1]} {forward:7.1f} / {grad_cell} {'same' if same else 'DIFFERENT'}")
                    conv_2d.cleanup_kernel(handle, fs)
                    conv_2d.cleanup_kernel(handle, bs)
                finally:
                    conv_gpu._CUDA, conv_gpu.DEPTHWISE_SHARES = saved
            tx, tw, tb, tg = (torch.as_tensor(a, device="cuda") for a in (x, w, b, g))
            torch_forward = torch_device(lambda: torch.nn.functional.silu(
                torch.nn.functional.conv2d(tx, tw, tb, s, k // 2, 1, c)))
            torch_grad = torch_device(lambda: torch.ops.aten.convolution_backward(
                tg, tx, tw, None, [s, s], [k // 2] * 2, [1, 1], False, [0, 0], c, [True, False, False]))
            torch_filter = torch_device(lambda: torch.ops.aten.convolution_backward(
                tg, tx, tw, None, [s, s], [k // 2] * 2, [1, 1], False, [0, 0], c, [False, True, False]))
            same_filter = np.array_equal(dws[0].view(np.uint8), dws[1].view(np.uint8))
            if first:
                print(f"variants compiled and first states made in {time.perf_counter() - begun:.1f} s; "
                      "us a call, forward / input gradient, the dtype's library share first")
                first = False
            print(f"{name:8} {str(dims):20} {k}x{k} s{s}: " + " | ".join(cells)
                  + f" | general gather {general:7.1f} | PyTorch {torch_forward:7.1f} / {torch_grad:7.1f}"
                  + f" || filter gradient: the library's {filters[0]:7.1f}, a block a tap {filters[1]:7.1f} "
                  + f"{'same' if same_filter else 'DIFFERENT'}, PyTorch {torch_filter:7.1f}", flush=True)


if __name__ == "__main__":
    main()
