"""Every op's checks agree with its declaration (kernels.registry), in the calls its conformance cases
make. Before each forward_kernel and backward_kernel call, the call is made wrong in each way the
op's spec allows: no stream, no handle or a stream for it, no state, a state or attrs of another op;
each tensor the spec declares required as None (and one entry of a required list); each tensor the
call gives with one more axis; each list one entry short, or a tensor where it goes. Each must raise
the error docs/api.md names, with its whole message (the argument, what was expected, what was
found), and leave every tensor the call writes as it was. init_kernel is given each shape with one
more axis and with another dtype, and must refuse both. After each backward, each gradient it
wrote is skipped in turn (None), and each forward result the spec declares optional is left out
(None), in calls that must write the other gradients' bits again.

The per-op tables (tests/test_bad_input_<op>.py) pick their rows by hand; this runs the same rules
over every argument of every op, so a check dropped from one op (a required flag turned off, an
optional tensor given but not looked at, a state read before it is checked) fails here."""

from __future__ import annotations

import copy
import re
import sys
from typing import Any

import numpy as np
import pytest

import kernels
from conformance.backends import KernelsBackend
from conformance.cases import all_cases
from conformance.runner import produce
from kernels import AttrsError, DeviceError, DTypeError, ShapeError, StateError, TensorShape
from kernels.registry import OPS

from .conftest import DEVICE_PARAMS, require

CASES = all_cases()


def _host(stream: Any, array: Any) -> np.ndarray:
    """A copy of a written tensor on the host, after the stream's work so far."""
    if isinstance(array, np.ndarray):
        return array.copy()
    stream.synchronize()
    return array.get()


def _poisoned_like(stream: Any, array: Any) -> Any:
    """A new tensor like `array` on its device, every byte 0x77, written on the stream."""
    if isinstance(array, np.ndarray):
        fresh = np.empty_like(array)
        fresh.view(np.uint8).fill(0x77)
        return fresh
    with array.device, stream:
        fresh = sys.modules["cupy"].empty_like(array)
        fresh.view(np.uint8).fill(0x77)
    return fresh


def _other_dims(array: Any) -> Any:
    """A zero tensor of the array's dtype, on its device, with one more axis: dims no state holds."""
    if isinstance(array, np.ndarray):
        return np.zeros(array.shape + (2,), dtype=array.dtype)
    cupy = sys.modules["cupy"]
    with array.device:
        return cupy.zeros(array.shape + (2,), dtype=array.dtype)


def _another_op(op: str, handle: Any) -> tuple[Any, Any, Any]:
    """(module, live state, attrs) of another op than `op` on the handle: element_unary, or for element_unary
    itself reshape."""
    shape = TensorShape((2, 3), np.float32)
    if op == "element_unary":
        attrs = kernels.ReshapeAttrs((3, 2))
        return kernels.reshape, kernels.reshape.init_kernel(handle, attrs, shape, TensorShape((3, 2), np.float32)), attrs
    attrs = kernels.ElementUnaryAttrs("RELU")
    return kernels.element_unary, kernels.element_unary.init_kernel(handle, attrs, shape, shape), attrs


