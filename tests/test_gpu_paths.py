"""Named GPU paths (kernels/runtime/gpu_paths.py): coverage.py cannot see CUDA, so each decision a GPU call
takes has a name, declared next to the code that takes it and counted when taken.

On the CPU: the registry is well formed, every name that the launch code records is declared
(an AST scan of the kernels' sources, and the pure functions that compute names run over their
inputs), recording is cheap and nests, and the small device (gpu.simulated_device) caps the grids
and plans the golden launch shapes as they are declared for. On a GPU (marked gpu): every golden
case under every schedule (the small device's included) and layout of the conformance run, then
every large differential case, run under recording; the golden cases alone must reach every declared
name; the table "path -> first case that reached it" is written to $KERNELS_GPU_PATHS_TABLE (or
printed with -s) for the closing note.
"""

from __future__ import annotations

import ast
import os
import pathlib
import sys
import threading
import types

import numpy as np
import pytest

import kernels
from kernels import (
    Activation,
    Pool2DAttrs,
    PoolOp,
    UnaryOpType,
    UpsampleAttrs,
    UpsampleMode,
    activation,
    concat,
    element_unary,
    pool_2d,
    softmax,
    transpose,
    upsample,
)
from kernels.runtime import gpu, gpu_paths
from kernels.runtime.core import KernelError, TensorShape

from .conftest import require
from .test_gpu_launch_plans import FakeArray, FakeStream, device  # noqa: F401 - device: the fixture

KERNELS = pathlib.Path(kernels.__file__).parent
DECLARED = gpu_paths.declared()


# --------------------------------------------------------------------------- the registry


def test_every_name_is_well_formed_and_described():
    assert len(DECLARED) > 100  # every op declares its paths (139 when written)
    for name, description in DECLARED.items():
        assert gpu_paths.NAME.fullmatch(name), name
        assert description.strip() and "\n" not in description, name
    ops = {name.split(".")[0] for name in DECLARED}
    assert ops == {"activation", "batch_matmul", "batch_norm", "concat", "conv_2d", "element_binary", "element_unary",
                   "gradient_reduction", "pool_2d", "reshape", "softmax", "top_k", "transpose", "upsample"}
    assert set(gpu_paths.counts()) == set(DECLARED)


@pytest.fixture
def registry(monkeypatch):
    """A scratch copy of the registry, so that the test's declarations do not stay."""
    monkeypatch.setattr(gpu_paths.REGISTRY, "descriptions", dict(gpu_paths.REGISTRY.descriptions))
    monkeypatch.setattr(gpu_paths.REGISTRY, "taken", dict(gpu_paths.REGISTRY.taken))


@pytest.mark.parametrize("paths, message", [
    ({"Kernel": "x"}, "not a dotted lower-case name"),
    ({"a..b": "x"}, "not a dotted lower-case name"),
    ({"ok": ""}, "needs a one-line description"),
    ({"ok": "two\nlines"}, "needs a one-line description"),
    ({"ok": None}, "needs a one-line description"),
])
def test_declare_refuses_malformed_names_and_descriptions(registry, paths, message):
    with pytest.raises(KernelError, match=message):
        gpu_paths.declare("scratch", paths)
    assert not any(name.startswith("scratch.") for name in gpu_paths.declared())  # nothing half-declared


def test_declare_refuses_a_name_twice(registry):
    assert gpu_paths.declare("scratch", {"one": "the first", "two": "the second"}) == ("scratch.one", "scratch.two")
    with pytest.raises(KernelError, match="'scratch.two' is declared twice"):
        gpu_paths.declare("scratch", {"three": "new", "two": "again"})
    with pytest.raises(KernelError, match="declared twice"):
        gpu_paths.declare("concat", {"kernel.join": "concat's own name"})
    assert "scratch.three" not in gpu_paths.declared()


