# ruff: noqa: B023  (each lambda is timed at once, inside the iteration that made it)
"""Host and device time of each exact cuDNN convolution algorithm on YOLOv10 shapes, next to
PyTorch's convolution of the same shape: which algorithms have low per-call host cost (small
shapes, batch 1) and which run fastest on the GPU (large shapes). Run on the GPU machine:

    python3 tools/conv_algos.py [--set small|x16|sweep] [--dtype float32|float16|bfloat16] [--count N]
                                [--workspace MiB]

--set small (default): a head 1x1, a C2f 3x3, the stem and a depthwise 3x3 at batch 1.
--set x16: yolov10x's 3x3 convolutions at batch 16, the ones that carry its eval's gap to PyTorch
(tools/yolov10_profile.py: model.1, model.2, model.3, model.4, model.17, model.23).
--set n1: yolov10n's dense 3x3 convolutions at batch 1 (its graph replay's largest kind of call), then
yolov10s's 32 channels at 160x160 and two below plan.IMPLICIT_GEMM_BELOW_FLOPS.
--set sweep: 3x3 convolutions at batch 1 to 8, and yolov10x's model.1 and model.2 at batch 1: where
IMPLICIT_PRECOMP_GEMM starts to beat IMPLICIT_GEMM on the device.
--set b16: yolov10x's and yolov10s's dense 3x3 and 1x1 convolutions at batch 16 (the float32 model(x) rows).
Without --engines, each shape also times our input and filter gradients (each alone) and PyTorch's
(aten.convolution_backward) with its default algorithm choice and with torch.backends.cudnn.deterministic,
and names the kernels each runs: whether PyTorch's training step is faster by other algorithms.
--engines: instead of the legacy algorithms, the forward through every backend engine that cuDNN's
heuristics offer (modes A and B, then the fallback list) and cudnn.engine_rejection accepts, one execution
plan each: its device time and its largest difference from our forward's output.
float32 runs cuDNN in FMA math (no TF32, PyTorch likewise); the half dtypes in tensor-op math.
First cuDNN's v7 heuristics' ranking (algo, math type, workspace MiB); then per algorithm its
workspace (MiB, cuDNN's size query), the host time of a call (the loop's wall time before
synchronizing) and the device time (CUDA events around the loop, over the calls), in microseconds.
The loop is enqueued behind a spin kernel that holds the stream longer than the host takes to enqueue
it, so the device time is the calls' back to back, not the host's pace."""

import argparse
import ctypes
import sys
import time

import numpy as np

sys.path.insert(0, ".")
import cupy  # noqa: E402
import torch  # noqa: E402

import kernels  # noqa: E402
from conformance.harness import spin  # noqa: E402
from kernels import TensorShape as S  # noqa: E402
from kernels.runtime import cudnn  # noqa: E402
from kernels.runtime.core import BFLOAT16  # noqa: E402

