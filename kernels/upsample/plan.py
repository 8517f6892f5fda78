"""upsample's GPU launch choice as data, pure and device-free: the named GPU path of a launch (plan_path)."""

from __future__ import annotations

from .attrs import OP, UpsampleAttrs


def plan_path(attrs: UpsampleAttrs, direction: str, vector: bool) -> str:
    """The named GPU path (kernels.runtime.gpu_paths) of a launch."""
    return f"{OP}.{attrs.mode.name.lower()}.{direction}" + ("_x2" if vector else "")