def test_reach_and_check_refuse_an_undeclared_name(registry):
    with pytest.raises(KernelError, match="'concat.nothing' is not declared"):
        gpu_paths.reach("concat.nothing")
    with pytest.raises(KernelError, match="is not declared"):
        gpu_paths.check("concat.nothing")
    assert gpu_paths.check("concat.kernel.join") == "concat.kernel.join"


def test_recording_counts_what_its_block_reached_and_nests(registry):
    gpu_paths.declare("scratch", {"a": "path a", "b": "path b", "c": "path c"})
    gpu_paths.reach("scratch.c")  # before any recording: seen by none
    with gpu_paths.recording() as outer:
        gpu_paths.reach("scratch.a")
        with gpu_paths.recording() as inner:
            gpu_paths.reach("scratch.b")
            gpu_paths.reach("scratch.b")
            assert inner.counts == {"scratch.b": 2}  # live inside the block
        gpu_paths.reach("scratch.a")
    gpu_paths.reach("scratch.a")  # after both: final counts do not change
    assert outer.counts == {"scratch.a": 2, "scratch.b": 2} and outer.reached == {"scratch.a", "scratch.b"}
    assert inner.counts == {"scratch.b": 2} and inner.reached == {"scratch.b"}
    assert gpu_paths.counts()["scratch.a"] == 3 and gpu_paths.counts()["scratch.c"] == 1


def test_reach_is_a_dict_update():
    """reach is on every GPU call's path (one to four times a call), so it must stay a dict update: far
    below a launch's host cost (about 5 us; 72 ns a reach against 49 ns for a plain function that adds
    to a dict, measured on the 2-core CI machine). Checked by what it calls, not by a time (a timed
    assertion fails on a loaded machine; timings are pytest-benchmark's): the one Python function run
    inside one reach of the unlocked GPU registry is reach itself (no context entered: a null context
    was half of its 0.25 us), and it calls no builtin or C function, so a lock, a log call, a copy or
    any other call added to it fails here."""
    name = "concat.kernel.join"
    called = []

    def profile(frame, event, arg):
        if event == "call":
            called.append(frame.f_code.co_qualname)
        elif event == "c_call":
            called.append(f"C {arg.__qualname__}")

    before = gpu_paths.counts()[name]
    sys.setprofile(profile)
    try:
        gpu_paths.reach(name)
    finally:
        sys.setprofile(None)
    assert gpu_paths.counts()[name] == before + 1
    assert called[-1] == "C setprofile"  # the profile's own switch-off
    assert called[:-1] == ["PathRegistry.reach"], called


# --------------------------------------------------------------------------- every recorded name is declared


def _literal_names(node: ast.AST) -> list[str]:
    """Every complete path name a string expression can stand for: its literals, both arms of a
    conditional; f-strings and concatenations give their constant text, matched as a prefix."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _literal_names(node.body) + _literal_names(node.orelse)
    return []


def test_every_literal_name_the_launch_code_records_is_declared():
    """An AST scan of kernels/: each gpu_paths.reach or check given a string (or either string of a
    conditional) names a declared path; names computed by a function are the next test's."""
    sites = 0
    for path in sorted(KERNELS.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("reach", "check")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "gpu_paths"):
                for name in _literal_names(node.args[0]):
                    sites += 1
                    assert name in DECLARED, f"{path.relative_to(KERNELS)}:{node.lineno}: {name!r} is not declared"
    assert sites >= 30  # the literal sites (conv_2d, batch_norm, element_binary, reshape, ...)


