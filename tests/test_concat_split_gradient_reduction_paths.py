"""The GPU paths of concat, split and gradient_reduction.

Without a device: the host side (copy unit, offsets, batches of 12 pieces or
pointers, index type, chained sums) runs against an
emulated device, a NumPy byte buffer on which each launch is carried out from
its kernel name and arguments, and must reproduce every case's golden, also with
tensors whose addresses allow only narrower units. With a device: the same
misaligned tensors on the GPU itself.
"""

from __future__ import annotations

import re
import types

import numpy as np
import pytest

from conformance.cases import CASE_MODULES
from kernels import concat, gradient_reduction, split
from kernels.runtime import core, gpu
from kernels.runtime.core import BFLOAT16, TensorShape

from .conftest import packed_launch_through, require

_TYPES = {"half_t": np.float16, "bfloat16_t": BFLOAT16,
          "float": np.float32, "double": np.float64, "unsigned char": np.uint8, "unsigned short": np.uint16,
          "unsigned int": np.uint32, "unsigned long long": np.uint64, "ulonglong2": np.dtype((np.void, 16))}


class FakeDevice:
    """Device memory as one NumPy byte buffer; arrays are placed `misalign` bytes past a 256-byte boundary."""

    id = 0  # the GPU ordinal check_call compares with the stream's

    def __init__(self, misalign: int):
        self.memory = np.zeros(1 << 22, dtype=np.uint8)  # grown by array() for the medium cases
        self.top, self.misalign = 256, misalign
        self.launches: list[str] = []

    def array(self, value=None, dims=None, dtype=None):
        dims, dtype = (value.shape, value.dtype) if value is not None else (dims, np.dtype(dtype))
        self.top = -(-self.top // 256) * 256 + self.misalign
        array = FakeArray(self, self.top, tuple(dims), dtype)
        self.top += array.nbytes + 256
        if self.top > self.memory.size:  # every view is taken afresh from self.memory, so it may move
            self.memory = np.concatenate([self.memory, np.zeros(2 * self.top - self.memory.size, np.uint8)])
        if value is not None:
            array.host()[...] = value
        return array

    def empty(self, dims, dtype, ordinal):
        """gpu.device_empty: memory a state keeps, on a 256-byte boundary as cudaMalloc gives it."""
        misalign, self.misalign = self.misalign, 0
        try:
            return self.array(dims=dims, dtype=dtype)
        finally:
            self.misalign = misalign

    def view(self, ptr: int, count: int, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        return self.memory[ptr:ptr + count * dtype.itemsize].view(dtype)

    def launch(self, stream, kernel, grid, block, args, shared_mem=0):
        """Carry out one launch of concat.cu or gradient_reduction.cu from its name and arguments."""
        self.launches.append(kernel)
        name, template = re.fullmatch(r"(\w+)<(.*)>", kernel).groups()
        template = [t.strip() for t in template.split(",")]
        unit_dtype, index_scalar = np.dtype(_TYPES[template[0]]), (np.int32 if template[1] == "int" else np.int64)
        grid = (grid,) if isinstance(grid, int) else tuple(grid)
        assert 1 <= grid[0] <= 65536 and all(isinstance(a, (np.generic, FakeArray)) for a in args)
        if name == "concat_copy":
            whole, whole_width, outer, pieces, widths, offsets = args
            assert isinstance(whole_width, index_scalar) and isinstance(outer, index_scalar) and 1 <= grid[1] <= 12
            rows = self.view(whole.ptr, int(outer) * int(whole_width), unit_dtype).reshape(int(outer), int(whole_width))
            for p in range(grid[1]):
                ptr, width, offset = (int(t["v"][p]) for t in (pieces, widths, offsets))
                assert ptr % unit_dtype.itemsize == 0 and whole.ptr % unit_dtype.itemsize == 0
                piece = self.view(ptr, int(outer) * width, unit_dtype).reshape(int(outer), width)
                if template[2] == "true":
                    rows[:, offset:offset + width] = piece
                else:
                    piece[...] = rows[:, offset:offset + width]
        elif name == "gradient_reduction_sum":
            output, count, input_count, inputs = args
            pack = int(template[2])
            pointers = [int(inputs["v"][k]) for k in range(int(input_count))]
            assert isinstance(count, index_scalar) and 1 <= len(pointers) <= 12
            assert all(p % (unit_dtype.itemsize * pack) == 0 for p in pointers + [output.ptr])
            total = self.view(pointers[0], int(count), unit_dtype).copy()
            for p in pointers[1:]:
                total = total + self.view(p, int(count), unit_dtype)  # left to right, as the kernel
            self.view(output.ptr, int(count), unit_dtype)[...] = total
        elif name == "gradient_reduction_sum_wide":
            # A half sum: float32 from inputs[0] (or the carry), the output rounded once (or the carry written).
            output, carry, count, input_count, carry_in, carry_out, inputs = args
            pack = int(template[2])
            pointers = [int(inputs["v"][k]) for k in range(int(input_count))]
            assert isinstance(count, index_scalar) and 1 <= len(pointers) <= 12
            assert all(p % (unit_dtype.itemsize * pack) == 0 for p in pointers + [output.ptr])
            if carry_in or carry_out:
                assert carry.dtype == np.float32 and carry.size >= int(count) and carry.ptr % 16 == 0
            terms = [self.view(p, int(count), unit_dtype).astype(np.float32) for p in pointers]
            total = self.view(carry.ptr, int(count), np.float32).copy() if carry_in else terms.pop(0)
            for term in terms:
                total = total + term
            if carry_out:
                self.view(carry.ptr, int(count), np.float32)[...] = total
            else:
                self.view(output.ptr, int(count), unit_dtype)[...] = total.astype(unit_dtype)
        elif name == "gradient_reduction_fanout":
            source, count, output_count, outputs = args
            assert isinstance(count, index_scalar) and 1 <= int(output_count) <= 12
            for k in range(int(output_count)):
                self.view(int(outputs["v"][k]), int(count), unit_dtype)[...] = self.view(source.ptr, int(count), unit_dtype)
        else:
            raise AssertionError(f"unknown kernel {kernel}")


class FakeArray:
    def __init__(self, device, ptr, shape, dtype):
        self.device, self.ptr, self.shape, self.dtype = device, ptr, shape, np.dtype(dtype)
        self.size = int(np.prod(shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        self.data, self._c_contiguous = types.SimpleNamespace(ptr=ptr, device_id=device.id), True
        self.strides = ()

    def host(self) -> np.ndarray:
        return self.device.view(self.ptr, self.size, self.dtype).reshape(self.shape)


@pytest.fixture
def emulate(monkeypatch):
    """A FakeDevice factory with gpu.launch and kernel lookup routed to it."""
    devices = []

    def function(module, name):
        assert name in module.name_expressions, name  # every kernel asked for is compiled
        return name

    def make(misalign: int) -> FakeDevice:
        device = FakeDevice(misalign)
        devices.append(device)
        runtime = types.SimpleNamespace(CUDARuntimeError=RuntimeError)
        monkeypatch.setattr(gpu, "launch", device.launch)
        monkeypatch.setattr(gpu, "PackedLaunch", packed_launch_through(device.launch))
        monkeypatch.setattr(gpu, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)))
        monkeypatch.setattr(gpu.CudaModule, "function", function)
        monkeypatch.setattr(gpu, "sm_count", lambda device: 132)  # an H200
        monkeypatch.setattr(gpu, "device_empty", device.empty)
        return device

    return make


def _cases(*ops):
    return [pytest.param(case, id=case.key) for op in ops for case in CASE_MODULES[op].TABLE]


def _check(device, golden, produced):
    for name, expected in golden.expected.items():
        got = produced[name].host()
        assert np.array_equal(got.view(np.uint8), expected.view(np.uint8)), f"{name}: {got} != {expected}"


@pytest.mark.parametrize("misalign", [0, 1, 2, 4, 8])
@pytest.mark.parametrize("case", _cases("concat", "split"))
def test_concat_split_host_side(case, misalign, emulate, store):
    if misalign % case.dtype.itemsize:
        pytest.skip("an array is always aligned to its element")
    device, golden = emulate(misalign), store.get(case)
    produced = {}
    if case.op == "concat":
        inputs = [device.array(golden.inputs[f"inputs.{i}"]) for i in range(case.attrs.num_inputs)]
        output = device.array(dims=golden.expected["output"].shape, dtype=case.dtype)
        axis = case.attrs.axis % len(output.shape)
        layout = concat.attrs.piece_layout(TensorShape(output.shape, case.dtype), [x.shape[axis] for x in inputs], axis)
        concat.gpu.gpu_join(types.SimpleNamespace(ptr=0, device=0), layout, inputs, output)
        grads = [None if i in case.extra["none_grads"] else device.array(dims=x.shape, dtype=case.dtype)
                 for i, x in enumerate(inputs)]
        concat.gpu.gpu_cut(types.SimpleNamespace(ptr=0, device=0), layout, device.array(golden.inputs["output_grad"]), grads)
        produced = {"output": output, **{f"input_grads.{i}": g for i, g in enumerate(grads) if g is not None}}
    else:
        input = device.array(golden.inputs["input"])
        axis = case.attrs.axis % len(input.shape)
        layout = concat.attrs.piece_layout(TensorShape(input.shape, case.dtype), case.attrs.splits, axis)
        outputs = [device.array(dims=golden.expected[f"outputs.{i}"].shape, dtype=case.dtype)
                   for i in range(len(case.attrs.splits))]
        concat.gpu.gpu_cut(types.SimpleNamespace(ptr=0, device=0), layout, input, outputs)
        input_grad = device.array(dims=input.shape, dtype=case.dtype)
        output_grads = [device.array(golden.inputs[f"output_grads.{i}"]) for i in range(len(outputs))]
        concat.gpu.gpu_join(types.SimpleNamespace(ptr=0, device=0), layout, output_grads, input_grad)
        produced = {"input_grad": input_grad, **{f"outputs.{i}": o for i, o in enumerate(outputs)}}
    _check(device, golden, produced)


@pytest.mark.parametrize("misalign", [0, 1, 2, 4, 8])
@pytest.mark.parametrize("case", _cases("gradient_reduction"))
def test_gradient_reduction_host_side(case, misalign, emulate, store):
    if misalign % case.dtype.itemsize:
        pytest.skip("an array is always aligned to its element")
    device, golden = emulate(misalign), store.get(case)
    count = sum(1 for name in golden.inputs if name.startswith("inputs."))
    inputs = [device.array(golden.inputs[f"inputs.{i}"]) for i in range(count)]
    output = device.array(dims=inputs[0].shape, dtype=case.dtype)
    gradient_reduction.gpu.gpu_sum(None, inputs, output, {})
    grads = [None if i in case.extra["none_grads"] else device.array(dims=output.shape, dtype=case.dtype)
             for i in range(count)]
    gradient_reduction.gpu.gpu_fanout(None, device.array(golden.inputs["output_grad"]),
                                      [g for g in grads if g is not None], {})
    _check(device, golden, {"output": output, **{f"input_grads.{i}": g for i, g in enumerate(grads) if g is not None}})


def test_units_follow_sizes_and_addresses(emulate):
    """16-byte units where every width and address allows, narrower ones where one does not."""
    device = emulate(0)
    layout = concat.attrs.piece_layout(TensorShape((2, 12, 4), np.float32), (4, 8), 1)  # rows of 64 and 128 bytes
    pieces = [device.array(dims=(2, 4, 4), dtype=np.float32), device.array(dims=(2, 8, 4), dtype=np.float32)]
    whole = device.array(dims=(2, 12, 4), dtype=np.float32)
    concat.gpu.gpu_join(types.SimpleNamespace(ptr=0, device=0), layout, pieces, whole)
    device.misalign = 4
    stream = types.SimpleNamespace(ptr=0, device=0)
    concat.gpu.gpu_join(stream, layout, pieces[:1] + [device.array(dims=(2, 8, 4), dtype=np.float32)], whole)
    assert device.launches == ["concat_copy<ulonglong2, int, true>", "concat_copy<unsigned int, int, true>"]


class FakeStream:
    """A GPU stream and handle of device 0 as check_call sees them."""

    device, ptr = 0, 0

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("case", _cases("concat", "split", "gradient_reduction"))
def test_state_launch_plans(case, emulate, store, monkeypatch):
    """forward_kernel and backward_kernel through check_call and the plans kept in the state: made
    on the first call (aligned), reused on the second, a new one where the addresses' alignment
    differs (third); each call's results are the golden's."""
    real_module = core._array_module
    monkeypatch.setattr(core, "_array_module", lambda a: "cupy" if isinstance(a, FakeArray) else real_module(a))
    golden, stream = store.get(case), FakeStream()
    device = emulate(0)
    op = {"concat": concat, "split": split, "gradient_reduction": gradient_reduction}[case.op]
    names = list(golden.inputs) + list(golden.expected)

    def listed(prefix, arrays):  # a list argument, None where the golden has no such tensor
        return [arrays.get(f"{prefix}.{i}") for i in range(sum(1 for n in names if n.startswith(prefix + ".")))]

    itemsize = case.dtype.itemsize
    state = None
    for misalign in (0, 0, itemsize if itemsize < 16 else 0):
        device.misalign = misalign
        inputs = {name: device.array(value) for name, value in golden.inputs.items()}
        produced = {name: device.array(dims=value.shape, dtype=value.dtype) for name, value in golden.expected.items()}
        if case.op == "split":
            outputs = listed("outputs", produced)
            if state is None:
                state = op.init_kernel(stream, case.attrs, core.TensorShape.of(inputs["input"]),
                                       [core.TensorShape(o.shape, o.dtype) for o in outputs])
            op.forward_kernel(stream, stream, state, case.attrs, inputs["input"], outputs)
            op.backward_kernel(stream, stream, state, case.attrs, None, listed("output_grads", inputs), None,
                               produced["input_grad"])
        else:
            xs = listed("inputs", inputs)
            grads = [produced.get(f"input_grads.{i}") for i in range(len(xs))]  # None where the case skips one
            if state is None:
                state = op.init_kernel(stream, case.attrs, [core.TensorShape(x.shape, x.dtype) for x in xs],
                                       core.TensorShape(produced["output"].shape, produced["output"].dtype))
            op.forward_kernel(stream, stream, state, case.attrs, xs, produced["output"])
            op.backward_kernel(stream, stream, state, case.attrs, None, inputs["output_grad"], None, grads)
        _check(device, golden, produced)
    plans = state.saved["layout"].plans if case.op != "gradient_reduction" else state.saved["gpu_plans"]
    if case.op == "gradient_reduction" and case.dtype in core.HALF_DTYPES and "inputs.12" in golden.inputs:
        # A half sum of more than 12 terms keeps its float32 carry beside the plans, made once.
        carry = plans.pop("carry")
        assert carry.dtype == np.float32 and carry.size == produced["output"].size
    assert plans and len(plans) <= 4, plans.keys()


# --------------------------------------------------------------------------- on a device


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_misaligned_views_on_gpu(offset):
    """Pieces that are contiguous views `offset` elements into a buffer: narrower units, same results."""
    require("gpu")
    import cupy

    from kernels import ConcatAttrs, GradientReductionAttrs, gpu_handle, gpu_stream
    from kernels import concat as concat_op

    stream, handle = gpu_stream(), gpu_handle()
    dims = [(2, 3, 8), (2, 5, 8), (2, 1, 8)]
    host = [np.arange(np.prod(d), dtype=np.float32).reshape(d) + 100 * i for i, d in enumerate(dims)]
    buffers = [cupy.zeros(int(np.prod(d)) + offset, dtype=np.float32) for d in dims]
    pieces = [b[offset:].reshape(d) for b, d in zip(buffers, dims)]
    for piece, value in zip(pieces, host):
        piece[...] = cupy.asarray(value)
    output = cupy.full((2, 9, 8), np.nan, dtype=np.float32)
    cupy.cuda.runtime.deviceSynchronize()  # the fills ran on CuPy's current stream, not on `stream`
    attrs = ConcatAttrs(axis=1, num_inputs=3)
    state = concat_op.init_kernel(handle, attrs, [TensorShape(d, np.float32) for d in dims], TensorShape((2, 9, 8), np.float32))
    concat_op.forward_kernel(stream, handle, state, attrs, pieces, output)
    grads = [b[offset:].reshape(d) for b, d in zip([cupy.full(b.size, np.nan, np.float32) for b in buffers], dims)]
    cupy.cuda.runtime.deviceSynchronize()
    concat_op.backward_kernel(stream, handle, state, attrs, output, output, pieces, grads)
    total = cupy.full((2, 3, 8), np.nan, dtype=np.float32)
    cupy.cuda.runtime.deviceSynchronize()
    reduction_state = gradient_reduction.init_kernel(handle, GradientReductionAttrs(), [TensorShape((2, 3, 8), np.float32)] * 2,
                                                     TensorShape((2, 3, 8), np.float32))
    gradient_reduction.forward_kernel(stream, handle, reduction_state, GradientReductionAttrs(), [grads[0], pieces[0]], total)
    stream.synchronize()
    expected = np.concatenate(host, axis=1)
    assert np.array_equal(cupy.asnumpy(output), expected)
    for grad, value in zip(grads, host):
        assert np.array_equal(cupy.asnumpy(grad), value)
    assert np.array_equal(cupy.asnumpy(total), 2 * host[0])
    handle.close()
