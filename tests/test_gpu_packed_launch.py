"""gpu.PackedLaunch without a device: the parameter buffer a launch hands cuLaunchKernel must hold, at
each parameter's pointer, the bytes CuPy's own launch would pass (the arrays' addresses written at the
call, each scalar's and struct's bytes packed once), with the grid, block, shared memory and stream the
launch was given. The driver call is replaced by one that reads that memory back as the driver would.
On a GPU, tests/test_gpu_launch_plans.py and the conformance cases check what packed launches compute."""

from __future__ import annotations

import ctypes
import threading
import types

import numpy as np
import pytest

from kernels.runtime import gpu
from kernels.runtime.core import CudaError, KernelError


class Driver:
    """cuLaunchKernel's stand-in: reads what each parameter pointer points at, `sizes` bytes each."""

    def __init__(self, sizes):
        self.sizes, self.calls = sizes, []

    def __call__(self, function, gx, gy, gz, bx, by, bz, shared, stream, parameters, extra):
        pointers = (ctypes.c_uint64 * len(self.sizes)).from_address(parameters)
        values = [ctypes.string_at(pointers[i], size) for i, size in enumerate(self.sizes)]
        self.calls.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, values, extra))


def _array(ptr):
    return types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr))


STREAM = types.SimpleNamespace(cupy_stream=types.SimpleNamespace(ptr=0x5000))
KERNEL = types.SimpleNamespace(ptr=0x1234)


def test_each_parameter_points_at_its_bytes(monkeypatch):
    ints = gpu.ints_arg([3, 1, 4])
    arguments = (gpu.ARRAY, np.int32(-7), gpu.ARRAY, np.float64(2.5), ints, gpu.ARRAY, np.int64(2**40 + 3))
    sizes = [8, 4, 8, 8, ints.nbytes, 8, 8]
    driver = Driver(sizes)
    monkeypatch.setattr(gpu, "_launch_kernel", driver)
    launch = gpu.PackedLaunch(KERNEL, (5, 2), 128, arguments)
    launch(STREAM, _array(0xA000), _array(0xB010), None)
    launch(STREAM, _array(0xC000), _array(0xD000), _array(0xE008))
    expected_scalars = [np.int32(-7).tobytes(), np.float64(2.5).tobytes(), ints.tobytes(),
                        np.int64(2**40 + 3).tobytes()]
    for call, addresses in zip(driver.calls, ((0xA000, 0xB010, 0), (0xC000, 0xD000, 0xE008))):
        function, grid, block, shared, stream, values, extra = call
        assert (function, grid, block, shared, stream, extra) == (0x1234, (5, 2, 1), (128, 1, 1), 0, 0x5000, 0)
        assert [values[i] for i in (0, 2, 5)] == [np.uint64(a).tobytes() for a in addresses]
        assert [values[i] for i in (1, 3, 4, 6)] == expected_scalars


def test_address_lists_fill_their_struct(monkeypatch):
    """An Addresses slot holds the call's addresses in a `struct Ints` the size of ints_arg's, the arrays'
    slots beside it their own; what one call wrote is replaced, not kept, by the next."""
    ints = gpu.ints_arg([0] * gpu.MAX_RANK)
    driver = Driver([8, ints.nbytes, 4, ints.nbytes])
    monkeypatch.setattr(gpu, "_launch_kernel", driver)
    launch = gpu.PackedLaunch(KERNEL, (3, 2), 64, (gpu.ARRAY, gpu.Addresses(2), np.int32(5), gpu.Addresses(12)))
    many = [0x1000 * (k + 1) + 16 for k in range(12)]
    launch(STREAM, _array(0xA0), (0xB0, 0xC0), many)
    launch(STREAM, None, [0xD0, 0xE0], many[::-1])
    for call, (array, pair, twelve) in zip(driver.calls, ((0xA0, (0xB0, 0xC0), many), (0, (0xD0, 0xE0), many[::-1]))):
        values = call[5]
        assert values[0] == np.uint64(array).tobytes()
        assert values[1] == gpu.ints_arg(list(pair)).tobytes()
        assert values[2] == np.int32(5).tobytes()
        assert values[3] == gpu.ints_arg(twelve).tobytes()


