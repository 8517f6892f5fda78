"""Shared fixtures: the golden store, and devices as parameters (GPU ones marked
`gpu` and skipped with the reason where there is no CUDA device or no CuPy). Every test marked
`gpu` runs with CuPy's current stream held back by a spin (tests/held_stream.py), so that work a
test leaves unordered with the kernels' stream fails every time."""

import numpy as np
import pytest

import kernels
from conformance.golden import GoldenFileError, GoldenStore
from conformance.harness import device_unavailable
from kernels.runtime.core import BFLOAT16

from .held_stream import held_current_stream  # noqa: F401 (autouse: every GPU test on a held-back current stream)

DEVICE_PARAMS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("gpu", id="gpu", marks=pytest.mark.gpu),
]


def load_store(path=None):
    """The golden store; a damaged file fails the test that asked for it with the file and dataset named
    (a plain message: the trace into h5py would say nothing more)."""
    try:
        return GoldenStore(path)
    except GoldenFileError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="session")
def store():
    return load_store()


def pytest_addoption(parser):
    parser.addoption("--backend", default=None, metavar="BACKEND",
                     help="the kernel library tests/test_conformance.py judges: kernels, torch, torch-strict, c:PATH "
                          "or module:attr (default: $KERNELS_BACKEND, else kernels; docs/backends.md)")


@pytest.fixture(scope="session")
def backend(request):
    """The backend the conformance cases run through (--backend, else KERNELS_BACKEND, else kernels)."""
    import os

    from conformance.backends import load

    name = request.config.getoption("--backend") or os.environ.get("KERNELS_BACKEND") or "kernels"
    try:
        return load(name)
    except Exception as error:
        pytest.fail(f"--backend {name}: {error}", pytrace=False)


def unit_roundoffs(dtype):
    """(u, v) of a GEMM or convolution in `dtype`: the unit roundoff of its compute type (float64's own,
    float32 for every other dtype, the half ones included) and that of its stored result where the
    result is rounded once more (a half dtype's; 0 otherwise)."""
    dtype = np.dtype(dtype)
    u = 2.0**-53 if dtype == np.float64 else 2.0**-24
    v = {np.dtype(np.float16): 2.0**-11, BFLOAT16: 2.0**-8}.get(dtype, 0.0)
    return u, v


def require(device):
    reason = device_unavailable(device)
    if reason is not None:
        pytest.skip(f"{device}: {reason}")


@pytest.fixture(params=DEVICE_PARAMS)
def device(request):
    """'cpu' or 'gpu' (skipped with the reason where the GPU is unavailable)."""
    require(request.param)
    return request.param


def run_main(capsys, main, argv, **kwargs):
    """A command's main(argv, **kwargs) -> (exit status, stdout, stderr); argparse's exits give their status too."""
    try:
        status = main(list(argv), **kwargs)
    except SystemExit as exit:
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


class Dev:
    """A device's stream, handle and array module, for tests that call kernels directly."""

    def __init__(self, device):
        self.name = device
        if device == "cpu":
            self.stream, self.handle, self.xp = kernels.cpu_stream(), kernels.cpu_handle(), np
        else:
            import cupy

            self.stream, self.handle, self.xp = kernels.gpu_stream(0), kernels.gpu_handle(0), cupy

    def array(self, value, dtype=None):
        """A device copy, made on the test's stream (see conformance.harness.Env._place for why)."""
        if self.xp is np:
            return np.array(value, dtype=dtype)
        with self.stream:
            return self.xp.asarray(np.asarray(value, dtype=dtype))

    def assign(self, target, value):
        """target[...] = value (a host array), enqueued on the test's stream: a copy on CuPy's current stream
        instead may land after a kernel on the test's stream has read the target (it did on the H200)."""
        if self.xp is np:
            target[...] = value
            return
        with self.stream:
            target[...] = self.xp.asarray(np.asarray(value))

    def host(self, array):
        if self.xp is np:
            return np.asarray(array)
        with self.stream:
            return self.xp.asnumpy(array, stream=self.stream.cupy_stream)


@pytest.fixture
def dev(device):
    d = Dev(device)
    yield d
    d.handle.close()


def pytest_collection_modifyitems(config, items):
    """Expensive large differential cases (marked `large`) run only when asked for: `-m large` (or a
    marker expression naming it) or KERNELS_LARGE_CASES=1; otherwise they are skipped with that reason."""
    import os

    if os.environ.get("KERNELS_LARGE_CASES") == "1" or "large" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="expensive large case: run with -m large or KERNELS_LARGE_CASES=1")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def cpu():
    """The CPU as tests/properties.py's Device (the property and large-case tests)."""
    from .properties import Device

    dev = Device("cpu")
    yield dev
    dev.close()


@pytest.fixture(scope="module")
def gpu():
    """The GPU as tests/properties.py's Device; skipped with the reason where it is unavailable."""
    from .properties import Device

    require("gpu")
    dev = Device("gpu")
    yield dev
    dev.close()


def packed_launch_through(launch):
    """A stand-in for gpu.PackedLaunch on a fake device: each call of the launch it makes calls
    launch(stream, kernel, grid, block, args, shared_mem) with the arguments gpu.launch would be given for
    the same parameters (an Addresses slot's addresses as the `struct Ints` the kernel reads)."""
    from kernels.runtime import gpu

    def packed_launch(kernel, grid, block, arguments, shared_mem=0):
        def call(stream, *given):
            assert len(given) == sum(a is gpu.ARRAY or isinstance(a, gpu.Addresses) for a in arguments), \
                "not one value a slot"
            values = iter(given)
            parameters = []
            for argument in arguments:
                if argument is gpu.ARRAY:
                    parameters.append(next(values))
                elif isinstance(argument, gpu.Addresses):
                    addresses = list(next(values))
                    assert len(addresses) == argument.count
                    parameters.append(gpu.ints_arg(addresses))
                else:
                    parameters.append(argument)
            launch(stream, kernel, grid, block, tuple(parameters), shared_mem)
        return call
    return packed_launch
