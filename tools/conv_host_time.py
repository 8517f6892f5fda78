"""Host time of one conv_2d forward in cuDNN: the legacy cudnnConvolutionForward against the backend
API's execution plan (KERNELS_CUDNN_BACKEND=1 when the state is made), with torch's F.conv2d beside.

The c2f 3x3 convolution (1, 32, 160, 160) -> 32, padding 1, in float32 and float16. Each row is the
median over --runs rounds of the host microseconds one call takes (a round times --calls calls back
to back, then waits for the device, so the queue never fills); the device times are not measured.
Also prints the engine the backend plan chose and the largest difference from the legacy output.
Run on the GPU machine from the repository root, nothing to install: python3 tools/conv_host_time.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, ".")


def _median_us(call, sync, runs: int, calls: int) -> float:
    """Not functional_overhead.median_us: that one times the wait for the device too, which for this
    convolution (device time near its host time) would be timed in place of the host's."""
    for _ in range(3):  # warm: plans, variant packs, caches
        call()
    sync()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        sync()
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="timed rounds; the median is printed (default 50)")
    parser.add_argument("--calls", type=int, default=20, help="calls a round (default 20)")
    args = parser.parse_args(argv)

    import cupy

    import kernels
    from kernels import Conv2DAttrs, TensorShape, conv_2d
    from kernels.runtime import cudnn

    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = None
    stream, handle = kernels.gpu_stream(0), kernels.gpu_handle(0)
    attrs = Conv2DAttrs(32, 3, 3, padding_h=1, padding_w=1, backward=False)
    dims = (1, 32, 160, 160)
    print(f"conv_2d.forward_kernel host time, c2f 3x3 {dims} -> 32, median of {args.runs} x {args.calls} calls")
    for dtype in (np.float32, np.float16):
        rng = np.random.default_rng(0)
        with stream:
            x = cupy.asarray(rng.standard_normal(dims).astype(dtype))
            w = cupy.asarray((rng.standard_normal((32, 32, 3, 3)) / 17).astype(dtype))
        outputs = {}
        for name, backend in (("legacy", False), ("backend", True)):
            previous = os.environ.pop(cudnn.BACKEND_ENV, None)
            if backend:
                os.environ[cudnn.BACKEND_ENV] = "1"
            try:
                state = conv_2d.init_kernel(handle, attrs, TensorShape(dims, dtype), TensorShape(dims, dtype))
            finally:
                os.environ.pop(cudnn.BACKEND_ENV, None)
                if previous is not None:
                    os.environ[cudnn.BACKEND_ENV] = previous
            with stream:
                output = cupy.empty(dims, dtype)

            def call(state=state, output=output, x=x, w=w):
                conv_2d.forward_kernel(stream, handle, state, attrs, x, w, None, output)

            us = _median_us(call, stream.synchronize, args.runs, args.calls)
            plan = state.descriptors.forward_plan
            detail = ""
            if plan is not None:
                detail = f"  engine {plan.engine}, workspace {plan.workspace} B, executions {plan.executions}, " \
                         f"variant packs {plan.packs}"
            else:
                detail = f"  algorithm {state.algorithms['forward'].algo}"
            print(f"{np.dtype(dtype).name:8s} {name:8s} {us:8.1f} us{detail}")
            outputs[name] = cupy.asnumpy(output, stream=stream.cupy_stream).astype(np.float64)
            conv_2d.cleanup_kernel(handle, state)
        difference = np.max(np.abs(outputs["legacy"] - outputs["backend"]))
        print(f"{np.dtype(dtype).name:8s} max |legacy - backend| = {difference:.3g}")
        if torch is not None:
            tx = torch.as_tensor(x, device="cuda")
            tw = torch.as_tensor(w, device="cuda")
            torch.backends.cudnn.allow_tf32 = False
            us = _median_us(lambda tx=tx, tw=tw: F.conv2d(tx, tw, None, 1, 1), torch.cuda.synchronize, args.runs, args.calls)
            print(f"{np.dtype(dtype).name:8s} {'torch':8s} {us:8.1f} us  (F.conv2d, allow_tf32 False, "
                  f"cudnn.benchmark {torch.backends.cudnn.benchmark})")
    handle.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
