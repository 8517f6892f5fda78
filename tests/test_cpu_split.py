"""tools/cpu_split.py: each kernel forced to p parts, its cpu_parallel calls timed part by part."""

from kernels.runtime import cpu

from .tools import load_tool

cpu_split = load_tool("cpu_split")


def test_parts_are_forced_to_the_threads_and_timed_one_by_one():
    real, pieces = cpu.cpu_parallel, cpu.PIECE_BYTES
    rows = cpu_split.measure([1, 2], runs=1, scale=8)
    assert (cpu.cpu_parallel, cpu.PIECE_BYTES) == (real, pieces)  # restored
    names = [name for name, p, _, _ in rows if p == 1]
    assert len(rows) == 8 and [name for name, p, _, _ in rows if p == 2] == names
    for name, p, seconds, records in rows:
        if p == 1 and name.startswith("element_binary"):
            assert records == []  # one thread: one NumPy call, no split
            continue
        # batch_norm's training forward: two sums passes and the apply pass; the others one pass.
        assert len(records) == (3 if name.startswith("batch_norm") else 1), (name, p, records)
        for wall, busy, largest, parts in records:
            assert parts == p, (name, p, parts)  # forced: one part per thread, however few the bytes
            assert 0 < largest <= busy and largest <= wall <= seconds


def test_report_prints_a_row_per_kernel_and_part_count(capsys):
    assert cpu_split.main(["cpu_split", "--threads", "2", "--runs", "1", "--scale", "8"]) == 0
    out = capsys.readouterr().out
    assert "| softmax forward (1, 5, 400, 50) dim -1 | 2 | " in out
    assert out.count(" | 2 | ") == 4 and out.count(" (2)") >= 6  # batch_norm's three calls, one each for the rest
