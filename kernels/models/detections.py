"""YOLOv10's detections on the device: ultralytics' v10 postprocess of the decoded one-to-one head
(B, 4 + nc, A), as calls made once per plan on buffers made once, so that a call allocates nothing and
a CUDA graph of the plan (Plan.capture) replays the detections too.

Per image, k = min(max_det, A):
  1. best[a] = the max over the classes of anchor a's scores;
  2. the k anchors of highest best score: the top_k op (descending, ties by the lower anchor first);
  3. their k x nc class scores gathered, flattened anchor-major (j * nc + c);
  4. the top k of those (top_k again): score, chosen anchor j = index // nc, class = index % nc;
  5. rows [x1, y1, x2, y2, score, class] in descending score.
Steps 1, 3 and 5 copy or compare values only (NumPy on the CPU, detections.cu on the GPU), and top_k gives
the same bits on both devices, so the detections are the same bits on the CPU and the GPU, and the same as
the stable argsorts of postprocess_reference (kernels.models.yolov10) wherever the scores are numbers.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np

from .. import top_k
from ..runtime import gpu as gpu_runtime
from ..runtime.core import TensorShape

_TYPES = gpu_runtime.HALF_TYPES + gpu_runtime.FLOAT_TYPES
_CUDA = gpu_runtime.CudaModule("detections.cu", [
    f"detections_{kind}<{t}>" for kind in ("best", "gather", "rows") for t in _TYPES])

_INDEX = np.dtype(np.int64)


class Detections:
    """The detection calls of one decoded buffer (B, 4 + nc, A) on one device: `calls` (each a
    (function, args) pair, run in order by run()) write `rows` (B, k, 6) in decoded's dtype. `states`
    lists the top_k states, (module, state), for the caller to clean up."""

    def __init__(self, decoded: Any, nc: int, max_det: int, xp: Any, stream: Any, handle: Any):
        batch, channels, anchors = decoded.shape
        if channels != 4 + nc:
            raise ValueError(f"decoded has {channels} channels, expected 4 + {nc}")
        k = min(max_det, anchors)
        dtype = decoded.dtype
        self.decoded, self.nc, self.k = decoded, nc, k
        self.xp, self.stream, self.handle = xp, stream, handle
        gpu = xp is not np
        with (stream if gpu else contextlib.nullcontext()):
            self.best = xp.empty((batch, anchors), dtype)
            self.anchor_values = xp.empty((batch, k), dtype)
            self.anchor_index = xp.empty((batch, k), _INDEX)
            self.scores = xp.empty((batch, k * nc), dtype)
            self.top_values = xp.empty((batch, k), dtype)
            self.top_index = xp.empty((batch, k), _INDEX)
            self.rows = xp.empty((batch, k, 6), dtype)
        self.states: list[tuple[Any, Any]] = []
        prefix = "gpu_" if gpu else "cpu_"
        select_anchors = self._top_k(self.best, self.anchor_values, self.anchor_index, prefix)
        select_classes = self._top_k(self.scores, self.top_values, self.top_index, prefix)
        if gpu:  # pragma: no cover - GPU: detections.cu's launches around the top_k ones
            sizes = (np.int64(batch), np.int32(channels), np.int32(anchors))
            self.calls: list[tuple[Callable[..., None], tuple]] = [
                self._launch("best", batch * anchors, (decoded, self.best) + sizes),
                select_anchors,
                self._launch("gather", batch * k * nc, (decoded, self.anchor_index, self.scores) + sizes
                             + (np.int32(k),)),
                select_classes,
                self._launch("rows", batch * k, (decoded, self.anchor_index, self.top_values, self.top_index,
                                                 self.rows) + sizes + (np.int32(k),)),
            ]
        else:
            self.calls = [(self._cpu_best, ()), select_anchors, (self._cpu_gather, ()), select_classes,
                          (self._cpu_rows, ())]

    def _top_k(self, input: Any, values: Any, indices: Any, prefix: str) -> tuple[Callable[..., None], tuple]:
        attrs = top_k.TopKAttrs(values.shape[-1])
        state = top_k.init_kernel(self.handle, attrs, TensorShape.of(input), TensorShape.of(values),
                                  TensorShape.of(indices))
        self.states.append((top_k, state))
        return getattr(top_k, prefix + "forward_kernel"), (self.stream, self.handle, state, attrs, input, values,
                                                            indices)

    def _launch(self, kind: str, count: int, args: tuple) -> tuple[Callable[..., None], tuple]:  # pragma: no cover - GPU
        kernel = _CUDA.function(f"detections_{kind}<{gpu_runtime.cuda_type(self.decoded.dtype)}>",
                                self.stream.device)  # compiled and looked up now: never while a graph is captured
        grid = gpu_runtime.grid_for(count)
        return gpu_runtime.launch, (self.stream, kernel, grid, gpu_runtime.BLOCK, args)

    # The CPU's steps (NumPy), each writing its buffer in place.

    def _cpu_best(self) -> None:
        np.max(self.decoded[:, 4:, :], axis=1, out=self.best)

    def _cpu_gather(self) -> None:
        chosen = np.take_along_axis(self.decoded[:, 4:, :], self.anchor_index[:, None, :], axis=2)  # (B, nc, k)
        np.copyto(self.scores.reshape(-1, self.k, self.nc), chosen.transpose(0, 2, 1))

    def _cpu_rows(self) -> None:
        anchor = np.take_along_axis(self.anchor_index, self.top_index // self.nc, axis=1)  # (B, k)
        np.copyto(self.rows[:, :, 0:4], np.take_along_axis(self.decoded[:, :4, :], anchor[:, None, :], axis=2)
                  .transpose(0, 2, 1))
        self.rows[:, :, 4] = self.top_values
        self.rows[:, :, 5] = (self.top_index % self.nc).astype(self.rows.dtype)

    def run(self) -> Any:
        """Make the calls (enqueued on the stream on the GPU); returns `rows`."""
        for function, args in self.calls:
            function(*args)
        return self.rows

    def close(self) -> None:
        states, self.states = self.states, []
        for module, state in states:
            module.cleanup_kernel(self.handle, state)
