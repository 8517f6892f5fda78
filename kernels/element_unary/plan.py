"""element_unary's GPU launch choices as data, pure and device-free: the backwards that are a device
copy (_COPY_BACKWARD) and the named GPU paths of a launch (plan_paths)."""

from __future__ import annotations

from .attrs import OP, UnaryOpType

_COPY_BACKWARD = frozenset({UnaryOpType.IDENTITY, UnaryOpType.SCALAR_ADD, UnaryOpType.SCALAR_SUB})


def plan_paths(direction: str, op_type: UnaryOpType, aligned: bool) -> tuple[str, str]:
    """The named GPU paths (kernels.runtime.gpu_paths) of a launch: the instantiation and the pack form."""
    return f"{OP}.{direction}.{op_type.name.lower()}", f"{OP}.{direction}.{'packs' if aligned else 'scalars'}"
