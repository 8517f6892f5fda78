"""A GPU handle: the cuDNN and cuBLAS handles of one device and a workspace, made on first use.

It sits above the GPU runtime (kernels.runtime.gpu: streams, memory, NVRTC) and the two library
bindings (kernels.runtime.cudnn, kernels.runtime.cublas), which need only the runtime below them:
nothing imports in a circle. cuDNN's library is loaded when a handle first asks for a cuDNN handle.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import cublas, cudnn, gpu

_HANDLES_LOCK = threading.Lock()
_HANDLES = {"cudnn": 0, "cublas": 0}


def live_library_handles() -> dict[str, int]:
    """How many cuDNN and cuBLAS handles GpuHandles hold now (for leak tests)."""
    with _HANDLES_LOCK:
        return dict(_HANDLES)


def _count_handle(library: str, change: int) -> None:
    with _HANDLES_LOCK:
        _HANDLES[library] += change


class GpuHandle:
    """cuDNN and cuBLAS handles of one device and a workspace, made on first use.

    A handle serves one stream at a time (its workspace is shared by the calls it serves): give
    each host thread its own. cuDNN is bound to the stream of each call when it changed;
    cuBLAS is bound by kernels.runtime.cublas when the stream changed. Close it (or use it as a context manager)
    to release everything.

    allow_tf32 (PyTorch's name; off by default) lets float32 conv_2d and batch_matmul states
    initialised with this handle run on TF32 tensor cores: inputs rounded to a 10-bit mantissa,
    sums in float32. It is fixed when the handle is made; without it nothing uses TF32.
    """

    def __init__(self, device: int = 0, allow_tf32: bool = False):
        if not isinstance(allow_tf32, bool):
            raise TypeError(f"gpu_handle: allow_tf32: expected a bool, found {allow_tf32!r}")
        gpu._require_cupy()
        self._allow_tf32 = allow_tf32
        self.device = int(device)
        self._cudnn: Any = None
        self._cublas: Any = None
        self._cudnn_stream: int | None = None  # the stream pointer cuDNN is bound to now
        self._workspace: Any = None
        self.closed = False

    @property
    def allow_tf32(self) -> bool:
        """Whether float32 conv_2d and batch_matmul states initialised with this handle may use TF32."""
        return self._allow_tf32

    def cudnn(self, stream: gpu.GpuStream) -> Any:
        """The cuDNN handle, bound to `stream`."""
        if self._cudnn is None:
            with gpu.cupy.cuda.Device(self.device):
                self._cudnn = cudnn.create_handle()
            _count_handle("cudnn", 1)
            self._cudnn_stream = None
        ptr = stream.ptr
        if ptr != self._cudnn_stream:
            cudnn.set_stream(self._cudnn, ptr)
            self._cudnn_stream = ptr
        return self._cudnn

    def cublas(self) -> Any:
        """The cuBLAS handle (kernels.runtime.cublas.CublasHandle: pedantic math, host pointer mode, its own
        workspace). Call cuBLAS through kernels.runtime.cublas, which binds it to the call's stream."""
        if self._cublas is None:
            self._cublas = cublas.create_handle(self.device)
            _count_handle("cublas", 1)
        return self._cublas

    def reserve(self, nbytes: int) -> None:
        """Grow the workspace to at least `nbytes` now (init_kernel does, so that calls never allocate)."""
        if self._workspace is None or self._workspace.nbytes < nbytes:
            self._workspace = None  # freed first (cudaFree waits for the work that used it)
            workspace = gpu.device_empty((max(int(nbytes), 1),), np.uint8, self.device)
            # cuDNN's half-precision layout conversions read workspace bytes its convolution never
            # wrote (compute-sanitizer's initcheck names them); zeros make those reads defined, so a
            # real uninitialized read can never hide among them. Done once, here at init: the memset
            # runs on the legacy stream and is waited for, so no kernel stream can overtake it.
            with gpu.cupy.cuda.Device(self.device):
                gpu.cupy.cuda.runtime.memsetAsync(workspace.data.ptr, 0, workspace.nbytes, 0)
                gpu.cupy.cuda.runtime.streamSynchronize(0)
            self._workspace = workspace

    def workspace(self, nbytes: int) -> Any:
        """The workspace: a device buffer of at least `nbytes`, kept across calls."""
        self.reserve(nbytes)
        return self._workspace

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._cudnn is not None:
            with gpu.cupy.cuda.Device(self.device):  # the handle's device current, whichever the caller's is
                cudnn.destroy_handle(self._cudnn)
            _count_handle("cudnn", -1)
            self._cudnn = None
            self._cudnn_stream = None
        if self._cublas is not None:
            cublas.destroy_handle(self._cublas, self.device)
            _count_handle("cublas", -1)
            self._cublas = None
        self._workspace = None

    def __enter__(self) -> "GpuHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        tf32 = ", allow_tf32=True" if self._allow_tf32 else ""
        return f"GpuHandle(device={self.device}{tf32})"




def gpu_handle(device: int = 0, allow_tf32: bool = False) -> GpuHandle:
    """A new GPU handle (cuDNN, cuBLAS, workspace) for `device`; allow_tf32=True lets float32
    conv_2d and batch_matmul use TF32 tensor cores (off by default, as PyTorch's allow_tf32)."""
    return GpuHandle(device, allow_tf32)
