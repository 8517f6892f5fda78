"""Every op of the library, found by its declaration: each package ``kernels/<op>/`` whose
``__init__.py`` ends with ``SPEC = declare_op(...)`` (kernels.runtime.spec) is an op. Nothing else
lists them: adding an op is adding its folder.

``OPS`` maps each op's name to its ``OpSpec``, in name order.
"""

from __future__ import annotations

import importlib
import pkgutil

from .runtime.spec import OpSpec


def _discover() -> dict[str, OpSpec]:
    package = importlib.import_module(__package__)
    found = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        if not info.ispkg:
            continue
        spec = getattr(importlib.import_module(f"{__package__}.{info.name}"), "SPEC", None)
        if isinstance(spec, OpSpec):
            found[spec.name] = spec
    return found


OPS: dict[str, OpSpec] = _discover()

__all__ = ["OPS", "OpSpec"]
