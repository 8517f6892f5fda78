"""Red zones (conformance/red_zones.py, docs/conformance.md): deliberately
broken kernels that read or write one element past a tensor fail their case with a report that
says where, and the runs really place tensors at aligned and misaligned addresses."""

import contextlib
import re

import numpy as np
import pytest

from conformance import red_zones
from conformance.cases import CASE_MODULES
from conformance.harness import GUARD_OF, LAYOUTS, POISONS, Env, runs
from conformance.runner import run_case
from kernels import transpose

from .conftest import DEVICE_PARAMS, require


def _case(name):
    return next(c for c in CASE_MODULES["transpose"].TABLE if c.name == name)


def _widened(array, before=0, after=0):
    """A 1-D view of the memory of `array` and of `before` elements before it and `after` past it,
    through the allocation it is a view of (its base buffer)."""
    buffer = array
    while buffer.base is not None:
        buffer = buffer.base
    assert buffer.ndim == 1 and buffer.dtype == array.dtype, "red-zone views share their buffer's dtype"
    start = (array.ctypes.data - buffer.ctypes.data) // array.itemsize
    return buffer[start - before:start + array.size + after]


def _run(case_name, store, monkeypatch, forward=None, backward=None):
    """Run a transpose case on the CPU with its forward and/or backward replaced."""
    if forward is not None:
        monkeypatch.setattr(transpose, "cpu_forward_kernel", forward)
    if backward is not None:
        monkeypatch.setattr(transpose, "cpu_backward_kernel", backward)
    case = _case(case_name)
    return run_case(case, store.get(case), "cpu")


ORIGINAL_FORWARD, ORIGINAL_BACKWARD = transpose.cpu_forward_kernel, transpose.cpu_backward_kernel


def test_a_write_one_element_past_the_end_fails_with_a_canary_report(store, monkeypatch):
    def forward(stream, handle, state, attrs, input, output):
        ORIGINAL_FORWARD(stream, handle, state, attrs, input, output)
        _widened(output, after=1)[-1] = 0  # one float32 past the end: 4 canary bytes

    result = _run("2d_3x5", store, monkeypatch, forward=forward)
    assert result.status == "failed"
    assert result.message.startswith("transpose / 2d_3x5 / cpu:")
    assert ("output (poison random): 4 bytes of the canary after the tensor changed, "
            "first at byte offsets +0, +1, +2, +3 past its end") in result.message
    for layout in LAYOUTS[1:]:
        assert f"layout {layout}): 4 bytes of the canary after" in result.message
    assert "before the tensor" not in result.message


def test_a_write_one_element_before_the_start_fails_with_a_canary_report(store, monkeypatch):
    def backward(stream, handle, state, attrs, output, output_grad, input, input_grad):
        ORIGINAL_BACKWARD(stream, handle, state, attrs, output, output_grad, input, input_grad)
        _widened(input_grad, before=1)[0] = 1  # float64: 8 bytes right before the first element

    result = _run("3d_cycle_120_f64", store, monkeypatch, backward=backward)
    assert result.status == "failed"
    assert ("input_grad (poison nan): 8 bytes of the canary before the tensor changed, "
            "nearest at byte offsets -1, -2, -3, -4, -5 from its start") in result.message
    assert "output (" not in result.message  # the forward was left alone


@pytest.mark.parametrize("case_name, guards", [("2d_3x5", ("-?inf", "nan")),
                                                ("4d_1032_int32", ("(2147483647|-2147483648)", "2147483647"))])
def test_a_read_one_element_past_the_end_shows_the_guard_in_the_output(store, monkeypatch, case_name, guards):
    def forward(stream, handle, state, attrs, input, output):
        ORIGINAL_FORWARD(stream, handle, state, attrs, input, output)
        output.reshape(-1)[-1] = _widened(input, after=1)[-1]  # the last element read from past the end

    result = _run(case_name, store, monkeypatch, forward=forward)
    assert result.status == "failed"
    for poison, guard in zip(POISONS, guards):  # random: an infinity (an extreme), nan: NaN (the maximum)
        report = re.search(rf"output \(poison {poison}\): 1 of .*?(?=\n\S)", result.message + "\nEND", re.S)
        assert report and re.search(rf"got (np\.\w+\()?{guard}\b", report.group()), result.message
    assert "canary" not in result.message and "read-only margin" not in result.message


def test_a_write_into_a_read_only_margin_fails(store, monkeypatch):
    def backward(stream, handle, state, attrs, output, output_grad, input, input_grad):
        ORIGINAL_BACKWARD(stream, handle, state, attrs, output, output_grad, input, input_grad)
        # The second element past the end (bytes +4 .. +7): 1/3 (0x3eaaaaab) differs from NaN
        # (0x7fc00000) in every byte.
        _widened(output_grad, after=2)[-1] = 1 / 3

    result = _run("2d_3x5", store, monkeypatch, backward=backward)
    assert result.status == "failed"
    assert ("output_grad (poison random): 4 bytes of the read-only margin after the tensor changed, "
            "first at byte offsets +4, +5, +6, +7 past its end") in result.message