def test_names_computed_by_the_plans_are_declared():
    """The pure functions that compute names, over every input they can be given."""
    for direction in ("forward", "backward"):
        for aligned in (True, False):
            for kind in Activation:
                assert set(activation.plan.plan_paths(direction, kind, aligned)) <= set(DECLARED)
            for op_type in UnaryOpType:
                if op_type is UnaryOpType.IDENTITY or (direction == "backward" and element_unary.UnaryOpType(
                        op_type) in element_unary.plan._COPY_BACKWARD):
                    continue  # a device copy, never a kernel (element_unary.copy)
                assert set(element_unary.plan.plan_paths(direction, op_type, aligned)) <= set(DECLARED)
            for mode in UpsampleMode:
                assert upsample.plan.plan_path(UpsampleAttrs(2, mode), direction, aligned and mode is UpsampleMode.NEAREST) \
                    in DECLARED
            for pool_type in PoolOp:
                for kernel in (3, 16):
                    attrs = Pool2DAttrs(kernel, kernel, 1, 1, 0, 0, pool_type)
                    assert set(pool_2d.plan.plan_paths(attrs, direction, aligned and direction == "forward")) <= set(DECLARED)


@pytest.mark.parametrize("lhs, rhs, expected", [
    ((4, 5), (1, 5), {"grad.rows", "grad.one_chunk"}),  # 4 positions to a thread: one chunk
    ((200, 3), (1, 3), {"grad.rows", "grad.chunks", "sum_partials.threads"}),  # 7 chunks of 32
    ((1 << 16, 3), (1, 3), {"grad.rows", "grad.chunks", "sum_partials.warps"}),
    ((6, 40), (6, 1), {"grad.warps", "grad.one_chunk"}),  # the innermost dim (>= 32) reduced
])
def test_element_binary_grad_paths(lhs, rhs, expected):
    """The rhs gradient's paths (broadcast along the rows): its kernel, its chunks, the second pass."""
    from kernels.element_binary.gpu import grad_paths
    from kernels.element_binary.plan import gpu_plan

    plan = gpu_plan(lhs, rhs, tuple(np.broadcast_shapes(lhs, rhs)))
    assert set(grad_paths(plan.grads[1])) == {f"element_binary.{p}" for p in expected}
    assert set(grad_paths(plan.grads[1])) <= set(DECLARED)


@pytest.mark.parametrize("dims, permutation, dtype, expected", [
    ((2, 1, 3), (1, 0, 2), np.float32, "transpose.copy"),
    ((2, 3, 4), (1, 0, 2), np.float32, "transpose.gather"),
    ((16, 512, 512), (0, 2, 1), np.float32, "transpose.tiled64"),
    ((2, 40, 50), (0, 2, 1), np.float32, "transpose.tiled32"),
    ((2, 512, 512), (0, 2, 1), np.dtype((np.void, 16)), "transpose.tiled32"),
])
def test_transpose_plan_paths(dims, permutation, dtype, expected):
    assert transpose.plan.plan_path(transpose.plan.gpu_plan(dims, permutation, np.dtype(dtype), sm_count=132)) == expected


@pytest.mark.parametrize("dims, axis, expected", [
    ((5, 3), 1, "softmax.rows.shared_warp"),
    ((5, 16), 1, "softmax.rows.shared_warp"),
    ((5, 17), 1, "softmax.rows.warp"),
    ((5, 33), 1, "softmax.rows.registers"),
    ((5, 1024), 1, "softmax.rows.registers"),
    ((5, 1025), 1, "softmax.block"),
    ((2, 16, 4, 10), 1, "softmax.columns_cached"),
    ((2, 600, 7), 1, "softmax.block"),
    ((2, 40, 7), 1, "softmax.columns"),
])
def test_softmax_plan_paths(dims, axis, expected):
    kind = softmax.plan.gpu_plan(dims, axis, np.dtype(np.float32))[0]
    assert softmax.plan.plan_path(kind) == expected and expected in DECLARED


def _layout(pieces, axis, dtype=np.float32):
    whole = list(pieces[0])
    whole[axis] = sum(p[axis] for p in pieces)
    return concat.attrs.piece_layout(TensorShape(tuple(whole), dtype), [p[axis] for p in pieces], axis)


