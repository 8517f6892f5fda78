"""kernels.functional's plans on the GPU: a forward without ctx on C-contiguous CuPy arrays keeps a plan per
form of its arguments (the dims, dtypes and devices of its arrays, its other arguments with their types) in
the runtime of its stream (the `stream=` given, or the device's default one), and a repeated call of the form
runs on it: the same bits as the full path, no new state, no checks of its arrays, and the same ordering with
CuPy's current stream as the full path (kernels/functional.py, _GpuPlan).

Every test here is marked `gpu` (skipped with the reason where there is no CUDA device or CuPy) and runs on
the held-back current stream of tests/held_stream.py: inputs made with `cupy.asarray` and results read with
`cupy.asnumpy` are on CuPy's current stream, and only the layer's ordering puts them before and after the
calls' work. Each planned call's output is allocated from a pool poisoned with NaN bytes (an unwritten
element shows as NaN, unequal to the full path's bits).
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import kernels
import kernels.functional as F
from conformance.harness import spin
from tests.conftest import require
from tests.test_functional import distinct, dyadic, reseed

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _inputs_of_this_test(request):
    reseed(request.node.name)  # the values drawn below: a function of the test alone


@pytest.fixture
def cupy():
    require("gpu")
    import cupy

    F.clear_cache()
    yield cupy
    F.clear_cache()


class _Envs:
    """Counts the full paths taken (each makes one functional._Env); a planned call makes none."""

    def __init__(self, monkeypatch):
        self.count = 0
        counter = self

        class Counting(F._Env):
            def __init__(self, *args, **kwargs):
                counter.count += 1
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(F, "_Env", Counting)


def _host_arrays():
    """The host values of _calls' arrays."""
    host = {"x4": distinct(2, 3, 4, 4), "w": dyadic(3, 3, 3, 3), "m": dyadic(3), "v": dyadic(3, low=1),
            "a": distinct(2, 3), "b": dyadic(2, 3), "bias": dyadic(3), "empty": np.zeros((0, 3, 4, 4))}
    host.update(a16=host["a"].astype(np.float16), x16=host["x4"].astype(np.float16),
                w16=host["w"].astype(np.float16))
    return host


def _calls(d):
    """name -> call(**keywords) of a planned forward on the arrays `d` (ctx= or stream= go in the keywords).
    Each op with plans, and forms that take other branches of their GPU code (half dtypes, activations,
    an empty batch, training batch_norm)."""
    x4, w, m, v, a, b, bias = d["x4"], d["w"], d["m"], d["v"], d["a"], d["b"], d["bias"]
    return {
        "relu": lambda **k: F.relu(a, **k), "silu": lambda **k: F.silu(a, **k), "gelu": lambda **k: F.gelu(a, **k),
        "pow": lambda **k: F.pow(a, 3, **k), "elu": lambda **k: F.elu(a, 0.5, **k),
        "relu half": lambda **k: F.relu(d["a16"], **k),
        "add": lambda **k: F.add(a, b, **k), "mul number": lambda **k: F.mul(a, 0.5, **k),
        "maximum": lambda **k: F.maximum(a, b, **k), "add half": lambda **k: F.add(d["a16"], d["a16"], **k),
        "softmax": lambda **k: F.softmax(a, 1, **k), "softmax dim 0": lambda **k: F.softmax(x4, 0, **k),
        "conv2d": lambda **k: F.conv2d(x4, w, bias, stride=(1, 2), padding=1, **k),
        "conv2d silu": lambda **k: F.conv2d(x4, w, activation=kernels.Activation.SILU, **k),
        "conv2d half": lambda **k: F.conv2d(d["x16"], d["w16"], padding=1, **k),
        "conv2d empty batch": lambda **k: F.conv2d(d["empty"], w, padding=1, **k),
        "max_pool2d": lambda **k: F.max_pool2d(x4, 2, **k),
        "max_pool2d relu": lambda **k: F.max_pool2d(x4, 3, stride=1, padding=1, activation="RELU", **k),
        "avg_pool2d": lambda **k: F.avg_pool2d(x4, (2, 2), padding=1, **k),
        "batch_norm eval": lambda **k: F.batch_norm(x4, m, v, m, v, **k),
        "batch_norm": lambda **k: F.batch_norm(x4, m, v, **k),
        "batch_norm training": lambda **k: F.batch_norm(x4, None, None, training=True, **k),
        "cat": lambda **k: F.cat([a, b], 1, **k), "split": lambda **k: F.split(a, [1, 2], dim=1, **k),
        "reshape": lambda **k: F.reshape(a, (-1,), **k), "permute": lambda **k: F.permute(x4, (0, 2, 3, 1), **k),
        "transpose": lambda **k: F.transpose(x4, 1, -1, **k), "matmul": lambda **k: F.matmul(x4, x4, **k),
        "interpolate": lambda **k: F.interpolate(x4, scale_factor=2, **k),
        "upsample bilinear": lambda **k: F.upsample(x4, scale_factor=2, mode="bilinear", **k),
        "gradient_reduction": lambda **k: F.gradient_reduction([a, b], **k),
        "topk": lambda **k: F.topk(x4, 2, **k),
    }


