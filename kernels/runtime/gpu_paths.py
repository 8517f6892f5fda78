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

from .paths import NAME, PathRegistry, Recording

REGISTRY = PathRegistry("GPU", "kernels.runtime.gpu_paths", "concat.kernel.join")
declare, reach, check = REGISTRY.declare, REGISTRY.reach, REGISTRY.check
declared, counts, recording = REGISTRY.declared, REGISTRY.counts, REGISTRY.recording

__all__ = ["NAME", "REGISTRY", "Recording", "declare", "reach", "check", "declared", "counts", "recording"]
