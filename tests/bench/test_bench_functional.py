"""The functional layer's cost per call on tiny tensors (issue 27): kernels.functional.<name> on
NumPy (CPU) or CuPy (GPU) arrays of 16 to 64 elements, beside its torch twin (torch.nn.functional,
torch.cat, ...) on the same values, so that the time is the layers' between the call and the kernel,
not the arithmetic. The target is at most 5x torch's on every row.

Each timed call is CALLS calls in a row (then a synchronize on the GPU, once, of the stream the calls ran
on): one call takes a few microseconds, under pytest-benchmark's timer resolution to time alone, and a synchronize after each
would be most of a GPU row. Our calls run as a user makes them: no stream= (a GPU call on the device's
default stream, ordered with CuPy's current one), no ctx. tools/functional_overhead.py prints the same
rows as a table, without pytest."""

import numpy as np
import pytest

import kernels.functional as F

CALLS = 100

# name -> (input dims, ours on arrays, torch's on tensors); the inputs are bench.array(dims, seed=i).
ROWS = {
    "relu 4x4": ([(4, 4)], lambda x: F.relu(x), lambda torch, x: torch.nn.functional.relu(x)),
    "silu 4x4": ([(4, 4)], lambda x: F.silu(x), lambda torch, x: torch.nn.functional.silu(x)),
    "sigmoid 4x4": ([(4, 4)], lambda x: F.sigmoid(x), lambda torch, x: torch.sigmoid(x)),
    "add 4x4": ([(4, 4), (4, 4)], lambda x, y: F.add(x, y), lambda torch, x, y: torch.add(x, y)),
    "mul 4x4": ([(4, 4), (4, 4)], lambda x, y: F.mul(x, y), lambda torch, x, y: torch.mul(x, y)),
    "mul 4x4 by 2.0": ([(4, 4)], lambda x: F.mul(x, 2.0), lambda torch, x: torch.mul(x, 2.0)),
    "softmax 4x4 dim 1": ([(4, 4)], lambda x: F.softmax(x, 1), lambda torch, x: torch.nn.functional.softmax(x, 1)),
    "conv2d 1x4x4x4 3x3": ([(1, 4, 4, 4), (4, 4, 3, 3)], lambda x, w: F.conv2d(x, w, padding=1),
                           lambda torch, x, w: torch.nn.functional.conv2d(x, w, padding=1)),
    "max_pool2d 1x4x4x4 2": ([(1, 4, 4, 4)], lambda x: F.max_pool2d(x, 2),
                             lambda torch, x: torch.nn.functional.max_pool2d(x, 2)),
    "batch_norm eval 1x4x4x4": ([(1, 4, 4, 4), (4,), (4,)], lambda x, m, v: F.batch_norm(x, m, v * v),
                                lambda torch, x, m, v: torch.nn.functional.batch_norm(x, m, v * v)),
    "cat 2x 4x4 dim 0": ([(4, 4), (4, 4)], lambda x, y: F.cat([x, y]), lambda torch, x, y: torch.cat([x, y])),
    "split 4x4 by 2": ([(4, 4)], lambda x: F.split(x, 2), lambda torch, x: torch.split(x, 2)),
    "reshape 4x4 to 16": ([(4, 4)], lambda x: F.reshape(x, (16,)), lambda torch, x: torch.reshape(x, (16,))),
    "transpose 4x4": ([(4, 4)], lambda x: F.transpose(x, 0, 1), lambda torch, x: torch.transpose(x, 0, 1)),
    "permute 1x4x4x4": ([(1, 4, 4, 4)], lambda x: F.permute(x, (0, 2, 3, 1)),
                        lambda torch, x: torch.permute(x, (0, 2, 3, 1))),
    "matmul 1x4x4": ([(1, 4, 4), (1, 4, 4)], lambda x, y: F.matmul(x, y), lambda torch, x, y: torch.bmm(x, y)),
    "interpolate nearest x2 1x4x4x4": ([(1, 4, 4, 4)], lambda x: F.interpolate(x, scale_factor=2),
                                       lambda torch, x: torch.nn.functional.interpolate(x, scale_factor=2)),
}


@pytest.mark.parametrize("row", list(ROWS), ids=[name.replace(" ", "_") for name in ROWS])
def test_functional_per_call(benchmark, bench, row):
    dims, ours, theirs = ROWS[row]
    inputs = [bench.array(d, seed=i) for i, d in enumerate(dims)]  # the same values on both sides
    if bench.impl == "torch":
        torch = bench.torch
        one = lambda: theirs(torch, *inputs)  # noqa: E731
    else:
        if bench.device == "gpu":
            bench.sync()  # the uploads, made on the bench's stream, done before the default stream reads them
        one = lambda: ours(*inputs)  # noqa: E731

    # Ours on the GPU run on the functional layer's default stream, not the bench's: that is the one to wait for.
    wait = F.default_stream(0).synchronize if bench.impl == "ours" and bench.device == "gpu" else (lambda: None)

    def calls():
        for _ in range(CALLS):
            one()
        wait()

    nbytes = sum(int(np.prod(d)) * 4 for d in dims)
    bench.run(benchmark, calls, CALLS * nbytes, f"functional per call x{CALLS}: {row}")