NAMES = list(_calls(dict.fromkeys(_host_arrays())))


class _Caller:
    """Where a test's arrays are made and read: CuPy's current stream (calls without stream= run on it), or the
    stream given to the calls (made and read on it, as a caller of stream= orders them)."""

    def __init__(self, cupy, given):
        self.cupy, self.stream = cupy, (kernels.gpu_stream(0) if given else None)
        self.keywords = {} if self.stream is None else {"stream": self.stream}

    def arrays(self):
        return {name: self.put(value) for name, value in _host_arrays().items()}

    def put(self, value):
        if self.stream is None:
            return self.cupy.asarray(value)
        with self.stream:
            return self.cupy.asarray(value)

    def host(self, result):
        """The result's arrays on the host, each as (dtype, dims, bytes)."""
        results = result if isinstance(result, (list, tuple)) else [result]
        if self.stream is None:
            hosts = [self.cupy.asnumpy(r) for r in results]
        else:
            with self.stream:
                hosts = [self.cupy.asnumpy(r, stream=self.stream.cupy_stream) for r in results]
        return [(h.dtype, h.shape, h.tobytes()) for h in hosts]

    def poison(self, result):
        """Free blocks of each output's size, filled with 0xFF bytes (NaN in every float dtype), on the pool of
        the stream the calls allocate on: the next outputs of those sizes are likely to be made in them."""
        stream = self.stream if self.stream is not None else F.default_stream(0)
        with stream:
            blocks = [self.cupy.full(max(r.nbytes, 1), 255, dtype=self.cupy.uint8)
                      for r in (result if isinstance(result, (list, tuple)) else [result]) for _ in range(2)]
        del blocks

    def plans(self):
        return F._gpu_runtime(self.stream if self.stream is not None else F.default_stream(0)).plans


@pytest.mark.parametrize("given", [False, True], ids=["default_stream", "stream_given"])
@pytest.mark.parametrize("name", NAMES)
def test_gpu_plans_give_the_full_paths_bits(cupy, monkeypatch, name, given):
    """The second and third call of a form run on its plan (no _Env, no new state) into poisoned outputs, with
    the bits of the first call (the full path) and of the same call given a ctx."""
    caller = _Caller(cupy, given)
    call = _calls(caller.arrays())[name]
    with F.Context() as ctx:
        expected = caller.host(call(ctx=ctx, **caller.keywords))
    first = call(**caller.keywords)
    assert caller.host(first) == expected
    assert len(caller.plans()) == 1
    made = F.cache_info()
    envs = _Envs(monkeypatch)
    for _ in range(2):
        caller.poison(first)
        again = call(**caller.keywords)
        assert type(again) is type(first)
        assert caller.host(again) == expected
    assert envs.count == 0  # both ran on the plan
    assert F.cache_info() == made
    assert len(caller.plans()) == 1


