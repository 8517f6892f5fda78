"""batch_matmul's attrs: none (the class exists so that every op is called the same way)."""

from __future__ import annotations

from dataclasses import dataclass

OP = "batch_matmul"


@dataclass(frozen=True)
class BatchMatmulAttrs:
    """batch_matmul has no attrs; the class exists so that every op is called the same way."""
