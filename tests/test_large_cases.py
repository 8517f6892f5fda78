"""Large differential cases (conformance/large_cases.py): seeded random tensors big enough to take
the paths the small goldens never reach, checked three ways:

- test_cpu_matches_torch: the CPU, forward and gradients, against PyTorch in float64 within the
  bound each op's reference in tests/test_properties.py derives (exact for data movement, max and
  relu; k * eps * sum(|terms|) for sums of products; ulps with the floor for transcendental ops);
- test_cpu_same_bits_on_any_threads (threshold cases): one thread and three threads give the same
  bits, so cpu.cpu_parallel's parts never change the arithmetic (the GPU comparisons rely on it);
- test_gpu_matches_cpu (marked gpu): the GPU against the CPU, bit for bit where both do the same
  operations, else within twice the CPU's bound.

Each case's `paths` claims are checked against the kernels' thresholds (test_paths_reached), and
every path has a case on each side (test_every_path_has_both_sides). Expensive cases (marked
`large`) run with `-m large` or KERNELS_LARGE_CASES=1 (tests/conftest.py).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import kernels
from conformance.large_cases import LARGE, LargeCase
from kernels import activation, batch_norm, conv_2d, element_binary, pool_2d, softmax
from kernels.runtime.core import TensorShape

from .properties import Expect, Sample, check, check_gpu
from .test_properties import OPS, _failures

pytest.importorskip("torch")


def _numel(dims) -> int:
    return int(np.prod(dims, dtype=np.int64))


def _layout(case: LargeCase):
    shape = TensorShape(case.shapes["input"], np.dtype(case.dtype))
    state = batch_norm.init_kernel(kernels.cpu_handle(), case.attrs, shape, shape)
    return state.layout


def _softmax_split(case: LargeCase) -> tuple[int, int, int]:
    dims = case.shapes["input"]
    axis = case.attrs.dim % len(dims)
    return _numel(dims[:axis]), dims[axis], _numel(dims[axis + 1:])


# Each CPU path: whether a case is past its threshold (True) or not, from the kernels' own constants.
PATHS = {
    # activation.blockwise: blocks of BLOCK_ELEMENTS past it (element_unary, every fused activation).
    "activation_blocks": lambda c: _numel(c.shapes["input" if c.op == "element_unary" else "output_grad"])
    > activation.cpu.BLOCK_ELEMENTS,
    # conv_2d: im2col as a strided view from WIDE_ROWS_BELOW output columns, stride phases below.
    "conv_wide_rows": lambda c: c.shapes["output_grad"][3] >= conv_2d.cpu.WIDE_ROWS_BELOW,
    "conv_plain": lambda c: conv_2d.cpu._plain(c.attrs),
    # softmax along the last dim: the rows cut into cache-sized blocks, not just one per thread.
    "softmax_rows_blocked": lambda c: _softmax_split(c)[2] == 1 and
    _softmax_split(c)[0] * _softmax_split(c)[1] > softmax.cpu.CPU_BLOCK_ELEMENTS,
    # softmax along an inner dim: blocks of inner columns (a row's size * inner past a block).
    "softmax_inner_columns": lambda c: _softmax_split(c)[2] > 1 and
    _softmax_split(c)[1] * _softmax_split(c)[2] > softmax.cpu.CPU_BLOCK_ELEMENTS,
    # ... and dim so long that columns 4 wide do not fit a block: the whole of inner.
    "softmax_long_dim": lambda c: softmax.cpu.CPU_BLOCK_ELEMENTS // _softmax_split(c)[1] < 4,
    # batch_norm: blocks of inner itself from CPU_BLOCK_ELEMENTS inner values, of whole rows below.
    "batch_norm_inner_blocks": lambda c: _layout(c).inner >= batch_norm.cpu.CPU_BLOCK_ELEMENTS,
    # pool_2d MAX backward: one plane a block when a plane has more outputs than a block holds.
    "pool_one_plane_blocks": lambda c: _numel(c.shapes["output_grad"][2:]) > pool_2d.cpu.CPU_BACKWARD_BLOCK,
    # element_binary: parts along an axis from _CPU_PARALLEL_MIN outputs.
    "binary_parallel": lambda c: _numel(c.shapes["output_grad"]) >= element_binary.cpu._CPU_PARALLEL_MIN,
}
# Paths whose far side shares the work out to the threads (cpu.cpu_parallel with 2 parts or more).
PARALLEL_PATHS = {"activation_blocks", "softmax_rows_blocked", "softmax_inner_columns", "batch_norm_inner_blocks",
                  "pool_one_plane_blocks", "binary_parallel"}


def _param(case: LargeCase):
    return pytest.param(case, id=case.id, marks=[pytest.mark.large] if case.expensive else [])


CASES = [_param(c) for c in LARGE.cases]
THRESHOLD_CASES = [_param(c) for c in LARGE.cases if c.group == "threshold"]


def _sample(case: LargeCase) -> Sample:
    inputs = case.inputs()
    if case.op == "conv_2d":
        inputs.setdefault("bias", None)  # the runner takes None for no bias
    return Sample(case.op, case.attrs, inputs, np.dtype(case.dtype), False, dict(case.extra))


@contextlib.contextmanager
def _one_part_per_thread():
    """cpu_parallel makes one part per thread however few bytes a call moves (runtime.cpu.PIECE_BYTES = 1):
    the cases are small, and the tests are about the parts' arithmetic, not their number."""
    real = kernels.runtime.cpu.PIECE_BYTES
    kernels.runtime.cpu.PIECE_BYTES = 1
    try:
        yield
    finally:
        kernels.runtime.cpu.PIECE_BYTES = real


