"""Data-parallel training of a Network: each rank (a process, one GPU each) takes a shard of the batch,
and after the backward the gradients are averaged over the ranks (as torch's DistributedDataParallel).
BatchNorm uses each rank's own batch statistics by default (as DDP), or the statistics of the whole
batch across the ranks (`sync_batch_norm=True`, as torch.nn.SyncBatchNorm).

The ranks talk through a communicator: an object with `rank`, `world_size`, `all_reduce_sum(array,
stream)` (in place, the same sum on every rank) and `broadcast(array, root, stream)`. On GPUs it is NCCL
(`kernels.models.nccl.connect()`, bootstrapped from the launcher's environment); `SingleProcess` is the
world of one. Nothing here assumes one host: a rank's device is its LOCAL_RANK, and the NCCL unique id
travels through a file (`KERNELS_NCCL_ID_FILE`) that every rank can read.

SyncBatchNorm is made from the batch_norm op's four functions, unchanged: per batch norm of a training
plan, the forward sums each channel's values and squares in float64, all-reduces the sums, and calls
the op's inference forward with the running statistics swapped for the whole batch's mean and biased
variance (its normalization is then the training one), then updates the running statistics with the
whole batch's unbiased variance. The backward calls the op's inference backward (gamma_grad =
sum(g * xhat) and beta_grad = sum(g) of the rank, input_grad = g * gamma * invstd), all-reduces those
two sums, and adds the terms of the batch statistics' gradient to input_grad: - gamma * invstd *
(sum(g) + xhat * sum(g * xhat)) / count, the sums over the whole batch. See docs/models.md.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from .. import batch_norm
from ..runtime.core import FLOAT_DTYPES, AttrsError, DTypeError, KernelError, ShapeError, StateError, fail
from .graph import BN

OP = "data_parallel"
ID_FILE_VARIABLE = "KERNELS_NCCL_ID_FILE"
GRADIENT_ALIGNMENT = 64  # elements: each gradient of the flat buffer starts 256 bytes (float32) apart at least


class LaunchError(KernelError):
    """The launcher's environment is missing a variable, or holds values that do not fit together."""


class Communicator(Protocol):
    rank: int
    world_size: int

    def all_reduce_sum(self, array: Any, stream: Any) -> None: ...

    def broadcast(self, array: Any, root: int, stream: Any) -> None: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------- the launcher's environment


@dataclass(frozen=True)
class Launch:
    """Where this process stands: its rank among world_size, and local_rank among the ranks of its host
    (the GPU it uses)."""

    rank: int
    world_size: int
    local_rank: int


_LAUNCHERS = (
    ("torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK")),
    ("mpirun", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")),
)


def _launch_of(launcher: str, names: Sequence[str], environ: Mapping[str, str]) -> Launch | None:
    present = [name for name in names if name in environ]
    if not present:
        return None
    if len(present) < len(names):
        missing = ", ".join(name for name in names if name not in environ)
        raise LaunchError(f"{OP}: environment: {launcher}'s {', '.join(names)} are set in part ({missing} missing)")
    values = []
    for name in names:
        text = environ[name].strip()
        if not text.isdigit():
            raise LaunchError(f"{OP}: environment: {name}: expected a non-negative integer, found {environ[name]!r}")
        values.append(int(text))
    rank, world_size, local_rank = values
    if world_size < 1 or rank >= world_size or local_rank >= world_size:
        raise LaunchError(f"{OP}: environment: {launcher}: expected 0 <= rank, local rank < world size, found rank "
                          f"{rank}, local rank {local_rank}, world size {world_size}")
    return Launch(rank, world_size, local_rank)


def launch_environment(environ: Mapping[str, str] | None = None) -> Launch:
    """The rank, world size and local rank that torchrun (RANK, WORLD_SIZE, LOCAL_RANK) or Open MPI's mpirun
    (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK) set; a world of one (0, 1, 0) where neither did. Both set
    and disagreeing, one set in part, or values that do not fit raise LaunchError."""
    environ = os.environ if environ is None else environ
    found = [(launcher, launch) for launcher, names in _LAUNCHERS
             if (launch := _launch_of(launcher, names, environ)) is not None]
    if not found:
        return Launch(0, 1, 0)
    if len(found) > 1 and found[0][1] != found[1][1]:
        raise LaunchError(f"{OP}: environment: torchrun's and mpirun's variables disagree ({found[0][1]} and {found[1][1]})")
    return found[0][1]


