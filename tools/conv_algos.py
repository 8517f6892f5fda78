# ruff: noqa: B023  (each lambda is timed at once, inside the iteration that made it)
"""Host and device time of each exact cuDNN convolution algorithm on YOLOv10 shapes, next to
PyTorch: which algorithms have low per-call host overhead. Run on the GPU machine."""

import sys
import time

import numpy as np

sys.path.insert(0, ".")
import cupy  # noqa: E402
import torch  # noqa: E402

import kernels  # noqa: E402
from kernels import TensorShape as S  # noqa: E402
from kernels import cudnn  # noqa: E402

torch.backends.cudnn.allow_tf32 = False
stream, handle = kernels.gpu_stream(), kernels.gpu_handle()
f32 = np.float32
SHAPES = [("head 1x1", (1, 64, 80, 80), 64, 1, 1, 0, 1), ("c2f 3x3", (1, 32, 160, 160), 32, 3, 1, 1, 1),
          ("stem 3x3 s2", (1, 3, 640, 640), 16, 3, 2, 1, 1), ("dw 3x3 s2", (1, 64, 80, 80), 64, 3, 2, 1, 64)]


def timed(function, count=200):
    function()
    stream.synchronize()
    start = time.perf_counter()
    for _ in range(count):
        function()
    host = (time.perf_counter() - start) / count
    stream.synchronize()
    return host * 1e6, (time.perf_counter() - start) / count * 1e6


for name, dims, out_c, k, s, p, g in SHAPES:
    x = cupy.asarray(np.random.default_rng(0).standard_normal(dims).astype(f32))
    w = cupy.asarray(np.random.default_rng(1).standard_normal((out_c, dims[1] // g, k, k)).astype(f32))
    attrs = kernels.Conv2DAttrs(out_channels=out_c, kernel_h=k, kernel_w=k, stride_h=s, stride_w=s, padding_h=p,
                                padding_w=p, groups=g)
    ho = (dims[2] + 2 * p - k) // s + 1
    y = cupy.empty((dims[0], out_c, ho, ho), f32)
    state = kernels.conv_2d.init_kernel(handle, attrs, S.of(x), S.of(y))
    kernels.conv_2d.forward_kernel(stream, handle, state, attrs, x, w, None, y)
    d, h = state.descriptors, handle.cudnn(stream)
    ws = handle.workspace(256 << 20)
    one, zero = cudnn.scalar(f32, 1), cudnn.scalar(f32, 0)
    print(f"{name}: chosen {state.algorithms}")
    for algo in (0, 1, 2):
        a = cudnn.Algorithm(algo, 3, 256 << 20)
        try:
            host, total = timed(lambda: cudnn.convolution_forward(h, one, d.x, x.data.ptr, d.w, w.data.ptr,
                                                                  d.conv, a, ws.data.ptr, 256 << 20, zero, d.y,
                                                                  y.data.ptr))
            print(f"  fwd algo {algo}: host {host:7.1f} us, with device {total:7.1f} us")
        except Exception as error:
            print(f"  fwd algo {algo}: {str(error)[:80]}")
    for algo in (0, 1):
        a = cudnn.Algorithm(algo, 3, 256 << 20)
        try:
            host, total = timed(lambda: cudnn.convolution_backward_data(h, one, d.w, w.data.ptr, d.y, y.data.ptr,
                                                                        d.conv, a, ws.data.ptr, 256 << 20, zero,
                                                                        d.x, x.data.ptr))
            print(f"  bwd data algo {algo}: host {host:7.1f} us, with device {total:7.1f} us")
        except Exception as error:
            print(f"  bwd data algo {algo}: {str(error)[:80]}")
    for algo in (0, 1, 3):
        a = cudnn.Algorithm(algo, 3, 256 << 20)
        try:
            host, total = timed(lambda: cudnn.convolution_backward_filter(h, one, d.x, x.data.ptr, d.y,
                                                                          y.data.ptr, d.conv, a, ws.data.ptr,
                                                                          256 << 20, zero, d.w, w.data.ptr))
            print(f"  bwd filter algo {algo}: host {host:7.1f} us, with device {total:7.1f} us")
        except Exception as error:
            print(f"  bwd filter algo {algo}: {str(error)[:80]}")
    tx, tw = torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda")
    conv = torch.nn.functional.conv2d
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        conv(tx, tw, None, s, p, 1, g)
    host = (time.perf_counter() - start) / 200 * 1e6
    torch.cuda.synchronize()
    print(f"  torch fwd: host {host:7.1f} us, with device {(time.perf_counter() - start) / 200 * 1e6:7.1f} us")
