"""The kernels' errors in the terms of the functional call that met them.

A kernel names itself and its own arguments (``conv_2d: filter: ...``, ``element_binary: rhs_shape: ...``);
a caller of ``kernels.functional.conv2d(input, weight)`` passed neither. ``in_user_terms`` rewrites such a
message as the function and its arguments (``conv2d: weight: ...``, ``add: other: ...``), the argument
names inside the message too, into an error of the same class; the kernel's own message stays as its
``__cause__`` (kernels/functional.py's ``_ordered`` raises the new one from it).
"""

from __future__ import annotations

import re

from .runtime.core import CudaError, KernelError

# A kernel argument -> the functional argument that carries it, for every op; "[i]" keeps the index.
_COMMON = {
    "input_shape": "input", "output_shape": "output", "output_grad": "grad_output",
    "output_grads[i]": "grad_outputs[i]",
}
# The kernels' per-axis attrs: one entry of the function's (H, W) pair.
_PAIRS = {f"{name}_{axis}": f"{name}[{index}]" for name in ("stride", "padding", "dilation")
          for index, axis in enumerate("hw")}
# Per kernel op (its OP name), the arguments whose functional name differs.
_PER_OP = {
    "conv_2d": {"filter": "weight", "filter_shape": "weight", "filter_grad": "weight.grad", **_PAIRS},
    "pool_2d": {"kernel_h": "kernel_size[0]", "kernel_w": "kernel_size[1]", **_PAIRS},
    "batch_norm": {"gamma": "weight", "beta": "bias", "state.running_mean": "running_mean",
                   "state.running_var": "running_var"},
    "concat": {"input_shapes[i]": "tensors[i]", "inputs[i]": "tensors[i]", "axis": "dim"},
    "gradient_reduction": {"input_shapes[i]": "tensors[i]", "inputs[i]": "tensors[i]"},
    "split": {"input_shape": "tensor", "input": "tensor", "splits": "split_size_or_sections",
              "splits[i]": "split_size_or_sections[i]", "axis": "dim"},
    "top_k": {"values_grad": "grad_values"},
    "transpose": {"permutation": "dims"},
    "batch_matmul": {"lhs": "input", "lhs_shape": "input", "rhs": "other", "rhs_shape": "other"},
    "element_binary": {"lhs": "input", "lhs_shape": "input", "rhs": "other", "rhs_shape": "other"},
}
# Per function, where one kernel argument is a different argument of it (a number operand, a scalar).
_PER_FUNCTION = {
    "elu": {"scalar": "alpha"}, "pow": {"scalar": "exponent"},
    "add": {"scalar": "other"}, "sub": {"scalar": "other"}, "mul": {"scalar": "other"}, "div": {"scalar": "other"},
    "transpose": {"permutation": "dim0/dim1"},
}
# Kernel argument names that are also plain words of a message's text: renamed as the argument only.
_PROSE = frozenset({"permutation", "axis", "scalar", "input", "splits"})
_MESSAGE = re.compile(r"(?s)([a-z_0-9]+): ([^:\s]+): (.*)")


def _names(kernel_op: str, function: str) -> dict[str, str]:
    return {**_COMMON, **_PER_OP.get(kernel_op, {}), **_PER_FUNCTION.get(function, {})}


def _rename(text: str, names: dict[str, str], prose: bool = False) -> str:
    """Every kernel argument named in `text` (a whole word, "name[3]" for the indexed ones) renamed; in
    `prose` (a message's text after the argument) not the names that are also plain words."""
    if prose:
        names = {key: value for key, value in names.items() if key not in _PROSE}

    def replace(match: re.Match) -> str:
        word, index = match[1], match[2]
        if index is not None:
            return names[f"{word}[i]"].replace("[i]", f"[{index}]") if f"{word}[i]" in names else match[0]
        return names.get(word, word)

    return re.sub(r"\b([a-z_]+(?:\.[a-z_]+)?)(?:\[(\d+)\])?(?![\w.])", replace, text)


def in_user_terms(error: KernelError, function: str, kernel_ops: frozenset[str]) -> KernelError | None:
    """`error` raised by a kernel (one of `kernel_ops`) inside the functional call `function`, as an error of
    the same class naming `function` and its arguments; None where it is already in those terms (raised by
    the functional layer itself) or is not an argument's (a library failure)."""
    match = _MESSAGE.fullmatch(str(error))
    if isinstance(error, CudaError) or match is None or match[1] not in kernel_ops:
        return None
    kernel_op, argument, rest = match.groups()
    names = _names(kernel_op, function)
    renamed = f"{function}: {_rename(argument, names)}: {_rename(rest, names, prose=True)}"
    if renamed == str(error):
        return None
    return type(error)(renamed)