def test_parameters_sit_on_16_byte_boundaries(monkeypatch):
    seen = []
    monkeypatch.setattr(gpu, "_launch_kernel", lambda *args: seen.append(args[9]))
    launch = gpu.PackedLaunch(KERNEL, 1, (32, 4), (np.int32(9), gpu.ARRAY))
    launch(STREAM, _array(0x40))
    pointers = (ctypes.c_uint64 * 2).from_address(seen[0])
    assert [p % 16 for p in pointers] == [0, 0] and pointers[1] - pointers[0] == 16


def test_shared_memory_past_the_limit_opts_the_kernel_in(monkeypatch):
    opted = []
    monkeypatch.setattr(gpu, "_let_launch", lambda kernel, size: opted.append((kernel.ptr, size)))
    monkeypatch.setattr(gpu, "_launch_kernel", Driver([8]))
    gpu.PackedLaunch(types.SimpleNamespace(ptr=0x77), 1, 32, (gpu.ARRAY,), shared_mem=gpu.SHARED_MEMORY_LIMIT)
    gpu.PackedLaunch(types.SimpleNamespace(ptr=0x78), 1, 32, (gpu.ARRAY,), shared_mem=100)
    assert opted == [(0x77, gpu.SHARED_MEMORY_LIMIT), (0x78, 100)]


def test_wrong_arguments_are_refused(monkeypatch):
    monkeypatch.setattr(gpu, "_launch_kernel", Driver([8]))
    with pytest.raises(KernelError, match="argument 1: ARRAY, Addresses or a NumPy scalar, found int"):
        gpu.PackedLaunch(KERNEL, 1, 32, (gpu.ARRAY, 3))
    launch = gpu.PackedLaunch(KERNEL, 1, 32, (gpu.ARRAY,))
    with pytest.raises(KernelError, match="1 arrays or address lists, given 2"):
        launch(STREAM, _array(1), _array(2))
    for count in (0, gpu.MAX_RANK + 1):
        with pytest.raises(KernelError, match=f"1 to {gpu.MAX_RANK} addresses in one struct Ints, asked for {count}"):
            gpu.Addresses(count)
    launch = gpu.PackedLaunch(KERNEL, 1, 32, (gpu.ARRAY, gpu.Addresses(3)))
    for wrong in ((1, 2), (1, 2, 3, 4)):
        with pytest.raises(KernelError, match=f"3 addresses in slot 2, given {len(wrong)}"):
            launch(STREAM, _array(1), wrong)


def test_a_failed_launch_raises_cuda_error(monkeypatch):
    error_type = type("CUDADriverError", (Exception,), {})
    monkeypatch.setattr(gpu, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(
        driver=types.SimpleNamespace(CUDADriverError=error_type))))

    def fail(*args):
        raise error_type("CUDA_ERROR_INVALID_VALUE: invalid argument")
    monkeypatch.setattr(gpu, "_launch_kernel", fail)
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        gpu.PackedLaunch(KERNEL, 1, 32, (gpu.ARRAY,))(STREAM, _array(1))
    # The opt-in to more shared memory, made when the launch is, fails as launch's does: a CudaError.
    monkeypatch.setattr(gpu, "_LAUNCHABLE", {})
    monkeypatch.setattr(gpu, "_let_launch", fail)
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        gpu.PackedLaunch(KERNEL, 1, 32, (gpu.ARRAY,), shared_mem=gpu.SHARED_MEMORY_LIMIT + 1)


def test_two_threads_launch_their_own_addresses(monkeypatch):
    """The lock: each launch reads the addresses its own call wrote, whatever another thread writes meanwhile."""
    seen = []

    def driver(*args):
        pointers = (ctypes.c_uint64 * 1).from_address(args[9])
        first = ctypes.c_uint64.from_address(pointers[0]).value
        threading.Event().wait(0.0005)  # let the other thread run while this launch is in the driver
        seen.append((first, ctypes.c_uint64.from_address(pointers[0]).value))
    monkeypatch.setattr(gpu, "_launch_kernel", driver)
    launch = gpu.PackedLaunch(KERNEL, 1, 32, (gpu.ARRAY,))

    def run(address):
        for _ in range(50):
            launch(STREAM, _array(address))
    threads = [threading.Thread(target=run, args=(a,)) for a in (0x100, 0x200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 100 and all(first == last for first, last in seen)
