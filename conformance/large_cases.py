"""Large differential cases: seeded random cases too big for goldens.h5, declared once here.

The golden cases are small, so the paths only large tensors take are never run by them: the
CPU's blocked paths (activation.cpu.BLOCK_ELEMENTS, softmax's CPU_BLOCK_ELEMENTS, batch_norm's and
pool_2d's blocks, element_binary's parallel threshold, conv_2d's wide and short rows,
cpu.cpu_parallel's parts) and the GPU's grid-stride, unrolled and 16-byte pack bodies (and conv_2d's
untiled depthwise forward). A case
here is (op, name, attrs, tensor shapes, dtype, seed): its inputs are regenerated from the seed
(NumPy's default_rng), never stored, and tests/test_large_cases.py compares the CPU with PyTorch
in float64 within bounds derived from the operation, and the GPU with the CPU
(docs/conformance.md, "Large differential cases").

Groups (`group`): "threshold", shapes on each side of a blocking or launch threshold, and
"yolov10", every shape of tests/bench/test_bench_*.py; "bandwidth" and "grid_stride", sizes for
the GPU's grid-stride loops. `expensive` cases (25 million elements and more: GBs of float64
references) run only with `-m large` or KERNELS_LARGE_CASES=1.
`paths` names, for each CPU path a case is meant to reach, the side of its threshold
(True: past it); the tests check the claim against the kernels' constants.

This module is not a case module (conformance/cases/): goldens.h5 and its digest do not see it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernels import (
    Activation,
    BatchMatmulAttrs,
    BatchNormAttrs,
    BatchNormMode,
    BinaryOpType,
    ConcatAttrs,
    Conv2DAttrs,
    ElementBinaryAttrs,
    ElementUnaryAttrs,
    GradientReductionAttrs,
    Pool2DAttrs,
    PoolOp,
    ReshapeAttrs,
    SoftmaxAttrs,
    SplitAttrs,
    TransposeAttrs,
    UnaryOpType,
    UpsampleAttrs,
    UpsampleMode,
    batch_matmul,
    concat,
    conv_2d,
    pool_2d,
    reshape,
    split,
    transpose,
    upsample,
)

Dims = tuple[int, ...]


@dataclass(frozen=True)
class LargeCase:
    """One large case: the tensors the kernels read, by name, as dims (a list of dims for list
    arguments); values come from default_rng(seed) in declaration order."""

    op: str
    name: str
    attrs: Any
    shapes: dict[str, Any]
    dtype: str = "float32"
    seed: int = 0
    group: str = "threshold"
    expensive: bool = False
    paths: dict[str, bool] = field(default_factory=dict)
    # Op-specific settings the runners take (batch norm's steps, which list gradients are needed,
    # whether upsample runs backward) and value settings: "scale" of the normal values of inputs,
    # "positive" for inputs that must be (rsqrt, fractional powers).
    extra: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def id(self) -> str:
        return f"{self.op}/{self.name}"

    @property
    def elements(self) -> int:
        """Elements of every tensor read: a rough measure of the case's cost."""
        return sum(int(np.prod(d, dtype=np.int64)) for dims in self.shapes.values()
                   for d in (dims if isinstance(dims, list) else [dims]))

    def inputs(self) -> dict[str, Any]:
        """The tensors the kernels read, regenerated from the seed: normal values times `scale`
        (inputs) or 1 (gradients, "output_grad*"), in the case's dtype."""
        rng = np.random.default_rng(self.seed)
        dtype = np.dtype(self.dtype)
        scale = self.extra.get("scale", 1.0)

        def values(name: str, dims: Dims) -> np.ndarray:
            if dtype.kind != "f":
                return rng.integers(-20, 21, dims).astype(dtype)
            array = rng.standard_normal(dims)
            if not name.startswith("output_grad"):
                array *= scale
                if self.extra.get("positive"):
                    array = np.abs(array) + 0.05 * scale
            return array.astype(dtype)

        return {name: [values(name, d) for d in dims] if isinstance(dims, list) else values(name, dims)
                for name, dims in self.shapes.items()}


class LargeTable:
    """The declared large cases, in declaration order; a duplicate op/name is refused."""

    def __init__(self) -> None:
        self.cases: list[LargeCase] = []

    def add(self, case: LargeCase) -> None:
        if any(c.id == case.id for c in self.cases):
            raise ValueError(f"duplicate large case {case.id}")
        self.cases.append(case)


