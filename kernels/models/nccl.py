"""The NCCL communicator of data-parallel training (kernels.models.parallel), through cupy.cuda.nccl.
GPU only: it needs CuPy, a CUDA device and the NCCL library (the nvidia-nccl-cu13 wheel: `pip install
-e '.[nccl]'`).

`connect()` bootstraps it from the launcher's environment: the rank, world size and local rank that
torchrun or mpirun set (parallel.launch_environment), the device LOCAL_RANK (or the one given), and the
NCCL unique id made by rank 0 and shared through the file KERNELS_NCCL_ID_FILE names. NCCL carries the
data itself (NVLink, PCIe, InfiniBand or sockets, as it finds them).

NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected", since NCCL 2.5, MPS or
not): a world of N ranks needs N GPUs.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from ..runtime import gpu
from ..runtime.core import CudaError, DeviceError
from . import parallel


def nccl_unavailable_reason() -> str | None:
    """Why NCCL cannot run here (no CuPy, no device, no NCCL library), or None."""
    reason = gpu.gpu_unavailable_reason()
    if reason is not None:
        return reason
    from cupy.cuda import nccl

    if not nccl.available:
        return "the NCCL library is not loadable (pip install nvidia-nccl-cu13)"
    return None


def _nccl() -> Any:
    reason = nccl_unavailable_reason()
    if reason is not None:
        raise DeviceError(f"{parallel.OP}: NCCL is unavailable: {reason}")
    from cupy.cuda import nccl

    return nccl


def _call(what: str, function: Any, *args: Any) -> Any:
    nccl = _nccl()
    try:
        return function(*args)
    except nccl.NcclError as error:
        raise CudaError("NCCL", str(error).split(":")[0], what) from error


def unique_id() -> tuple[int, ...]:
    """A new NCCL unique id (rank 0 makes it; every rank passes it to the communicator)."""
    nccl = _nccl()
    return tuple(_call("ncclGetUniqueId", nccl.get_unique_id))


class NcclCommunicator:
    """One rank of an NCCL communicator on `device`: sums and broadcasts of float32 and float64 CuPy arrays of
    that device, enqueued on a kernels GpuStream."""

    def __init__(self, launch: parallel.Launch, device: int, nccl_id: tuple[int, ...]):
        nccl = _nccl()
        self.rank, self.world_size, self.device = launch.rank, launch.world_size, int(device)
        what = f"ncclCommInitRank (rank {self.rank} of {self.world_size}, GPU {self.device})"
        with gpu.cupy.cuda.Device(self.device):
            try:  # CuPy 14 takes the id as its 128 bytes, and refuses a tuple
                self.comm = _call(what, nccl.NcclCommunicator, self.world_size, bytes(v & 0xFF for v in nccl_id),
                                  self.rank)
            except TypeError:  # older CuPy: the tuple of ints get_unique_id gave
                self.comm = _call(what, nccl.NcclCommunicator, self.world_size, tuple(nccl_id), self.rank)
        self._types = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64}
        self._sum = nccl.NCCL_SUM

    def _check(self, array: Any, stream: Any) -> int:
        if stream.device != self.device or array.device.id != self.device:
            raise DeviceError(f"{parallel.OP}: the communicator is of GPU {self.device}, found stream of GPU "
                              f"{stream.device} and array of GPU {array.device.id}")
        if not array.flags.c_contiguous or array.dtype not in self._types:
            raise DeviceError(f"{parallel.OP}: expected a C-contiguous float32 or float64 array, found {array.dtype}")
        return self._types[array.dtype]

    def all_reduce_sum(self, array: Any, stream: Any) -> None:
        """array = the sum of every rank's array, in place, enqueued on `stream` (the same sum on every rank)."""
        kind = self._check(array, stream)
        with gpu.cupy.cuda.Device(self.device):
            _call("ncclAllReduce", self.comm.allReduce, array.data.ptr, array.data.ptr, array.size, kind, self._sum,
                  stream.ptr)

    def broadcast(self, array: Any, root: int, stream: Any) -> None:
        """array = root's array, in place, enqueued on `stream`."""
        kind = self._check(array, stream)
        with gpu.cupy.cuda.Device(self.device):
            _call("ncclBroadcast", self.comm.bcast, array.data.ptr, array.size, kind, int(root), stream.ptr)

    def close(self) -> None:
        comm, self.comm = getattr(self, "comm", None), None
        if comm is not None:
            with gpu.cupy.cuda.Device(self.device):
                comm.destroy()

    def __enter__(self) -> "NcclCommunicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def connect(environ: Mapping[str, str] | None = None, device: int | None = None) -> NcclCommunicator:
    """This process's rank of the communicator its launcher describes (parallel.launch_environment), on GPU
    `device` (LOCAL_RANK where None). The unique id goes through the file KERNELS_NCCL_ID_FILE names (not
    needed for a world of one); rank 0 removes it once every rank has joined."""
    environ = os.environ if environ is None else environ
    launch = parallel.launch_environment(environ)
    path = environ.get(parallel.ID_FILE_VARIABLE) or None
    nccl_id = parallel.share_unique_id(launch, path, unique_id)
    communicator = NcclCommunicator(launch, launch.local_rank if device is None else device, nccl_id)
    parallel.remove_id_file(launch, path)  # ncclCommInitRank returned: every rank has read it
    return communicator
