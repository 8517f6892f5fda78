"""Data-parallel training (kernels.models.parallel): the launcher's environment, the unique id's file, the
shards, and the step itself: averaged gradients equal to the one-process step (the whole batch under
SyncBatchNorm, the sum of the shards' steps with per-rank statistics), with ranks as threads and as
processes on the CPU, and through NCCL on the GPU (skipped with the reason where it cannot run).

Bounds: derived from the computation on the data at hand, never from one host's measurement. The step under
test and its reference (the one-process step) make the same sums in other orders (the batch statistics per
shard then across ranks, the weight gradients per shard then all-reduced, against the whole batch at once).
Each of the two carries the rounding error of its sums, amplified by the network: for a result, about its
condition times the unit roundoff u of its dtype, summed over its terms. How much this network amplifies
rounding on these inputs is measured by the same reference step in float32 against float64: that
difference, e32 (per tensor), is the rounding error at u32 = 2^-24; the same sums with the same condition
at u64 = 2^-53 give e32 * 2^-29. So each result of a float64 step is held to

    |ours - reference| <= MARGIN * e32 * u(dtype) / u32,   MARGIN = 2 * 8

(L2 norms per gradient tensor and per running statistic, max |error| per output tensor): 2 because both
sides carry their own error, 8 because a sum of many rounding errors in one order is a few times larger
than in another (e32 is one such order). A float32 step is held to the same with u(dtype) = u32. Host
differences (BLAS kernels, thread counts, SIMD width) change the orders of the sums on both sides alike,
and e32 with them. docs/models.md gives the measured ratios. With per-rank statistics the float64 step is
exact: each rank computes its shard's step as the one-process step on that shard does, and the average of 2
ranks scaled by 2 is exact.
"""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import kernels
from kernels import AttrsError, ShapeError, StateError
from kernels.batch_norm import BatchNormAttrs, BatchNormMode
from kernels.models import YOLOv10, parallel
from kernels.models.parallel import Launch, LaunchError
from tests.parallel_ranks import ThreadGroup, batch, output_grads_like

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

UNIT = {"float64": 2.0 ** -53, "float32": 2.0 ** -24}  # unit roundoff
MARGIN = 2 * 8  # both sides' errors, times one order of a sum's rounding against another's (module docstring)


# --------------------------------------------------------------------------- the launcher's environment


@pytest.mark.parametrize("environ, launch", [
    ({}, Launch(0, 1, 0)),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, Launch(3, 8, 1)),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "5"}, Launch(5, 16, 5)),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, Launch(1, 2, 0)),
    ({"RANK": " 0 ", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PATH": "/bin"}, Launch(0, 1, 0)),
], ids=["none", "torchrun", "mpirun", "both_agree", "spaces"])
def test_launch_environment(environ, launch):
    assert parallel.launch_environment(environ) == launch


@pytest.mark.parametrize("environ, pattern", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, r"torchrun's RANK, WORLD_SIZE, LOCAL_RANK are set in part \(LOCAL_RANK missing\)"),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, r"mpirun's .* set in part \(OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK missing\)"),
    ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, r"RANK: expected a non-negative integer, found 'x'"),
    ({"RANK": "0", "WORLD_SIZE": "-2", "LOCAL_RANK": "0"}, r"WORLD_SIZE: expected a non-negative integer, found '-2'"),
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, r"rank 2, local rank 0, world size 2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2"}, r"rank 0, local rank 2, world size 2"),
    ({"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0"}, r"world size 0"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, r"torchrun's and mpirun's variables disagree"),
], ids=["torchrun_part", "mpirun_part", "not_int", "negative", "rank_past", "local_past", "world0", "disagree"])
def test_launch_environment_refusals(environ, pattern):
    with pytest.raises(LaunchError, match=r"^data_parallel: .*" + pattern):
        parallel.launch_environment(environ)