# (name, input dims, output channels, kernel, stride, padding, groups)
SETS = {
    "small": [("head 1x1", (1, 64, 80, 80), 64, 1, 1, 0, 1), ("c2f 3x3", (1, 32, 160, 160), 32, 3, 1, 1, 1),
              ("stem 3x3 s2", (1, 3, 640, 640), 16, 3, 2, 1, 1), ("dw 3x3 s2", (1, 64, 80, 80), 64, 3, 2, 1, 64)],
    "x16": [("model.1 3x3 s2", (16, 80, 320, 320), 160, 3, 2, 1, 1),
            ("model.2 3x3", (16, 80, 160, 160), 80, 3, 1, 1, 1),
            ("model.3 3x3 s2", (16, 160, 160, 160), 320, 3, 2, 1, 1),
            ("model.4 3x3", (16, 160, 80, 80), 160, 3, 1, 1, 1),
            ("model.17 3x3 s2", (16, 320, 80, 80), 320, 3, 2, 1, 1),
            ("model.23 3x3", (16, 320, 80, 80), 80, 3, 1, 1, 1)],
    "n1": [("c2f 16ch 160", (1, 16, 160, 160), 16, 3, 1, 1, 1), ("c2f 32ch 80", (1, 32, 80, 80), 32, 3, 1, 1, 1),
           ("c2f 64ch 40", (1, 64, 40, 40), 64, 3, 1, 1, 1), ("c2f 128ch 20", (1, 128, 20, 20), 128, 3, 1, 1, 1),
           ("head 64ch 80", (1, 64, 80, 80), 64, 3, 1, 1, 1), ("head 128->64 40", (1, 128, 40, 40), 64, 3, 1, 1, 1),
           ("head 256->64 20", (1, 256, 20, 20), 64, 3, 1, 1, 1), ("head 64ch 20", (1, 64, 20, 20), 64, 3, 1, 1, 1),
           ("s c2f 32ch 160", (1, 32, 160, 160), 32, 3, 1, 1, 1), ("32ch 20", (1, 32, 20, 20), 32, 3, 1, 1, 1),
           ("16ch 40", (1, 16, 40, 40), 16, 3, 1, 1, 1)],
    "b16": [("x model.1 3x3 s2", (16, 80, 320, 320), 160, 3, 2, 1, 1), ("x model.2 3x3", (16, 80, 160, 160), 80, 3, 1, 1, 1),
            ("x model.4 3x3", (16, 160, 80, 80), 160, 3, 1, 1, 1), ("x model.23 3x3", (16, 320, 80, 80), 80, 3, 1, 1, 1),
            ("x 3x3 320ch 40", (16, 320, 40, 40), 320, 3, 1, 1, 1), ("s 3x3 64ch 80", (16, 64, 80, 80), 64, 3, 1, 1, 1),
            ("s 3x3 128ch 40", (16, 128, 40, 40), 128, 3, 1, 1, 1),
            ("x 1x1 160->160 at 160", (16, 160, 160, 160), 160, 1, 1, 0, 1),
            ("x 1x1 400->160 at 160", (16, 400, 160, 160), 160, 1, 1, 0, 1),
            ("x 1x1 640->640 at 40", (16, 640, 40, 40), 640, 1, 1, 0, 1)],
    "sweep": [(f"160ch 3x3 b{n}", (n, 160, 80, 80), 160, 3, 1, 1, 1) for n in (1, 2, 4, 8)]
    + [(f"32ch 3x3 b{n}", (n, 32, 160, 160), 32, 3, 1, 1, 1) for n in (4, 16)]
    + [("x model.1 3x3 s2 b1", (1, 80, 320, 320), 160, 3, 2, 1, 1), ("x model.2 3x3 b1", (1, 80, 160, 160), 80, 3, 1, 1, 1)],
}
DTYPES = {"float32": (np.float32, torch.float32), "float16": (np.float16, torch.float16),
          "bfloat16": (BFLOAT16, torch.bfloat16)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), default="small")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--count", type=int, default=0, help="calls timed per algorithm (default: 200 small, 20 else)")
    parser.add_argument("--workspace", type=int, default=2048, help="MiB of workspace an algorithm may use")
    parser.add_argument("--engines", action="store_true", help="the forward's backend engines, not the legacy algorithms")
    arguments = parser.parse_args()
    workspace = arguments.workspace << 20
    count = arguments.count or (200 if arguments.set in ("small", "n1") else 20)
    dtype, torch_dtype = DTYPES[arguments.dtype]
    math = cudnn.FMA_MATH if arguments.dtype == "float32" else cudnn.TENSOR_OP_MATH
    torch.backends.cudnn.allow_tf32 = False
    stream, handle = kernels.gpu_stream(), kernels.gpu_handle()
    cupy_stream = stream.cupy_stream

    def timed(function) -> tuple[float, float]:
        function()
        stream.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        spin(stream, count * 200_000)  # 200 us a call: longer than any call's host time here
        begun = time.perf_counter()
        start.record(cupy_stream)
        for _ in range(count):
            function()
        host = (time.perf_counter() - begun) / count * 1e6
        end.record(cupy_stream)
        end.synchronize()
        return host, cupy.cuda.get_elapsed_time(start, end) * 1e3 / count

    print(f"set {arguments.set}, {arguments.dtype}, {count} calls each; host us / device us per call")
    for name, dims, out_c, k, s, p, g in SETS[arguments.set]:
        rng = np.random.default_rng(0)
        with stream:
            x = cupy.asarray(rng.standard_normal(dims).astype(np.float32).astype(dtype))
            w = cupy.asarray((rng.standard_normal((out_c, dims[1] // g, k, k)) * 0.1).astype(np.float32).astype(dtype))
            ho, wo = (dims[2] + 2 * p - k) // s + 1, (dims[3] + 2 * p - k) // s + 1
            y = cupy.empty((dims[0], out_c, ho, wo), dtype)
            dx, dw = cupy.empty_like(x), cupy.empty_like(w)  # the backward's outputs (x and w stay as made)
        attrs = kernels.Conv2DAttrs(out_channels=out_c, kernel_h=k, kernel_w=k, stride_h=s, stride_w=s, padding_h=p,
                                    padding_w=p, groups=g)
        state = kernels.conv_2d.init_kernel(handle, attrs, S.of(x), S.of(y))
        ours = timed(lambda: kernels.conv_2d.forward_kernel(stream, handle, state, attrs, x, w, None, y))
        print(f"{name} {dims}->{out_c}: paths {state.paths}, chosen "
              f"{ {d: (a.algo, a.math_type) for d, a in state.algorithms.items()} }; our forward "
              f"{ours[0]:8.1f} / {ours[1]:8.1f}")
        if not arguments.engines:  # our input and filter gradients, each alone (y stands for the output's gradient)
            backward = kernels.conv_2d.backward_kernel
            for direction, grads in (("data", (None, dx, w, None)), ("filter", (x, None, None, dw))):
                host, device = timed(lambda: backward(stream, handle, state, attrs, None, y, *grads, None))
                print(f"  our bwd {direction}: {host:8.1f} / {device:8.1f}")
        d, h = state.descriptors, handle.cudnn(stream)
        if arguments.engines:
            ours_y = y.copy()
            plan = AllEngines("forward", h, dtype, dims, w.shape, y.shape, (p, p), (s, s), (1, 1), False, workspace)
            try:
                for mode, engine, notes, plan_descriptor, size in plan.found:
                    ws = handle.workspace(max(size, 1))
                    plan.plan, plan._key = plan_descriptor, None
                    device = timed(lambda: plan.run(h, x.data.ptr, w.data.ptr, y.data.ptr, ws.data.ptr))[1]
                    difference = float(cupy.abs(y.astype(np.float32) - ours_y.astype(np.float32)).max())
                    print(f"  engine {engine:3d} (heuristics mode {mode}, numerical notes {notes}, "
                          f"{size / 2**20:.0f} MiB): {device:8.1f} us, max |ours - engine's| {difference:.2e}")
            finally:
                plan.destroy()
            kernels.conv_2d.cleanup_kernel(handle, state)
            continue
        if d.conv is None:
            continue
        ws = handle.workspace(workspace)
        ordered = {"fwd": (d.x, d.w, d.conv, d.y), "bwd data": (d.w, d.y, d.conv, d.x),
                   "bwd filter": (d.x, d.y, d.conv, d.w)}
        one, zero = cudnn.scalar(dtype, 1), cudnn.scalar(dtype, 0)
        calls = {
            "fwd": (cudnn.EXACT_FWD_ALGOS, lambda a: cudnn.convolution_forward(
                h, one, d.x, x.data.ptr, d.w, w.data.ptr, d.conv, a, ws.data.ptr, workspace, zero, d.y, y.data.ptr)),
            "bwd data": (cudnn.EXACT_BWD_DATA_ALGOS, lambda a: cudnn.convolution_backward_data(
                h, one, d.w, w.data.ptr, d.y, y.data.ptr, d.conv, a, ws.data.ptr, workspace, zero, d.x, dx.data.ptr)),
            "bwd filter": (cudnn.EXACT_BWD_FILTER_ALGOS, lambda a: cudnn.convolution_backward_filter(
                h, one, d.x, x.data.ptr, d.y, y.data.ptr, d.conv, a, ws.data.ptr, workspace, zero, d.w, dw.data.ptr)),
        }
        for (direction, (algos, call)), key in zip(calls.items(), cudnn._DIRECTIONS):
            size_function = cudnn._DIRECTIONS[key][2]
            d.conv.set_math_type(math)
            print(f"  {direction} heuristics (algo, math, MiB): {heuristics(key, h, ordered[direction], d.conv, math)}")
            for algo in algos:
                try:
                    d.conv.set_math_type(math)
                    size = cudnn._workspace_size(size_function, h, [o.ptr for o in ordered[direction]], int(algo))
                    mib = "-" if size is None else f"{size / 2**20:.0f}"
                    host, device = timed(lambda: call(cudnn.Algorithm(int(algo), math, workspace)))
                    print(f"  {direction} algo {int(algo)} ({mib} MiB): {host:8.1f} / {device:8.1f}")
                except Exception as error:  # an algorithm cuDNN does not support for this shape
                    print(f"  {direction} algo {int(algo)}: {str(error)[:80]}")
        stream.synchronize()
        tx = torch.from_numpy(cupy.asnumpy(x).astype(np.float32)).cuda().to(torch_dtype)
        tw = torch.from_numpy(cupy.asnumpy(w).astype(np.float32)).cuda().to(torch_dtype)
        conv = torch.nn.functional.conv2d
        print(f"  torch fwd: {'%8.1f / %8.1f' % torch_timed(lambda: conv(tx, tw, None, s, p, 1, g), count)}")
        ty = conv(tx, tw, None, s, p, 1, g)
        for direction, mask in (("bwd data", [True, False, False]), ("bwd filter", [False, True, False])):
            def backward():
                return torch.ops.aten.convolution_backward(ty, tx, tw, None, [s, s], [p, p], [1, 1], False, [0, 0], g,
                                                           mask)
            for deterministic in (False, True):  # PyTorch's default step, then its deterministic one
                torch.backends.cudnn.deterministic = deterministic
                host, device = torch_timed(backward, count)
                print(f"  torch {direction}{' deterministic' if deterministic else ''}: {host:8.1f} / {device:8.1f}"
                      f"  kernels: {torch_kernels(backward)}")
            torch.backends.cudnn.deterministic = False
        kernels.conv_2d.cleanup_kernel(handle, state)


def torch_timed(function, count: int, sleep_cycles: int = 400_000) -> tuple[float, float]:
    """Host and device us a call of a PyTorch function, timed as timed() times ours: the calls enqueued behind a
    sleep of `sleep_cycles` a call (about 2 GHz: 200 us a call by default), so the device time is theirs back to
    back (also tools/depthwise_times.py's)."""
    for _ in range(2):
        function()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(count * sleep_cycles)
    begun = time.perf_counter()
    start.record()
    for _ in range(count):
        function()
    host = (time.perf_counter() - begun) / count * 1e6
    end.record()
    end.synchronize()
    return host, start.elapsed_time(end) * 1e3 / count


def torch_kernels(function) -> list[str]:
    """The names of the CUDA kernels one call of a PyTorch function runs (its profiler's), shortened: which
    cuDNN kernels (deterministic or not) PyTorch's algorithm choice runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        function()
        torch.cuda.synchronize()
    return [event.name[:60] for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA]


class AllEngines(cudnn.ConvolutionPlan):
    """A ConvolutionPlan that finalizes a plan for every engine the heuristics offer (modes A and B, then the
    fallback list; each engine once) that engine_rejection accepts and whose workspace fits: `found` holds
    (mode, engine, numerical notes, plan, workspace bytes); `plan` is set to each in turn to run it."""

    def _choose(self, graph, tf32: bool, workspace_limit: int) -> None:
        self.found, seen = [], set()
        for mode in (cudnn.HEUR_MODE_A, HEUR_MODE_B, cudnn.HEUR_MODE_FALLBACK):
            for config in self._configs(graph, mode):
                engine = self._make(cudnn.BACKEND_ENGINE_DESCRIPTOR)
                config.get_descriptors(cudnn.ATTR_ENGINECFG_ENGINE, [engine])
                index = int(engine.get(cudnn.ATTR_ENGINE_GLOBAL_INDEX, cudnn.TYPE_INT64, ctypes.c_int64, 1)[0])
                notes = engine.get(cudnn.ATTR_ENGINE_NUMERICAL_NOTE, cudnn.TYPE_NUMERICAL_NOTE, ctypes.c_int,
                                   cudnn.NUMERICAL_NOTE_TYPE_COUNT)
                if index in seen or cudnn.engine_rejection(notes, self.dtype, tf32) is not None:
                    continue
                seen.add(index)
                plan = self._make(cudnn.BACKEND_EXECUTION_PLAN_DESCRIPTOR)
                plan.set(cudnn.ATTR_EXECUTION_PLAN_HANDLE, cudnn.TYPE_HANDLE, ctypes.c_void_p, [self.handle])
                plan.set_descriptors(cudnn.ATTR_EXECUTION_PLAN_ENGINE_CONFIG, [config])
                if plan.try_finalize() != cudnn.STATUS_SUCCESS:
                    continue
                size = int(plan.get(cudnn.ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, cudnn.TYPE_INT64, ctypes.c_int64, 1)[0])
                if size <= workspace_limit:
                    self.found.append((mode, index, list(notes), plan, size))
        self.plan = self.found[0][3] if self.found else None


HEUR_MODE_B = 1  # cudnnBackendHeurMode_t's CUDNN_HEUR_MODE_B (the library asks modes A and the fallback only)


def heuristics(direction: str, handle: int, ordered: tuple, conv, math: int) -> list[tuple[int, int, int]]:
    """cuDNN's v7 heuristics' ranking of the deterministic algorithms: (algo, math type, workspace MiB)."""
    max_count, function = cudnn._DIRECTIONS[direction][:2]
    lib, count, returned = cudnn.library(), ctypes.c_int(), ctypes.c_int()
    cudnn.check(getattr(lib, max_count)(handle, ctypes.byref(count)), max_count)
    results = (cudnn.AlgoPerf * max(count.value, 1))()
    conv.set_math_type(math)
    cudnn.check(getattr(lib, function)(handle, *(o.ptr for o in ordered), len(results), ctypes.byref(returned),
                                       results), function)
    return [(r.algo, r.mathType, r.memory >> 20) for r in results[: returned.value]
            if r.status == cudnn.STATUS_SUCCESS and r.determinism == cudnn.DETERMINISTIC]


if __name__ == "__main__":
    main()
