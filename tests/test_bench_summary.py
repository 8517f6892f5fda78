"""The benchmark summary (tools/bench_summary.py) on synthetic records: rows, ratios, geomeans,
the % of a device copy, full names, and tools/bench_table.py's Markdown from the JSON."""

import json

import pytest

from tests.tools import load_tool
from tools.bench_summary import (
    Record,
    Row,
    format_markdown,
    format_text,
    records_from_benchmarks,
    records_from_json,
    summarize,
    threads_line,
    to_json,
    variant_of,
)

LONG = "concat forward 4 inputs -> (1, 1024, 160, 160) axis 1 (a group name well past forty-four characters)"
SOFTMAX_F, SOFTMAX_B = "softmax forward (1, 5, 400, 400) dim -1", "softmax backward (1, 5, 400, 400) dim -1"
CONV = "conv_2d forward 1x64x80x80 3x3 s1 p1 g1"
COPY, ADD = "bandwidth copy (256 MB tensors)", "bandwidth add (256 MB tensors)"

RECORDS = [
    Record(SOFTMAX_F, "test_softmax[ours-cpu-psa_1x5x400x400_dim-1-forward]", "ours", "cpu", 200e-6, 6_400_000),
    Record(SOFTMAX_F, "test_softmax[torch-cpu-psa_1x5x400x400_dim-1-forward]", "torch", "cpu", 100e-6, 6_400_000),
    Record(SOFTMAX_B, "test_softmax[ours-cpu-psa_1x5x400x400_dim-1-backward]", "ours", "cpu", 50e-6, 9_600_000),
    Record(SOFTMAX_B, "test_softmax[torch-cpu-psa_1x5x400x400_dim-1-backward]", "torch", "cpu", 100e-6, 9_600_000),
    Record(LONG, "test_concat[ours-gpu-large-forward]", "ours", "gpu", 400e-6, 4_000_000),
    Record(LONG, "test_concat[torch-gpu-large-forward]", "torch", "gpu", 200e-6, 4_000_000),
    # variants of ours without a twin of their own: compared with the group's one PyTorch record
    Record(LONG, "test_concat_variant[ours-gpu-large-forward-one]", "ours", "gpu", 100e-6, 4_000_000),
    Record(LONG, "test_concat_variant[ours-gpu-large-forward-two]", "ours", "gpu", 200e-6, 4_000_000),
    Record(CONV, "test_conv_2d_forward[ours-gpu-c3]", "ours", "gpu", 1e-3, 10**9, flops=2 * 10**9),
    Record(CONV, "test_conv_2d_forward[torch-gpu-c3]", "torch", "gpu", 0.5e-3, 10**9, flops=2 * 10**9),
    Record(CONV, "test_conv_2d_forward[ours-cpu-c3]", "ours", "cpu", 4e-3, 10**9, flops=2 * 10**9),  # no twin
    Record(COPY, "test_large[copy-ours]", "ours", "gpu", 1e-3, 2 * 10**9),  # 2000 GB/s
    Record(COPY, "test_large[copy-torch]", "torch", "gpu", 0.8e-3, 2 * 10**9),  # 2500 GB/s: the device copy
    Record(ADD, "test_large[add-ours]", "ours", "gpu", 1.5e-3, 3 * 10**9),  # 2000 GB/s
    Record(ADD, "test_large[add-torch]", "torch", "gpu", 1.2e-3, 3 * 10**9),
]


def approx_row(*fields):
    return Row(*fields[:4], *(None if v is None else pytest.approx(v) for v in fields[4:]))


def test_variant_drops_impl_and_device_only():
    assert variant_of("test_softmax[ours-cpu-psa_1x5x400x400_dim-1-forward]", "ours", "cpu") == \
        "test_softmax[psa_1x5x400x400_dim-1-forward]"
    assert variant_of("test_large[copy-torch]", "torch", "gpu") == "test_large[copy]"
    assert variant_of("test_plain", "ours", "cpu") == "test_plain"