class _Probing:
    """An op's functions, whose forward_kernel and backward_kernel first make each wrong variant of the
    call they are given (each must raise, write nothing), then the call itself. `probed` collects
    (direction, variant) for each variant made."""

    def __init__(self, module: Any, spec: Any, probed: set):
        self.module, self.spec, self.probed = module, spec, probed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)

    def init_kernel(self, handle, attrs, *shapes):
        """Each shape (a list's first) with one more axis must be refused (ShapeError, or AttrsError where the
        attrs no longer fit it: an axis counted from the end, k past the last dim), and with another dtype
        (DTypeError), naming the op; which argument the message blames is the op's order of checks. A shape
        of no elements is not given one more axis: reshape takes it (any dims of no elements fit)."""
        for position, (name, shape) in enumerate(zip(self.spec.shapes, shapes)):
            many = isinstance(shape, (list, tuple))
            first = shape[0] if many else shape
            other_dtype = np.float64 if first.dtype != np.float64 else np.float32
            variants = [("another dtype", TensorShape(first.dims, other_dtype), (DTypeError,))]
            if first.numel:
                variants.append(("one more axis", TensorShape(first.dims + (2,), first.dtype), (ShapeError, AttrsError)))
            for what, wrong, errors in variants:
                call = list(shapes)
                call[position] = [wrong] + list(shape[1:]) if many else wrong
                with pytest.raises(errors, match=rf"^{self.spec.name}: ") as raised:
                    self.module.init_kernel(handle, attrs, *call)
                assert type(raised.value) in errors, f"{self.spec.name} init, {name} {what}: {raised.value!r}"
                self.probed.add(("init", f"{name} {what}"))
        return self.module.init_kernel(handle, attrs, *shapes)

    def forward_kernel(self, stream, handle, state, attrs, *tensors, **options):
        self._probe("forward", self.module.forward_kernel, (stream, handle, state, attrs), tensors, options)
        # The call itself with attrs equal to the state's, another object: check_call compares them by value.
        return self.module.forward_kernel(stream, handle, state, copy.copy(attrs), *tensors, **options)

    def backward_kernel(self, stream, handle, state, attrs, *tensors):
        self._probe("backward", self.module.backward_kernel, (stream, handle, state, attrs), tensors, {})
        self.module.backward_kernel(stream, handle, state, copy.copy(attrs), *tensors)
        self._skip_each_gradient(stream, handle, state, attrs, tensors)
        self._without_each_unread_output(stream, handle, state, attrs, tensors)

    def _again(self, stream, handle, state, attrs, tensors: tuple, replace: dict, what: str) -> None:
        """Backward again, every gradient written into a fresh poisoned buffer, which must then hold the full
        call's bits. `replace` maps a position to what to pass there instead (a forward value), or for a
        gradient to the indices of its entries to skip (None) instead (a single gradient's is 0)."""
        call, pairs = list(tensors), []
        for position, arg in enumerate(self.spec.args("backward")):
            if position in replace and arg.role != "grad":
                call[position] = replace[position]
            elif arg.role == "grad":
                entries = list(tensors[position]) if arg.many else [tensors[position]]
                skip = replace.get(position, ())
                fresh = [None if entry is None or index in skip else _poisoned_like(stream, entry)
                         for index, entry in enumerate(entries)]
                pairs += [(entry, new) for entry, new in zip(entries, fresh) if new is not None]
                call[position] = fresh if arg.many else fresh[0]
        self.module.backward_kernel(stream, handle, state, attrs, *call)
        for index, (full, new) in enumerate(pairs):
            assert np.array_equal(_host(stream, full).view(np.uint8), _host(stream, new).view(np.uint8)), \
                f"{self.spec.name} backward, {what}: gradient {index} differs from the full call's"
        self.probed.add(("backward", what))

    def _without_each_unread_output(self, stream, handle, state, attrs, tensors: tuple) -> None:
        """Backward again without each forward result the spec declares optional (those the gradients never
        read: None, or for a list None for the whole list), which must change nothing."""
        for position, arg in enumerate(self.spec.args("backward")):
            if arg.role == "output" and not arg.required and tensors[position] is not None:
                self._again(stream, handle, state, attrs, tensors, {position: None}, f"{arg.name} None accepted")

    def _skip_each_gradient(self, stream, handle, state, attrs, tensors: tuple) -> None:
        """Backward again for each gradient the call wrote, with that gradient None (a list's first entry) and
        the others written to fresh poisoned buffers: each must hold the bits the full call wrote, since None
        skips its gradient and nothing else."""
        for position, arg in enumerate(self.spec.args("backward")):
            value = tensors[position]
            first = (value[0] if value else None) if arg.many else value
            if arg.role != "grad" or first is None:
                continue
            what = f"{arg.name}[0] skipped" if arg.many else f"{arg.name} skipped"
            self._again(stream, handle, state, attrs, tensors, {position: (0,)}, what)

    def _variants(self, direction: str, head: tuple, tensors: tuple, other_state: Any,
                  other_attrs: Any) -> list[tuple[str, tuple, list, type, str]]:
        """(what, head, tensors, error, message pattern) for each wrong variant of the call. The patterns
        are whole messages after the op's name: what was expected, and what was found."""
        stream, handle, state, attrs = head
        op = self.spec.name
        kind = r"\(cpu_{0}\(\) or gpu_{0}\(\)\)"
        out = [("stream None", (None, handle, state, attrs), list(tensors), DeviceError,
                rf"stream: expected a kernels CPU or GPU stream {kind.format('stream')}, found NoneType"),
               ("handle None", (stream, None, state, attrs), list(tensors), DeviceError,
                rf"handle: expected a kernels handle {kind.format('handle')}, found NoneType"),
               ("a stream for the handle", (stream, stream, state, attrs), list(tensors), DeviceError,
                rf"handle: expected a kernels handle {kind.format('handle')}, found {type(stream).__name__}"),
               ("state None", (stream, handle, None, attrs), list(tensors), StateError,
                rf"state: expected a state from {op}\.init_kernel, found NoneType"),
               ("state of another op", (stream, handle, other_state, attrs), list(tensors), StateError,
                rf"state: expected a state from {op}\.init_kernel, found {type(other_state).__name__}"),
               ("attrs of another op", (stream, handle, state, other_attrs), list(tensors), AttrsError,
                r"attrs: expected the attrs the state was made with \(.*\), found " + re.escape(str(other_attrs)))]

        def replaced(position: int, value: Any) -> list:
            call = list(tensors)
            call[position] = value
            return call

        def other_dims(name: str, value: Any) -> str:
            return rf"{name}: expected dims {re.escape(str(value.shape))}, found {re.escape(str(value.shape + (2,)))}"

        for position, (arg, value) in enumerate(zip(self.spec.args(direction), tensors)):
            name = re.escape(arg.name)
            assert not (arg.required and value is None), \
                f"{op} {direction}: {arg.name} is declared required, yet a valid call passes None"
            if arg.required:
                found = rf"expected a list of {len(value)}, found NoneType" if arg.many else \
                    r"expected an array .*, found None"
                out.append((f"{arg.name} None", head, replaced(position, None), ShapeError, rf"{name}: {found}"))
            if arg.many and value:
                out.append((f"{arg.name} one short", head, replaced(position, list(value[:-1])), ShapeError,
                            rf"{name}: expected a list of {len(value)}, found a list of {len(value) - 1}"))
                if arg.required:
                    out.append((f"{arg.name}[0] None", head, replaced(position, [None] + list(value[1:])), ShapeError,
                                rf"{name}\[0\]: expected an array .*, found None"))
                if value[0] is not None:
                    out.append((f"{arg.name} not a list", head, replaced(position, value[0]), ShapeError,
                                rf"{name}: expected a list of {len(value)}, found {type(value[0]).__name__}"))
                    out.append((f"{arg.name}[0] other dims", head,
                                replaced(position, [_other_dims(value[0])] + list(value[1:])), ShapeError,
                                other_dims(rf"{name}\[0\]", value[0])))
            elif not arg.many and value is not None:
                out.append((f"{arg.name} other dims", head, replaced(position, _other_dims(value)), ShapeError,
                            other_dims(name, value)))
        return out

    def _probe(self, direction: str, function: Any, head: tuple, tensors: tuple, options: dict) -> None:
        args = self.spec.args(direction)
        written_role = "output" if direction == "forward" else "grad"
        written = [t for arg, value in zip(args, tensors) if arg.role == written_role
                   for t in (value if arg.many else [value]) if t is not None]
        stream, handle = head[0], head[1]
        before = [_host(stream, t) for t in written]
        other_module, other_state, other_attrs = _another_op(self.spec.name, handle)
        for what, call_head, call, error_type, pattern in self._variants(direction, head, tensors, other_state,
                                                                         other_attrs):
            try:
                function(*call_head, *call, **options)
            except error_type as error:
                assert re.fullmatch(rf"{self.spec.name}: {pattern}", str(error)), f"{direction}, {what}: {error}"
            else:
                pytest.fail(f"{self.spec.name} {direction}, {what}: the call did not raise {error_type.__name__}")
            for index, (b, t) in enumerate(zip(before, written)):
                assert np.array_equal(b.view(np.uint8), _host(stream, t).view(np.uint8)), \
                    f"{self.spec.name} {direction}, {what}: the refused call wrote written tensor {index}"
            self.probed.add((direction, what))
        other_module.cleanup_kernel(handle, other_state)