LARGE = LargeTable()


# --------------------------------------------------------------------------- declaring helpers


def _add(op: str, name: str, attrs: Any, shapes: dict[str, Any], **kw: Any) -> None:
    LARGE.add(LargeCase(op, name, attrs, shapes, **kw))


def _unary(op: str, name: str, attrs: Any, dims: Dims, out_dims: Dims, **kw: Any) -> None:
    _add(op, name, attrs, {"input": dims, "output_grad": out_dims}, **kw)


def _conv(name: str, dims: Dims, attrs: Conv2DAttrs, **kw: Any) -> None:
    shapes = {"input": dims, "filter": conv_2d.filter_dims(attrs, dims[1])}
    if attrs.use_bias:
        shapes["bias"] = (attrs.out_channels,)
    shapes["output_grad"] = conv_2d.output_dims(attrs, dims)
    _add("conv_2d", name, attrs, shapes, **kw)


def _pool(name: str, dims: Dims, attrs: Pool2DAttrs, **kw: Any) -> None:
    _unary("pool_2d", name, attrs, dims, pool_2d.output_dims(attrs, dims), **kw)


def _batch_norm(name: str, dims: Dims, attrs: BatchNormAttrs, steps: tuple[bool, ...], **kw: Any) -> None:
    shapes: dict[str, Any] = {}
    for step in range(len(steps)):
        suffix = "" if step == 0 else f"_step{step + 1}"
        shapes["input" + suffix], shapes["output_grad" + suffix] = dims, dims
    if attrs.affine:
        stat = (dims[1],) if attrs.mode is BatchNormMode.SPATIAL else dims[1:]
        shapes["gamma"], shapes["beta"] = stat, stat
    _add("batch_norm", name, attrs, shapes, extra={"steps": list(steps), **kw.pop("extra", {})}, **kw)


def _binary(name: str, op_type: BinaryOpType, lhs: Dims, rhs: Dims, **kw: Any) -> None:
    _add("element_binary", name, ElementBinaryAttrs(op_type),
         {"lhs": lhs, "rhs": rhs, "output_grad": tuple(np.broadcast_shapes(lhs, rhs))}, **kw)


def _concat(name: str, pieces: list[Dims], axis: int, **kw: Any) -> None:
    attrs = ConcatAttrs(axis, len(pieces))
    _add("concat", name, attrs, {"inputs": pieces, "output_grad": concat.output_dims(attrs, pieces)},
         extra={"needed": [True] * len(pieces)}, **kw)


def _split(name: str, dims: Dims, splits: tuple[int, ...], axis: int, **kw: Any) -> None:
    attrs = SplitAttrs(splits, axis)
    _add("split", name, attrs, {"input": dims, "output_grads": split.output_dims(attrs, dims)},
         extra={"needed": []}, **kw)


def _matmul(name: str, lhs: Dims, rhs: Dims, **kw: Any) -> None:
    _add("batch_matmul", name, BatchMatmulAttrs(),
         {"lhs": lhs, "rhs": rhs, "output_grad": batch_matmul.output_dims(lhs, rhs)}, **kw)


def _softmax(name: str, dims: Dims, dim: int, **kw: Any) -> None:
    _unary("softmax", name, SoftmaxAttrs(dim), dims, dims, extra={"scale": 3.0}, **kw)


def _element_unary(name: str, op_type: UnaryOpType, dims: Dims, scalar: float | None = None, **kw: Any) -> None:
    _unary("element_unary", name, ElementUnaryAttrs(op_type, scalar), dims, dims,
           extra={"scale": 2.0, **kw.pop("extra", {})}, **kw)


def _gradient_reduction(name: str, dims: Dims, count: int, **kw: Any) -> None:
    _add("gradient_reduction", name, GradientReductionAttrs(), {"inputs": [dims] * count, "output_grad": dims},
         extra={"needed": [True] * count}, **kw)


def _upsample(name: str, dims: Dims, attrs: UpsampleAttrs, **kw: Any) -> None:
    _unary("upsample", name, attrs, dims, upsample.output_dims(attrs, dims), extra={"backward": True}, **kw)


