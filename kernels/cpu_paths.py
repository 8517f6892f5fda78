"""Named CPU paths: the branches of the CPU code that only tensors past a size take (blocked passes,
passes shared out to the threads, conv_2d's wide rows), each with a name, declared by the code that
takes it and counted when taken, so that a run can say which it reached (the twin of
:mod:`kernels.gpu_paths`, whose paths coverage.py cannot see at all; these it sees, but only a run
that reaches them proves them).

- ``declare(op, {suffix: description})`` (at a module's import) adds ``"<op>.<suffix>"``; names
  are unique, lower-case, dotted, each with a one-line description.
- ``reach(name)`` adds one to the name's count: a dict update under a lock (the parts of a pass
  reach from the pool's threads), refused for a name never declared, never touching the data.
  ``reach_if(name, taken)`` reaches it where `taken`, and ``reach_part(name, first, last, count)``
  where [first, last) is a proper part of range(count): the pass was shared out (cpu.cpu_parallel
  made two parts or more). Both keep the test here, so the kernels hold no branch of their own.
- ``recording()`` is a context manager whose ``Recording`` says which names were reached inside it;
  ``declared()`` lists every name with its description, importing every declaring module first.

``python -m conformance --cpu-paths FILE`` writes which the run reached (docs/conformance.md,
"Named CPU paths"); tests/test_cpu_paths.py checks that the default run reaches every one.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import threading
from typing import Iterator, Mapping

from .core import KernelError

# "<op>.<part>[.<part>...]": what a path name looks like.
NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9][a-z0-9_]*)+")

_DESCRIPTIONS: dict[str, str] = {}
_COUNTS: dict[str, int] = {}  # every declared name, from 0; reach() adds to it
_LOCK = threading.Lock()  # a count's read and write stay together when parts reach at once

# The modules that declare paths (declared() imports them: some are imported lazily by their ops).
MODULES = ("kernels.cpu", "kernels.activation", "kernels.batch_norm.cpu", "kernels.concat", "kernels.conv_2d.cpu",
           "kernels.element_binary.cpu", "kernels.pool_2d.cpu", "kernels.softmax")


def declare(op: str, paths: Mapping[str, str]) -> tuple[str, ...]:
    """Declare the size-gated paths of `op`'s CPU code, {suffix: one-line description}; returns the
    full names. A malformed or duplicate name, or a missing description, raises KernelError."""
    names = []
    for suffix, description in paths.items():
        name = f"{op}.{suffix}"
        if not NAME.fullmatch(name):
            raise KernelError(f"CPU path {name!r}: not a dotted lower-case name like 'softmax.rows.blocks'")
        if name in _DESCRIPTIONS or name in names:
            raise KernelError(f"CPU path {name!r} is declared twice")
        if not isinstance(description, str) or not description.strip() or "\n" in description:
            raise KernelError(f"CPU path {name!r}: needs a one-line description")
        names.append(name)
    for name, description in zip(names, paths.values()):
        _DESCRIPTIONS[name] = description
        _COUNTS[name] = 0
    return tuple(names)


def reach(name: str) -> None:
    """Count one taking of the declared path `name`."""
    with _LOCK:
        try:
            _COUNTS[name] += 1
        except KeyError:
            raise KernelError(f"CPU path {name!r} is not declared (kernels.cpu_paths.declare)") from None


def reach_if(name: str, taken: bool) -> None:
    """Reach `name` where `taken`: the kernel states its size gate once, without a branch of its own."""
    if taken:
        reach(name)


def reach_part(name: str, first: int, last: int, count: int) -> None:
    """Reach `name` where the part [first, last) is not the whole of range(count): the pass that
    runs it was shared out (a part function calls it)."""
    reach_if(name, last - first < count)


def declared() -> dict[str, str]:
    """Every declared path name with its one-line description, sorted by name."""
    for module in MODULES:
        importlib.import_module(module)
    return dict(sorted(_DESCRIPTIONS.items()))


def counts() -> dict[str, int]:
    """How often each declared path was taken in this process so far."""
    with _LOCK:
        return dict(_COUNTS)


class Recording:
    """What a recording() block reached: `counts` (name -> times taken inside the block, for the
    names taken at least once) and `reached` (those names), final when the block exits."""

    def __init__(self) -> None:
        self._start = counts()
        self._end: dict[str, int] | None = None

    @property
    def counts(self) -> dict[str, int]:
        now, start = (counts() if self._end is None else self._end), self._start
        return {name: count - start.get(name, 0) for name, count in now.items() if count > start.get(name, 0)}

    @property
    def reached(self) -> set[str]:
        return set(self.counts)


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Within the block, count the CPU paths taken; the Recording yielded says which were."""
    result = Recording()
    try:
        yield result
    finally:
        result._end = counts()
