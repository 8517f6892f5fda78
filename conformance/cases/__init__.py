"""One module per op, named as the op (kernels.registry), each holding its case table (`TABLE`),
its PyTorch program (`torch_program`) and its harness (`run`). An op of the registry without a case
module here is an error: every op is judged."""

from __future__ import annotations

import importlib

from kernels.registry import OPS

from ..case import Case

# The case module of each op, in the registry's (name) order.
CASE_MODULES = {name: importlib.import_module(f"{__name__}.{name}") for name in OPS}


def all_cases() -> list[Case]:
    """Every declared case, op by op in name order, cases in declaration order."""
    return [case for op in sorted(CASE_MODULES) for case in CASE_MODULES[op].TABLE]
