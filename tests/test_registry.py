"""The op registry (kernels.registry, kernels.runtime.spec): every op's declaration matches its code,
and what lists ops (the package's exports, the case modules, the named paths) is derived from it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import kernels
from conformance.cases import CASE_MODULES
from kernels.registry import OPS
from kernels.runtime import core, cpu_paths, gpu_paths
from kernels.runtime.spec import Arg, OpSpec, declare_op

# The library's 14 ops: a folder that loses its declaration, or an op declared twice, changes this.
EXPECTED = {"batch_matmul", "batch_norm", "concat", "conv_2d", "element_binary", "element_unary", "gradient_reduction",
            "pool_2d", "reshape", "softmax", "split", "top_k", "transpose", "upsample"}


def _parameters(function, skip: int) -> list[str]:
    return list(inspect.signature(function).parameters)[skip:]


def test_every_op_folder_is_declared_once_and_nothing_else_is():
    assert set(OPS) == EXPECTED
    assert list(OPS) == sorted(OPS)
    folders = {info.name for info in pkgutil.iter_modules(kernels.__path__) if info.ispkg}
    assert folders == EXPECTED | {"activation", "models", "runtime"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_declaration_matches_the_functions(name):
    """The declared tensors are the functions' parameters, in order, so a declaration cannot drift
    from its op; each tensor the forward reads has one gradient; dtypes are what init_kernel accepts."""
    spec = OPS[name]
    module = importlib.import_module(spec.module)
    assert spec.name == name == module.OP and spec.module == f"kernels.{name}"
    assert _parameters(module.init_kernel, 2) == list(spec.shapes)
    for twin in ("cpu", "gpu"):
        forward = _parameters(getattr(module, f"{twin}_forward_kernel"), 4)
        assert forward == [arg.name for arg in spec.forward] + list(spec.forward_options)
        assert _parameters(getattr(module, f"{twin}_backward_kernel"), 4) == [arg.name for arg in spec.backward]
    read = {arg.name for arg in spec.forward if arg.role in ("input", "weight")}
    assert {arg.of for arg in spec.args("backward", "grad")} == read  # a gradient of every tensor read, once
    assert [arg.name for arg in spec.args("forward", "output")] == [arg.name for arg in spec.args("backward", "output")]
    assert spec.args("backward", "output_grad") and all(arg.required for arg in spec.args("backward", "output_grad"))
    assert (module.forward_kernel, module.backward_kernel, module.cleanup_kernel) == \
        (spec.forward_kernel, spec.backward_kernel, spec.cleanup_kernel)
    assert (module.cpu_init_kernel, module.gpu_init_kernel, module.cpu_cleanup_kernel, module.gpu_cleanup_kernel) == \
        (module.init_kernel,) * 2 + (module.cleanup_kernel,) * 2
    assert set(spec.devices) == {"cpu", "gpu"} and spec.dtypes
    assert inspect.signature(spec.forward_kernel) == inspect.signature(module.cpu_forward_kernel)


def test_the_package_exports_every_declared_op_and_its_public_types():
    for name, spec in OPS.items():
        assert kernels.OPS[name] is importlib.import_module(spec.module)
        assert getattr(kernels, name) is kernels.OPS[name] and name in kernels.__all__
        for value in (spec.attrs, *spec.exports):
            assert getattr(kernels, value.__name__) is value and value.__name__ in kernels.__all__
    assert kernels.UnaryOpType in OPS["element_unary"].exports and kernels.Conv2DAttrs is OPS["conv_2d"].attrs


def test_the_case_modules_and_named_paths_follow_the_registry():
    assert list(CASE_MODULES) == list(OPS)
    assert all(module.__name__ == f"conformance.cases.{name}" for name, module in CASE_MODULES.items())
    ops_of = lambda names: {name.split(".")[0] for name in names}  # noqa: E731
    assert ops_of(gpu_paths.declared()) <= set(OPS) | {"activation"}
    assert ops_of(cpu_paths.declared()) <= set(OPS) | {"activation", "cpu"}


def test_a_declaration_refuses_what_cannot_be_called():
    namespace = {"__name__": "kernels.example", "init_kernel": lambda handle, attrs, input_shape: None}
    with pytest.raises(core.KernelError, match="example: declare_op needs cpu_forward_kernel, gpu_forward_kernel"):
        declare_op("example", namespace, attrs=object, shapes=("input_shape",), forward=(), backward=(),
                   dtypes=(np.float32,), forward_doc="", backward_doc="")
    twice = (Arg("input", "input"), Arg("input", "output"))
    with pytest.raises(core.KernelError, match=r"example: forward names a tensor twice: \['input', 'input'\]"):
        declare_op("example", namespace, attrs=object, shapes=(), forward=twice, backward=(), dtypes=(),
                   forward_doc="", backward_doc="")
    with pytest.raises(core.KernelError, match="role must be one of"):
        Arg("input", "data")
    with pytest.raises(core.KernelError, match="names the tensor it is the gradient of"):
        Arg("input_grad", "grad")
    with pytest.raises(core.KernelError, match="names the tensor it is the gradient of"):
        Arg("input", "input", of="output")


def test_a_new_op_is_its_folder_and_one_declaration(tmp_path, monkeypatch):
    """An op package added under kernels/ with a SPEC is found by the registry's discovery, with nothing
    else edited: the package is made in a scratch folder on kernels' search path."""
    folder = tmp_path / "scale_by_two"
    folder.mkdir()
    (folder / "__init__.py").write_text('''
from dataclasses import dataclass

from ..runtime import cpu, core
from ..runtime.core import ALL_FLOAT_DTYPES
from ..runtime.spec import UNARY_FORWARD, UNARY_SHAPES, declare_op, unary_backward

OP = "scale_by_two"


@dataclass(frozen=True)
class ScaleByTwoAttrs:
    pass


def init_kernel(handle, attrs, input_shape, output_shape):
    return core.make_state(OP, handle, attrs, ScaleByTwoAttrs, input_shape=input_shape, output_shape=output_shape)


@cpu.cpu_kernel
def cpu_forward_kernel(stream, handle, state, attrs, input, output):
    output[...] = input * 2


@cpu.cpu_kernel
def cpu_backward_kernel(stream, handle, state, attrs, output, output_grad, input, input_grad):
    input_grad[...] = output_grad * 2


gpu_forward_kernel, gpu_backward_kernel = cpu_forward_kernel, cpu_backward_kernel
SPEC = declare_op(OP, globals(), attrs=ScaleByTwoAttrs, shapes=UNARY_SHAPES, forward=UNARY_FORWARD,
                  backward=unary_backward(output=False, input=False), dtypes=ALL_FLOAT_DTYPES,
                  forward_doc="output = 2 input", backward_doc="input_grad = 2 output_grad")
''')
    monkeypatch.setattr(kernels, "__path__", [*kernels.__path__, str(tmp_path)])
    from kernels import registry

    found = registry._discover()
    assert list(found) == sorted(EXPECTED | {"scale_by_two"})
    spec = found["scale_by_two"]
    assert isinstance(spec, OpSpec) and spec.attrs.__name__ == "ScaleByTwoAttrs"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.full_like(x, np.nan)
    state = spec.init_kernel(kernels.cpu_handle(), spec.attrs(), core.TensorShape.of(x), core.TensorShape.of(y))
    spec.forward_kernel(kernels.cpu_stream(), kernels.cpu_handle(), state, spec.attrs(), x, y)
    np.testing.assert_array_equal(y, np.arange(0, 12, 2, dtype=np.float32).reshape(2, 3))


def test_the_per_op_test_tables_cover_every_declared_op():
    """The tests that need a hand-written function per op (property samples, graph-capture builders)
    keep a table of them: a declared op missing from one fails here, not silently untested."""
    from . import test_gpu_graph_capture, test_properties

    assert set(test_properties.OPS) == set(OPS)
    built = {name for name in OPS if any(key == name or key.startswith(name + "_")
                                         for key in test_gpu_graph_capture.BUILDERS)}
    assert built == set(OPS)