def test_planned_training_batch_norm_updates_the_running_statistics_as_the_full_path(cupy):
    x, m, v = distinct(4, 3, 2, 2), dyadic(3), dyadic(3, low=1)
    results = []
    for planned in (False, True):
        F.clear_cache()
        mean, var, device_x = cupy.asarray(m), cupy.asarray(v), cupy.asarray(x)
        outputs = []
        for _ in range(3):  # planned: the full path, then the plan twice; else the full path every time
            if not planned:
                F.clear_cache()
            outputs.append(cupy.asnumpy(F.batch_norm(device_x, mean, var, training=True, momentum=0.25)).tobytes())
        assert len(F._gpu_runtime(F.default_stream(0)).plans) == 1
        results.append(outputs + [cupy.asnumpy(mean).tobytes(), cupy.asnumpy(var).tobytes()])
    assert results[0] == results[1]


def test_each_form_has_its_own_gpu_plan(cupy, monkeypatch):
    """Other dims, dtype, argument value or type, stream or device: another plan (a full path first); a strided
    CuPy array takes the full path every call; the CPU's plans stay apart."""
    a = distinct(2, 3)
    device_a = cupy.asarray(a)
    plans = F._gpu_runtime(F.default_stream(0)).plans
    envs = _Envs(monkeypatch)
    forms = [
        lambda: F.relu(device_a), lambda: F.relu(cupy.asarray(distinct(3, 2))),
        lambda: F.relu(device_a.astype(cupy.float32)), lambda: F.pow(device_a, 2), lambda: F.pow(device_a, 3),
        lambda: F.pow(device_a, 2.0),
    ]
    for count, form in enumerate(forms, 1):
        for _ in range(2):
            form()
        assert envs.count == count and len(plans) == count
    stream = kernels.gpu_stream(0)
    with stream:
        on_stream = cupy.asarray(a)
    for _ in range(2):
        F.relu(on_stream, stream=stream)
    assert envs.count == len(forms) + 1 and len(plans) == len(forms)
    assert len(F._gpu_runtime(stream).plans) == 1
    strided = cupy.asarray(distinct(2, 6))[:, ::2]
    for _ in range(2):
        assert np.array_equal(cupy.asnumpy(F.relu(strided)), np.maximum(cupy.asnumpy(strided), 0))
    assert envs.count == len(forms) + 3 and len(plans) == len(forms)
    F.relu(a)
    assert len(F._PLANS) == 1 and len(plans) == len(forms)
    if cupy.cuda.runtime.getDeviceCount() > 1:
        with cupy.cuda.Device(1):
            other = cupy.asarray(a)
        for _ in range(2):
            assert np.array_equal(cupy.asnumpy(F.relu(other)), np.maximum(a, 0))
        assert envs.count == len(forms) + 5 and len(plans) == len(forms)  # the CPU call's full path counted too
        assert len(F._gpu_runtime(F.default_stream(1)).plans) == 1