@pytest.mark.parametrize("pieces, axis, to_whole, unit, expected", [
    ([(2, 3, 4), (2, 5, 4)], 1, True, 16, {"join", "unit16", "rows", "tail"}),
    ([(1, 3, 4), (1, 5, 4)], 1, False, 4, {"cut", "unit4", "one_row", "tail"}),
    ([(1, 1)] * 13, 1, True, 1, {"join", "unit1", "one_row", "batches", "tail"}),
    # 132 SMs x 8 blocks x 256 threads a stride: a piece of 4 strides runs the unrolled loop, no tail
    ([(1, 4 * 132 * 8 * 256 * 4)] * 2, 1, True, 4, {"join", "unit4", "one_row", "unrolled"}),
    ([(1, 4 * 132 * 8 * 256 * 4 + 4)] * 2, 1, True, 4, {"join", "unit4", "one_row", "unrolled", "tail"}),
])
def test_concat_kernel_paths(pieces, axis, to_whole, unit, expected):
    """Which of copy_piece's loops run, from the grid the plan sizes: thread t enters the unrolled
    loop while t + (UNROLL - 1) * stride < count, the tail while units are left after it."""
    layout = _layout(pieces, axis)
    got = concat.plan.kernel_paths(layout, to_whole, unit, list(range(len(pieces))), sm_count=132)
    assert set(got) == {f"concat.kernel.{p}" for p in expected} and set(got) <= set(DECLARED)


# --------------------------------------------------------------------------- the small device


def test_simulated_device_caps_every_strided_grid_and_answers_its_sm_count():
    """gpu.simulated_device: sm_count() answers the simulated count (CuPy is never asked), grid_for and
    capped give at most max_blocks blocks, blocks nest, and another thread plans for the real device."""
    assert gpu.simulated() is None
    assert [gpu.grid_for(n) for n in (0, 1, 256, 257, 10**9)] == [1, 1, 1, 2, gpu.GRID_BLOCKS]
    assert gpu.capped(70000, 65535) == 65535 and gpu.capped(0, 65535) == 1
    with gpu.simulated_device(sm_count=1, max_blocks=2):
        assert gpu.simulated() == (1, 2) and gpu.sm_count(0) == 1
        assert [gpu.grid_for(n) for n in (0, 1, 256, 257, 513, 10**9)] == [1, 1, 1, 2, 2, 2]
        assert gpu.grid_for(4 * 256 * 4, per_thread=4) == 2 and gpu.grid_for(1024, per_thread=4) == 1
        assert [gpu.capped(n, 65535) for n in (1, 2, 3, 70000)] == [1, 2, 2, 2] and gpu.capped(5, 1) == 1
        with gpu.simulated_device(sm_count=4, max_blocks=1):
            assert gpu.sm_count(3) == 4 and gpu.grid_for(10**6) == 1 and gpu.capped(9, 65535) == 1
        assert gpu.simulated() == (1, 2)
        seen = []
        thread = threading.Thread(target=lambda: seen.append(gpu.simulated()))
        thread.start()
        thread.join()
        assert seen == [None]
    assert gpu.simulated() is None and gpu.grid_for(10**9) == gpu.GRID_BLOCKS
    for sm_count, max_blocks in ((0, 2), (1, 0)):
        with pytest.raises(ValueError, match="must be >= 1"), gpu.simulated_device(sm_count, max_blocks):
            pass


def _golden(op, name):
    from conformance.cases import all_cases

    return next(case for case in all_cases() if case.op == op and case.name == name)


def _small(function, *args, **kwargs):
    with gpu.simulated_device(sm_count=1, max_blocks=2):
        return function(*args, **kwargs)