def test_launch_environment_reads_os_environ_by_default(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(name, {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}[name])
    assert parallel.launch_environment() == Launch(1, 4, 1)


# --------------------------------------------------------------------------- the unique id's file


def test_unique_id_through_the_file(tmp_path):
    path = str(tmp_path / "id.json")
    made = []

    def make_id():
        made.append(1)
        return list(range(-64, 64))

    first = parallel.share_unique_id(Launch(0, 2, 0), path, make_id)
    second = parallel.share_unique_id(Launch(1, 2, 1), path, lambda: pytest.fail("only rank 0 makes the id"))
    assert first == second == tuple(range(-64, 64)) and made == [1]
    assert os.listdir(tmp_path) == ["id.json"]  # the temporary file was renamed into place
    parallel.remove_id_file(Launch(1, 2, 1), path)
    assert os.path.exists(path)  # only rank 0 removes it
    parallel.remove_id_file(Launch(0, 2, 0), path)
    assert not os.path.exists(path)
    parallel.remove_id_file(Launch(0, 2, 0), path)  # already gone: nothing to do
    parallel.remove_id_file(Launch(0, 1, 0), None)


def test_unique_id_waits_for_rank_0(tmp_path):
    path = str(tmp_path / "id.json")
    got = []
    reader = threading.Thread(target=lambda: got.append(parallel.share_unique_id(Launch(1, 2, 0), path, None)))
    reader.start()
    threading.Event().wait(0.05)
    assert not got  # still waiting
    parallel.share_unique_id(Launch(0, 2, 0), path, lambda: (7,) * 128)
    reader.join(10)
    assert got == [(7,) * 128]


def test_unique_id_refusals(tmp_path):
    assert parallel.share_unique_id(Launch(0, 1, 0), None, lambda: [1, 2]) == (1, 2)  # a world of one: no file
    with pytest.raises(LaunchError, match=r"KERNELS_NCCL_ID_FILE: expected the path of a file .* found none for a world of 2"):
        parallel.share_unique_id(Launch(0, 2, 0), None, lambda: [1])
    with pytest.raises(LaunchError, match=r"rank 1: no unique id in .*missing.json after 0.05 s"):
        parallel.share_unique_id(Launch(1, 2, 1), str(tmp_path / "missing.json"), None, timeout=0.05)


# --------------------------------------------------------------------------- shards


def test_shards_cut_the_batch_in_equal_contiguous_parts():
    assert [parallel.shard_bounds(8, r, 4) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    x = np.arange(12.0).reshape(6, 2)
    parts = [parallel.shard(x, r, 3) for r in range(3)]
    assert all(p.flags.c_contiguous for p in parts)
    np.testing.assert_array_equal(np.concatenate(parts), x)
    np.testing.assert_array_equal(parts[1], [[4.0, 5.0], [6.0, 7.0]])
    with pytest.raises(ShapeError, match=r"^data_parallel: batch: expected a multiple of the world size 4, found 6"):
        parallel.shard(np.zeros((6, 3)), 0, 4)


def test_single_process_changes_nothing():
    world = parallel.SingleProcess()
    x = np.arange(4.0)
    world.all_reduce_sum(x, None)
    world.broadcast(x, 0, None)
    world.close()
    assert (world.rank, world.world_size) == (0, 1)
    np.testing.assert_array_equal(x, np.arange(4.0))


# --------------------------------------------------------------------------- the step, ranks as threads (CPU)


def _grads_for(outputs, batch_size):
    return output_grads_like({k: [np.empty((batch_size,) + a.shape[1:], a.dtype) for a in v]
                              for k, v in outputs.items() if k in ("one2many", "one2one")})


def _rank_grads(full, rank, world):
    """A rank's output gradients: its rows of the whole batch's, times the world size (its loss is the mean
    over its shard)."""
    return {k: [np.ascontiguousarray(parallel.shard(a, rank, world)) * world for a in v] for k, v in full.items()}


def _running(model):
    return {n: np.array(a) for n, a in model.state_dict().items() if n.endswith(("running_mean", "running_var"))}


def run_threads(world, sync, dtype, batch_size=4, size=64):
    """A data-parallel step of yolov10n over `world` ranks as threads: each rank's gradients, running statistics
    and outputs. Ranks past 0 start from other weights: the broadcast must make them rank 0's."""
    x = batch(batch_size, size, dtype)
    group = ThreadGroup(world)
    results, errors = [None] * world, []

    def rank(r):
        try:
            with YOLOv10("n", dtype=dtype) as model:
                if r:
                    model.init_random(seed=100 + r)
                trainer = parallel.DataParallel(model, group.communicator(r), sync_batch_norm=sync).train()
                out = trainer(np.ascontiguousarray(parallel.shard(x, r, world)))
                outputs = {k: [a.copy() for a in v] for k, v in out.items()}
                trainer.backward(_rank_grads(_grads_for(out, batch_size), r, world))
                results[r] = ({n: g.copy() for n, g in model.grads.items()}, _running(model), outputs)
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)
            group.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results, x


def reference_whole_batch(x, dtype):
    with YOLOv10("n", dtype=dtype) as model:
        out = model(x)
        outputs = {k: [a.copy() for a in v] for k, v in out.items()}
        model.backward(_grads_for(out, x.shape[0]))
        return {n: g.copy() for n, g in model.grads.items()}, _running(model), outputs


def reference_per_shard(x, world, dtype):
    """Each shard's one-process step (from the same weights and running statistics), its gradients summed."""
    grads, running = None, []
    for r in range(world):
        with YOLOv10("n", dtype=dtype) as model:
            out = model(np.ascontiguousarray(parallel.shard(x, r, world)))
            full = _grads_for(out, x.shape[0])
            model.backward({k: [np.ascontiguousarray(parallel.shard(a, r, world)) for a in v] for k, v in full.items()})
            grads = {n: g.copy() if grads is None else grads[n] + g for n, g in model.grads.items()}
            running.append(_running(model))
    return grads, running


def references(x):
    """The whole-batch reference step on x (reference_whole_batch) in float32 and in float64, the inputs
    rounded to float32 for both: (narrow, wide), each (gradients, running statistics, outputs)."""
    x32 = x.astype(np.float32)
    return reference_whole_batch(x32, "float32"), reference_whole_batch(x32.astype(np.float64), "float64")


def check_within(got, expected, narrow, wide, dtype, what):
    """Every tensor of `got` against `expected` (the reference step in dtype), by the module docstring's bound:
    ||got - expected|| <= MARGIN * ||narrow - wide|| * u(dtype) / u32 (L2 norms; narrow and wide: the
    reference step in float32 and float64). Returns the worst ratio of error to bound and its tensor."""
    scale = MARGIN * UNIT[dtype] / UNIT["float32"]
    assert set(got) == set(expected) == set(narrow) == set(wide)
    worst = (0.0, None)
    for name, reference in expected.items():
        error = float(np.linalg.norm(got[name].astype(np.float64) - reference))
        e32 = float(np.linalg.norm(narrow[name].astype(np.float64) - wide[name]))
        bound = scale * e32
        assert error <= bound, (f"{what} {name}: ||ours - reference|| {error:.3e} > {bound:.3e} = {MARGIN} x "
                                f"the float32 step's error {e32:.3e} x {UNIT[dtype] / UNIT['float32']:g}")
        ratio = error / bound if bound else 0.0
        if worst[1] is None or ratio > worst[0]:
            worst = (ratio, name)
    return worst


def check_outputs(ours, rank, world, expected, narrow, wide, dtype):
    """A rank's training outputs against its rows of the reference step's, by the module docstring's bound
    with max |error| per output tensor."""
    scale = MARGIN * UNIT[dtype] / UNIT["float32"]
    for key in ("one2many", "one2one"):
        for level, got in enumerate(ours[key]):
            shard = [parallel.shard(outputs[key][level], rank, world) for outputs in (expected, narrow, wide)]
            error = float(np.max(np.abs(got.astype(np.float64) - shard[0])))
            bound = scale * float(np.max(np.abs(shard[1].astype(np.float64) - shard[2])))
            assert error <= bound, f"rank {rank} output {key}[{level}]: max |ours - reference| {error:.3e} > {bound:.3e}"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sync_batch_norm_step_equals_the_whole_batch_step(dtype):
    results, x = run_threads(2, True, dtype)
    narrow, wide = references(x)
    grads, running, outputs = narrow if dtype == "float32" else reference_whole_batch(x, dtype)
    for rank in range(2):
        check_within(results[rank][0], grads, narrow[0], wide[0], dtype, f"rank {rank} gradient")
        check_within(results[rank][1], running, narrow[1], wide[1], dtype, f"rank {rank} running statistic")
        check_outputs(results[rank][2], rank, 2, outputs, narrow[2], wide[2], dtype)
    for name in grads:  # every rank holds the same average, to the bit
        np.testing.assert_array_equal(results[0][0][name], results[1][0][name])


def test_per_rank_batch_norm_step_equals_the_shards_steps():
    results, x = run_threads(2, False, "float64")
    grads, running = reference_per_shard(x, 2, "float64")
    for rank in range(2):
        for name in grads:
            np.testing.assert_array_equal(results[rank][0][name], grads[name], err_msg=name)
        for name, value in running[rank].items():  # each rank keeps its own shard's running statistics
            np.testing.assert_array_equal(results[rank][1][name], value, err_msg=name)
    assert any(not np.array_equal(running[0][n], running[1][n]) for n in running[0])


def test_a_world_of_one_is_the_plain_step():
    """SingleProcess with SyncBatchNorm: the step of the model alone (the statistics through the sync path)."""
    x = batch(2, 64, "float64")
    grads, _, _ = reference_whole_batch(x, "float64")
    narrow, wide = references(x)
    with YOLOv10("n", dtype="float64") as model:
        trainer = parallel.DataParallel(model, parallel.SingleProcess(), sync_batch_norm=True)
        out = trainer(x)
        trainer.backward(_grads_for(out, 2))
        got = {name: g.copy() for name, g in model.grads.items()}
        trainer(x)  # the same plan again: synchronized once
        assert len(trainer.synced) == 1 and len(trainer.synced[x.shape]) == len(model.plans[(x.shape, True)].bn_names)
        trainer.eval()(x)  # inference: the model's own plan
        assert not model.training and trainer.train() is trainer and model.training
    # Checked after every call above has run: what the test reaches does not depend on a bound holding.
    check_within(got, grads, narrow[0], wide[0], "float64", "gradient")


def test_refusals():
    with YOLOv10("n", dtype="float64") as model:
        x = batch(2, 64, "float64")
        model(x)
        with pytest.raises(StateError, match=r"a model with no training plan yet"):
            parallel.DataParallel(model, parallel.SingleProcess())
    with pytest.raises(StateError, match=r"an open model"):
        parallel.DataParallel(model, parallel.SingleProcess())
    with YOLOv10("n", dtype="float64") as model:
        trainer = parallel.DataParallel(model, parallel.SingleProcess(), sync_batch_norm=True)
        with pytest.raises(ShapeError, match=r"multiples of 32"):
            trainer(np.zeros((2, 3, 40, 64)))
        with pytest.raises(ShapeError, match=r"more than 1 value per channel over every rank"):
            trainer(batch(1, 32, "float64"))  # the last feature map is 1x1 and the batch 1
        trainer(batch(2, 64, "float64"))
        plan = model.plan((2, 3, 64, 64))
        with pytest.raises(StateError, match=r"is not the op's forward \(already synchronized\?\)"):
            parallel.synchronize_batch_norms(plan, model, parallel.SingleProcess())
        state = next(s for s in plan.node_states if s.op == "batch_norm")
        with pytest.raises(StateError, match=r"a training forward before the backward"):
            parallel.SyncBatchNorm(model, state, state.attrs, parallel.SingleProcess()).backward(*([None] * 12))
        for attrs in (BatchNormAttrs(mode=BatchNormMode.PER_ACTIVATION), BatchNormAttrs(momentum=None),
                      BatchNormAttrs(affine=False)):
            with pytest.raises(AttrsError, match=r"sync_batch_norm: expected SPATIAL batch norms"):
                parallel.SyncBatchNorm(model, state, attrs, parallel.SingleProcess())


def test_sync_without_gamma_and_input_gradients():
    """A batch norm whose gamma_grad, beta_grad and input_grad are not asked for still joins the reductions
    (every rank must make the same calls) and writes nothing it was not given."""
    with YOLOv10("n", dtype="float64") as model:
        trainer = parallel.DataParallel(model, parallel.SingleProcess(), sync_batch_norm=True)
        x = batch(2, 64, "float64")
        trainer(x)
        plan = model.plans[(x.shape, True)]
        function, args = next((f, a) for f, a in plan.backward_calls if getattr(f, "__name__", "") == "backward")
        args = list(args)
        gamma_grad = args[10]
        before = gamma_grad.copy()
        args[7] = args[10] = args[11] = None
        function(*args)
        np.testing.assert_array_equal(gamma_grad, before)


# --------------------------------------------------------------------------- ranks as processes


def launch_ranks(world, tmp_path, extra, devices=None, nccl=False):
    """`python -m tests.parallel_ranks` as `world` processes with torchrun's variables and the id file."""
    folder = tmp_path / "exchange"
    folder.mkdir(exist_ok=True)
    processes = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   KERNELS_NCCL_ID_FILE=str(tmp_path / "nccl_id.json"), PYTHONPATH=ROOT)
        command = [sys.executable, "-m", "tests.parallel_ranks", "--folder", str(folder),
                   "--out", str(tmp_path / f"rank{rank}.npz"), *extra]
        if devices is not None:
            command += ["--device", devices[rank]]
        if nccl:
            command += ["--comm", "nccl"]
        processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [p.communicate(timeout=600)[0].decode() for p in processes]
    for rank, (process, output) in enumerate(zip(processes, outputs)):
        assert process.returncode == 0, f"rank {rank}:\n{output[-3000:]}"
    return [dict(np.load(tmp_path / f"rank{rank}.npz")) for rank in range(world)]


