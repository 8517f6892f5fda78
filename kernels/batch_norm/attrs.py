"""batch_norm's attrs, BatchNormMode, and the state with what a forward keeps for backward
(SavedForward, which cpu.py and gpu.py both make); the op's contract is the package's docstring."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import activation as activations
from ..activation import Activation
from ..runtime import core
from ..runtime.core import AttrsError, TensorShape, fail

if TYPE_CHECKING:
    from .gpu import GpuCalls
    from .plan import GpuPlan, Layout

OP = "batch_norm"


class BatchNormMode(enum.Enum):
    """SPATIAL: one statistic per channel (BatchNorm2d); PER_ACTIVATION: one per (c, h, w) (BatchNorm1d over N)."""

    SPATIAL = "SPATIAL"
    PER_ACTIVATION = "PER_ACTIVATION"


def _attr_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(value):
        raise fail(AttrsError, OP, name, "a finite real number", repr(value))
    return float(value)


@dataclass(frozen=True)
class BatchNormAttrs:
    """affine: gamma and beta are given; eps > 0; 0 <= momentum <= 1, or None for the cumulative average."""

    affine: bool = True
    eps: float = 1e-5
    momentum: float | None = 0.1
    mode: BatchNormMode = BatchNormMode.SPATIAL
    activation: Activation | None = None  # applied after the normalization, forward and backward
    # False: no backward will be called on the state (inference only). The forward then keeps nothing
    # for one (no copy of a fused activation's pre-activation) and backward_kernel raises StateError.
    backward: bool = True

    def __post_init__(self) -> None:
        core.set_attr(self, "affine", core.attr_bool(OP, "affine", self.affine))
        core.set_attr(self, "backward", core.attr_bool(OP, "backward", self.backward))
        eps = _attr_real("eps", self.eps)
        if eps <= 0:
            raise fail(AttrsError, OP, "eps", "a number > 0", eps)
        core.set_attr(self, "eps", eps)
        if self.momentum is not None:
            momentum = _attr_real("momentum", self.momentum)
            if not 0.0 <= momentum <= 1.0:
                raise fail(AttrsError, OP, "momentum", "a number in [0, 1] or None (cumulative average)", momentum)
            core.set_attr(self, "momentum", momentum)
        core.set_attr(self, "mode", core.attr_enum(OP, "mode", self.mode, BatchNormMode))
        core.set_attr(self, "activation", activations.attr_activation(OP, self.activation))


# --------------------------------------------------------------------------- the state


@dataclass(frozen=True)
class SavedForward:
    """What backward needs from the forward before it: whether it trained (batch statistics) or not
    (running ones), whether the input was empty, and on the CPU the float64 mean and inverse deviation
    per statistic (the GPU keeps them in the state's device arrays)."""

    training: bool
    empty: bool = False
    mean: np.ndarray | None = None
    invstd: np.ndarray | None = None


@dataclass(eq=False)
class BatchNormState(core.KernelState):
    """The running statistics (arrays on the state's device, shaped and typed like gamma: the input's dtype,
    float32 for a half input;
    a caller may read them or overwrite them, in place or by assignment), the number of training
    forwards so far, and what backward needs from the forward before it (`forward`, `pre`)."""

    running_mean: Any = None
    running_var: Any = None
    num_batches_tracked: int = 0
    # Set by init_kernel.
    layout: Layout | None = None
    stat_shape: TensorShape | None = None  # of gamma, beta and the running statistics
    # Kept by forward for backward: the forward's kind and statistics, and the pre-activation of a
    # fused activation (made by the first forward that needs it, kept until cleanup).
    forward: SavedForward | None = None
    pre: Any = None
    # CPU only: the float64 pre-activation gradient of a fused activation's backward, written by its
    # sums pass and read by its apply (made by the first such backward, kept until cleanup).
    cpu_grad: Any = None
    # GPU only. Made by init_kernel: the plan, float64 device arrays of the saved mean and inverse
    # deviation (written by a forward, read by backward), backward's coefficients and the partial sums,
    # and the event recorded after init's fills (None once they are seen complete). Made by the first
    # GPU call: the launches' fixed parts.
    plan: GpuPlan | None = None
    saved_mean: Any = None
    saved_invstd: Any = None
    coef: Any = None
    partials: Any = None
    ready: Any = None
    calls: GpuCalls | None = None

    def training_step(self) -> float:
        """Count a training forward; the weight of its statistics (momentum None: 1 / steps so far, as torch)."""
        self.num_batches_tracked += 1
        momentum = self.attrs.momentum
        return 1.0 / self.num_batches_tracked if momentum is None else momentum

    def release(self) -> None:
        super().release()
        self.running_mean = self.running_var = self.forward = self.pre = self.cpu_grad = None
        self.saved_mean = self.saved_invstd = self.coef = self.partials = self.ready = self.calls = None
