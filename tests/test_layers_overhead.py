"""tools/layers_overhead.py: its stand-ins carry a real public GPU call (the checks run, the launch is reached
once, with the state's kernel and the stream), and are gone after the block."""

import numpy as np
import pytest

from kernels import ShapeError, element_binary
from kernels.runtime import core, gpu

from .tools import load_tool

layers_overhead = load_tool("layers_overhead")


def test_the_stand_ins_carry_a_public_gpu_call_to_one_launch():
    saved = (core._CUPY_ARRAY, gpu.cupy, gpu._launch_kernel)
    launches = []
    with layers_overhead.stand_ins(launches) as made:
        made.call()
        assert len(launches) == 1
        function, gx, gy, gz, bx, by, bz, shared, stream_ptr, parameters, extra = launches[0]
        assert (function, stream_ptr, (bx, by, bz), shared, extra) == (0x99, 0x5000, (gpu.BLOCK, 1, 1), 0, 0)
        words = made.arguments[2].gpu_forward[1][1]._words  # the vector launch's slots: lhs, rhs, output
        assert [int(words[slot]) for slot in (0, 2, 4)] == [0x1000, 0x2000, 0x3000]
        stream, handle, state, attrs, lhs, rhs, _ = made.arguments
        wrong = layers_overhead.StandInArray((4, 5), np.float32, 0x4000)
        with pytest.raises(ShapeError, match=r"^element_binary: output: expected dims \(4, 4\), found \(4, 5\)"):
            element_binary.forward_kernel(stream, handle, state, attrs, lhs, rhs, wrong)
        assert len(launches) == 1
    assert (core._CUPY_ARRAY, gpu.cupy, gpu._launch_kernel) == saved


def test_parts_time_every_piece_and_each_timed_call_launches_once():
    launches = []
    times = layers_overhead.parts(calls=20, runs=2, launches=launches)
    assert list(times) == ["the whole call", "the op's GPU code (checks and launch)", "the checks (_check_forward)",
                           "the state's PackedLaunch", "the layers above the op's code"]
    assert all(us > 0 for name, us in times.items() if name != "the layers above the op's code")
    # The whole call, the op's code and the PackedLaunch each launched once a call; the checks never: a piece
    # that stopped short of the launch (or launched twice) would time something else.
    assert len(launches) == 3 * 20 * 2
    assert {(arguments[0], arguments[8]) for arguments in launches} == {(0x99, 0x5000)}