def split(saved):
    grads = {k[5:]: v for k, v in saved.items() if k.startswith("grad/")}
    running = {k[8:]: v for k, v in saved.items() if k.startswith("running/")}
    return grads, running


def test_two_processes_bootstrap_and_step_on_the_cpu(tmp_path):
    """Two ranks as processes launched with torchrun's variables: the unique id through the file (the same on
    both), the shards, the broadcast and the SyncBatchNorm reductions (through the test's file exchange)."""
    saved = launch_ranks(2, tmp_path, ["--sync", "--dtype", "float64"])
    assert [list(s["launch"]) for s in saved] == [[0, 2, 0], [1, 2, 1]]
    assert bytes(saved[0]["unique"]) == bytes(saved[1]["unique"])
    x = batch(4, 64, "float64")
    grads, running, _ = reference_whole_batch(x, "float64")
    narrow, wide = references(x)
    for s in saved:
        got_grads, got_running = split(s)
        check_within(got_grads, grads, narrow[0], wide[0], "float64", "gradient")
        check_within(got_running, running, narrow[1], wide[1], "float64", "running statistic")


# --------------------------------------------------------------------------- the GPU


def _gpu_reason():
    return kernels.gpu_unavailable_reason()


def _nccl_reason():
    reason = _gpu_reason()
    if reason is not None:
        return reason
    from kernels.models import nccl

    return nccl.nccl_unavailable_reason()


