"""conv_2d's attrs and its state (with the state's cuDNN descriptors); the op's contract is the
package's docstring."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import activation
from ..runtime import core
from ..runtime.core import AttrsError, fail

if TYPE_CHECKING:
    from .plan import Direction, Fold, Gemm, Path

OP = "conv_2d"


@dataclass(frozen=True)
class Conv2DAttrs:
    out_channels: int
    kernel_h: int
    kernel_w: int
    stride_h: int = 1
    stride_w: int = 1
    padding_h: int = 0
    padding_w: int = 0
    dilation_h: int = 1
    dilation_w: int = 1
    groups: int = 1
    use_bias: bool = False
    activation: activation.Activation | None = None  # applied after the bias
    # False: no backward will be called on the state (inference only). A fused activation's forward then
    # keeps no pre-activation (it is applied in the output itself) and backward_kernel raises StateError.
    backward: bool = True

    def __post_init__(self) -> None:
        for name in ("out_channels", "kernel_h", "kernel_w", "stride_h", "stride_w", "dilation_h", "dilation_w",
                     "groups"):
            core.set_attr(self, name, core.attr_int(OP, name, getattr(self, name), minimum=1))
        for name in ("padding_h", "padding_w"):
            core.set_attr(self, name, core.attr_int(OP, name, getattr(self, name), minimum=0))
        if self.out_channels % self.groups:
            raise fail(AttrsError, OP, "groups", f"a divisor of out_channels ({self.out_channels})", self.groups)
        core.set_attr(self, "use_bias", core.attr_bool(OP, "use_bias", self.use_bias))
        core.set_attr(self, "activation", activation.attr_activation(OP, self.activation))
        core.set_attr(self, "backward", core.attr_bool(OP, "backward", self.backward))


@dataclass(eq=False)
class Conv2DDescriptors:
    """The cuDNN descriptors of one GPU state (None where not made: a zero-size convolution, no bias),
    owned by it until cleanup."""

    x: Any = None  # the input
    w: Any = None  # the filter
    y: Any = None  # the output
    bias: Any = None  # (1, O, 1, 1)
    conv: Any = None  # the convolution
    # Each direction's cuDNN backend plan (cudnn.ConvolutionPlan: its graph, engine, plan and variant pack),
    # made at init where that direction runs in cuDNN and KERNELS_CUDNN_BACKEND is not 0 (the backward ones
    # only for a state made for backward); None: that direction's legacy call.
    forward_plan: Any = None
    backward_data_plan: Any = None
    backward_filter_plan: Any = None

    def destroy(self) -> list[core.KernelError]:
        """Destroy every descriptor made, each once; return the failures (the others are destroyed anyway)."""
        errors = []
        for name in ("forward_plan", "backward_data_plan", "backward_filter_plan", "y", "bias", "x", "w", "conv"):
            descriptor = getattr(self, name)
            if descriptor is None:
                continue
            setattr(self, name, None)
            try:
                descriptor.destroy()
            except core.KernelError as error:
                errors.append(error)
        return errors


@dataclass(eq=False)
class Conv2DState(core.KernelState):
    """The state of one conv_2d: the pre-activation its last forward kept (a fused activation's
    backward reads it); on the GPU also its cuDNN descriptors, the path and cuDNN algorithm of each
    direction (chosen at init), the workspace they need, and what the calls make once and keep.
    core.KernelState's `saved` dict is unused."""

    # The forward's pre-activation, for the backward of a fused activation (None: no forward yet).
    pre: Any = None
    # GPU, made at init.
    descriptors: Conv2DDescriptors = field(default_factory=Conv2DDescriptors)
    algorithms: dict[Direction, Any] = field(default_factory=dict)  # cudnn.Algorithm of each direction
    paths: dict[Direction, Path] = field(default_factory=dict)  # plan.choose_paths
    workspace_size: int = 0  # bytes of the handle's workspace the calls use
    tf32: bool = False  # float32 with the handle's allow_tf32: cuDNN and cuBLAS may use TF32 tensor cores
    chunk: int = 1  # images whose columns and per-image filter gradients the workspace holds at once
    partials_at: int = 0  # where in the workspace (elements) the per-image filter gradients start
    tile: tuple[int, int, int] | None = None  # a depthwise forward's (tile_h, tile_w, shared bytes): plan.depthwise_tile
    rows: tuple[int, int, int] | None = None  # its (kernel_h, kernel_w, stride) where it has its own kernels: plan.depthwise_rows
    filter_taps: bool = False  # its filter gradient a block a channel for all taps: plan.depthwise_filter_taps
    filter_taps_blocks: int = 1  # the blocks an SM holds that kernel is compiled for: plan.depthwise_filter_taps_blocks
    # GPU, made on first use and kept until cleanup: the shapes and attrs never change after init.
    pre_buffer: Any = None  # the pre-activation (a fused activation's forward writes it, then output)
    pre_grad_buffer: Any = None  # the pre-activation's gradient
    geometry: Any = None  # struct ConvGeometry of conv_2d.cu (a NumPy scalar)
    turned_geometry: Any = None  # a stride-1 depthwise input gradient's, as the forward of the turned filter
    forward_plan: list[Gemm] | None = None
    backward_data_plan: list[Gemm | Fold] | None = None
    backward_filter_plan: list[Gemm | Fold] | None = None
    # conv_2d.cu's launches (gpu.PackedLaunch), by what a call picks: the kernel and whether the bias is
    # given and which activation is fused ("depthwise_forward" and "epilogue"), or the kernel alone.
    launches: dict[tuple, Any] = field(default_factory=dict)

    def release(self) -> None:
        errors = self.descriptors.destroy()  # destroy them all, then report the first failure
        self.pre = self.pre_buffer = self.pre_grad_buffer = self.geometry = self.turned_geometry = None
        self.forward_plan = self.backward_data_plan = self.backward_filter_plan = None
        self.launches.clear()
        self.algorithms.clear()
        self.paths.clear()
        super().release()
        if errors:
            raise errors[0]