def _transpose(name: str, dims: Dims, permutation: tuple[int, ...], **kw: Any) -> None:
    attrs = TransposeAttrs(permutation)
    _unary("transpose", name, attrs, dims, transpose.output_dims(attrs, dims), **kw)


def _reshape(name: str, dims: Dims, shape: tuple[int, ...], **kw: Any) -> None:
    attrs = ReshapeAttrs(shape)
    _unary("reshape", name, attrs, dims, reshape.output_dims(attrs, dims), **kw)


SILU, RELU, GELU = Activation.SILU, Activation.RELU, Activation.GELU
MAX, AVG = PoolOp.MAX, PoolOp.AVG
B17 = 1 << 17  # activation.cpu.BLOCK_ELEMENTS, softmax.cpu.CPU_BLOCK_ELEMENTS
B16 = 1 << 16  # batch_norm's CPU_BLOCK_ELEMENTS, pool_2d.cpu's CPU_BACKWARD_BLOCK, element_binary's _CPU_PARALLEL_MIN
Y = {"group": "yolov10"}
BIG = {"group": "yolov10", "expensive": True}  # 25 million elements and more

# --------------------------------------------------------------------------- threshold cases
# Each pair sits on either side of one CPU threshold; `paths` states which side.

# activation.blockwise (element_unary and every fused activation): one call up to BLOCK_ELEMENTS,
# blocks of it shared out to the threads above (a ragged last block too).
_element_unary("silu_at_block", UnaryOpType.SILU, (B17,), seed=1, paths={"activation_blocks": False})
_element_unary("silu_past_block", UnaryOpType.SILU, (3, 43691), seed=2, paths={"activation_blocks": True})
_element_unary("gelu_5_blocks_float64", UnaryOpType.GELU, (5 * B17 + 77,), dtype="float64", seed=3,
               paths={"activation_blocks": True})
_element_unary("tanh_past_block", UnaryOpType.TANH, (B17 + 1,), seed=4, paths={"activation_blocks": True})
_element_unary("pow_1.5_past_block", UnaryOpType.POW, (2, B17 + 5), scalar=1.5, seed=5,
               extra={"positive": True}, paths={"activation_blocks": True})
_element_unary("rsqrt_past_block_float64", UnaryOpType.RSQRT, (B17 + 3,), dtype="float64", seed=6,
               extra={"positive": True}, paths={"activation_blocks": True})
_element_unary("elu_past_block", UnaryOpType.ELU, (4, 65537), scalar=0.5, seed=7, paths={"activation_blocks": True})
_element_unary("relu_past_block", UnaryOpType.RELU, (B17 + 9,), seed=8, paths={"activation_blocks": True})

# conv_2d: im2col as a strided view for output rows of WIDE_ROWS_BELOW (64) or more, through the
# stride phases below; the fused activation blocked past BLOCK_ELEMENTS outputs.
_conv("wide_row_64_s2_p1", (1, 8, 128, 127), Conv2DAttrs(16, 3, 3, 2, 2, 1, 1), seed=10,
      paths={"conv_wide_rows": True, "conv_plain": False})
_conv("short_row_63_s2_p1", (1, 8, 126, 125), Conv2DAttrs(16, 3, 3, 2, 2, 1, 1), seed=11,
      paths={"conv_wide_rows": False, "conv_plain": False})
_conv("wide_silu_past_block", (2, 4, 96, 96), Conv2DAttrs(16, 3, 3, 1, 1, 1, 1, use_bias=True, activation=SILU),
      seed=12, paths={"conv_wide_rows": True, "conv_plain": False, "activation_blocks": True})
_conv("short_depthwise_x2_silu_past_block", (8, 8, 80, 80),
      Conv2DAttrs(16, 3, 3, 2, 2, 1, 1, groups=8, activation=SILU), seed=13,
      paths={"conv_wide_rows": False, "conv_plain": False, "activation_blocks": True})
_conv("short_dilated_groups2_relu", (2, 6, 70, 70), Conv2DAttrs(8, 3, 5, 1, 2, 2, 1, 2, 3, groups=2, activation=RELU),
      seed=14, paths={"conv_wide_rows": False, "conv_plain": False})
_conv("plain_1x1_bias_gelu_past_block", (2, 16, 70, 70), Conv2DAttrs(32, 1, 1, use_bias=True, activation=GELU),
      seed=15, paths={"conv_wide_rows": True, "conv_plain": True, "activation_blocks": True})
