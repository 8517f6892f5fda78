"""Named CPU paths (kernels/runtime/cpu_paths.py): the branches of the CPU code that only tensors past a size
take, each declared next to its code and counted when taken.

The registry is well formed and cheap; every name the kernels reach is declared (an AST scan of
their sources); and the default conformance run on the CPU (`python -m conformance --device cpu
--cpu-paths FILE`) reaches every declared name, through the medium cases of conformance/cases,
its report naming the first case that reached each one.
"""

from __future__ import annotations

import ast
import json
import pathlib
import threading

import pytest

import kernels
from conformance.__main__ import main
from kernels.runtime import cpu, cpu_paths
from kernels.runtime.core import KernelError

KERNELS = pathlib.Path(kernels.__file__).parent
DECLARED = cpu_paths.declared()


# --------------------------------------------------------------------------- the registry


def test_every_name_is_well_formed_and_described():
    assert len(DECLARED) >= 30  # 30 when written
    for name, description in DECLARED.items():
        assert cpu_paths.NAME.fullmatch(name), name
        assert description.strip() and "\n" not in description, name
    assert {name.split(".")[0] for name in DECLARED} == {
        "activation", "batch_norm", "concat", "conv_2d", "cpu", "element_binary", "pool_2d", "softmax"}
    assert set(cpu_paths.counts()) == set(DECLARED)


@pytest.fixture
def registry(monkeypatch):
    """A scratch copy of the registry, so that the test's declarations do not stay."""
    monkeypatch.setattr(cpu_paths.REGISTRY, "descriptions", dict(cpu_paths.REGISTRY.descriptions))
    monkeypatch.setattr(cpu_paths.REGISTRY, "taken", dict(cpu_paths.REGISTRY.taken))


@pytest.mark.parametrize("paths, message", [
    ({"Blocks": "x"}, "not a dotted lower-case name"),
    ({"a..b": "x"}, "not a dotted lower-case name"),
    ({"ok": ""}, "needs a one-line description"),
    ({"ok": "two\nlines"}, "needs a one-line description"),
    ({"ok": None}, "needs a one-line description"),
])
def test_declare_refuses_malformed_names_and_descriptions(registry, paths, message):
    with pytest.raises(KernelError, match=message):
        cpu_paths.declare("scratch", {"fine": "a good one", **paths})
    assert not any(name.startswith("scratch.") for name in cpu_paths.declared())  # nothing half-declared


def test_declare_refuses_a_name_twice(registry):
    assert cpu_paths.declare("scratch", {"a": "one"}) == ("scratch.a",)
    with pytest.raises(KernelError, match="declared twice"):
        cpu_paths.declare("scratch", {"a": "again"})
    with pytest.raises(KernelError, match="declared twice"):
        cpu_paths.declare("softmax", {"threads": "taken"})


def test_reach_counts_and_refuses_undeclared_names(registry):
    (name,) = cpu_paths.declare("scratch", {"x": "a path"})
    with cpu_paths.recording() as outer:
        cpu_paths.reach(name)
        with cpu_paths.recording() as inner:
            cpu_paths.reach_if(name, True)
            cpu_paths.reach_if(name, False)
            cpu_paths.reach_part(name, 0, 3, 6)  # a part of several: the pass was shared out
            cpu_paths.reach_part(name, 0, 6, 6)  # the whole: it was not
        assert inner.counts == {name: 2} and inner.reached == {name}
        cpu_paths.reach(name)
    assert outer.counts == {name: 4}
    cpu_paths.reach(name)
    assert outer.counts == {name: 4} and inner.counts == {name: 2}  # final when the block exits
    assert cpu_paths.counts()[name] == 5
    with pytest.raises(KernelError, match="'scratch.y' is not declared"):
        cpu_paths.reach("scratch.y")


def test_reaches_from_many_threads_at_once_are_all_counted(registry):
    (name,) = cpu_paths.declare("scratch", {"x": "a path"})

    def many():
        for _ in range(20000):
            cpu_paths.reach(name)

    threads = [threading.Thread(target=many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cpu_paths.counts()[name] == 80000


def _reached_names() -> set[str]:
    """The path constants the kernels pass to cpu_paths.reach*, resolved in their modules."""
    import importlib

    names = set()
    for path in KERNELS.rglob("*.py"):
        module_name = "kernels." + ".".join(path.relative_to(KERNELS).with_suffix("").parts)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("reach", "reach_if", "reach_part")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "cpu_paths"):
                module = importlib.import_module(module_name.removesuffix(".__init__"))
                argument = node.args[0]
                if isinstance(argument, ast.IfExp):
                    names |= {getattr(module, side.id) for side in (argument.body, argument.orelse)}
                else:
                    names.add(getattr(module, argument.id))
    return names


def test_every_name_the_kernels_reach_is_declared_and_every_declared_one_is_reached_somewhere():
    reached = _reached_names()
    assert reached <= set(DECLARED), reached - set(DECLARED)
    assert set(DECLARED) <= reached, set(DECLARED) - reached


# --------------------------------------------------------------------------- the conformance run


def test_the_default_conformance_run_reaches_every_cpu_path(tmp_path, capsys):
    """Done when: `python -m conformance` reaches every size-gated CPU path, and its report says so."""
    if cpu.available_cores() < 2:
        pytest.skip("the .threads paths need a CPU handle of two threads or more (the conformance run's "
                    "handle has the available cores)")
    report_path = tmp_path / "paths.json"
    assert main(["--device", "cpu", "--cpu-paths", str(report_path)]) == 0, capsys.readouterr().out
    report = json.loads(report_path.read_text())
    assert report["unreached"] == {}
    assert report["summary"] == {"declared": len(DECLARED), "reached": len(DECLARED)}
    assert set(report["reached"]) == set(DECLARED)
    for name, entry in report["reached"].items():
        assert entry["count"] >= 1 and entry["description"] == DECLARED[name]
        assert entry["first"].endswith("[cpu]"), entry
    # The medium cases reach them: none of the small ones does.
    assert all("/medium_" in entry["first"] for entry in report["reached"].values()), report["reached"]
