"""The YOLOv10 large cases whose tensors are past kernels.runtime.cpu.PARALLEL_MIN_BYTES (or batch_norm's,
pool_2d's and conv_2d's blocks) take the parts that cpu.cpu_parts, cpu.cpu_copy, cpu.cpu_planes and
the ops' own blocks share out to the threads: one thread and three (uneven parts on any machine)
must give the same bits. The BLAS thread count is the handle's and is not changed here (a GEMM's
bits may depend on it: docs/api.md), so conv_2d's copies and folds around its GEMMs are checked too."""

from __future__ import annotations

import numpy as np
import pytest

import kernels
from conformance.large_cases import LARGE

from .test_large_cases import assert_same_bits_on_one_and_three_threads

pytest.importorskip("torch")

# One case per path the parts change; each is checked past its threshold below.
IDS = [
    "batch_norm/v10_stem_1x16x320x320_silu",
    "concat/head_1x144x6400_1600_400_last_axis",
    "conv_2d/c2f_3x3_1x32x160x160_32",
    "conv_2d/stem_3x3s2_1x3x640x640_16",
    "element_binary/channel_mul_1x80x160x160_1x80x1x1",
    "gradient_reduction/3x1x80x160x160",
    "pool_2d/sppf_v10x_1x640x20x20",
    "reshape/flatten_1x640x160x160",
    "split/c2f_1x160x160x160_halves",
    "upsample/nearest_x2_1x640x40x40",
    "upsample/bilinear_x2_1x64x80x80",
]
CASES = {case.id: case for case in LARGE.cases}


def test_the_cases_are_past_the_parallel_threshold():
    """Past cpu.PARALLEL_MIN_BYTES; batch_norm and pool_2d share out their own blocks, past one block."""
    from kernels import batch_norm, pool_2d

    for case_id in IDS:
        case = CASES[case_id]
        elements = max(int(np.prod(dims)) for dims in case.shapes.values())
        if case.op == "batch_norm":
            assert elements > batch_norm.cpu.CPU_BLOCK_ELEMENTS, case_id
        elif case.op == "pool_2d":
            assert elements > pool_2d.cpu.CPU_FORWARD_BLOCK, case_id
        else:
            assert elements * np.dtype(case.dtype).itemsize >= kernels.runtime.cpu.PARALLEL_MIN_BYTES, case_id


@pytest.mark.parametrize("case_id", IDS)
def test_one_thread_and_three_give_the_same_bits(case_id, cpu):
    assert_same_bits_on_one_and_three_threads(CASES[case_id], cpu)