# On the GPU: a depthwise forward whose one-output tile already reaches an input region past the shared
# memory a block may use (conv_2d/plan.py DEPTHWISE_SHARED_LIMIT: 113 x 113 floats) runs untiled.
_conv("depthwise_dilated_56_untiled", (1, 2, 120, 120),
      Conv2DAttrs(2, 3, 3, 1, 1, 56, 56, 56, 56, groups=2, use_bias=True, activation=SILU), seed=16,
      paths={"conv_wide_rows": True, "conv_plain": False})

# softmax: cache-sized blocks of whole rows (dim last), of rows by inner (size * inner up to
# CPU_BLOCK_ELEMENTS), or of inner columns at least 4 wide past it, or whole rows where dim alone is
# longer than a block / 4.
_softmax("last_dim_below_block", (327, 400), -1, seed=20, paths={"softmax_rows_blocked": False})
_softmax("last_dim_past_block", (400, 400), -1, seed=21, paths={"softmax_rows_blocked": True})
_softmax("last_dim_longer_than_block", (2, B17 + 3), -1, seed=22, paths={"softmax_rows_blocked": True})
_softmax("inner_at_block", (3, 16, 8192), 1, seed=23, paths={"softmax_inner_columns": False})
_softmax("inner_past_block", (2, 16, 8193), 1, seed=24,
         paths={"softmax_inner_columns": True, "softmax_long_dim": False})
_softmax("inner_past_block_long_dim", (2, 33000, 5), 1, seed=25,
         paths={"softmax_inner_columns": True, "softmax_long_dim": True})

# batch_norm: blocks of whole (stats, inner) rows below CPU_BLOCK_ELEMENTS inner values, of inner
# itself from it; training then inference, with a fused activation.
_batch_norm("inner_below_block", (2, 4, 255, 257), BatchNormAttrs(eps=1e-3, momentum=0.03, activation=SILU),
            (True, False), seed=30, paths={"batch_norm_inner_blocks": False})
_batch_norm("inner_at_block", (2, 3, 256, 256), BatchNormAttrs(eps=1e-3, momentum=0.03, activation=SILU),
            (True, False), seed=31, paths={"batch_norm_inner_blocks": True})
_batch_norm("per_activation_past_block", (3, 2, 200, 200),
            BatchNormAttrs(eps=1e-5, momentum=None, mode=BatchNormMode.PER_ACTIVATION), (True, True, False), seed=32,
            paths={"batch_norm_inner_blocks": False})

# pool_2d: MAX backward over blocks of whole planes up to pool_2d.cpu.CPU_BACKWARD_BLOCK outputs, one plane a
# block past it; fused activations blocked past BLOCK_ELEMENTS.
_pool("max_planes_per_block", (2, 3, 128, 128), Pool2DAttrs(3, 3, 1, 1, 1, 1, MAX), seed=40,
      paths={"pool_one_plane_blocks": False})
_pool("max_plane_at_block", (1, 3, 256, 256), Pool2DAttrs(3, 3, 1, 1, 1, 1, MAX), seed=41,
      paths={"pool_one_plane_blocks": False})
_pool("max_plane_past_block", (1, 3, 257, 256), Pool2DAttrs(3, 3, 1, 1, 1, 1, MAX, activation=SILU), seed=42,
      paths={"pool_one_plane_blocks": True, "activation_blocks": True})
_pool("avg_no_pad_count_past_block", (2, 3, 161, 300), Pool2DAttrs(3, 2, 1, 2, 1, 1, AVG, False, activation=GELU),
      seed=43, paths={"activation_blocks": True})
# The GPU MAX forward: tiles through shared memory up to 48 KB, one thread an output past it.
_pool("max_tile_past_shared_memory", (2, 3, 96, 96), Pool2DAttrs(32, 32, 32, 32, 0, 0, MAX), dtype="float64", seed=44,
      description="a 3x3 output tile reads a 96x96 float64 window: past the tiled GPU forward's 48 KB of shared "
                  "memory, so the direct kernel runs (pool_2d.max.forward_direct), with int argmax taps")

