"""top_k's forward kernel at each block width beside torch.sort(descending=True, stable=True): the device
time of one launch (CUDA events around 100 launches back to back) at 256, 512 and 1024 threads, the width
the plan picks, and whether every width gave the plan's bits. Detector-like scores (a sigmoid of normal
values) on YOLOv10's rows and on shorter ones. The launches are not held behind a spin kernel (as
tools/conv_algos.py's are): a launch's host time (about 10 us, ours or torch.sort's) is below every
kernel's time on these shapes (25 us and up), so the GPU is never left waiting. Run on the GPU machine:
python3 tools/top_k_widths.py (docs/performance.md#top_k-and-the-detections)."""

import sys

import numpy as np

sys.path.insert(0, ".")
import cupy  # noqa: E402
import torch  # noqa: E402

import kernels  # noqa: E402
from kernels.runtime import gpu  # noqa: E402
from kernels.top_k import gpu as top_k_gpu  # noqa: E402
from kernels.top_k.plan import gpu_plan  # noqa: E402

WIDTHS = (256, 512, 1024)
SHAPES = ((4096, 300, 10), (1024, 1000, 100), (256, 2048, 300), (64, 4096, 300), (1, 8400, 300), (16, 8400, 300),
          (1, 24000, 300), (16, 24000, 300), (2, 30000, 300),
          (1, 8400, 8400), (16, 2000, 1500), (64, 4096, 2048))  # a large k: the scratch path's radix sort
LAUNCHES = 100


def timed(function, start, stop, elapsed_ms):
    """us a call: the mean over LAUNCHES calls back to back, between a start and a stop event on their stream."""
    function()
    start()
    for _ in range(LAUNCHES):
        function()
    stop()
    return elapsed_ms() / LAUNCHES * 1000


def timed_ours(stream, function, grid, width, args, shared_mem):
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    return timed(lambda: gpu.launch(stream, function, grid, width, args, shared_mem=shared_mem),
                 lambda: start.record(stream.cupy_stream), lambda: (stop.record(stream.cupy_stream), stop.synchronize()),
                 lambda: cupy.cuda.get_elapsed_time(start, stop))


def timed_torch(function):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    return timed(function, start.record, lambda: (stop.record(), stop.synchronize()), lambda: start.elapsed_time(stop))


def main():
    stream = kernels.gpu_stream(0)
    print("dtype rows x n k | " + " ".join(f"{w:>6}" for w in WIDTHS) + " | plan | same bits | torch.sort (us)")
    for dtype in (np.float32, np.float16):
        for rows, n, k in SHAPES:
            rng = np.random.default_rng(n + rows)
            x = (1 / (1 + np.exp(-(3 * rng.standard_normal((rows, n)) - 4)))).astype(dtype)
            plan = gpu_plan((rows, n), k, np.dtype(dtype), gpu.shared_memory_optin(0))
            with stream:
                xd = cupy.asarray(x)
                keys = cupy.empty(plan.scratch, plan.key_dtype)
                index = cupy.empty(plan.scratch, np.int32)
            function = top_k_gpu._CUDA.function(plan.forward)
            times, results = [], {}
            for width in WIDTHS:
                with stream:
                    values = cupy.full((rows, k), np.nan, dtype)
                    indices = cupy.full((rows, k), -1, np.int64)
                args = (xd, values, indices, keys, index, np.int64(rows), np.int32(n), np.int32(k),
                        np.int32(plan.cache_bytes > 0), np.int32(plan.sort_bytes > 0))
                times.append(timed_ours(stream, function, plan.grid, width, args, plan.shared_mem))
                results[width] = (values.get().view(np.uint8), indices.get())
            mine = results[plan.block]
            same = all(np.array_equal(r[0], mine[0]) and np.array_equal(r[1], mine[1]) for r in results.values())
            t = torch.as_tensor(x, device="cuda")
            sort = timed_torch(lambda: torch.sort(t, dim=-1, descending=True, stable=True))  # noqa: B023 (run here)
            print(f"{np.dtype(dtype).name} {rows} x {n} k {k} | " + " ".join(f"{t_:6.1f}" for t_ in times)
                  + f" | {plan.block} | {same} | {sort:.1f}", flush=True)


if __name__ == "__main__":
    main()