def test_small_device_plans_of_the_golden_launch_shapes():
    """The golden cases declared for the small schedule (conformance/cases/*.py, "GPU launch shapes") take,
    under gpu.simulated_device(1, 2), the launches they are there for, and not on the H200's 132 SMs."""
    from kernels.conv_2d import plan as conv_plan
    from kernels.pool_2d import plan as pool_plan

    # pool_2d: tiles of 16 x 17 over 31 x 33 outputs, both last tiles partial; 3 planes over 2 plane blocks.
    case = _golden("pool_2d", "max_3x3_s1_p1_partial_tiles_31x33")
    tile_h, tile_w, tiles_h, tiles_w, _ = pool_plan.max_forward_tile(case.attrs, 31, 33, 4)
    assert (tile_h, tile_w, tiles_h, tiles_w) == (16, 17, 2, 2) and 31 % tile_h and 33 % tile_w
    assert case.inputs["input"].shape[1] == 3 and _small(gpu.capped, 3, 65535) == 2
    # pool_2d: a window past 48 KB of shared memory even for a one-row tile: the direct forward, int taps.
    case = _golden("pool_2d", "max_64x97_direct_f64")
    assert pool_plan.max_forward_tile(case.attrs, 1, 2, 8) is None
    assert pool_2d.plan.plan_paths(case.attrs, "forward", False) == ("pool_2d.max.forward_direct", "pool_2d.max.taps_i32")
    # concat: pieces longer than 3 strides of a 2-block grid run the unrolled copy, aligned and misaligned;
    # on 132 SMs the grid covers them in one round.
    case = _golden("concat", "rows_past_unrolled_small_device")
    dims = [case.inputs[f"inputs.{i}"].shape for i in range(3)]
    layout = _layout(dims, 1)
    for unit in (16, 4):
        small = _small(concat.plan.kernel_paths, layout, True, unit, [0, 1, 2], sm_count=1)
        assert {"concat.kernel.unrolled", "concat.kernel.tail"} <= set(small)
        assert "concat.kernel.unrolled" not in concat.plan.kernel_paths(layout, True, unit, [0, 1, 2], sm_count=132)
    # concat: a one-row join and cut of 128000 bytes: on one SM both run the unrolled copy, on 132 neither.
    case = _golden("concat", "one_row_past_unrolled_small_device")
    dims = [case.inputs[f"inputs.{i}"].shape for i in range(3)]
    layout = _layout(dims, 1)
    assert layout.outer == 1 and layout.row_bytes == 128000
    for to_whole, direction in ((True, "concat.kernel.join"), (False, "concat.kernel.cut")):
        small = _small(concat.plan.kernel_paths, layout, to_whole, 16, [0, 1, 2], sm_count=1)
        assert {direction, "concat.kernel.one_row", "concat.kernel.unrolled"} <= set(small)
        assert "concat.kernel.unrolled" not in concat.plan.kernel_paths(layout, to_whole, 16, [0, 1, 2], sm_count=132)
    # conv_2d: dilation 55: one output's 111 x 111 input region is past a tiled block's shared memory.
    case = _golden("conv_2d", "depthwise_dilation_55_untiled")
    state = types.SimpleNamespace(attrs=case.attrs, shapes={
        "input_shape": TensorShape((1, 2, 111, 112), np.float32), "output_shape": TensorShape((1, 2, 1, 2), np.float32)})
    assert conv_plan.depthwise(case.attrs, 2) and conv_plan.depthwise_tile(state) is None


