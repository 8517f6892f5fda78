"""Named CPU paths: the branches of the CPU code that only tensors past a size take (blocked passes,
passes shared out to the threads, conv_2d's wide rows), each with a name, declared by the code that
takes it and counted when taken, so that a run can say which it reached (the twin of
:mod:`kernels.runtime.gpu_paths`, whose paths coverage.py cannot see at all; these it sees, but only a run
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

from .paths import NAME, PathRegistry, Recording

# Locked: the parts of a pass reach from the pool's threads at once.
REGISTRY = PathRegistry("CPU", "kernels.runtime.cpu_paths", "softmax.rows.blocks", locked=True)
declare, reach, declared, counts, recording = (REGISTRY.declare, REGISTRY.reach, REGISTRY.declared, REGISTRY.counts,
                                               REGISTRY.recording)


def reach_if(name: str, taken: bool) -> None:
    """Reach `name` where `taken`: the kernel states its size gate once, without a branch of its own."""
    if taken:
        reach(name)


def reach_part(name: str, first: int, last: int, count: int) -> None:
    """Reach `name` where the part [first, last) is not the whole of range(count): the pass that
    runs it was shared out (a part function calls it)."""
    reach_if(name, last - first < count)


__all__ = ["NAME", "REGISTRY", "Recording", "declare", "reach", "reach_if", "reach_part", "declared",
           "counts", "recording"]