def share_unique_id(launch: Launch, path: str | None, make_id: Callable[[], Sequence[int]], timeout: float = 120.0,
                    poll: float = 0.01) -> tuple[int, ...]:
    """The communicator's unique id, the same on every rank: rank 0 makes it (make_id) and writes it to
    `path` (atomically: a temporary file renamed); the others wait for the file (up to `timeout` seconds)
    and read it. A world of one needs no file. The path must be new to this run and readable by every
    rank (a shared file system where the ranks span hosts); rank 0 removes it once the communicator is
    made (remove_id_file)."""
    if launch.world_size == 1 and path is None:
        return tuple(int(v) for v in make_id())
    if not path:
        raise LaunchError(f"{OP}: environment: {ID_FILE_VARIABLE}: expected the path of a file every rank can read "
                          f"(the NCCL unique id goes through it), found none for a world of {launch.world_size}")
    if launch.rank == 0:
        unique_id = tuple(int(v) for v in make_id())
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as file:
            json.dump(list(unique_id), file)
        os.replace(temporary, path)
        return unique_id
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise LaunchError(f"{OP}: rank {launch.rank}: no unique id in {path} after {timeout:g} s (is rank 0 running, "
                              f"and {ID_FILE_VARIABLE} the same path on every rank?)")
        time.sleep(poll)
    with open(path) as file:
        return tuple(int(v) for v in json.load(file))


def remove_id_file(launch: Launch, path: str | None) -> None:
    """Rank 0, once the communicator is made (every rank has read the id: making it waits for all): remove
    the id file, so that a later run given the same path never reads a stale id."""
    if launch.rank == 0 and path:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- sharding