# element_binary: one call below _CPU_PARALLEL_MIN outputs, parts along the first axis at least as
# long as the threads from it.
_binary("add_below_parallel", BinaryOpType.ADD, (255, 257), (255, 257), seed=50, paths={"binary_parallel": False})
_binary("add_at_parallel", BinaryOpType.ADD, (256, 256), (256, 256), seed=51, paths={"binary_parallel": True})
_binary("div_broadcast_left_past_parallel", BinaryOpType.DIV, (1, 300), (257, 1, 300), seed=52,
        paths={"binary_parallel": True})
_binary("max_past_parallel", BinaryOpType.MAX, (3, 1, 181, 181), (3, 2, 181, 181), seed=53,
        paths={"binary_parallel": True})
_binary("sub_size1_lead_past_parallel", BinaryOpType.SUB, (1, 70000), (1,), seed=54,
        paths={"binary_parallel": True})

# --------------------------------------------------------------------------- YOLOv10 shapes
# Every shape of tests/bench/test_bench_*.py, forward and backward (bandwidth: below).

_matmul("psa_scores_1x5_400x32_32x400", (1, 5, 400, 32), (1, 5, 32, 400), seed=100, **Y)
_matmul("psa_values_1x5_64x400_400x400", (1, 5, 64, 400), (1, 5, 400, 400), seed=101, **Y)
_batch_norm("v10_stem_1x16x320x320_silu", (1, 16, 320, 320), BatchNormAttrs(eps=1e-3, momentum=0.03, activation=SILU),
            (True, False), seed=102, paths={"batch_norm_inner_blocks": True}, **Y)
_batch_norm("v10n_deep_1x256x20x20_silu", (1, 256, 20, 20), BatchNormAttrs(eps=1e-3, momentum=0.03, activation=SILU),
            (True, False), seed=103, paths={"batch_norm_inner_blocks": False}, **Y)
_concat("sppf_4x1x320x20x20", [(1, 320, 20, 20)] * 4, 1, seed=104, **Y)
_concat("head_1x144x6400_1600_400_last_axis", [(1, 144, 6400), (1, 144, 1600), (1, 144, 400)], -1, seed=105, **Y)
_concat("large_4x1x256x160x160", [(1, 256, 160, 160)] * 4, 1, seed=106, **BIG)
_conv("stem_3x3s2_1x3x640x640_16", (1, 3, 640, 640), Conv2DAttrs(16, 3, 3, 2, 2, 1, 1), seed=107,
      paths={"conv_wide_rows": True}, **Y)
_conv("c2f_3x3_1x32x160x160_32", (1, 32, 160, 160), Conv2DAttrs(32, 3, 3, 1, 1, 1, 1), seed=108,
      paths={"conv_wide_rows": True}, **Y)
_conv("scdown_dw3x3s2_1x64x80x80", (1, 64, 80, 80), Conv2DAttrs(64, 3, 3, 2, 2, 1, 1, groups=64), seed=109,
      paths={"conv_wide_rows": False}, **Y)
_conv("head_1x1_bias_1x64x80x80_64", (1, 64, 80, 80), Conv2DAttrs(64, 1, 1, use_bias=True), seed=110,
      paths={"conv_plain": True}, **Y)
_binary("residual_add_1x80x160x160", BinaryOpType.ADD, (1, 80, 160, 160), (1, 80, 160, 160), seed=111,
        paths={"binary_parallel": True}, **Y)
_binary("channel_mul_1x80x160x160_1x80x1x1", BinaryOpType.MUL, (1, 80, 160, 160), (1, 80, 1, 1), seed=112,
        paths={"binary_parallel": True}, **Y)
_element_unary("silu_1x80x320x320", UnaryOpType.SILU, (1, 80, 320, 320), seed=113,
               paths={"activation_blocks": True}, **Y)
_gradient_reduction("3x1x80x160x160", (1, 80, 160, 160), 3, seed=114, **Y)
_pool("sppf_v10n_1x128x20x20", (1, 128, 20, 20), Pool2DAttrs(5, 5, 1, 1, 2, 2, MAX), seed=115,
      paths={"pool_one_plane_blocks": False}, **Y)
_pool("sppf_v10x_1x640x20x20", (1, 640, 20, 20), Pool2DAttrs(5, 5, 1, 1, 2, 2, MAX), seed=116,
      paths={"pool_one_plane_blocks": False}, **Y)