def test_margins_are_a_pack_and_a_row_wide_on_each_side_and_hold_their_patterns(store):
    case = _case("tile_edges_2x33x37")
    for layout in LAYOUTS:
        env = Env(case, store.get(case), "cpu", "random", layout=layout)
        env.read("input"), env.write("output")
        for (role, name), zone in env.zones.items():
            raw = zone.buffer.view(np.uint8)
            width = zone.buffer.itemsize
            least = red_zones.PACK_BYTES + zone.shape[-1] * width
            end = (zone.start + zone.count) * width
            assert zone.start * width >= least and raw.size - end >= least, (layout, name)
            if role == "written":
                assert (raw[:zone.start * width] == red_zones.CANARY).all() and (raw[end:] == red_zones.CANARY).all()
            else:  # poison random: +-inf margins (the nan poison's NaN ones: below)
                assert np.isinf(zone.buffer[:zone.start]).all() and np.isinf(zone.buffer[zone.start + zone.count:]).all()
            view = zone.view
            assert view.flags.c_contiguous and view.base is not None
            offset = view.ctypes.data % red_zones.ALIGNMENT
            assert offset in ((0,) if layout == "aligned" else (0, width)), (layout, name, offset)
        env.close()


def test_zero_size_tensors_are_contiguous_views_too(store):
    case = _case("zero_size")
    for layout in LAYOUTS:
        env = Env(case, store.get(case), "cpu", "nan", layout=layout)
        for view in (env.read("input"), env.write("output")):
            assert view.size == 0 and view.flags.c_contiguous
        env.close()


def _address(array):
    return array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_the_runs_reach_aligned_misaligned_and_mixed_addresses(store, monkeypatch, device):
    """Every tensor's address mod 16, per kernel call, across one case's runs: both 16-byte
    boundaries (the pack paths) and 4 bytes past one (float32: the element-wise paths) occur,
    for all tensors at once and for one tensor misaligned among aligned ones."""
    require(device)
    kernel = f"{device}_forward_kernel"
    original = getattr(transpose, kernel)
    seen = []

    def forward(stream, handle, state, attrs, input, output):
        assert input.flags.c_contiguous and output.flags.c_contiguous
        seen.append((_address(input) % 16, _address(output) % 16))
        return original(stream, handle, state, attrs, input, output)

    monkeypatch.setattr(transpose, kernel, forward)
    case = _case("yolov10_psa_last_two")
    result = run_case(case, store.get(case), device)
    assert result.status == "passed", result.message
    assert len(seen) == len(runs(device))
    assert {(0, 0), (4, 4), (4, 0), (0, 4)} <= set(seen), seen


def test_every_layout_runs_with_every_poison_on_every_device():
    for device in ("cpu", "gpu"):
        done = {(layout, poison) for _, layout, poison in runs(device)}
        assert done == {(layout, poison) for layout in LAYOUTS for poison in POISONS}, device


def test_guard_values_poison_every_float_dtype_half_ones_included():
    """A read-only tensor's margins hold NaN, or +-inf, for every float dtype (bfloat16's kind is "V",
    not "f"), the dtype's maximum (or the maximum and the minimum) for integers."""
    from kernels.runtime.core import BFLOAT16

    for dtype in (np.float16, BFLOAT16, np.float32, np.float64):
        filled = np.full(3, red_zones.guard_value(np.dtype(dtype)), dtype=dtype)
        assert np.isnan(filled.astype(np.float64)).all(), dtype
        extremes = np.array(red_zones.guard_extremes(np.dtype(dtype)), dtype=dtype).astype(np.float64)
        assert extremes.tolist() == [np.inf, -np.inf], dtype
    assert red_zones.guard_value(np.dtype(np.int16)) == 32767
    assert red_zones.guard_value(np.dtype(np.bool_)) is True


# --------------------------------------------------------------------------- the guards of read margins


def _margins(zone):
    """The values of a read zone's margins: (before the tensor, after it), as placed."""
    return zone.buffer[:zone.start], zone.buffer[zone.start + zone.count:]


def test_each_poison_has_its_guard_nan_with_nan_and_alternating_infinities_with_random(store):
    assert red_zones.GUARDS == ("nan", "inf")
    assert {poison: GUARD_OF[poison] for poison in POISONS} == {"random": "inf", "nan": "nan"}
    case = _case("2d_3x5")
    for layout in LAYOUTS:
        for poison in POISONS:
            env = Env(case, store.get(case), "cpu", poison, layout=layout)
            env.read("input")
            before, after = _margins(env.zones[("read", "input")])
            if poison == "nan":
                assert np.isnan(before).all() and np.isnan(after).all(), layout
            else:  # +inf and -inf in turn, element by element
                for margin in (before, after):
                    assert np.isinf(margin).all(), layout
                    assert (np.diff(np.signbit(margin).astype(int)) != 0).all(), layout
            env.close()