def _visible():
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


@pytest.mark.gpu
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "per_rank"])
def test_two_processes_sharing_one_gpu(tmp_path, sync):
    """NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected", NCCL >= 2.5), so
    these two ranks on GPU 0 exchange through the test's files: what runs is the bootstrap (the real NCCL
    unique id through the id file), the shards, the broadcast and the step with its reductions on the GPU.
    NCCL's own all-reduce is tested by the one-rank and the several-GPU tests below. (Without the NCCL
    library the id is random bytes: the rest runs the same.)"""
    reason = _gpu_reason()
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    saved = launch_ranks(2, tmp_path, ["--dtype", "float32", "--batch", "4", "--size", "64"]
                         + (["--sync"] if sync else []), devices=["gpu:0", "gpu:0"])
    assert bytes(saved[0]["unique"]) == bytes(saved[1]["unique"])
    _compare_with_one_gpu(saved, sync, 4, 64)


def _one_gpu_step(x, sync, world, batch_size, dtype):
    """The one-GPU step in dtype: the whole batch under sync (else each shard's step, their gradients summed):
    (gradients in float64, running statistics per step)."""
    import cupy

    expected_grads, expected_running = None, []
    for shard in ([x] if sync else [parallel.shard(x, r, world) for r in range(world)]):
        r = len(expected_running)
        with YOLOv10("n", device="gpu", dtype=dtype) as model:
            with model.stream:
                out = model(cupy.asarray(np.ascontiguousarray(shard, dtype=dtype)))
                full = _grads_for({k: [a.get() for a in v] for k, v in out.items() if k in ("one2many", "one2one")},
                                  batch_size)
                if not sync:
                    full = {k: [np.ascontiguousarray(parallel.shard(a, r, world)) for a in v] for k, v in full.items()}
                model.backward({k: [cupy.asarray(a) for a in v] for k, v in full.items()})
            model.stream.synchronize()
            grads = {n: g.get().astype(np.float64) for n, g in model.grads.items()}
            expected_grads = grads if expected_grads is None else {n: expected_grads[n] + g for n, g in grads.items()}
            expected_running.append({n: np.array(a.get()) for n, a in model.state_dict().items()
                                     if n.endswith(("running_mean", "running_var"))})
    return expected_grads, expected_running