class _ProbingBackend(KernelsBackend):
    """This library, each op's functions wrapped in _Probing."""

    name = "kernels-probing"

    def __init__(self, probed: set):
        self.probed = probed

    def op(self, name: str) -> Any:
        module = super().op(name)
        return None if module is None else _Probing(module, OPS[name], self.probed)


def _expected_variants(spec: Any) -> set:
    """The variants every op's cases must reach between them: in each direction, no stream or handle, a stream
    for the handle, no state, a state or attrs of another op; None for each required tensor, other dims for
    each tensor that is always given (required); each gradient skipped; each optional forward result left out."""
    out = {("backward", f"{arg.name}[0] skipped" if arg.many else f"{arg.name} skipped")
           for arg in spec.args("backward", "grad")}
    out |= {("init", f"{name} {what}") for name in spec.shapes for what in ("one more axis", "another dtype")}
    out |= {("backward", f"{arg.name} None accepted") for arg in spec.args("backward", "output") if not arg.required}
    for direction in ("forward", "backward"):
        out |= {(direction, what) for what in ("stream None", "handle None", "a stream for the handle", "state None",
                                               "state of another op", "attrs of another op")}
        for arg in spec.args(direction):
            if arg.required:
                out.add((direction, f"{arg.name} None"))
                out.add((direction, f"{arg.name}[0] other dims" if arg.many else f"{arg.name} other dims"))
                if arg.many:
                    out |= {(direction, f"{arg.name}{what}") for what in ("[0] None", " one short", " not a list")}
    return out


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("op", list(OPS))
def test_every_declared_tensor_is_checked(op, device, store):
    """Each of the op's cases runs once through the probing backend (its forward and backward calls as
    the conformance harness makes them, on poisoned tensors); every required tensor of the spec is
    probed in some case."""
    require(device)
    probed: set = set()
    backend = _ProbingBackend(probed)
    for case in CASES:
        devices = case.extra.get("devices")
        if case.op == op and (devices is None or device in devices):
            produce(case, store.get(case), device, backend=backend)
    missing = _expected_variants(OPS[op]) - probed
    assert not missing, f"{op}: no case makes a call that probes {sorted(missing)}"