def test_rows_ratios_and_geomeans():
    ops = {s.op: s for s in summarize(RECORDS)}
    assert list(ops) == ["bandwidth", "concat", "conv_2d", "softmax"]

    assert ops["softmax"].rows == [
        approx_row("softmax", SOFTMAX_B, "test_softmax[psa_1x5x400x400_dim-1-backward]", "cpu",
                   50.0, 100.0, 0.5, 192.0, None, None),
        approx_row("softmax", SOFTMAX_F, "test_softmax[psa_1x5x400x400_dim-1-forward]", "cpu",
                   200.0, 100.0, 2.0, 32.0, None, None),
    ]
    assert (ops["softmax"].geomean, ops["softmax"].count) == (pytest.approx(1.0), 2)

    assert ops["concat"].rows == [
        approx_row("concat", LONG, "test_concat[large-forward]", "gpu", 400.0, 200.0, 2.0, 10.0, None, None),
        approx_row("concat", LONG, "test_concat_variant[large-forward-one]", "gpu",
                   100.0, 200.0, 0.5, 40.0, None, None),
        approx_row("concat", LONG, "test_concat_variant[large-forward-two]", "gpu",
                   200.0, 200.0, 1.0, 20.0, None, None),
    ]
    assert (ops["concat"].geomean, ops["concat"].count) == (pytest.approx(1.0), 3)

    assert ops["conv_2d"].rows == [
        approx_row("conv_2d", CONV, "test_conv_2d_forward[c3]", "cpu", 4000.0, None, None, 250.0, 0.5, None),
        approx_row("conv_2d", CONV, "test_conv_2d_forward[c3]", "gpu", 1000.0, 500.0, 2.0, 1000.0, 2.0, None),
    ]
    assert (ops["conv_2d"].geomean, ops["conv_2d"].count) == (pytest.approx(2.0), 1)

    # % of the faster device copy (2500 GB/s), on the bandwidth rows of that device
    assert ops["bandwidth"].rows == [
        approx_row("bandwidth", ADD, "test_large[add]", "gpu", 1500.0, 1200.0, 1.25, 2000.0, None, 80.0),
        approx_row("bandwidth", COPY, "test_large[copy]", "gpu", 1000.0, 800.0, 1.25, 2000.0, None, 80.0),
    ]
    assert (ops["bandwidth"].geomean, ops["bandwidth"].count) == (pytest.approx(1.25), 2)


def test_text_full_names_and_closing_lines():
    lines = format_text(summarize(RECORDS))
    width = len(LONG)  # the group column is as wide as the longest group
    assert lines[0].split() == ["group", "variant", "device", "ours", "µs", "PyTorch", "µs", "ours/PyTorch",
                                "GB/s", "TFLOP/s", "%", "copy"]
    assert lines[0].startswith("group".ljust(width) + "  variant")
    concat = [line for line in lines if line.startswith(LONG)]
    assert len(concat) == 3
    assert concat[1].split(LONG, 1)[1].split() == ["test_concat_variant[large-forward-one]", "gpu",
                                                   "100.0", "200.0", "0.50", "40.0", "-", "-"]
    assert "bandwidth: geomean ours/PyTorch 1.25 over 2 rows" in lines
    assert "concat: geomean ours/PyTorch 1.00 over 3 rows" in lines
    assert "conv_2d: geomean ours/PyTorch 2.00 over 1 row (1 without a PyTorch twin)" in lines
    assert lines[-1] == "softmax: geomean ours/PyTorch 1.00 over 2 rows"
    # grouped by op: each op's rows, its closing line, a blank line
    assert lines[1].startswith(ADD) and lines[3].startswith("bandwidth: geomean") and lines[4] == ""
    assert len(lines) == 1 + len(RECORDS) - 6 + 4 * 2 - 1


def test_text_without_copy_rows_has_no_copy_column():
    lines = format_text(summarize(RECORDS[:4]))
    assert lines == [
        "group                                     variant                                       device  ours µs"
        "  PyTorch µs  ours/PyTorch   GB/s  TFLOP/s",
        "softmax backward (1, 5, 400, 400) dim -1  test_softmax[psa_1x5x400x400_dim-1-backward]  cpu        50.0"
        "       100.0          0.50  192.0        -",
        "softmax forward (1, 5, 400, 400) dim -1   test_softmax[psa_1x5x400x400_dim-1-forward]   cpu       200.0"
        "       100.0          2.00   32.0        -",
        "softmax: geomean ours/PyTorch 1.00 over 2 rows",
    ]


