"""Exchanging tensors with PyTorch through DLPack, bfloat16 included.

DLPack has a bfloat16 type code, but NumPy's ``from_dlpack`` does not take it (PyTorch's bfloat16 tensor
is refused with "Unsupported dtype in DLTensor") and ml_dtypes' bfloat16 is a NumPy dtype of kind "V" that
no DLPack consumer takes (``torch.from_dlpack`` refuses it). Both ways go through uint16, whose bits are
the same: a torch bfloat16 tensor is exchanged as its ``view(torch.uint16)`` and viewed as
``ml_dtypes.bfloat16`` on our side, and a bfloat16 array goes back as ``view(uint16)`` and is viewed as
``torch.bfloat16`` by torch. Views only: no copy either way, on the CPU (NumPy) and the GPU (CuPy).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np

from .core import BFLOAT16


def is_torch(obj: Any) -> bool:
    """Whether `obj` is a torch tensor (without importing torch: only once the caller has)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def producer(obj: Any) -> Any:
    """What to hand a DLPack consumer for `obj`: a torch bfloat16 tensor's uint16 view, else `obj`."""
    if is_torch(obj) and obj.dtype == sys.modules["torch"].bfloat16:
        return obj.view(sys.modules["torch"].uint16)
    return obj


def imported(obj: Any, array: Any) -> Any:
    """The array a consumer made of producer(obj), viewed as ml_dtypes' bfloat16 where obj was bfloat16."""
    if array is not obj and is_torch(obj) and obj.dtype == sys.modules["torch"].bfloat16:
        return array.view(BFLOAT16)
    return array


def from_dlpack(obj: Any, xp: Any = np) -> Any:
    """`obj` (anything with __dlpack__) as an array of `xp` (numpy or cupy) sharing its memory."""
    return imported(obj, xp.from_dlpack(producer(obj)))


def to_torch(array: Any) -> Any:
    """A torch tensor sharing the memory of a NumPy or CuPy array (ml_dtypes' bfloat16 as torch.bfloat16)."""
    import torch

    exported = array.view(np.uint16) if array.dtype == BFLOAT16 else array
    if isinstance(exported, np.ndarray) and not exported.flags.writeable:
        # A read-only array has no DLPack export (NumPy before 2.1 makes every array it imports by DLPack
        # read-only); torch.from_numpy shares the same memory, and warns that torch may write it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            tensor = torch.from_numpy(exported)
    else:
        tensor = torch.from_dlpack(exported)
    return tensor.view(torch.bfloat16) if array.dtype == BFLOAT16 else tensor
