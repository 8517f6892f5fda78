"""The fused activations' GPU launch choice as data, pure and device-free: the named GPU paths of a
launch (plan_paths)."""

from __future__ import annotations

from .attrs import Activation


def plan_paths(direction: str, activation: Activation, aligned: bool) -> tuple[str, str]:
    """The named GPU paths (kernels.runtime.gpu_paths) of a launch: the instantiation and the pack form."""
    return f"activation.{direction}.{activation.name.lower()}", f"activation.{direction}.{'packs' if aligned else 'scalars'}"