@contextlib.contextmanager
def _threads(count: int | None):
    """cpu.cpu_threads() reports `count` (None: the real count) inside the block, one part per thread."""
    if count is None:
        yield
        return
    real = kernels.runtime.cpu.cpu_threads
    kernels.runtime.cpu.cpu_threads = lambda: count
    try:
        with _one_part_per_thread():
            yield
    finally:
        kernels.runtime.cpu.cpu_threads = real


@contextlib.contextmanager
def _parts_spy():
    """Records the parts of every cpu.cpu_parallel call inside the block (one per thread, see
    _one_part_per_thread, at most one per item)."""
    real, counts = kernels.runtime.cpu.cpu_parallel, []

    def spy(function, count, nbytes=None):
        counts.append(min(kernels.runtime.cpu.cpu_threads(), count))
        return real(function, count, nbytes)

    kernels.runtime.cpu.cpu_parallel = spy
    try:
        with _one_part_per_thread():
            yield counts
    finally:
        kernels.runtime.cpu.cpu_parallel = real


def test_declarations():
    """Every case names a known op, group and path; names are unique (LargeTable refuses duplicates)."""
    assert len({c.id for c in LARGE.cases}) == len(LARGE.cases)
    for case in LARGE.cases:
        assert case.op in OPS, case.id
        assert case.group in ("threshold", "yolov10", "bandwidth", "grid_stride"), case.id
        assert set(case.paths) <= set(PATHS), case.id
        assert not (case.group == "threshold" and case.expensive), f"{case.id}: threshold cases run in CI"
    with pytest.raises(ValueError, match="duplicate"):
        LARGE.add(LARGE.cases[0])


def test_inputs_are_regenerated_from_the_seed():
    case = LARGE.cases[0]
    first, second = case.inputs(), case.inputs()
    assert all(np.array_equal(first[name], second[name]) for name in first)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in LARGE.cases if c.paths])
def test_paths_reached(case):
    """Each case is on the side of each threshold it claims (against the kernels' constants)."""
    wrong = {path: PATHS[path](case) for path, side in case.paths.items() if PATHS[path](case) != side}
    assert not wrong, f"{case.id}: on the other side of {wrong} (past the threshold: True)"


def test_every_path_has_both_sides():
    """Each path is reached on both sides of its threshold by cases that run in CI."""
    sides = {path: set() for path in PATHS}
    for case in LARGE.cases:
        if not case.expensive:
            for path, side in case.paths.items():
                sides[path].add(side)
    missing = {path: {True, False} - seen for path, seen in sides.items() if seen != {True, False}}
    assert not missing, f"paths missing a side: {missing}"


@pytest.mark.parametrize("case", CASES)
def test_cpu_matches_torch(case, cpu):
    """Forward and gradients on the CPU against PyTorch in float64, within each tensor's bound."""
    _, run, expect = OPS[case.op]
    sample = _sample(case)
    with np.errstate(all="ignore"), _parts_spy() as parts:
        results = run(cpu, sample)
        failures = _failures(results, expect(sample), lambda name, got, e: check(name, got, e, got.dtype))
    assert not failures, f"{case.id} on the CPU:\n" + "\n".join(failures)
    parallel = [path for path, side in case.paths.items() if side and path in PARALLEL_PATHS]
    if parallel and kernels.runtime.cpu.cpu_threads() > 1:
        assert max(parts, default=0) > 1, f"{case.id}: {parallel} should share work out, cpu_parallel got {parts}"


def assert_same_bits_on_one_and_three_threads(case: LargeCase, cpu) -> None:
    """The case on one thread and on three (uneven parts on any machine) gives the same bits."""
    _, run, _ = OPS[case.op]
    sample = _sample(case)
    with np.errstate(all="ignore"):
        with _threads(1):
            alone = run(cpu, sample)
        with _threads(3):
            shared = run(cpu, sample)
    differ = [name for name in alone if check(name, shared[name], Expect(alone[name]), alone[name].dtype)]
    assert not differ, f"{case.id}: {differ} differ between 1 and 3 threads"


@pytest.mark.parametrize("case", THRESHOLD_CASES)
def test_cpu_same_bits_on_any_threads(case, cpu):
    assert_same_bits_on_one_and_three_threads(case, cpu)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_matches_cpu(case, gpu, cpu):
    """The GPU against our CPU: bit for bit where both do the same operations, else within twice the bound."""
    _, run, expect = OPS[case.op]
    sample = _sample(case)
    with np.errstate(all="ignore"):
        on_cpu = run(cpu, sample)
        failures = _failures(run(gpu, sample), expect(sample),
                             lambda name, got, e: check_gpu(name, got, on_cpu[name], e, got.dtype))
    assert not failures, f"{case.id} on the GPU:\n" + "\n".join(failures)
