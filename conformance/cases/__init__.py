"""One module per op, each holding its case table (`TABLE`), its PyTorch program
(`torch_program`) and its harness (`run`). Register new modules in CASE_MODULES."""

from __future__ import annotations

from ..case import Case
from . import (
    batch_matmul,
    batch_norm,
    concat,
    conv_2d,
    element_binary,
    element_unary,
    gradient_reduction,
    pool_2d,
    reshape,
    softmax,
    split,
    transpose,
    upsample,
)

CASE_MODULES = {
    "conv_2d": conv_2d,
    "batch_norm": batch_norm,
    "pool_2d": pool_2d,
    "transpose": transpose,
    "reshape": reshape,
    "upsample": upsample,
    "batch_matmul": batch_matmul,
    "softmax": softmax,
    "concat": concat,
    "split": split,
    "gradient_reduction": gradient_reduction,
    "element_unary": element_unary,
    "element_binary": element_binary,
}


def all_cases() -> list[Case]:
    """Every declared case, op by op in name order, cases in declaration order."""
    return [case for op in sorted(CASE_MODULES) for case in CASE_MODULES[op].TABLE]