def test_the_element_past_either_end_is_plus_inf_in_one_layout_and_minus_inf_in_the_other():
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    signs = {}
    for shift in (0, 1):
        zone, _ = red_zones.place(values, "read", shift, np.empty, lambda a: a.ctypes.data, guard="inf")
        signs[shift] = (zone.buffer[zone.start - 1], zone.buffer[zone.start + zone.count])
    assert {signs[0][0], signs[1][0]} == {np.inf, -np.inf}
    assert {signs[0][1], signs[1][1]} == {np.inf, -np.inf}


def test_integer_guards_alternate_the_maximum_and_the_minimum_bools_stay_true():
    for dtype, high, low in ((np.int16, 32767, -32768), (np.uint8, 255, 0), (np.int64, 2**63 - 1, -2**63)):
        zone, _ = red_zones.place(np.zeros(4, dtype), "read", 0, np.empty, lambda a: a.ctypes.data, guard="inf")
        before, after = _margins(zone)
        assert set(before.tolist()) == set(after.tolist()) == {high, low}, dtype
        zone, _ = red_zones.place(np.zeros(4, dtype), "read", 0, np.empty, lambda a: a.ctypes.data, guard="nan")
        assert set(np.concatenate(_margins(zone)).tolist()) == {high}, dtype
    zone, _ = red_zones.place(np.zeros(4, bool), "read", 0, np.empty, lambda a: a.ctypes.data, guard="inf")
    assert np.concatenate(_margins(zone)).all()
    zone, _ = red_zones.place(np.zeros(4, np.complex64), "read", 1, np.empty, lambda a: a.ctypes.data, guard="inf")
    assert np.isinf(np.concatenate(_margins(zone))).all()
    with pytest.raises(ValueError, match="guard"):
        red_zones.place(np.zeros(4, np.float32), "read", 0, np.empty, lambda a: a.ctypes.data, guard="zero")


def test_a_read_past_the_end_that_feeds_a_max_is_caught(store, monkeypatch):
    """A max drops NaN (fmax, or a comparison that keeps the first operand): a NaN margin alone
    would let an out-of-bounds read into a max pass; +inf shows in the output."""
    def forward(stream, handle, state, attrs, input, output):
        ORIGINAL_FORWARD(stream, handle, state, attrs, input, output)
        flat = output.reshape(-1)
        flat[-1] = np.fmax(flat[-1], _widened(input, after=1)[-1])  # one element past the end into a max

    result = _run("2d_3x5", store, monkeypatch, forward=forward)
    assert result.status == "failed"
    assert re.search(r"output \(poison random(, layout \w+)?\): 1 of .*got (np\.\w+\()?inf\b", result.message,
                     re.S), result.message
    assert "poison nan" not in result.message  # NaN margins: fmax drops them, the bug hides there


def _padded_trusting_earlier_zeros(input, attrs):
    """conv_2d.cpu._padded without zeroing the borders: it trusts the zeros an earlier call left in the
    kept buffer (a broken kernel)."""
    from kernels.conv_2d import cpu as conv_cpu

    n, c, h, w = input.shape
    top, left = attrs.padding_h, attrs.padding_w
    padded = conv_cpu._buffer("padded", (n, c, h + 2 * top, w + 2 * left), input.dtype)
    padded[:, :, top:top + h, left:left + w] = input
    return padded


@pytest.mark.parametrize("poisoned", [True, False], ids=["scratch_poisoned", "scratch_as_left"])
def test_a_kernel_that_reads_kept_scratch_it_did_not_write_fails(store, monkeypatch, poisoned):
    """The runs fill the scratch the CPU kernels keep across calls with their poison (Env.scratch_poisoned):
    a padded im2col whose borders are the last call's zeros fails, where with the scratch left as it was
    it passes (this thread's buffer zeroed first, as a clean earlier call would leave it)."""
    from kernels.conv_2d import cpu as conv_cpu

    case = next(c for c in CASE_MODULES["conv_2d"].TABLE if c.name == "wide_rows_pad_0x2_stride_1x2_dilation_1x2")
    conv_cpu._buffer("padded", (1 << 20,), np.uint8)[...] = 0
    monkeypatch.setattr(conv_cpu, "_padded", _padded_trusting_earlier_zeros)
    if not poisoned:
        monkeypatch.setattr(Env, "scratch_poisoned", lambda self: contextlib.nullcontext())
    result = run_case(case, store.get(case), "cpu")
    assert result.status == ("failed" if poisoned else "passed"), result.message