def _compare_with_one_gpu(saved, sync, batch_size, size):
    """The ranks' averaged gradients (float32) against the one-GPU step (the whole batch under sync, else the
    shards'), by the module docstring's bound, with the one-GPU step's float32 error against float64 as e32."""
    world = len(saved)
    x = batch(batch_size, size, "float32")
    grads, running = _one_gpu_step(x, sync, world, batch_size, "float32")
    wide_grads, wide_running = _one_gpu_step(x.astype(np.float64), sync, world, batch_size, "float64")
    for rank, s in enumerate(saved):
        got_grads, got_running = split(s)
        ratio, name = check_within(got_grads, grads, grads, wide_grads, "float32", f"rank {rank} gradient")
        print(f"rank {rank} {'sync' if sync else 'per-rank'}: worst gradient error {ratio:.2f} of its bound ({name})")
        step = 0 if sync else rank
        check_within(got_running, running[step], running[step], wide_running[step], "float32",
                     f"rank {rank} running statistic")


@pytest.mark.gpu
def test_nccl_world_of_one():
    """The real NCCL communicator with one rank: its all-reduce and broadcast (identities for one rank) run
    on the kernels' stream, and the data-parallel step through it is the plain step."""
    reason = _nccl_reason()
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    import cupy

    from kernels.models import nccl

    with nccl.connect(environ={}) as communicator:
        assert (communicator.rank, communicator.world_size, communicator.device) == (0, 1, 0)
        stream = kernels.gpu_stream(0)
        with stream:
            values = cupy.arange(10, dtype=cupy.float32) * 0.5
        communicator.all_reduce_sum(values, stream)
        communicator.broadcast(values, 0, stream)
        stream.synchronize()
        np.testing.assert_array_equal(values.get(), np.arange(10, dtype=np.float32) * 0.5)
        with stream:
            ints = cupy.zeros(3, cupy.int32)
        with pytest.raises(kernels.DeviceError, match="float32 or float64"):
            communicator.all_reduce_sum(ints, stream)


@pytest.mark.gpu
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "per_rank"])
def test_nccl_ranks_one_per_gpu(tmp_path, sync):
    """One rank per visible GPU (at least 2), through NCCL, against the one-GPU step."""
    reason = _nccl_reason()
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    world = _visible()
    if world < 2:
        pytest.skip(f"needs 2 CUDA devices for NCCL ranks (NCCL refuses two ranks on one GPU), {world} visible")
    world = 2 if world < 4 else 4
    saved = launch_ranks(world, tmp_path, ["--dtype", "float32", "--batch", str(2 * world), "--size", "64"]
                         + (["--sync"] if sync else []), nccl=True)
    assert not os.path.exists(tmp_path / "nccl_id.json")  # rank 0 removed it once every rank joined
    _compare_with_one_gpu(saved, sync, 2 * world, 64)