_pool("sppf_8x256x80x80", (8, 256, 80, 80), Pool2DAttrs(5, 5, 1, 1, 2, 2, MAX), seed=117, **BIG)
_reshape("flatten_1x640x160x160", (1, 640, 160, 160), (1, 640, 25600), seed=118, **Y)
_reshape("psa_1x640x20x20_to_1x5x128x400", (1, 640, 20, 20), (1, 5, 128, 400), seed=119, **Y)
_softmax("psa_1x5x400x400_dim-1", (1, 5, 400, 400), -1, seed=120, paths={"softmax_rows_blocked": True}, **Y)
_softmax("dfl_1x16x4x8400_dim1", (1, 16, 4, 8400), 1, seed=121, paths={"softmax_inner_columns": True}, **Y)
_split("c2f_1x160x160x160_halves", (1, 160, 160, 160), (80, 80), 1, seed=122, **Y)
_split("psa_1x5x128x400_32_32_64", (1, 5, 128, 400), (32, 32, 64), 2, seed=123, **Y)
_transpose("psa_1x5x128x400_0132", (1, 5, 128, 400), (0, 1, 3, 2), seed=124, **Y)
_transpose("nchw_to_nhwc_8x64x160x160", (8, 64, 160, 160), (0, 2, 3, 1), seed=125, **BIG)
_upsample("nearest_x2_1x640x20x20", (1, 640, 20, 20), UpsampleAttrs(2, UpsampleMode.NEAREST), seed=126, **Y)
_upsample("nearest_x2_1x640x40x40", (1, 640, 40, 40), UpsampleAttrs(2, UpsampleMode.NEAREST), seed=127, **Y)
_upsample("bilinear_x2_1x64x80x80", (1, 64, 80, 80), UpsampleAttrs(2, UpsampleMode.BILINEAR), seed=128, **Y)

# tests/bench/test_bench_bandwidth.py: 16x64x256x256 float32 (64 Mi elements, 256 MB a tensor), the
# memory-bound kernels at the size where the GPU's grid-stride loops (65536 blocks of 256 threads,
# 16-byte packs) run more than once. Expensive.
BW = (16, 64, 256, 256)
BWX = {"group": "bandwidth", "expensive": True}
_reshape("bandwidth_flatten", BW, (16 * 64, 256 * 256), seed=200, **BWX)
_transpose("bandwidth_last_two", BW, (0, 1, 3, 2), seed=201, **BWX)
_concat("bandwidth_4_channels", [(16, 16, 256, 256)] * 4, 1, seed=202, **BWX)
_split("bandwidth_4_channels", BW, (16,) * 4, 1, seed=203, **BWX)
_upsample("bandwidth_nearest_x2", (16, 64, 128, 128), UpsampleAttrs(2, UpsampleMode.NEAREST), seed=204, **BWX)
_element_unary("bandwidth_silu", UnaryOpType.SILU, BW, seed=205, **BWX)
_binary("bandwidth_add", BinaryOpType.ADD, BW, BW, seed=206, **BWX)
_softmax("bandwidth_last_dim_1024", (16 * 64 * 256 * 256 // 1024, 1024), -1, seed=207, **BWX)
_pool("bandwidth_max_3x3_s1", BW, Pool2DAttrs(3, 3, 1, 1, 1, 1, MAX), seed=208, **BWX)
_batch_norm("bandwidth_inference", BW, BatchNormAttrs(eps=1e-3, momentum=0.03), (False,), seed=209, **BWX)
_gradient_reduction("bandwidth_2", BW, 2, seed=210, **BWX)

# --------------------------------------------------------------------------- GPU grid strides
# Past the most threads a launch has (gpu.grid_for: 65536 blocks of 256, 2**24 threads): the
# grid-stride loops run a second, ragged round, element-wise (1 a thread) and in 16-byte packs
# (2 float64 a thread). Expensive.
GS = {"group": "grid_stride", "expensive": True}
_element_unary("grid_stride_sigmoid_packs_float64", UnaryOpType.SIGMOID, ((1 << 25) + 3,), dtype="float64",
               seed=300, **GS)
_gradient_reduction("grid_stride_2x", ((1 << 24) + 257,), 2, seed=301, **GS)
_transpose("grid_stride_4097x4099", (4097, 4099), (1, 0), seed=302, **GS)
_binary("grid_stride_mul_broadcast", BinaryOpType.MUL, ((1 << 12) + 1, 1), ((1 << 12) + 3,), seed=303, **GS)
