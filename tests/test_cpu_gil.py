"""tools/cpu_gil.py: each kernel's NumPy call alone and in threads side by side."""

import json

import numpy as np

from .tools import load_tool

cpu_gil = load_tool("cpu_gil")


def test_every_call_is_timed_alone_and_side_by_side():
    rows = cpu_gil.measure(2, calls=2)
    assert list(rows) == list(cpu_gil.CALLS)
    for name, (alone, speedup) in rows.items():
        assert alone > 0 and speedup > 0, name


def test_the_calls_write_what_the_kernels_write():
    d = cpu_gil.arrays(0)
    cpu_gil.CALLS["add.at"](d)
    expected = np.zeros(cpu_gil.ELEMENTS, np.float32)
    for target, value in zip(d["targets"], d["x"]):  # one add at a time, in order
        expected[target] += value
    assert np.array_equal(d["y"], expected)
    cpu_gil.CALLS["im2col"](d)
    assert np.array_equal(d["columns"][5, 2, 1], d["padded"][5, 2:66, 1:65])  # channel 5, tap (2, 1)


def test_report_and_json(tmp_path, capsys):
    out = tmp_path / "gil.json"
    assert cpu_gil.main(["cpu_gil", "--threads", "2", "--calls", "2", "--json", str(out)]) == 0
    assert "| add.at | " in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert list(report) == ["2"] and list(report["2"]) == list(cpu_gil.CALLS)

