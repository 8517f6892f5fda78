"""Ranks for the data-parallel tests where NCCL cannot run: in threads of one process (ThreadGroup), or in
processes that share a folder (FileCommunicator: the test-only stand-in of NCCL's transport for ranks that
NCCL refuses, as two ranks on one GPU). Both sum in rank order, so every rank gets the same bits.

`python -m tests.parallel_ranks ...` is one rank of a data-parallel step (yolov10 on its shard), launched
with torchrun's variables by the tests: it bootstraps from the environment, runs the step and saves what it
made (gradients, running statistics, its shard's outputs) to an .npz for the test to compare."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
import time

import numpy as np


def to_host(array):
    return array.get() if hasattr(array, "get") else np.array(array)


class ThreadGroup:
    """world_size ranks as threads of this process."""

    def __init__(self, world_size):
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size)
        self.slots = [None] * world_size

    def communicator(self, rank):
        return ThreadRank(self, rank)


class ThreadRank:
    def __init__(self, group, rank):
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def all_reduce_sum(self, array, stream):
        group = self.group
        group.slots[self.rank] = np.array(array, copy=True)
        group.barrier.wait()
        total = group.slots[0].copy()
        for part in group.slots[1:]:
            total += part
        group.barrier.wait()
        array[...] = total

    def broadcast(self, array, root, stream):
        group = self.group
        if self.rank == root:
            group.slots[root] = np.array(array, copy=True)
        group.barrier.wait()
        value = group.slots[root]
        group.barrier.wait()
        array[...] = value

    def close(self):
        pass


class FileCommunicator:
    """Ranks in processes sharing `folder`: each call writes this rank's array as .npy (renamed into place)
    and waits for every rank's; host copies (CuPy arrays are synchronized on the stream first)."""

    def __init__(self, folder, rank, world_size, timeout=300.0):
        self.folder, self.rank, self.world_size, self.timeout = folder, rank, world_size, timeout
        self.calls = 0

    def _exchange(self, array, stream):
        if hasattr(stream, "cupy_stream"):
            stream.synchronize()
        self.calls += 1
        name = os.path.join(self.folder, f"call{self.calls}_rank{{}}.npy")
        temporary = name.format(self.rank) + ".tmp.npy"
        np.save(temporary, to_host(array))
        os.replace(temporary, name.format(self.rank))
        deadline = time.monotonic() + self.timeout
        parts = []
        for rank in range(self.world_size):
            while not os.path.exists(name.format(rank)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {rank} wrote no {name.format(rank)}")
                time.sleep(0.005)
            parts.append(np.load(name.format(rank)))
        return parts

    def _set(self, array, value, stream):
        if hasattr(stream, "cupy_stream"):
            import cupy

            with stream:
                array[...] = cupy.asarray(value)
        else:
            array[...] = value

    def all_reduce_sum(self, array, stream):
        parts = self._exchange(array, stream)
        total = parts[0].copy()
        for part in parts[1:]:
            total += part
        self._set(array, total, stream)

    def broadcast(self, array, root, stream):
        self._set(array, self._exchange(array, stream)[root], stream)

    def close(self):
        pass


# --------------------------------------------------------------------------- one rank of a step


def batch(batch_size, size, dtype, seed=0):
    """The whole batch every rank knows: inputs, and the outputs' gradients made by shapes of yolov10's heads."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch_size, 3, size, size)).astype(dtype)


def output_grads_like(outputs, seed=1):
    """Varied values (never all ones: they hide index bugs) shaped like the training outputs."""
    rng = np.random.default_rng(seed)
    return {key: [rng.standard_normal(a.shape).astype(a.dtype) * 0.01 for a in outputs[key]]
            for key in ("one2many", "one2one")}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")  # cpu, or gpu:N for every rank (two ranks may share one GPU)
    parser.add_argument("--comm", choices=["file", "nccl"], default="file")
    parser.add_argument("--folder", help="the FileCommunicator's folder")
    parser.add_argument("--sync", action="store_true")
    parser.add_argument("--variant", default="n")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--out", required=True)
    arguments = parser.parse_args(argv)

    from kernels.models import YOLOv10, parallel

    launch = parallel.launch_environment()
    path = os.environ.get(parallel.ID_FILE_VARIABLE)
    if arguments.comm == "nccl":
        from kernels.models import nccl

        communicator = nccl.connect()
        device = f"gpu:{communicator.device}"
        unique = b"nccl"
    else:
        from kernels.models import nccl

        def make_id():
            return tuple(np.frombuffer(os.urandom(128), np.int8).tolist())

        if arguments.device.startswith("gpu") and nccl.nccl_unavailable_reason() is None:
            make_id = nccl.unique_id  # noqa: F811 - the real id, through the real file bootstrap
        unique_id = parallel.share_unique_id(launch, path, make_id)  # the file stays: no collective init to wait on
        unique = hashlib.sha256(np.array(unique_id, np.int64).tobytes()).digest()
        communicator = FileCommunicator(arguments.folder, launch.rank, launch.world_size)
        device = arguments.device
    model = YOLOv10(arguments.variant, device=device, dtype=arguments.dtype)
    if launch.rank != 0:
        model.init_random(seed=launch.rank + 100)  # different weights: the broadcast must make them rank 0's
    trainer = parallel.DataParallel(model, communicator, sync_batch_norm=arguments.sync)
    x = parallel.shard(batch(arguments.batch, arguments.size, arguments.dtype), launch.rank, launch.world_size)
    with model.active():
        out = trainer(model.xp.asarray(np.ascontiguousarray(x)))
        full = output_grads_like({k: [np.empty((arguments.batch,) + a.shape[1:], a.dtype) for a in v]
                                  for k, v in out.items() if k in ("one2many", "one2one")})
        # Each rank's loss is the mean over its shard: its output gradient is world_size times its rows of the
        # whole batch's (exact: a power of two for 1, 2, 4, 8 ranks).
        grads = {k: [model.xp.asarray(np.ascontiguousarray(parallel.shard(g, launch.rank, launch.world_size))
                                      * launch.world_size) for g in v] for k, v in full.items()}
    trainer.backward(grads)
    model.stream.synchronize()
    saved = {f"grad/{name}": to_host(g) for name, g in model.grads.items()}
    saved.update({f"running/{name}": to_host(array) for name, array in model.state_dict().items()
                  if name.endswith(("running_mean", "running_var"))})
    saved.update({f"out/{k}/{i}": to_host(a) for k, v in out.items() if k in ("one2many", "one2one")
                  for i, a in enumerate(v)})
    saved["unique"] = np.frombuffer(unique, np.uint8)
    saved["launch"] = np.array([launch.rank, launch.world_size, launch.local_rank])
    np.savez(arguments.out, **saved)
    model.close()
    communicator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