def shard_bounds(batch: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of rank's shard: the batch cut into world_size equal, contiguous shards. The batch
    must divide evenly (as the average of the ranks' gradients is the whole batch's only then)."""
    if batch % world_size:
        raise fail(ShapeError, OP, "batch", f"a multiple of the world size {world_size}", batch)
    size = batch // world_size
    return rank * size, (rank + 1) * size


def shard(array: Any, rank: int, world_size: int) -> Any:
    """Rank's shard (rows along the first axis) of a whole batch: a C-contiguous view."""
    start, stop = shard_bounds(int(array.shape[0]), rank, world_size)
    return array[start:stop]


# --------------------------------------------------------------------------- communicators


class SingleProcess:
    """The world of one rank: the reductions change nothing."""

    rank, world_size = 0, 1

    def all_reduce_sum(self, array: Any, stream: Any) -> None:
        pass

    def broadcast(self, array: Any, root: int, stream: Any) -> None:
        pass

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- SyncBatchNorm


def _sum_of_squares(xp: Any, x: Any, axes: tuple[int, ...]) -> Any:
    """Per channel, the sum of x * x in float64 (no float64 copy of x on the GPU)."""
    if xp is np:
        return np.square(x, dtype=np.float64).sum(axis=axes)
    return _gpu_squares()(x, axis=axes)  # pragma: no cover - GPU: a CuPy reduction


def _gpu_squares() -> Any:  # pragma: no cover - GPU: a CuPy reduction kernel, made once
    global _SQUARES
    if _SQUARES is None:
        import cupy

        _SQUARES = cupy.ReductionKernel("T x", "float64 y", "static_cast<double>(x) * static_cast<double>(x)",
                                        "a + b", "y = a", "0", "kernels_sum_of_squares")
    return _SQUARES


_SQUARES: Any = None


class SyncBatchNorm:
    """One batch norm of a training plan with statistics over every rank's shard: stands in for the op's
    forward and backward calls in the plan (same arguments)."""

    def __init__(self, runtime: Any, state: Any, attrs: batch_norm.BatchNormAttrs, communicator: Any):
        if attrs.mode is not batch_norm.BatchNormMode.SPATIAL or attrs.momentum is None or not attrs.affine:
            raise fail(AttrsError, OP, "sync_batch_norm", "SPATIAL batch norms with gamma, beta and a momentum", attrs)
        self.runtime, self.state, self.attrs, self.communicator = runtime, state, attrs, communicator
        xp = runtime.xp
        channels = state.running_mean.shape[0]
        with runtime.active():
            self.batch_mean = runtime.empty((channels,))  # the whole batch's statistics, in the running ones' place
            self.batch_var = runtime.empty((channels,))
            self.sums = xp.empty((2, channels), np.float64)  # forward: sum(x), sum(x * x); backward: sum(g), sum(g xhat)
            self.scratch = runtime.empty((2, channels))  # gamma_grad and beta_grad where the plan asks for none
        self.forward_kernel = getattr(batch_norm, runtime.prefix + "forward_kernel")
        self.backward_kernel = getattr(batch_norm, runtime.prefix + "backward_kernel")
        self.count = 0
        self.mean: Any = None  # float64, per channel: the statistics the op normalized with
        self.invstd: Any = None

    def _swap(self) -> tuple[Any, Any]:
        running = (self.state.running_mean, self.state.running_var)
        self.state.running_mean, self.state.running_var = self.batch_mean, self.batch_var
        return running

    def forward(self, stream: Any, handle: Any, state: Any, attrs: Any, input: Any, gamma: Any, beta: Any,
                output: Any) -> None:
        xp, runtime = self.runtime.xp, self.runtime
        axes = (0,) + tuple(range(2, input.ndim))
        local = int(np.prod([input.shape[a] for a in axes]))
        with runtime.active():
            self.sums[0] = xp.sum(input, axis=axes, dtype=np.float64)
            self.sums[1] = _sum_of_squares(xp, input, axes)
        self.communicator.all_reduce_sum(self.sums, stream)
        count = self.count = local * self.communicator.world_size
        if count <= 1:
            raise fail(ShapeError, OP, "input", "more than 1 value per channel over every rank when training", input.shape)
        with runtime.active():
            mean = self.sums[0] / count
            var = xp.maximum(self.sums[1] / count - mean * mean, 0.0)  # biased, as the op's training forward
            self.batch_mean[...] = mean
            self.batch_var[...] = var
            # What the op normalizes with: the statistics rounded to the dtype, widened again.
            self.mean = self.batch_mean.astype(np.float64)
            self.invstd = 1.0 / xp.sqrt(self.batch_var.astype(np.float64) + attrs.eps)
        running = self._swap()
        try:
            self.forward_kernel(stream, handle, state, attrs, input, gamma, beta, output, training=False)
        finally:
            state.running_mean, state.running_var = running
        momentum = attrs.momentum
        with runtime.active():
            running_mean, running_var = running
            running_mean[...] = momentum * mean + (1.0 - momentum) * running_mean.astype(np.float64)
            running_var[...] = momentum * (var * (count / (count - 1))) + (1.0 - momentum) * running_var.astype(np.float64)

    def backward(self, stream: Any, handle: Any, state: Any, attrs: Any, output: Any, output_grad: Any, input: Any,
                 input_grad: Any, gamma: Any, beta: Any, gamma_grad: Any, beta_grad: Any) -> None:
        if self.mean is None:
            raise fail(StateError, OP, "sync_batch_norm", "a training forward before the backward", "none")
        runtime = self.runtime
        gamma_grad = self.scratch[0] if gamma_grad is None else gamma_grad
        beta_grad = self.scratch[1] if beta_grad is None else beta_grad
        running = self._swap()
        try:
            self.backward_kernel(stream, handle, state, attrs, output, output_grad, input, input_grad, gamma, beta,
                                 gamma_grad, beta_grad)
        finally:
            state.running_mean, state.running_var = running
        with runtime.active():
            self.sums[0] = beta_grad
            self.sums[1] = gamma_grad
        self.communicator.all_reduce_sum(self.sums, stream)
        if input_grad is None:
            return
        with runtime.active():
            shape = (1, -1) + (1,) * (input.ndim - 2)
            scale = gamma.astype(np.float64) * self.invstd / self.count
            slope = scale * self.invstd * self.sums[1]  # d input_grad / d x, per channel
            offset = scale * self.sums[0] - slope * self.mean
            input_grad -= (slope.astype(input.dtype).reshape(shape) * input
                           + offset.astype(input.dtype).reshape(shape))


def synchronize_batch_norms(plan: Any, runtime: Any, communicator: Any) -> list[SyncBatchNorm]:
    """Replace every batch norm's forward and backward calls in a training plan by SyncBatchNorm's."""
    forward_op = getattr(batch_norm, runtime.prefix + "forward_kernel")
    backward_op = getattr(batch_norm, runtime.prefix + "backward_kernel")
    synced: dict[int, SyncBatchNorm] = {}
    for n, node in enumerate(plan.graph.nodes):
        if node.kind != BN:
            continue
        function, args = plan.forward_calls[n]
        if getattr(function, "func", None) is not forward_op:
            raise StateError(f"{OP}: a plan's batch norm call {n} is not the op's forward (already synchronized?)")
        sync = synced[id(args[2])] = SyncBatchNorm(runtime, args[2], args[3], communicator)
        plan.forward_calls[n] = (sync.forward, args)
    for i, (function, args) in enumerate(plan.backward_calls):
        if function is backward_op:
            plan.backward_calls[i] = (synced[id(args[2])].backward, args)
    return list(synced.values())


# --------------------------------------------------------------------------- the data-parallel model


class DataParallel:
    """A Network trained data-parallel: give each rank's model (on the rank's device, the same weights
    on every rank: rank 0's are broadcast at construction, as DDP) and communicator. `forward(x)` takes
    the rank's shard; `backward(output_grads)` leaves in `model.grads` the average over the ranks of
    their shards' gradients (as DDP). With each rank's loss the mean over its shard, that average is
    the gradient of the mean over the whole batch.

    sync_batch_norm: False (the default, as DDP) normalizes each rank's shard with its own statistics
    and keeps each rank's running statistics (DDP's broadcast_buffers=False); True normalizes with the
    whole batch's, which makes the step the one-process step on the whole batch, running statistics
    included.
    """

    def __init__(self, model: Any, communicator: Any, sync_batch_norm: bool = False, broadcast: bool = True):
        if model.closed:
            raise fail(StateError, OP, "model", "an open model", "one already closed")
        if model.dtype not in FLOAT_DTYPES:  # one gradient bucket of one dtype; half ones mix float32 BatchNorms
            raise fail(DTypeError, OP, "model", "a float32 or float64 model (data-parallel half precision is not built)",
                       str(model.dtype))
        self.model, self.communicator, self.sync_batch_norm = model, communicator, bool(sync_batch_norm)
        self.synced: dict[tuple, list[SyncBatchNorm]] = {}
        self.gradients = self._bucket()
        if broadcast and communicator.world_size > 1:
            for array in model.state_dict().values():
                if array.dtype == model.dtype:  # the counts (num_batches_tracked) are host numbers, the same
                    communicator.broadcast(array, 0, model.stream)

    def _bucket(self) -> Any:
        """Every trainable parameter's gradient as a view of one flat buffer, so that the average is one
        all-reduce: made before any training plan (the plans write the views)."""
        model = self.model
        if any(training for _, training in model.plans):
            raise fail(StateError, OP, "model", "a model with no training plan yet (its gradients become views "
                       "of one buffer)", "one that has trained")
        names = [entry.name for entry in model.registry.entries if entry.kind == "param"]
        offsets, total = [], 0
        for name in names:
            offsets.append(total)
            size = int(np.prod(model.params[name].shape))
            total += -(-size // GRADIENT_ALIGNMENT) * GRADIENT_ALIGNMENT
        with model.active():
            flat = model.zeros((max(total, 1),))
            for name, offset in zip(names, offsets):
                shape = model.params[name].shape
                model._grads[name] = flat[offset:offset + int(np.prod(shape))].reshape(shape)
        return flat

    def train(self, mode: bool = True) -> "DataParallel":
        self.model.train(mode)
        return self

    def eval(self) -> "DataParallel":
        return self.train(False)

    def forward(self, x: Any, **options: Any) -> dict[str, Any]:
        """The model on this rank's shard x; in training with sync_batch_norm, its batch norms synchronized."""
        model = self.model
        if model.training and self.sync_batch_norm:
            dims = tuple(getattr(x, "shape", ()))
            if dims not in self.synced:
                model.check_input_dims(dims)
                self.synced[dims] = synchronize_batch_norms(model.plan(dims), model, self.communicator)
        return model.forward(x, **options)

    __call__ = forward

    def backward(self, output_grads: dict[str, Any]) -> dict[str, Any]:
        """The model's backward on this rank's shard, then the gradients averaged over the ranks (one
        all-reduce of the flat buffer, on the model's stream)."""
        result = self.model.backward(output_grads)
        self.communicator.all_reduce_sum(self.gradients, self.model.stream)
        if self.communicator.world_size > 1:
            with self.model.active():
                self.gradients *= self.gradients.dtype.type(1.0 / self.communicator.world_size)
        return result
