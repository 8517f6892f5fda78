"""Named GPU paths: coverage.py cannot see CUDA, so every real decision a GPU call takes (which
kernel or template instantiation, which launch-plan variant, which library method, vector packs
or scalars, one launch or several, where the host decides it) has a name here, declared by the op's
GPU code next to the code that takes it, and counted when taken.

- ``declare(op, {suffix: description})`` (at an op module's import) adds ``"<op>.<suffix>"``;
  names are unique, lower-case, dotted, each with a one-line description.
- ``reach(name)`` (on the launch path) adds one to the name's count: a dict update, refused for a
  name that was never declared, and never anything that touches the data.
- ``recording()`` is a context manager whose ``Recording`` says which names were reached inside it
  (nested recordings each see their own block); ``declared()`` lists every name with its
  description, importing every op module first so the list is whole.

tests/test_gpu_paths.py checks the registry on the CPU and, on a GPU, that the conformance run and
the large differential cases reach every declared name (docs/conformance.md#named-gpu-paths).
"""

from __future__ import annotations

import contextlib
import importlib
import re
from typing import Iterator, Mapping

from .core import KernelError

# "<op>.<part>[.<part>...]": what a path name looks like.
NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9][a-z0-9_]*)+")

_DESCRIPTIONS: dict[str, str] = {}
_COUNTS: dict[str, int] = {}  # every declared name, from 0; reach() adds to it

# The modules that declare paths (imported by declared(): some are imported lazily by their ops).
MODULES = ("kernels.activation", "kernels.batch_matmul", "kernels.batch_norm.gpu", "kernels.concat",
           "kernels.conv_2d.gpu", "kernels.element_binary.gpu", "kernels.element_unary", "kernels.gradient_reduction",
           "kernels.pool_2d.gpu", "kernels.reshape", "kernels.softmax", "kernels.transpose", "kernels.upsample")


def declare(op: str, paths: Mapping[str, str]) -> tuple[str, ...]:
    """Declare the paths of `op`'s GPU code, {suffix: one-line description}; returns the full names.
    A malformed or duplicate name, or a missing description, raises KernelError."""
    names = []
    for suffix, description in paths.items():
        name = f"{op}.{suffix}"
        if not NAME.fullmatch(name):
            raise KernelError(f"GPU path {name!r}: not a dotted lower-case name like 'concat.kernel.join'")
        if name in _DESCRIPTIONS:
            raise KernelError(f"GPU path {name!r} is declared twice")
        if not isinstance(description, str) or not description.strip() or "\n" in description:
            raise KernelError(f"GPU path {name!r}: needs a one-line description")
        names.append(name)
    for name, description in zip(names, paths.values()):
        _DESCRIPTIONS[name] = description
        _COUNTS[name] = 0
    return tuple(names)


def reach(name: str) -> None:
    """Count one taking of the declared path `name` (the GPU launch code calls it)."""
    try:
        _COUNTS[name] += 1
    except KeyError:
        raise KernelError(f"GPU path {name!r} is not declared (kernels.gpu_paths.declare)") from None


def check(name: str) -> str:
    """`name`, where declared (launch plans check the names they store once, when made)."""
    if name not in _DESCRIPTIONS:
        raise KernelError(f"GPU path {name!r} is not declared (kernels.gpu_paths.declare)")
    return name


def declared() -> dict[str, str]:
    """Every declared path name with its one-line description, sorted by name."""
    for module in MODULES:
        importlib.import_module(module)
    return dict(sorted(_DESCRIPTIONS.items()))


def counts() -> dict[str, int]:
    """How often each declared path was taken in this process so far."""
    return dict(_COUNTS)


class Recording:
    """What a recording() block reached: `counts` (name -> times taken inside the block, for the
    names taken at least once) and `reached` (those names), final when the block exits."""

    def __init__(self) -> None:
        self._start = dict(_COUNTS)
        self._end: dict[str, int] | None = None

    def _now(self) -> dict[str, int]:
        return _COUNTS if self._end is None else self._end

    @property
    def counts(self) -> dict[str, int]:
        now, start = self._now(), self._start
        return {name: count - start.get(name, 0) for name, count in now.items() if count > start.get(name, 0)}

    @property
    def reached(self) -> set[str]:
        return set(self.counts)


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Within the block, count the GPU paths taken; the Recording yielded says which were."""
    result = Recording()
    try:
        yield result
    finally:
        result._end = dict(_COUNTS)
