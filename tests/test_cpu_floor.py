"""tools/cpu_floor.py: the floor of a CPU row split into parts, and its table from three summaries."""

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("cpu_floor", os.path.join(ROOT, "tools", "cpu_floor.py"))
cpu_floor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpu_floor)


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