def test_small_device_grids_of_the_plans():
    """Under the small device every plan that sizes a grid its kernel strides over gives at most two blocks,
    and the plans that decide the order of sums (element_binary's chunks) do not move: the same bits."""
    from kernels.batch_norm import plan as batch_norm_plan
    from kernels.element_binary.plan import gpu_plan as binary_plan

    assert batch_norm_plan.grid2(300, 7) == (300, 7) and _small(batch_norm_plan.grid2, 300, 7) == (2, 2)
    assert softmax.plan.gpu_plan((5, 1025), 1, np.dtype(np.float32))[1] == 5
    assert _small(softmax.plan.gpu_plan, (5, 1025), 1, np.dtype(np.float32))[1] == 2
    assert _small(softmax.plan.gpu_plan, (3000, 40), 1, np.dtype(np.float32))[1] == 2  # rows: 4 a block
    plan = transpose.plan.gpu_plan((5, 40, 50), (0, 2, 1), np.dtype(np.float32), sm_count=132)
    assert plan[1].endswith(", 32>") and plan[2] == (4, 5)  # too few 64 x 64 tiles for 132 SMs: 32 x 32 ones
    with gpu.simulated_device(sm_count=1, max_blocks=2):
        plan = transpose.plan.gpu_plan((5, 40, 50), (0, 2, 1), np.dtype(np.float32), sm_count=gpu.sm_count(0))
    assert transpose.plan.plan_path(plan) == "transpose.tiled64" and plan[2] == (1, 2)  # 5 batches over 2 blocks
    for lhs, rhs in (((300, 3), (1, 3)), ((6, 40), (6, 1)), ((4, 256, 40), (1,))):
        out = tuple(np.broadcast_shapes(lhs, rhs))
        assert _small(binary_plan, lhs, rhs, out) == binary_plan(lhs, rhs, out)
    assert gpu.simulated() is None


class _FakeEnv:
    """A conformance Env on test_gpu_launch_plans' recording fake device: every tensor an address,
    `misalign` elements past a 256-byte boundary."""

    def __init__(self, recorder, case, golden, misalign):
        self.recorder, self.case, self.golden, self.misalign = recorder, case, golden, misalign
        self.attrs, self.stream = case.attrs, FakeStream()
        self.handle, self.arrays = self.stream, {}

    def _array(self, key, dims, dtype):
        if key not in self.arrays:
            self.arrays[key] = self.recorder.array(tuple(dims), dtype, self.misalign * np.dtype(dtype).itemsize)
        return self.arrays[key]

    def read(self, name):
        value = self.golden.inputs[name]
        return self._array(("read", name), value.shape, value.dtype)

    def write(self, name, dims=None, dtype=None):
        expected = self.golden.expected.get(name)
        dims = expected.shape if dims is None else dims
        dtype = (expected.dtype if expected is not None else self.case.dtype) if dtype is None else dtype
        return self._array(("written", name), dims, dtype)

    def reads_list(self, prefix):
        return [self.read(f"{prefix}.{i}") for i in range(sum(k.startswith(prefix + ".") for k in self.golden.inputs))]

    def writes_list(self, prefix):
        return [self.write(f"{prefix}.{i}") for i in range(sum(k.startswith(prefix + ".") for k in self.golden.expected))]

    def observe(self, name, array):
        pass

    def op(self, name=None):
        return kernels.OPS[name or self.case.op]

    def shape(self, name):
        value = self.golden.inputs.get(name)
        value = self.golden.expected[name] if value is None else value
        return TensorShape(value.shape, value.dtype)


