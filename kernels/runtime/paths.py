"""A registry of named paths: each real decision a kernel takes has a name, declared by the code
that takes it and counted when taken, so that a run can say which it reached. kernels.runtime.gpu_paths
(the GPU's launch decisions, which coverage.py cannot see) and kernels.runtime.cpu_paths (the CPU's
size-gated branches) are each one PathRegistry; their modules say what they name."""

from __future__ import annotations

import contextlib
import importlib
import re
import threading
from typing import Iterator, Mapping

from .core import KernelError

# "<op>.<part>[.<part>...]": what a path name looks like.
NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9][a-z0-9_]*)+")


class PathRegistry:
    """The declared names of one device's paths, their descriptions and how often each was taken.

    `device` ("GPU", "CPU"), `module` (where declare lives) and `example` (a well-formed name) word
    the errors; declared() imports the kernels package first, whose op packages import the modules
    that declare names; `locked`: reach() takes a lock (the CPU's parts reach from the pool's threads at once)."""

    def __init__(self, device: str, module: str, example: str, locked: bool = False):
        self.device, self.module, self.example = device, module, example
        self.descriptions: dict[str, str] = {}
        self.taken: dict[str, int] = {}  # every declared name, from 0; reach() adds to it
        self._lock: contextlib.AbstractContextManager = threading.Lock() if locked else contextlib.nullcontext()
        if locked:
            self.reach = self._reach_locked  # type: ignore[method-assign]

    def declare(self, op: str, paths: Mapping[str, str]) -> tuple[str, ...]:
        """Declare `op`'s paths, {suffix: one-line description}; returns the full names "<op>.<suffix>".
        A malformed or duplicate name, or a missing description, raises KernelError (declaring none)."""
        names = []
        for suffix, description in paths.items():
            name = f"{op}.{suffix}"
            if not NAME.fullmatch(name):
                raise KernelError(f"{self.device} path {name!r}: not a dotted lower-case name like '{self.example}'")
            if name in self.descriptions or name in names:
                raise KernelError(f"{self.device} path {name!r} is declared twice")
            if not isinstance(description, str) or not description.strip() or "\n" in description:
                raise KernelError(f"{self.device} path {name!r}: needs a one-line description")
            names.append(name)
        for name, description in zip(names, paths.values()):
            self.descriptions[name] = description
            self.taken[name] = 0
        return tuple(names)

    def _undeclared(self, name: str) -> KernelError:
        return KernelError(f"{self.device} path {name!r} is not declared ({self.module}.declare)")

    def reach(self, name: str) -> None:
        """Count one taking of the declared path `name`: a dict update, never touching the data. A locked
        registry's reach is _reach_locked, which takes the lock around this; an unlocked one's (the GPU's)
        enters no null context, which was half of its 0.25 us a call, paid on every launch."""
        try:
            self.taken[name] += 1
        except KeyError:
            raise self._undeclared(name) from None

    def _reach_locked(self, name: str) -> None:
        with self._lock:
            PathRegistry.reach(self, name)

    def check(self, name: str) -> str:
        """`name`, where declared (launch plans check the names they store once, when made)."""
        if name not in self.descriptions:
            raise self._undeclared(name)
        return name

    def declared(self) -> dict[str, str]:
        """Every declared path name with its one-line description, sorted by name."""
        importlib.import_module("kernels")  # every op package, and with it the halves that declare names
        return dict(sorted(self.descriptions.items()))

    def counts(self) -> dict[str, int]:
        """How often each declared path was taken in this process so far."""
        with self._lock:
            return dict(self.taken)

    @contextlib.contextmanager
    def recording(self) -> Iterator[Recording]:
        """Within the block, count the paths taken; the Recording yielded says which were."""
        result = Recording(self)
        try:
            yield result
        finally:
            result._end = self.counts()


class Recording:
    """What a recording() block reached: `counts` (name -> times taken inside the block, for the
    names taken at least once) and `reached` (those names), final when the block exits."""

    def __init__(self, registry: PathRegistry) -> None:
        self._registry = registry
        self._start = registry.counts()
        self._end: dict[str, int] | None = None

    @property
    def counts(self) -> dict[str, int]:
        now, start = (self._registry.counts() if self._end is None else self._end), self._start
        return {name: count - start.get(name, 0) for name, count in now.items() if count > start.get(name, 0)}

    @property
    def reached(self) -> set[str]:
        return set(self.counts)
