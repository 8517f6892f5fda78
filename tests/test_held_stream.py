"""The held-back current stream of the GPU tests (tests/held_stream.py): which tests get it, its length,
and, on the GPU, that it turns an upload not ordered with the kernels' stream into a failure every time."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import kernels
from kernels import ElementUnaryAttrs, TensorShape, UnaryOpType, element_unary

from .conftest import require
from .held_stream import DEFAULT_HOLD_MS, hold_ns, wants_hold

# --------------------------------------------------------------------------- without a device


class Node:
    """Stands in for a pytest item: the markers it carries."""

    def __init__(self, *markers):
        self.markers = markers

    def get_closest_marker(self, name):
        return name if name in self.markers else None


def test_only_gpu_tests_that_do_not_opt_out_are_held():
    assert wants_hold(Node("gpu"), 5_000_000)
    assert wants_hold(Node("gpu", "large"), 1)
    assert not wants_hold(Node(), 5_000_000)
    assert not wants_hold(Node("large"), 5_000_000)
    assert not wants_hold(Node("gpu", "default_stream"), 5_000_000)
    assert not wants_hold(Node("gpu"), 0)  # KERNELS_GPU_TEST_HOLD_MS=0 turns it off
    assert wants_hold(Node("gpu"), 5_000_000, ["dev", "store"])
    assert not wants_hold(Node("gpu"), 5_000_000, ["bench", "benchmark"])  # timed as a user calls


def test_the_hold_length_comes_from_the_environment():
    assert hold_ns({}) == DEFAULT_HOLD_MS * 1_000_000 == 5_000_000
    assert hold_ns({"KERNELS_GPU_TEST_HOLD_MS": " "}) == 5_000_000
    assert hold_ns({"KERNELS_GPU_TEST_HOLD_MS": "20"}) == 20_000_000
    assert hold_ns({"KERNELS_GPU_TEST_HOLD_MS": "0.5"}) == 500_000
    assert hold_ns({"KERNELS_GPU_TEST_HOLD_MS": "0"}) == 0
    for text in ("x", "-1", "nan"):
        with pytest.raises(ValueError, match=r"KERNELS_GPU_TEST_HOLD_MS: expected a number of milliseconds"):
            hold_ns({"KERNELS_GPU_TEST_HOLD_MS": text})


def test_a_test_not_marked_gpu_runs_unheld(held_current_stream):
    assert held_current_stream is None


# --------------------------------------------------------------------------- on the device


@pytest.mark.gpu
def test_gpu_tests_run_on_a_held_back_current_stream(held_current_stream):
    """CuPy's current stream is the held one, neither the legacy default stream nor the kernels' stream,
    and it is busy (a spin runs on it) right after the hold is renewed."""
    require("gpu")
    import cupy

    current = cupy.cuda.get_current_stream()
    assert held_current_stream is not None and current == held_current_stream.stream(0)
    assert current.ptr not in (0, cupy.cuda.Stream.null.ptr, cupy.cuda.Stream.ptds.ptr)
    held_current_stream.devices[0].held_until = 0.0  # as if the last spin were over: renew queues another
    held_current_stream.renew()
    assert not current.done
    held_current_stream.synchronize()
    assert current.done


def _identity(values):
    """An IDENTITY element_unary state on GPU 0, its stream and handle, and a NaN output of values' shape
    (made on the kernels' stream); one call made already, so a later call only launches."""
    import cupy

    stream, handle = kernels.gpu_stream(0), kernels.gpu_handle(0)
    attrs = ElementUnaryAttrs(UnaryOpType.IDENTITY)
    shape = TensorShape(values.shape, values.dtype)
    state = element_unary.init_kernel(handle, attrs, shape, shape)
    with stream:
        output = cupy.zeros(values.shape, values.dtype)
        element_unary.forward_kernel(stream, handle, state, attrs, output, output)
        output.fill(np.nan)
    stream.synchronize()
    return stream, handle, attrs, state, output


@pytest.mark.gpu
def test_an_upload_on_the_current_stream_is_read_before_it_lands(held_current_stream):
    """The pattern this hold exists for (conformance/tf32.py had it): cupy.asarray uploads on CuPy's
    current stream, a kernel reads the array on the kernels' stream, and nothing orders the two. The
    kernel reads the array before the upload lands, on every run; once the held stream is synchronized
    the upload is there, and the same call gives the values."""
    require("gpu")
    import cupy

    values = (np.random.default_rng(25).standard_normal(4099) + 1000).astype(np.float32)  # never 0, never NaN
    stream, handle, attrs, state, output = _identity(values)
    gc.disable()  # nothing between the upload and the launch but the two calls
    try:
        x = cupy.asarray(values)  # on the held current stream
        element_unary.forward_kernel(stream, handle, state, attrs, x, output)
    finally:
        gc.enable()
    stream.synchronize()
    early = cupy.asnumpy(output, stream=stream.cupy_stream)
    assert not np.array_equal(early, values), "the kernel read the upload complete: the current stream was not held"
    held_current_stream.synchronize()
    element_unary.forward_kernel(stream, handle, state, attrs, x, output)
    stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(output, stream=stream.cupy_stream), values)
    element_unary.cleanup_kernel(handle, state)
    handle.close()


@pytest.mark.gpu
def test_an_upload_on_the_kernels_stream_is_read_complete(held_current_stream):
    """The same call with the upload made on the kernels' stream (`with stream:`): ordered, so right at once."""
    require("gpu")
    import cupy

    values = (np.random.default_rng(26).standard_normal(4099) + 1000).astype(np.float32)
    stream, handle, attrs, state, output = _identity(values)
    with stream:
        x = cupy.asarray(values)
    element_unary.forward_kernel(stream, handle, state, attrs, x, output)
    stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(output, stream=stream.cupy_stream), values)
    element_unary.cleanup_kernel(handle, state)
    handle.close()


@pytest.mark.gpu
@pytest.mark.default_stream
def test_a_test_marked_default_stream_runs_on_cupys_own_current_stream(held_current_stream):
    require("gpu")
    import cupy

    assert held_current_stream is None
    assert cupy.cuda.get_current_stream() in (cupy.cuda.Stream.null, cupy.cuda.Stream.ptds)