def test_golden_cases_reach_every_path_under_the_small_device_on_a_fake_device(device, monkeypatch, store):  # noqa: F811
    """The conformance run's small schedule, without a GPU: every golden case's run, aligned and
    misaligned, on the recording fake device of tests/test_gpu_launch_plans.py inside the small device,
    reaches every declared name of the ops the fake stands in for (conv_2d and batch_matmul call cuDNN
    and cuBLAS: theirs are the GPU test's); on 132 SMs the golden cases leave the unrolled copy and the
    64x64 transpose tiles out."""
    from conformance.cases import all_cases
    from conformance.harness import SMALL_DEVICE, execute

    class Context:  # cupy.cuda.Device, Stream.null and Event, for batch_norm's state
        done = True
        null = None  # Stream.null, entered as a context

        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def record(self, *args):
            pass

        def synchronize(self):
            pass

    Context.null = Context()
    monkeypatch.setattr(gpu.cupy.cuda, "Device", Context, raising=False)
    monkeypatch.setattr(gpu.cupy.cuda, "Stream", Context, raising=False)
    monkeypatch.setattr(gpu.cupy.cuda, "Event", Context, raising=False)
    monkeypatch.setattr(gpu, "sm_count", lambda ordinal: (gpu.simulated() or (132,))[0])
    monkeypatch.setattr(FakeArray, "fill", lambda self, value: None, raising=False)
    monkeypatch.setattr(FakeArray, "__getitem__", lambda self, index: self, raising=False)  # a view: its address
    faked = sorted({case.op for case in all_cases()} - {"conv_2d", "batch_matmul"})

    def reached(simulated):
        with gpu_paths.recording() as recording:
            for case in all_cases():
                if case.op in faked and "gpu" in case.extra.get("devices", ("gpu",)):
                    for misalign in (0, 1):
                        env = _FakeEnv(device, case, store.get(case), misalign)
                        if simulated:
                            with gpu.simulated_device(**SMALL_DEVICE):
                                execute(case, env)
                        else:
                            execute(case, env)
        return recording.reached

    names = {name for name in DECLARED if name.split(".")[0] in faked + ["activation"]}
    assert not names - reached(True)
    assert names - reached(False) == {"concat.kernel.unrolled", "transpose.tiled64"}


# --------------------------------------------------------------------------- on a GPU: every path reached


def _first_reach(table: dict[str, str], recording: gpu_paths.Recording, label: str) -> None:
    for name in sorted(recording.reached):
        table.setdefault(name, label)


def _write_table(table: dict[str, str]) -> str:
    rows = ["| path | first case that reached it |", "|---|---|"]
    rows += [f"| `{name}` | {table.get(name, '**not reached**')} |" for name in DECLARED]
    text = "\n".join(rows) + "\n"
    target = os.environ.get("KERNELS_GPU_PATHS_TABLE")
    if target:
        pathlib.Path(target).write_text(text)
    print(text)
    return text


@pytest.mark.gpu
def test_gpu_run_reaches_every_declared_path(store):
    """Every golden case, as the conformance run runs it on the GPU (every schedule, layout and poison, the
    small device included), must reach every declared name by itself; then every large differential case
    (expensive ones too; the GPU side only, their comparisons are tests/test_large_cases.py's) runs under
    recording for the table, where a name the golden cases reach only under the small device shows so."""
    require("gpu")
    pytest.importorskip("torch")  # tests/properties.py's runners import it
    from conformance.cases import all_cases
    from conformance.large_cases import LARGE
    from conformance.runner import run_case

    from .properties import Device
    from .test_large_cases import _sample
    from .test_properties import OPS

    table: dict[str, str] = {}
    failed = []
    for case in all_cases():
        with gpu_paths.recording() as recording:
            result = run_case(case, store.get(case), "gpu")
        if result.status == "failed":
            failed.append(result.key)
        _first_reach(table, recording, f"golden {case.op}/{case.name}")
    golden_unreached = sorted(set(DECLARED) - set(table))
    gpu_device = Device("gpu")
    try:
        for case in LARGE.cases:
            _, run, _ = OPS[case.op]
            with gpu_paths.recording() as recording, np.errstate(all="ignore"):
                run(gpu_device, _sample(case))
            _first_reach(table, recording, f"large {case.id}")
    finally:
        gpu_device.close()
    _write_table(table)
    unreached = sorted(set(DECLARED) - set(table))
    assert not unreached, "GPU paths no case reaches:\n" + "\n".join(f"  {name}: {DECLARED[name]}" for name in unreached)
    assert not golden_unreached, ("GPU paths the conformance run (the golden cases) does not reach, only large "
                                  "cases:\n" + "\n".join(f"  {name}: {DECLARED[name]} ({table[name]})"
                                                          for name in golden_unreached))
    assert not failed, f"golden cases failed on the GPU (tests/test_conformance.py says how): {failed}"