@pytest.mark.parametrize("given", [False, True], ids=["default_stream", "stream_given"])
@pytest.mark.parametrize("name", NAMES)
def test_planned_calls_are_ordered_as_the_full_path(cupy, monkeypatch, name, given):
    """Without stream=: CuPy's current stream is the caller's own (not the held one), and the calls run on it;
    the inputs are set on it behind a spin, just before a planned call, whose own kernels run behind a spin
    (before_gpu_call), and its result is read with cupy.asnumpy on the caller's stream: no synchronization
    but the last. stream= given: the same, all on that stream, as its caller orders it."""
    caller_stream = kernels.gpu_stream(0) if given else None
    current = cupy.cuda.Stream(non_blocking=True)

    class Current:  # what conformance.harness.spin takes
        device, cupy_stream = 0, (current if caller_stream is None else caller_stream.cupy_stream)

    keywords = {} if caller_stream is None else {"stream": caller_stream}
    with cupy.cuda.Device(0), Current.cupy_stream:  # CuPy's current stream: the caller's
        host = _host_arrays()
        arrays = {key: cupy.asarray(value) for key, value in host.items()}
        call = _calls(arrays)[name]
        with F.Context() as ctx:
            expected = call(ctx=ctx, **keywords)
            expected = [cupy.asnumpy(e) for e in (expected if isinstance(expected, (list, tuple)) else [expected])]
        call(**keywords)  # the plan made
        for key in ("x4", "a", "x16", "a16"):  # what the call reads, written late
            arrays[key].fill(np.nan)
        spin(Current())
        for key in ("x4", "a", "x16", "a16"):
            arrays[key].set(host[key])
        envs = _Envs(monkeypatch)
        with kernels.runtime.core.before_gpu_call(spin):
            got = call(**keywords)
        got = [cupy.asnumpy(g) for g in (got if isinstance(got, (list, tuple)) else [got])]
    Current.cupy_stream.synchronize()
    assert envs.count == 0
    assert [g.tobytes() for g in got] == [e.tobytes() for e in expected]


def test_clear_cache_and_cache_info_count_the_gpu_plans(cupy, monkeypatch):
    """Planned calls make no state; clear_cache drops the GPU plans with their runtimes (the next call takes
    the full path and makes a state again); past _PLAN_LIMIT a runtime's plans are dropped together."""
    x = cupy.asarray(distinct(2, 3))
    envs = _Envs(monkeypatch)
    for _ in range(3):
        F.relu(x)
    assert envs.count == 1 and F.cache_info() == {"element_unary": 1}
    F.clear_cache()
    assert F.cache_info() == {} and not F._GPU_RUNTIMES
    for _ in range(2):
        F.relu(x)
    assert envs.count == 2 and F.cache_info() == {"element_unary": 1}
    F.clear_cache()
    monkeypatch.setattr(F, "_PLAN_LIMIT", 2)
    for n in (2, 3, 4):
        values = distinct(n, 5)
        device_values = cupy.asarray(values)
        for _ in range(2):  # the full path, then the plan
            assert np.array_equal(cupy.asnumpy(F.relu(device_values)), np.maximum(values, 0))
    plans = F._gpu_runtime(F.default_stream(0)).plans
    assert [form[1] for form in plans] == [(4, 5)]


def test_a_dropped_streams_plans_go_with_it(cupy):
    """A plan keeps no reference to its stream (its runtime is the stream's, kept while the stream lives): a
    stream the caller drops is collected, and its runtime closed with its plans and states."""
    stream = kernels.gpu_stream(0)
    with stream:
        x = cupy.asarray(distinct(2, 3))
    for _ in range(2):
        F.relu(x, stream=stream)
    stream.synchronize()
    runtime = F._gpu_runtime(stream)
    assert len(runtime.plans) == 1
    dropped = weakref.ref(stream)
    del stream
    gc.collect()
    assert dropped() is None
    assert runtime.closed and not runtime.plans and runtime.free == {}


def test_a_dropped_cupy_streams_kernels_stream_goes_with_it(cupy):
    """Calls without stream= run on CuPy's current stream, through a kernels stream made for it (F.default_stream)
    that refers to it weakly: a CuPy stream the caller drops is collected, and with it that kernels stream, its
    runtime closed with its plans and states."""
    caller = cupy.cuda.Stream(non_blocking=True)
    with caller:
        x = cupy.asarray(distinct(2, 3))
        for _ in range(2):
            F.relu(x)
        stream = F.default_stream(0)
    caller.synchronize()
    runtime = F._gpu_runtime(stream)
    assert stream.cupy_stream is caller and len(runtime.plans) == 1
    dropped, dropped_stream = weakref.ref(caller), weakref.ref(stream)
    del caller, stream
    gc.collect()
    assert dropped() is None and dropped_stream() is None
    assert runtime.closed and not runtime.plans and runtime.free == {}
