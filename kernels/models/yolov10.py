"""YOLOv10 (ultralytics' yolov10{n,s,m,b,l,x}.yaml) built from the kernels' op calls.

The blocks mirror ultralytics' modules: each declares its parameters in the order ultralytics
registers them (so the state_dict's names and order are ultralytics'), and traces its forward
into a Graph of primitive op calls. Channel widths and repeats follow ultralytics' parse_model:
c = make_divisible(min(c, max_channels) * width, 8), n = max(round(n * depth), 1).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from ..activation import Activation
from ..batch_norm import BatchNormAttrs
from ..conv_2d import Conv2DAttrs
from ..element_binary import BinaryOpType
from ..element_unary import UnaryOpType
from ..pool_2d import Pool2DAttrs, PoolOp
from ..runtime.core import HALF_DTYPES, AttrsError, ShapeError, fail
from ..upsample import UpsampleAttrs
from .detections import Detections
from .graph import Graph, Plan, Tensor
from .network import Network, Registry

OP = "YOLOv10"
VARIANTS = ("n", "s", "m", "b", "l", "x")
# (depth, width, max_channels) of each variant, as the yamls' `scales`.
SCALES = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 768), "b": (0.67, 1.00, 512),
          "l": (1.00, 1.00, 512), "x": (1.00, 1.25, 512)}
BN_EPS, BN_MOMENTUM = 1e-3, 0.03
REG_MAX = 16
STRIDES = (8, 16, 32)
MAX_DET = 300


# --------------------------------------------------------------------------- blocks


class Conv:
    """conv_2d (no bias, padding k // 2) -> batch_norm (eps 1e-3, momentum 0.03) with SiLU fused, or no activation."""

    def __init__(self, reg: Registry, prefix: str, c1: int, c2: int, k: int = 1, s: int = 1, g: int = 1,
                 act: bool = True, fold: bool = True):
        self.weight = reg.param(f"{prefix}.conv.weight", (c2, c1 // g, k, k), "weight", (c1 // g) * k * k)
        self.bn = reg.batch_norm(f"{prefix}.bn", c2)
        self.dims = (c2, c1 // g, k, k)
        self.c2 = c2
        self.conv_attrs = Conv2DAttrs(c2, k, k, s, s, k // 2, k // 2, groups=g)
        self.bn_attrs = BatchNormAttrs(eps=BN_EPS, momentum=BN_MOMENTUM, activation=Activation.SILU if act else None)
        # Fused: one conv with the BatchNorm folded into its weight and bias, the SiLU fused (fold False: a
        # part of a larger fold, RepVGGDW's).
        self.fused = (f"{prefix}.fused.weight", f"{prefix}.fused.bias")
        self.fused_attrs = dataclasses.replace(self.conv_attrs, use_bias=True, activation=self.bn_attrs.activation)
        if fold:
            reg.fold(*self.fused, self.dims, [(self.weight, self.bn, BN_EPS)])

    def __call__(self, g: Graph, x: Tensor) -> Tensor:
        if g.fused:
            return g.conv2d(x, g.param(self.fused[0], self.dims, frozen=True),
                            g.param(self.fused[1], (self.c2,), frozen=True), self.fused_attrs)
        y = g.conv2d(x, g.param(self.weight, self.dims), None, self.conv_attrs)
        gamma = g.param(f"{self.bn}.weight", (self.c2,))
        beta = g.param(f"{self.bn}.bias", (self.c2,))
        return g.batch_norm(y, gamma, beta, self.bn_attrs, self.bn)


class Conv2d:
    """torch's nn.Conv2d 1x1 with bias (the heads' last layers)."""

    def __init__(self, reg: Registry, prefix: str, c1: int, c2: int):
        self.weight = reg.param(f"{prefix}.weight", (c2, c1, 1, 1), "weight", c1)
        self.bias = reg.param(f"{prefix}.bias", (c2,), "bias", c1)
        self.c1, self.c2 = c1, c2
        self.attrs = Conv2DAttrs(c2, 1, 1, use_bias=True)

    def __call__(self, g: Graph, x: Tensor) -> Tensor:
        return g.conv2d(x, g.param(self.weight, (self.c2, self.c1, 1, 1)), g.param(self.bias, (self.c2,)), self.attrs)


class Sequential:
    def __init__(self, *blocks: Any):
        self.blocks = blocks

    def __call__(self, g: Graph, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(g, x)
        return x


def _add(g: Graph, a: Tensor, b: Tensor) -> Tensor:
    return g.binary(a, b, BinaryOpType.ADD)


class Bottleneck:
    """Two 3x3 Convs, plus the input when shortcut (c1 == c2 in every C2f)."""

    def __init__(self, reg: Registry, prefix: str, c: int, shortcut: bool):
        self.cv1 = Conv(reg, f"{prefix}.cv1", c, c, 3)
        self.cv2 = Conv(reg, f"{prefix}.cv2", c, c, 3)
        self.add = shortcut

    def __call__(self, g: Graph, x: Tensor) -> Tensor:
        y = self.cv2(g, self.cv1(g, x))
        return _add(g, x, y) if self.add else y


class RepVGGDW:
    """SiLU(Conv 7x7 depthwise (no act)(x) + Conv 3x3 depthwise (no act)(x))."""

    def __init__(self, reg: Registry, prefix: str, c: int):
        self.conv = Conv(reg, f"{prefix}.conv", c, c, 7, g=c, act=False, fold=False)
        self.conv1 = Conv(reg, f"{prefix}.conv1", c, c, 3, g=c, act=False, fold=False)
        # Fused (ultralytics' RepVGGDW.fuse): both convs with their BatchNorms folded into one 7x7 depthwise
        # conv (the 3x3 centred in it: its padding 1 is the 7x7's 3 less 2), the SiLU fused.
        self.fused = (f"{prefix}.fused.weight", f"{prefix}.fused.bias")
        self.dims, self.c = (c, 1, 7, 7), c
        self.fused_attrs = Conv2DAttrs(c, 7, 7, padding_h=3, padding_w=3, groups=c, use_bias=True,
                                       activation=Activation.SILU)
        reg.fold(*self.fused, self.dims, [(self.conv.weight, self.conv.bn, BN_EPS),
                                          (self.conv1.weight, self.conv1.bn, BN_EPS)])

    def __call__(self, g: Graph, x: Tensor) -> Tensor:
        if g.fused:
            return g.conv2d(x, g.param(self.fused[0], self.dims, frozen=True),
                            g.param(self.fused[1], (self.c,), frozen=True), self.fused_attrs)
        return g.unary(_add(g, self.conv(g, x), self.conv1(g, x)), UnaryOpType.SILU)


class CIB:
    """dw3x3 Conv, 1x1 Conv to 2c, RepVGGDW (lk) or dw3x3 Conv, 1x1 Conv to c, dw3x3 Conv; plus x when shortcut."""

    def __init__(self, reg: Registry, prefix: str, c: int, shortcut: bool, lk: bool):
        p = f"{prefix}.cv1"
        self.cv1 = Sequential(
            Conv(reg, f"{p}.0", c, c, 3, g=c),
            Conv(reg, f"{p}.1", c, 2 * c, 1),
            RepVGGDW(reg, f"{p}.2", 2 * c) if lk else Conv(reg, f"{p}.2", 2 * c, 2 * c, 3, g=2 * c),
            Conv(reg, f"{p}.3", 2 * c, c, 1),
            Conv(reg, f"{p}.4", c, c, 3, g=c),
        )
        self.add = shortcut

    def __call__(self, g: Graph, x: Tensor) -> Tensor:
        y = self.cv1(g, x)
        return _add(g, x, y) if self.add else y


class C2f:
    """cv1 (1x1 to 2c) -> split in halves -> n blocks chained on the last part -> concat of 2 + n parts -> cv2."""

    def __init__(self, reg: Registry, prefix: str, c1: int, c2: int, n: int, shortcut: bool, cib: bool = False,
                 lk: bool = False):
        self.c = c2 // 2
        self.cv1 = Conv(reg, f"{prefix}.cv1", c1, 2 * self.c, 1)
        self.cv2 = Conv(reg, f"{prefix}.cv2", (2 + n) * self.c, c2, 1)
        self.m = [CIB(reg, f"{prefix}.m.{i}", self.c, shortcut, lk) if cib else
                  Bottleneck(reg, f"{prefix}.m.{i}", self.c, shortcut) for i in range(n)]

    def __call__(self, g: Graph, x: Tensor) -> Tensor:
        parts = g.split(self.cv1(g, x), (self.c, self.c), 1)
        for block in self.m:
            parts.append(block(g, parts[-1]))
        return self.cv2(g, g.concat(parts, 1))


class SCDown:
    """1x1 Conv, then a depthwise 3x3 stride-2 Conv without activation."""

    def __init__(self, reg: Registry, prefix: str, c1: int, c2: int):
        self.cv1 = Conv(reg, f"{prefix}.cv1", c1, c2, 1)
        self.cv2 = Conv(reg, f"{prefix}.cv2", c2, c2, 3, 2, g=c2, act=False)

    def __call__(self, g: Graph, x: Tensor) -> Tensor:
        return self.cv2(g, self.cv1(g, x))


class SPPF:
    """cv1 (to c1 / 2), three chained MAX 5x5/1/2 pools, concat of the four, cv2."""

    def __init__(self, reg: Registry, prefix: str, c1: int, c2: int):
        c = c1 // 2
        self.cv1 = Conv(reg, f"{prefix}.cv1", c1, c, 1)
        self.cv2 = Conv(reg, f"{prefix}.cv2", 4 * c, c2, 1)
        self.pool = Pool2DAttrs(5, 5, 1, 1, 2, 2, PoolOp.MAX)

    def __call__(self, g: Graph, x: Tensor) -> Tensor:
        parts = [self.cv1(g, x)]
        for _ in range(3):
            parts.append(g.pool2d(parts[-1], self.pool))
        return self.cv2(g, g.concat(parts, 1))


class Attention:
    """ultralytics' Attention(dim, num_heads, attn_ratio 0.5): qkv 1x1 Conv (no act), per head
    softmax(q^T k * key_dim^-0.5) applied to v, plus a depthwise 3x3 positional Conv of v, then proj."""

    def __init__(self, reg: Registry, prefix: str, dim: int, num_heads: int):
        self.heads = num_heads
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * 0.5)
        self.scale = self.key_dim ** -0.5
        self.dim = dim
        self.qkv = Conv(reg, f"{prefix}.qkv", dim, dim + 2 * self.key_dim * num_heads, 1, act=False)
        self.proj = Conv(reg, f"{prefix}.proj", dim, dim, 1, act=False)
        self.pe = Conv(reg, f"{prefix}.pe", dim, dim, 3, g=dim, act=False)

    def __call__(self, g: Graph, x: Tensor) -> Tensor:
        b, c, h, w = x.dims
        n = h * w
        qkv = g.reshape(self.qkv(g, x), (b, self.heads, 2 * self.key_dim + self.head_dim, n))
        q, k, v = g.split(qkv, (self.key_dim, self.key_dim, self.head_dim), 2)
        attn = g.matmul(g.transpose(q, (0, 1, 3, 2)), k)  # (b, heads, n, n)
        attn = g.softmax(g.unary(attn, UnaryOpType.SCALAR_MULTIPLY, self.scale), -1)
        y = g.reshape(g.matmul(v, g.transpose(attn, (0, 1, 3, 2))), (b, c, h, w))
        y = _add(g, y, self.pe(g, g.reshape(v, (b, c, h, w))))
        return self.proj(g, y)


class PSA:
    """cv1 -> split (c, c) -> b += Attention(b); b += ffn(b) -> cv2(concat(a, b))."""

    def __init__(self, reg: Registry, prefix: str, c1: int):
        self.c = c1 // 2
        self.cv1 = Conv(reg, f"{prefix}.cv1", c1, 2 * self.c, 1)
        self.cv2 = Conv(reg, f"{prefix}.cv2", 2 * self.c, c1, 1)
        self.attn = Attention(reg, f"{prefix}.attn", self.c, self.c // 64)
        self.ffn = Sequential(Conv(reg, f"{prefix}.ffn.0", self.c, 2 * self.c, 1),
                              Conv(reg, f"{prefix}.ffn.1", 2 * self.c, self.c, 1, act=False))

    def __call__(self, g: Graph, x: Tensor) -> Tensor:
        a, b = g.split(self.cv1(g, x), (self.c, self.c), 1)
        b = _add(g, b, self.attn(g, b))
        b = _add(g, b, self.ffn(g, b))
        return self.cv2(g, g.concat([a, b], 1))


def anchors_and_strides(level_dims: Sequence[tuple[int, int]], strides: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """ultralytics' make_anchors (offset 0.5), transposed: anchor centres (1, 2, A) as (x, y) and the
    stride of each anchor (1, 1, A), level after level, each level row-major over (h, w)."""
    points, per_anchor = [], []
    for (h, w), stride in zip(level_dims, strides):
        sy, sx = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
        points.append(np.stack([sx.reshape(-1), sy.reshape(-1)]))
        per_anchor.append(np.full(h * w, float(stride)))
    return np.concatenate(points, 1)[None], np.concatenate(per_anchor)[None, None]


class V10Detect:
    """v10Detect: per level, one-to-many cat(cv2(x), cv3(x)) and one-to-one heads (copies, reading x
    detached); in eval the one-to-one outputs decoded: DFL, anchors, boxes x1y1x2y2 * stride, sigmoid scores."""

    def __init__(self, reg: Registry, prefix: str, nc: int, ch: Sequence[int]):
        self.nc, self.no = nc, 4 * REG_MAX + nc
        c2, c3 = max(16, ch[0] // 4, REG_MAX * 4), max(ch[0], min(nc, 100))

        def box(name: str, i: int, x: int) -> Sequential:
            p = f"{prefix}.{name}.{i}"
            return Sequential(Conv(reg, f"{p}.0", x, c2, 3), Conv(reg, f"{p}.1", c2, c2, 3),
                              Conv2d(reg, f"{p}.2", c2, 4 * REG_MAX))

        def cls(name: str, i: int, x: int) -> Sequential:
            p = f"{prefix}.{name}.{i}"
            return Sequential(Sequential(Conv(reg, f"{p}.0.0", x, x, 3, g=x), Conv(reg, f"{p}.0.1", x, c3, 1)),
                              Sequential(Conv(reg, f"{p}.1.0", c3, c3, 3, g=c3), Conv(reg, f"{p}.1.1", c3, c3, 1)),
                              Conv2d(reg, f"{p}.2", c3, nc))

        self.cv2 = [box("cv2", i, x) for i, x in enumerate(ch)]
        self.cv3 = [cls("cv3", i, x) for i, x in enumerate(ch)]
        self.dfl = reg.param(f"{prefix}.dfl.conv.weight", (1, REG_MAX, 1, 1), "arange", frozen=True)
        self.one2one_cv2 = [box("one2one_cv2", i, x) for i, x in enumerate(ch)]
        self.one2one_cv3 = [cls("one2one_cv3", i, x) for i, x in enumerate(ch)]

    def __call__(self, g: Graph, xs: Sequence[Tensor], training: bool) -> dict[str, Any]:
        one2one = []
        for i, x in enumerate(xs):
            x = g.detach(x)
            one2one.append(g.concat([self.one2one_cv2[i](g, x), self.one2one_cv3[i](g, x)], 1))
        outputs: dict[str, Any] = {"one2one": one2one}
        if not g.fused:  # fused inference drops the one-to-many head, as ultralytics' v10Detect.fuse()
            outputs = {"one2many": [g.concat([self.cv2[i](g, x), self.cv3[i](g, x)], 1) for i, x in enumerate(xs)],
                       "one2one": one2one}
        if not training:
            outputs["decoded"] = self.decode(g, one2one)
        return outputs

    def decode(self, g: Graph, levels: Sequence[Tensor]) -> Tensor:
        """(B, 4 + nc, A): boxes x1, y1, x2, y2 in input pixels, then the class scores (sigmoid)."""
        b = levels[0].dims[0]
        flat = [g.reshape(t, (b, self.no, t.dims[2] * t.dims[3])) for t in levels]
        cat = g.concat(flat, 2)
        a = cat.dims[2]
        box, cls = g.split(cat, (4 * REG_MAX, self.nc), 1)
        bins = g.softmax(g.transpose(g.reshape(box, (b, 4, REG_MAX, a)), (0, 2, 1, 3)), 1)  # (b, 16, 4, a)
        dfl = g.conv2d(bins, g.param(self.dfl, (1, REG_MAX, 1, 1), frozen=True), None, Conv2DAttrs(1, 1, 1))
        lt, rb = g.split(g.reshape(dfl, (b, 4, a)), (2, 2), 1)
        anchors, strides = anchors_and_strides([t.dims[2:] for t in levels], STRIDES)
        anchor_points = g.constant("anchors", anchors)
        boxes = g.concat([g.binary(anchor_points, lt, BinaryOpType.SUB), g.binary(anchor_points, rb, BinaryOpType.ADD)], 1)
        boxes = g.binary(boxes, g.constant("strides", strides), BinaryOpType.MUL)
        return g.concat([boxes, g.unary(cls, UnaryOpType.SIGMOID)], 1)


def postprocess(xp: Any, decoded: Any, nc: int, max_det: int = MAX_DET) -> Any:
    """ultralytics' v10 postprocess of decoded (B, 4 + nc, A): per image the k = min(max_det, A) anchors of
    highest best-class score, then the top k of their k x nc scores; rows [x1, y1, x2, y2, score, class]
    in descending score, in decoded's dtype. Ties keep the lower index first, and NaN counts as the
    largest score (the top_k op's order). Computed by the detection stage a model's plan keeps
    (kernels.models.detections: the top_k op and copies) on decoded's device (xp: numpy or cupy): a new
    array. The same as postprocess_reference wherever the scores are numbers."""
    from ..runtime import cpu as cpu_runtime

    decoded = xp.ascontiguousarray(decoded)
    if xp is np:
        stream, handle = cpu_runtime.cpu_stream(), cpu_runtime.cpu_handle()
    else:  # pragma: no cover - GPU
        from ..runtime import gpu as gpu_runtime
        from ..runtime.handle import gpu_handle

        device = decoded.device.id
        stream, handle = gpu_runtime.gpu_stream(device), gpu_handle(device)
        # decoded was written on the caller's current stream: the detections' stream waits for it
        gpu_runtime.stream_wait(stream.cupy_stream, xp.cuda.get_current_stream(), device)
    stage = Detections(decoded, nc, max_det, xp, stream, handle)
    try:
        rows = stage.run()
        if xp is not np:  # pragma: no cover - GPU: back on the caller's current stream
            gpu_runtime.stream_wait(xp.cuda.get_current_stream(), stream.cupy_stream, device)
        return rows
    finally:
        stage.close()
        if xp is not np:  # pragma: no cover - GPU: its work is enqueued; the handle made no library handle
            handle.close()


def postprocess_reference(xp: Any, decoded: Any, nc: int, max_det: int = MAX_DET) -> Any:
    """postprocess by xp's stable argsorts (what the model ran before the top_k op; the tests' reference):
    equal to postprocess wherever the scores are numbers (a NaN sorts last here, first there). A float16
    or bfloat16 `decoded` is sorted widened to float32 (exact, the same order and ties) and the rows
    rounded back to its dtype, which holds them exactly (the class indices too: integers below 256)."""
    if decoded.dtype in HALF_DTYPES:
        return postprocess_reference(xp, decoded.astype(np.float32), nc, max_det).astype(decoded.dtype)
    batch, _, anchors = decoded.shape
    k = min(max_det, anchors)
    boxes, scores = decoded[:, :4, :], decoded[:, 4:, :]
    best = xp.argsort(-scores.max(axis=1), axis=1, kind="stable")[:, :k]  # (B, k)
    boxes = xp.take_along_axis(boxes, best[:, None, :], axis=2).transpose(0, 2, 1)  # (B, k, 4)
    scores = xp.take_along_axis(scores, best[:, None, :], axis=2).transpose(0, 2, 1).reshape(batch, k * nc)
    top = xp.argsort(-scores, axis=1, kind="stable")[:, :k]
    top_scores = xp.take_along_axis(scores, top, axis=1)
    top_boxes = xp.take_along_axis(boxes, (top // nc)[:, :, None], axis=1)
    classes = (top % nc).astype(decoded.dtype)
    return xp.concatenate([top_boxes, top_scores[:, :, None], classes[:, :, None]], axis=2)


# --------------------------------------------------------------------------- the network


def _channels(c: int, width: float, max_channels: int) -> int:
    return int(math.ceil(min(c, max_channels) * width / 8) * 8)


def _repeats(n: int, depth: float) -> int:
    return max(round(n * depth), 1) if n > 1 else n


# Per layer: (from, repeats, module, args) as the yamls, for the layers that differ by variant only in
# C2f / C2fCIB choices (given by _layers).
def _layers(variant: str) -> list[tuple[Any, int, str, tuple]]:
    cib = {  # layer -> lk (True: RepVGGDW in the CIBs) for the layers that are C2fCIB in the variant's yaml
        "n": {22: True}, "s": {8: True, 22: True}, "m": {8: False, 19: False, 22: False},
        "b": {8: False, 13: False, 19: False, 22: False}, "l": {8: False, 13: False, 19: False, 22: False},
        "x": {6: False, 8: False, 13: False, 19: False, 22: False},
    }[variant]

    def c2f(index: int, n: int, c: int, shortcut: bool) -> tuple[Any, int, str, tuple]:
        if index in cib:
            return (-1, n, "C2fCIB", (c, True, cib[index]))  # shortcut True in every C2fCIB of the yamls
        return (-1, n, "C2f", (c, shortcut))

    return [
        (-1, 1, "Conv", (64, 3, 2)), (-1, 1, "Conv", (128, 3, 2)), c2f(2, 3, 128, True),
        (-1, 1, "Conv", (256, 3, 2)), c2f(4, 6, 256, True), (-1, 1, "SCDown", (512, 3, 2)), c2f(6, 6, 512, True),
        (-1, 1, "SCDown", (1024, 3, 2)), c2f(8, 3, 1024, True), (-1, 1, "SPPF", (1024, 5)), (-1, 1, "PSA", (1024,)),
        (-1, 1, "Upsample", ()), ((-1, 6), 1, "Concat", ()), c2f(13, 3, 512, False),
        (-1, 1, "Upsample", ()), ((-1, 4), 1, "Concat", ()), c2f(16, 3, 256, False),
        (-1, 1, "Conv", (256, 3, 2)), ((-1, 13), 1, "Concat", ()), c2f(19, 3, 512, False),
        (-1, 1, "SCDown", (512, 3, 2)), ((-1, 10), 1, "Concat", ()), c2f(22, 3, 1024, False),
        ((16, 19, 22), 1, "v10Detect", ()),
    ]


class YOLOv10(Network):
    """YOLOv10 of one variant on one device and dtype, built from the kernels' op calls.

    model(x): x (N, 3, H, W), H and W multiples of 32. Training mode (the default, as torch):
    {"one2many": [p3, p4, p5], "one2one": [p3, p4, p5]}, each (N, 64 + nc, H/s, W/s), s = 8, 16, 32.
    Eval: also "decoded" (N, 4 + nc, A), the one-to-one head's boxes and scores, and "detections"
    (N, min(300, A), 6) [x1, y1, x2, y2, score, class]. Every array returned is a buffer of the plan
    of that input shape and mode, overwritten by its next call (the detections too).

    dtype: "float32", "float64", or "float16" / "bfloat16" (mixed precision, as a PyTorch half model
    whose BatchNorms are kept float32): the input, activations, outputs, gradients, the conv weights
    and biases (the DFL's and the fused ones too) in the half dtype; the BatchNorms' gamma, beta and
    running statistics (and gamma's and beta's gradients) float32. Every op computes in float32 inside
    and rounds once to the half dtype (docs/ops.md).
    """

    OP = OP
    GRAD_OUTPUTS = ("one2many", "one2one")

    def __init__(self, variant: str = "n", num_classes: int = 80, device: Any = "cpu", dtype: Any = "float32"):
        if isinstance(variant, str) and variant.startswith("yolov10") and variant[len("yolov10"):] in VARIANTS:
            variant = variant[len("yolov10"):]  # the name the CLI and ultralytics take: yolov10n
        if variant not in VARIANTS:
            names = ", ".join("yolov10" + v for v in VARIANTS)
            raise fail(AttrsError, OP, "variant", f"one of {', '.join(VARIANTS)} (or {names})", repr(variant))
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
            raise fail(AttrsError, OP, "num_classes", "an integer >= 1", repr(num_classes))
        self.variant, self.num_classes = variant, int(num_classes)
        registry = Registry()
        self.layers = self._build(registry, variant, self.num_classes)
        super().__init__(registry, device, dtype)
        self.init_random(0)

    @staticmethod
    def _build(reg: Registry, variant: str, nc: int) -> list[tuple[Any, Any]]:
        depth, width, max_channels = SCALES[variant]
        channels: list[int] = []
        layers: list[tuple[Any, Any]] = []
        for i, (source, n, kind, args) in enumerate(_layers(variant)):
            prefix = f"model.{i}"
            c1 = channels[-1] if channels else 3
            if kind in ("Conv", "SCDown"):
                c2 = _channels(args[0], width, max_channels)
                block: Any = Conv(reg, prefix, c1, c2, args[1], args[2]) if kind == "Conv" else SCDown(reg, prefix, c1, c2)
            elif kind in ("C2f", "C2fCIB"):
                c2 = _channels(args[0], width, max_channels)
                block = C2f(reg, prefix, c1, c2, _repeats(n, depth), args[1], cib=kind == "C2fCIB",
                            lk=kind == "C2fCIB" and args[2])
            elif kind == "SPPF":
                c2 = _channels(args[0], width, max_channels)
                block = SPPF(reg, prefix, c1, c2)
            elif kind == "PSA":
                c2 = c1
                block = PSA(reg, prefix, c1)
            elif kind == "Upsample":
                c2, block = c1, None
            elif kind == "Concat":
                c2, block = sum(channels[j] for j in source), None
            else:  # v10Detect
                c2, block = 0, V10Detect(reg, prefix, nc, [channels[j] for j in source])
            channels.append(c2)
            layers.append((source, (kind, block)))
        return layers

    def check_input_dims(self, dims: tuple[int, ...]) -> None:
        if len(dims) != 4 or dims[1] != 3 or dims[0] < 1 or any(d < 32 or d % 32 for d in dims[2:]):
            raise fail(ShapeError, OP, "x", "dims (N >= 1, 3, H, W) with H and W positive multiples of 32", dims)

    def trace(self, graph: Graph, x: Tensor, training: bool) -> dict[str, Any]:
        saved: list[Tensor] = []
        upsample = UpsampleAttrs(2)
        for i, (source, (kind, block)) in enumerate(self.layers[:-1]):
            graph.layer = f"model.{i}"  # each node records its ultralytics layer (profiles)
            if kind == "Upsample":
                x = graph.upsample(x, upsample)
            elif kind == "Concat":
                x = graph.concat([x if j == -1 else saved[j] for j in source], 1)
            else:
                x = block(graph, x)
            saved.append(x)
        source, (_, detect) = self.layers[-1]
        graph.layer = f"model.{len(self.layers) - 1}"
        return detect(graph, [saved[j] for j in source], training)

    def plan(self, dims: tuple[int, ...]) -> Plan:
        """The plan of an input shape and mode; an eval plan also keeps its detection stage (`plan.after`:
        kernels.models.detections), made once with the plan, which Plan.capture captures with the forward."""
        plan = super().plan(dims)
        if plan.after is None and not plan.training and "decoded" in plan.outputs:
            with self.active():
                plan.after = Detections(plan.outputs["decoded"], self.num_classes, MAX_DET, self.xp, self.stream,
                                        self.handle)
        return plan

    def runs_after(self, plan: Any, detections: bool = True) -> bool:
        """In eval, the detection stage runs after the forward unless `detections=False`."""
        return detections and plan.after is not None

    def finish(self, plan: Any, detections: bool = True) -> dict[str, Any]:
        """The plan's outputs, and in eval the detections (the plan's detection stage: the top_k op on the
        device, into a buffer of the plan, run by forward) unless `detections=False` (model(x, detections=False))."""
        outputs = dict(plan.outputs)
        if self.runs_after(plan, detections):
            outputs["detections"] = plan.after.rows
        return outputs