def test_markdown():
    lines = format_markdown(summarize(RECORDS[:4]))
    assert lines == [
        "### softmax",
        "",
        "| group | variant | device | ours µs | PyTorch µs | ours/PyTorch | GB/s | TFLOP/s |",
        "|---|---|---|---:|---:|---:|---:|---:|",
        f"| {SOFTMAX_B} | test_softmax[psa_1x5x400x400_dim-1-backward] | cpu | 50.0 | 100.0 | 0.50 | 192.0 | - |",
        f"| {SOFTMAX_F} | test_softmax[psa_1x5x400x400_dim-1-forward] | cpu | 200.0 | 100.0 | 2.00 | 32.0 | - |",
        "",
        "softmax: geomean ours/PyTorch 1.00 over 2 rows",
    ]


def test_json_round_trip_and_bench_table(tmp_path, capsys):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(to_json(RECORDS)))
    assert records_from_json(json.loads(path.read_text())) == RECORDS
    # pytest-benchmark's own --benchmark-json layout reads the same
    pb = {"benchmarks": [{"group": r.group, "name": r.name, "stats": {"median": r.median_s},
                          "extra_info": {"impl": r.impl, "device": r.device, "bytes": r.bytes, "flops": r.flops}}
                         for r in RECORDS]}
    assert records_from_benchmarks(pb["benchmarks"]) == RECORDS

    tool = load_tool("bench_table")
    assert tool.main(["bench_table.py", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == format_markdown(summarize(RECORDS))
    assert f"| {ADD} | test_large[add] | gpu | 1500.0 | 1200.0 | 1.25 | 2000.0 | - | 80 |" in out
    assert "concat: geomean ours/PyTorch 1.00 over 3 rows" in out


THREADS = {"ours": 16, "cores": 16, "torch": 16,
           "blas": [{"internal_api": "openblas", "version": "0.3.31", "num_threads": 16}]}


def test_threads_line_says_what_each_side_ran_on():
    assert threads_line(THREADS) == ("CPU threads: ours 16, GEMMs included (NumPy's BLAS: openblas 0.3.31, "
                                     "16 by default); PyTorch 16; 16 cores available")
    assert threads_line({"ours": 2, "cores": 2, "blas": []}) == \
        "CPU threads: ours 2, GEMMs included (NumPy's BLAS: not found); PyTorch ?; 2 cores available"
    assert threads_line({**THREADS, "set": {"runtime.cpu.PIECE_BYTES": 1, "softmax.cpu.PARALLEL_BLOCK_ELEMENTS": 262144}}) == (
        "CPU threads: ours 16, GEMMs included (NumPy's BLAS: openblas 0.3.31, 16 by default); PyTorch 16; "
        "16 cores available; set: runtime.cpu.PIECE_BYTES=1, softmax.cpu.PARALLEL_BLOCK_ELEMENTS=262144")
    assert threads_line({**THREADS, "environment": {"OPENBLAS_THREAD_TIMEOUT": "4"}}) == (
        "CPU threads: ours 16, GEMMs included (NumPy's BLAS: openblas 0.3.31, 16 by default); PyTorch 16; "
        "16 cores available; environment: OPENBLAS_THREAD_TIMEOUT=4")


def test_the_threads_used_name_the_thread_pools_environment(monkeypatch):
    from tests.bench import conftest

    for name in conftest.THREAD_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "4")
    assert conftest.cpu_threads_used()["environment"] == {"OPENBLAS_THREAD_TIMEOUT": "4"}
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT")
    assert "environment" not in conftest.cpu_threads_used()


def test_bench_set_sets_the_kernels_int_constants_and_refuses_anything_else(monkeypatch):
    from kernels import softmax
    from kernels.runtime import cpu
    from tests.bench.conftest import set_constants

    monkeypatch.setattr(cpu, "PIECE_BYTES", cpu.PIECE_BYTES)  # restored after the test
    monkeypatch.setattr(softmax.cpu, "PARALLEL_BLOCK_ELEMENTS", softmax.cpu.PARALLEL_BLOCK_ELEMENTS)
    assert set_constants(" runtime.cpu.PIECE_BYTES=1, softmax.cpu.PARALLEL_BLOCK_ELEMENTS=262144,") == \
        {"runtime.cpu.PIECE_BYTES": 1, "softmax.cpu.PARALLEL_BLOCK_ELEMENTS": 262144}
    assert (cpu.PIECE_BYTES, softmax.cpu.PARALLEL_BLOCK_ELEMENTS) == (1, 262144)
    assert set_constants("") == {}
    for bad in ("runtime.cpu.PIECE_BYTES", "runtime.cpu.PIECE_BYTES=1.5", "runtime.cpu.NO_SUCH=1", "no_such.X=1",
                "runtime.cpu.cpu_parallel=1",
                "PIECE_BYTES=1", "runtime.cpu.PIECE_BYTES=one"):
        with pytest.raises(pytest.UsageError, match=r"^\$KERNELS_BENCH_SET: .* is not MODULE\.NAME=INT"):
            set_constants(bad)
    assert cpu.PIECE_BYTES == 1, "nothing set by a refused item"


def test_bench_table_opens_with_the_threads_line(tmp_path, capsys):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(to_json(RECORDS[:4], THREADS)))
    assert json.loads(path.read_text())["threads"] == THREADS
    tool = load_tool("bench_table")
    assert tool.main(["bench_table.py", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [threads_line(THREADS), "", *format_markdown(summarize(RECORDS[:4]))]


PARTS = [
    Record(SOFTMAX_F, "test_softmax[ours-gpu-psa-forward]", "ours", "gpu", 30e-6, 6_400_000, 0, 12e-6, 9e-6),
    Record(SOFTMAX_F, "test_softmax[torch-gpu-psa-forward]", "torch", "gpu", 20e-6, 6_400_000, 0, 7e-6, 10e-6),
    Record(SOFTMAX_B, "test_softmax[ours-gpu-psa-backward]", "ours", "gpu", 40e-6, 9_600_000, 0, 15e-6, None),
    Record(SOFTMAX_B, "test_softmax[torch-gpu-psa-backward]", "torch", "gpu", 50e-6, 9_600_000),
]


def test_the_parts_of_a_call_show_where_a_run_measured_them():
    (softmax,) = summarize(PARTS)
    backward, forward = softmax.rows
    assert (forward.ours_host_us, forward.torch_host_us, forward.ours_device_us, forward.torch_device_us) == \
        (pytest.approx(12.0), pytest.approx(7.0), pytest.approx(9.0), pytest.approx(10.0))
    assert (backward.ours_host_us, backward.torch_host_us, backward.ours_device_us, backward.torch_device_us) == \
        (pytest.approx(15.0), None, None, None)
    assert format_markdown([softmax])[2:6] == [
        "| group | variant | device | ours µs | PyTorch µs | ours/PyTorch | GB/s | TFLOP/s | ours host µs "
        "| PyTorch host µs | ours GPU µs | PyTorch GPU µs |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {SOFTMAX_B} | test_softmax[psa-backward] | gpu | 40.0 | 50.0 | 0.80 | 240.0 | - | 15.0 | - | - | - |",
        f"| {SOFTMAX_F} | test_softmax[psa-forward] | gpu | 30.0 | 20.0 | 1.50 | 213.3 | - | 12.0 | 7.0 | 9.0 | 10.0 |",
    ]
    assert format_text([softmax])[0].endswith("ours host µs  PyTorch host µs  ours GPU µs  PyTorch GPU µs")
    assert format_text([softmax])[2].split()[-4:] == ["12.0", "7.0", "9.0", "10.0"]
    # the JSON keeps the parts, and pytest-benchmark's extra_info gives them in µs
    assert records_from_json(json.loads(json.dumps(to_json(PARTS)))) == PARTS
    info = {"impl": "ours", "device": "gpu", "bytes": 6_400_000, "flops": 0, "host_us": 12.0, "device_us": 9.0}
    (record,) = records_from_benchmarks([{"group": SOFTMAX_F, "name": PARTS[0].name, "stats": {"median": 30e-6},
                                          "extra_info": info}])
    assert (record.host_s, record.device_s) == (pytest.approx(12e-6), pytest.approx(9e-6))
    # a run without parts has no parts columns
    assert "ours host µs" not in format_markdown(summarize(RECORDS))[2]


class _FakeGpu:
    """torch's events, streams and sleep kernel over a simulated GPU clock, and a host clock that a
    timed call advances: what conftest.Bench.parts sees of a call costing `host` seconds on the host
    and `work` on the GPU (`waits`: the call also waits for the GPU, as one that synchronizes would)."""

    def __init__(self, host, work, waits=False):
        self.host, self.work, self.waits, self.gpu, self.clock, self.sleeps = host, work, waits, 0.0, 0.0, []
        self.slept, self.synced = 0.0, 0
        fake = self

        class Event:
            def __init__(self, enable_timing):
                assert enable_timing

            def record(self, stream):
                self.at = fake.gpu

            def synchronize(self):
                pass

            def elapsed_time(self, other):  # ms, as torch's
                return (other.at - self.at) * 1e3

        class Cuda:
            def __init__(self):
                self.Event, self.streams = Event, []

            def current_stream(self):
                return "torch's stream"

            def ExternalStream(self, pointer, device):  # noqa: N802
                return ("external", pointer, device)

            def stream(self, stream):
                self.streams.append(stream)
                import contextlib
                return contextlib.nullcontext()

            def _sleep(self, cycles):
                fake.sleeps.append(cycles)
                fake.slept = cycles / 2e9  # a 2 GHz clock
                fake.gpu += fake.slept

        self.cuda = Cuda()
        self.device = lambda kind, index: (kind, index)

    def call(self):
        # behind a sleeping kernel the host takes twice as long (as seen on the H100 host); idle, `host`
        self.clock += self.host * (2 if self.slept else 1) + (self.slept if self.waits else 0.0)
        self.gpu += self.work

    def sync(self):
        self.synced += 1


@pytest.mark.parametrize("impl", ["ours", "torch"])
def test_bench_parts_times_the_host_and_the_gpu_apart(monkeypatch, impl):
    from tests.bench import conftest

    def run(host, work, waits=False):
        fake = _FakeGpu(host, work, waits)
        monkeypatch.setitem(__import__("sys").modules, "torch", fake)
        monkeypatch.setattr(conftest.time, "perf_counter", lambda: fake.clock)
        bench = object.__new__(conftest.Bench)
        bench.impl, bench.device = impl, "gpu"
        bench.stream = type("S", (), {"ptr": 0x1234, "device": 1})()
        bench.sync = fake.sync
        return bench.parts(fake.call, calls=5), fake

    (host, device), fake = run(10e-6, 5e-6)
    assert (host, device) == (pytest.approx(10e-6), pytest.approx(5e-6))  # the host time of the idle GPU's calls
    assert fake.synced == 5, "each host-timed call waited for"
    assert fake.sleeps == [conftest.SLEEP_CYCLES] * 5
    assert fake.cuda.streams == (["torch's stream"] if impl == "torch" else [("external", 0x1234, ("cuda", 1))])
    # a call whose host time (6 ms behind the sleep) the sleep does not outlast twice over: it doubles until it does
    (host, device), fake = run(3e-3, 20e-6)
    assert (host, device) == (pytest.approx(3e-3), pytest.approx(20e-6))
    assert fake.sleeps == [conftest.SLEEP_CYCLES * 2**k for k in range(4) for _ in range(5)]
    # a call that waits for the GPU outlasts every sleep: no GPU time
    (host, device), fake = run(10e-6, 5e-6, waits=True)
    assert device is None and host == pytest.approx(10e-6)
    assert fake.sleeps[-1] == 64 * conftest.SLEEP_CYCLES
