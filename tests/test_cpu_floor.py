"""tools/cpu_floor.py: the floor of a CPU row split into parts, and its table from three summaries."""

import json

from .tools import load_tool

cpu_floor = load_tool("cpu_floor")


def test_floor_is_the_best_split_into_parts():
    # 1000 us on one thread, 18 us a hand-off: 7 parts give 1000/7 + 6*18 = 250.86 (8 give 251).
    assert abs(cpu_floor.floor(1000.0, 16, 18.0) - (1000 / 7 + 6 * 18)) < 1e-9
    assert cpu_floor.floor(1000.0, 2, 18.0) == 518.0
    assert cpu_floor.floor(10.0, 16, 18.0) == 10.0  # too small to share


def test_table_sorts_rows_into_met_and_floors(tmp_path, capsys):
    def summary(name, threads, ours, torch):
        rows = [{"group": g, "impl": impl, "device": "cpu", "median_s": us * 1e-6}
                for g, o, t in zip(("a", "b"), ours, torch) for impl, us in (("ours", o), ("torch", t))]
        (tmp_path / name).write_text(json.dumps({"records": rows, "threads": {"ours": threads}}))
        return str(tmp_path / name)

    one = summary("1.json", 1, (1000.0, 100000.0), (1.0, 1.0))
    two = summary("2.json", 2, (500.0, 50000.0), (400.0, 100.0))
    every = summary("16.json", 16, (300.0, 20000.0), (200.0, 100.0))
    assert cpu_floor.main(["cpu_floor", one, two, every]) == 0
    out = capsys.readouterr().out
    # a: 1.5x on 16 (met), 1.25x on 2 (met); b: 200x on 16, floor 100000/16+15*18 = 6520 us = 65x (over 3x).
    assert "| a | 1000 | 300 / 200 | 1.50 | " in out
    assert "| b | 100000 | 20000 / 100 | 200.00 (floor over) | 65.20 |" in out
    assert "met: 1 rows on 16 threads, 1 on 2" in out and "floor over: 1 rows on 16 threads, 1 on 2" in out


def test_one_pass_bound_from_a_ceiling_run():
    """With tools/cpu_ceiling.py's JSON, the least time one NumPy pass over a row's bytes takes on the host:
    the best, over the part counts measured up to the column's threads, of bytes / copy bandwidth + hand-off."""
    ceiling = {"records": [
        {"pass": "empty", "elements": 0, "threads": 1, "impl": "numpy", "median_us": 0.1, "gbps": None},
        {"pass": "empty", "elements": 0, "threads": 2, "impl": "numpy", "median_us": 30.0, "gbps": None},
        {"pass": "empty", "elements": 0, "threads": 8, "impl": "numpy", "median_us": 100.0, "gbps": None},
        {"pass": "copy", "elements": 1000, "threads": 8, "impl": "numpy", "median_us": 1.0, "gbps": 1000.0},  # small: unused
        {"pass": "copy", "elements": 9000, "threads": 1, "impl": "numpy", "median_us": 9.0, "gbps": 10.0},
        {"pass": "copy", "elements": 9000, "threads": 2, "impl": "numpy", "median_us": 9.0, "gbps": 20.0},
        {"pass": "copy", "elements": 9000, "threads": 8, "impl": "numpy", "median_us": 9.0, "gbps": 80.0},
        {"pass": "copy", "elements": 9000, "threads": 8, "impl": "torch", "median_us": 9.0, "gbps": 999.0},
    ]}
    bound = cpu_floor.one_pass_bound(ceiling)
    # 1 MB: 1 part 100 + 0.1 us; 2 parts 50 + 30; 8 parts 12.5 + 100.
    assert abs(bound(1e6, 1) - 100.1) < 1e-9 and bound(1e6, 2) == 80.0 and bound(1e6, 16) == 80.0
    # 100 MB: 8 parts win, 1250 + 100 us.
    assert bound(1e8, 16) == 1350.0 and bound(1e8, 4) == 5030.0


def test_table_marks_rows_a_single_pass_cannot_bring_within_the_target(tmp_path, capsys):
    def summary(name, threads, ours, torch):
        rows = [{"group": g, "impl": impl, "device": "cpu", "median_s": us * 1e-6, "bytes": b}
                for g, o, t, b in zip(("a", "b"), ours, torch, (1e6, 1e8)) for impl, us in (("ours", o), ("torch", t))]
        (tmp_path / name).write_text(json.dumps({"records": rows, "threads": {"ours": threads}}))
        return str(tmp_path / name)

    ceiling = tmp_path / "ceiling.json"
    ceiling.write_text(json.dumps({"records": [
        {"pass": "empty", "elements": 0, "threads": p, "impl": "numpy", "median_us": h, "gbps": None}
        for p, h in ((1, 0.0), (2, 30.0), (16, 200.0))] + [
        {"pass": "copy", "elements": 9000, "threads": p, "impl": "numpy", "median_us": 1.0, "gbps": g}
        for p, g in ((1, 10.0), (2, 20.0), (16, 100.0))]}))
    one = summary("1.json", 1, (1000.0, 100000.0), (1.0, 1.0))
    two = summary("2.json", 2, (500.0, 50000.0), (100.0, 100.0))
    every = summary("16.json", 16, (700.0, 20000.0), (200.0, 100.0))
    assert cpu_floor.main(["cpu_floor", one, two, every, "--ceiling", str(ceiling)]) == 0
    out = capsys.readouterr().out
    # a on 16: 3.5x; floor 1000/7 + 6*18 = 250.9 us (1.25x): under; one pass over 1 MB: 80 us (0.40x).
    # On 2: 5x, floor 518 us (5.18x): over, though one pass would take 80 us (0.80x).
    assert "| a | 1000 | 700 / 200 | 3.50 ✗ | 1.25 | 0.40 | 500 / 100 | 5.00 (floor over) | 5.18 | 0.80 |" in out
    # b on 16: one pass over 100 MB at best 1200 us, 12x PyTorch's 100 us: bound over (NumPy cannot).
    assert "| b | 100000 | 20000 / 100 | 200.00 (bound over) | 65.20 | 12.00 |" in out
    assert "bound over: 1 rows on 16 threads, 1 on 2" in out


def test_runs_joined_by_commas_give_each_row_its_best(tmp_path, capsys):
    """Two runs of a setting: each row, ours and PyTorch's, takes its least median of the two."""
    def summary(name, threads, ours, torch):
        rows = [{"group": "a", "impl": "ours", "device": "cpu", "median_s": ours * 1e-6},
                {"group": "a", "impl": "torch", "device": "cpu", "median_s": torch * 1e-6}]
        (tmp_path / name).write_text(json.dumps({"records": rows, "threads": {"ours": threads}}))
        return str(tmp_path / name)

    one = summary("1.json", 1, 1000.0, 900.0) + "," + summary("1b.json", 1, 800.0, 950.0)
    two = summary("2.json", 2, 500.0, 400.0)
    every = summary("16.json", 16, 900.0, 200.0) + "," + summary("16b.json", 16, 700.0, 250.0)
    assert cpu_floor.main(["cpu_floor", one, two, every]) == 0
    # 1 thread: 800 (the second run); 16 threads: ours 700 (second), PyTorch 200 (first): 3.50x.
    assert "| a | 800 | 700 / 200 | 3.50" in capsys.readouterr().out
