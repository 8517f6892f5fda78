"""YOLOv10 as a plain `torch.nn` program: the whole-network reference the kernel model
(`kernels.models`) is compared with.

Written here from the published architecture facts of ultralytics' `yolov10{n,s,m,b,l,x}.yaml`
(ultralytics 8.4.x), without the ultralytics package. Module classes, attribute names and their
order follow ultralytics', so `state_dict()` has its names, order and shapes (a real checkpoint's
state dict loads as it is) and `repr()` of every top-level layer matches its printed module tree;
tests/test_model_reference.py checks both against tests/data/yolov10/.

It runs in float32 and float64 (`build(...).to(torch.float64)`), on any torch device, and in float16
and bfloat16 as a mixed-precision model (`build(..., dtype=torch.float16)`): every parameter and
activation in the half dtype except the BatchNorm modules, kept float32 (`bn.float()`: weight, bias
and running statistics), as PyTorch's mixed precision keeps them; `F.batch_norm` takes half input with
float32 parameters (CUDA, and the CPU in torch 2.13, both checked) and returns the half dtype.

    model = build("n")                             # DetectionModel, 80 classes, torch's default init
    load_numpy(model, state)                       # ultralytics names -> NumPy arrays, strict
    state = to_numpy(model)                        # the other way
    model.train(); out = model(x)                  # {"one2many": [p3, p4, p5], "one2one": [p3, p4, p5]}
    model.eval(); detections, heads = model(x)     # (N, min(300, anchors), 6), the same dict
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

VARIANTS = ("n", "s", "m", "b", "l", "x")

# BatchNorm settings of every YOLOv10 layer (ultralytics sets them after construction).
BN_EPS = 1e-3
BN_MOMENTUM = 0.03

# Per variant: (depth multiple, width multiple, max channels), as in the yaml's `scales`.
SCALES = {
    "n": (0.33, 0.25, 1024),
    "s": (0.33, 0.50, 1024),
    "m": (0.67, 0.75, 768),
    "b": (0.67, 1.00, 512),
    "l": (1.00, 1.00, 512),
    "x": (1.00, 1.25, 512),
}

# The layer table shared by the six variants: (from, repeats, block, args), channels before
# scaling. `from` -1 is the layer before. C2f args: (channels, shortcut); the backbone's C2f have
# shortcuts, the head's do not. C2fCIB args: (channels, shortcut, large kernel).
_BASE_LAYERS = [
    (-1, 1, "Conv", (64, 3, 2)),            # 0  P1/2
    (-1, 1, "Conv", (128, 3, 2)),           # 1  P2/4
    (-1, 3, "C2f", (128, True)),            # 2
    (-1, 1, "Conv", (256, 3, 2)),           # 3  P3/8
    (-1, 6, "C2f", (256, True)),            # 4
    (-1, 1, "SCDown", (512, 3, 2)),         # 5  P4/16
    (-1, 6, "C2f", (512, True)),            # 6
    (-1, 1, "SCDown", (1024, 3, 2)),        # 7  P5/32
    (-1, 3, "C2f", (1024, True)),           # 8
    (-1, 1, "SPPF", (1024, 5)),             # 9
    (-1, 1, "PSA", (1024,)),                # 10
    (-1, 1, "Upsample", ()),                # 11
    ((-1, 6), 1, "Concat", ()),             # 12 with backbone P4
    (-1, 3, "C2f", (512, False)),           # 13
    (-1, 1, "Upsample", ()),                # 14
    ((-1, 4), 1, "Concat", ()),             # 15 with backbone P3
    (-1, 3, "C2f", (256, False)),           # 16 P3/8 out
    (-1, 1, "Conv", (256, 3, 2)),           # 17
    ((-1, 13), 1, "Concat", ()),            # 18 with head P4
    (-1, 3, "C2f", (512, False)),           # 19 P4/16 out
    (-1, 1, "SCDown", (512, 3, 2)),         # 20
    ((-1, 10), 1, "Concat", ()),            # 21 with head P5
    (-1, 3, "C2fCIB", (1024, True, True)),  # 22 P5/32 out
    ((16, 19, 22), 1, "v10Detect", ()),     # 23
]

# Where a variant's table departs from the base: layer index -> (block, args).
_VARIANT_LAYERS = {
    "n": {},
    "s": {8: ("C2fCIB", (1024, True, True))},
    "m": {8: ("C2fCIB", (1024, True)), 19: ("C2fCIB", (512, True)), 22: ("C2fCIB", (1024, True, False))},
    "b": {8: ("C2fCIB", (1024, True)), 13: ("C2fCIB", (512, True)), 19: ("C2fCIB", (512, True)),
          22: ("C2fCIB", (1024, True, False))},
    "x": {6: ("C2fCIB", (512, True)), 8: ("C2fCIB", (1024, True)), 13: ("C2fCIB", (512, True)),
          19: ("C2fCIB", (512, True)), 22: ("C2fCIB", (1024, True, False))},
}
_VARIANT_LAYERS["l"] = _VARIANT_LAYERS["b"]  # l differs from b only in its scales

REG_MAX = 16  # DFL bins per box side
STRIDES = (8, 16, 32)  # of the three detection levels P3, P4, P5
MAX_DET = 300  # detections kept by the one-to-one head


class Conv(nn.Module):
    """Conv2d (no bias, padding k // 2) -> BatchNorm2d -> SiLU (Identity when act is False)."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, g: int = 1, act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Concat(nn.Module):
    """Concatenation of a list of tensors along `dimension`."""

    def __init__(self, dimension: int = 1):
        super().__init__()
        self.d = dimension

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(x, self.d)


class Bottleneck(nn.Module):
    """Two 3x3 Convs, with a residual add when asked for and the channel counts allow it."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, e: float = 1.0):
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, 3)
        self.cv2 = Conv(hidden, c2, 3)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """1x1 Conv to 2c channels, halves chained through n blocks, all 2 + n parts concatenated, 1x1 Conv."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = False, e: float = 0.5):
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(self._block(shortcut) for _ in range(n))

    def _block(self, shortcut: bool) -> nn.Module:
        return Bottleneck(self.c, self.c, shortcut, e=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.cv1(x).chunk(2, 1))
        for block in self.m:
            parts.append(block(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


class RepVGGDW(nn.Module):
    """Depthwise 7x7 and 3x3 Convs (no activation) summed, then SiLU."""

    def __init__(self, ed: int):
        super().__init__()
        self.conv = Conv(ed, ed, 7, 1, g=ed, act=False)
        self.conv1 = Conv(ed, ed, 3, 1, g=ed, act=False)
        self.dim = ed
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x) + self.conv1(x))


class CIB(nn.Module):
    """Compact inverted block: dw3x3, 1x1 to 2c_, RepVGGDW (lk) or dw3x3, 1x1 to c2, dw3x3; residual."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, e: float = 0.5, lk: bool = False):
        super().__init__()
        hidden = int(c2 * e)
        middle = RepVGGDW(2 * hidden) if lk else Conv(2 * hidden, 2 * hidden, 3, g=2 * hidden)
        self.cv1 = nn.Sequential(
            Conv(c1, c1, 3, g=c1),
            Conv(c1, 2 * hidden, 1),
            middle,
            Conv(2 * hidden, c2, 1),
            Conv(c2, c2, 3, g=c2),
        )
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv1(x)
        return x + y if self.add else y


class C2fCIB(C2f):
    """C2f with CIB blocks."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = False, lk: bool = False, e: float = 0.5):
        self._lk = lk
        super().__init__(c1, c2, n, shortcut, e)

    def _block(self, shortcut: bool) -> nn.Module:
        return CIB(self.c, self.c, shortcut, e=1.0, lk=self._lk)


class SCDown(nn.Module):
    """Spatial-channel downsampling: 1x1 Conv to c2, then a depthwise k x k stride-s Conv without activation."""

    def __init__(self, c1: int, c2: int, k: int = 3, s: int = 2):
        super().__init__()
        self.cv1 = Conv(c1, c2, 1)
        self.cv2 = Conv(c2, c2, k, s, g=c2, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv2(self.cv1(x))


class SPPF(nn.Module):
    """1x1 Conv to c1 // 2, three chained k x k stride-1 max pools, the four concatenated, 1x1 Conv."""

    def __init__(self, c1: int, c2: int, k: int = 5):
        super().__init__()
        hidden = c1 // 2
        self.cv1 = Conv(c1, hidden, 1)
        self.cv2 = Conv(hidden * 4, c2, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [self.cv1(x)]
        for _ in range(3):
            parts.append(self.m(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


class Attention(nn.Module):
    """Multi-head self-attention over the H*W positions, plus a depthwise positional conv of v."""

    def __init__(self, dim: int, num_heads: int = 8, attn_ratio: float = 0.5):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim**-0.5
        qkv_channels = dim + 2 * num_heads * self.key_dim
        self.qkv = Conv(dim, qkv_channels, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, 1, g=dim, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        positions = height * width
        per_head = self.qkv(x).view(batch, self.num_heads, 2 * self.key_dim + self.head_dim, positions)
        q, k, v = per_head.split([self.key_dim, self.key_dim, self.head_dim], dim=2)
        scores = (q.transpose(-2, -1) @ k) * self.scale  # (B, heads, N, N): query position x key position
        weights = scores.softmax(dim=-1)
        attended = (v @ weights.transpose(-2, -1)).view(batch, channels, height, width)
        return self.proj(attended + self.pe(v.reshape(batch, channels, height, width)))


class PSA(nn.Module):
    """Partial self-attention: half the channels pass, the other half gets attention and a feed-forward."""

    def __init__(self, c1: int, c2: int, e: float = 0.5):
        super().__init__()
        if c1 != c2:
            raise ValueError(f"PSA keeps its channel count: c1 {c1} != c2 {c2}")
        self.c = int(c1 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1)
        self.cv2 = Conv(2 * self.c, c1, 1)
        self.attn = Attention(self.c, num_heads=self.c // 64, attn_ratio=0.5)
        self.ffn = nn.Sequential(Conv(self.c, 2 * self.c, 1), Conv(2 * self.c, self.c, 1, act=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        passed, attended = self.cv1(x).split((self.c, self.c), dim=1)
        attended = attended + self.attn(attended)
        attended = attended + self.ffn(attended)
        return self.cv2(torch.cat((passed, attended), 1))


class DFL(nn.Module):
    """Distribution focal loss decode: softmax over c1 bins, then their expectation by a fixed 1x1 conv."""

    def __init__(self, c1: int = REG_MAX):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.arange(c1, dtype=torch.float32).view(1, c1, 1, 1))
        self.c1 = c1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, anchors = x.shape  # (B, 4 * c1, A)
        bins = x.view(batch, 4, self.c1, anchors).transpose(2, 1).softmax(1)  # (B, c1, 4, A)
        return self.conv(bins).view(batch, 4, anchors)


class v10Detect(nn.Module):  # noqa: N801 (ultralytics' class name, so reprs match)
    """YOLOv10's head: a one-to-many and a one-to-one branch, each a box (4 x 16 DFL bins) and a class
    conv stack per level. The one-to-one branch reads detached features, so it trains only itself."""

    def __init__(self, nc: int = 80, ch: tuple[int, ...] = ()):
        super().__init__()
        self.nc = nc
        self.nl = len(ch)
        self.reg_max = REG_MAX
        self.no = nc + 4 * REG_MAX
        self.stride = STRIDES
        self.max_det = MAX_DET
        box_channels = max(16, ch[0] // 4, 4 * REG_MAX)
        cls_channels = max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(c, box_channels, 3), Conv(box_channels, box_channels, 3), nn.Conv2d(box_channels, 4 * REG_MAX, 1))
            for c in ch
        )
        self.cv3 = nn.ModuleList(
            nn.Sequential(
                nn.Sequential(Conv(c, c, 3, g=c), Conv(c, cls_channels, 1)),
                nn.Sequential(Conv(cls_channels, cls_channels, 3, g=cls_channels), Conv(cls_channels, cls_channels, 1)),
                nn.Conv2d(cls_channels, nc, 1),
            )
            for c in ch
        )
        self.dfl = DFL(REG_MAX)
        # The one-to-one branch starts as a copy of the one-to-many one, as in ultralytics.
        self.one2one_cv2 = _copy_module(self.cv2)
        self.one2one_cv3 = _copy_module(self.cv3)

    def forward(self, x: list[torch.Tensor]):
        detached = [xi.detach() for xi in x]
        one2one = [torch.cat((self.one2one_cv2[i](detached[i]), self.one2one_cv3[i](detached[i])), 1) for i in range(self.nl)]
        one2many = [torch.cat((self.cv2[i](x[i]), self.cv3[i](x[i])), 1) for i in range(self.nl)]
        heads = {"one2many": one2many, "one2one": one2one}
        if self.training:
            return heads
        detections, _ = select_detections(decode(self, one2one), self.max_det, self.nc)
        return detections, heads


def _copy_module(module: nn.Module) -> nn.Module:
    return copy.deepcopy(module)


def make_anchors(feats: list[torch.Tensor], strides: tuple[int, ...], offset: float = 0.5):
    """Anchor points (grid cell centres, in cells) and their strides, level after level:
    shapes (2, A) and (1, A), in the features' dtype and device."""
    points, stride_rows = [], []
    for feature, stride in zip(feats, strides):
        _, _, height, width = feature.shape
        xs = torch.arange(width, dtype=feature.dtype, device=feature.device) + offset
        ys = torch.arange(height, dtype=feature.dtype, device=feature.device) + offset
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((grid_x, grid_y), -1).view(-1, 2))
        stride_rows.append(torch.full((height * width, 1), stride, dtype=feature.dtype, device=feature.device))
    return torch.cat(points).transpose(0, 1), torch.cat(stride_rows).transpose(0, 1)


def decode(head: v10Detect, feats: list[torch.Tensor]) -> torch.Tensor:
    """Raw head outputs (B, 64 + nc, H, W) per level -> (B, A, 4 + nc): x1y1x2y2 boxes in input
    pixels and sigmoid class scores for every anchor."""
    batch = feats[0].shape[0]
    flat = torch.cat([f.view(batch, head.no, -1) for f in feats], 2)
    anchors, strides = make_anchors(feats, head.stride)
    box, cls = flat.split((4 * head.reg_max, head.nc), 1)
    distances = head.dfl(box)  # (B, 4, A): left, top, right, bottom in cells
    left_top, right_bottom = distances.chunk(2, 1)
    boxes = torch.cat((anchors - left_top, anchors + right_bottom), 1) * strides
    return torch.cat((boxes, cls.sigmoid()), 1).permute(0, 2, 1)


def select_detections(preds: torch.Tensor, max_det: int, nc: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The one-to-one head's top-k, as ultralytics does it: the k = min(max_det, A) anchors with the
    highest class score, then the k highest (anchor, class) scores among them.

    Returns the detections (B, k, 6): x1, y1, x2, y2, score, class (as a float), in descending
    score order; and the anchor index (B, k) of each, which the comparison uses to match detections.
    """
    batch, anchors, _ = preds.shape
    boxes, scores = preds.split([4, nc], dim=-1)
    k = min(max_det, anchors)
    best = scores.amax(dim=-1).topk(k)[1]  # (B, k) anchor indices
    boxes = boxes.gather(1, best.unsqueeze(-1).expand(-1, -1, 4))
    scores = scores.gather(1, best.unsqueeze(-1).expand(-1, -1, nc))
    top_scores, flat_index = scores.flatten(1).topk(k)
    rows = torch.arange(batch, device=preds.device)[:, None]
    slot = torch.div(flat_index, nc, rounding_mode="floor")
    detections = torch.cat(
        [boxes[rows, slot], top_scores[..., None], (flat_index % nc)[..., None].to(preds.dtype)], dim=-1)
    return detections, best.gather(1, slot)


class DetectionModel(nn.Module):
    """The whole network: `model` is the sequence of top-level layers (state names `model.<i>.`);
    each layer's `f` says which earlier outputs it reads (-1: the layer before)."""

    def __init__(self, variant: str = "n", nc: int = 80):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"unknown YOLOv10 variant {variant!r}: expected one of {', '.join(VARIANTS)}")
        self.variant = variant
        self.nc = nc
        self.model = nn.Sequential(*_layers(variant, nc))

    def forward(self, x: torch.Tensor):
        outputs: list[torch.Tensor] = []
        for layer in self.model:
            if layer.f != -1:
                x = outputs[layer.f] if isinstance(layer.f, int) else [x if j == -1 else outputs[j] for j in layer.f]
            x = layer(x)
            outputs.append(x)
        return x


def layer_table(variant: str) -> list[tuple]:
    """The variant's (from, repeats, block, args) rows, channels before scaling."""
    table = list(_BASE_LAYERS)
    for index, (block, args) in _VARIANT_LAYERS[variant].items():
        source, repeats, _, _ = table[index]
        table[index] = (source, repeats, block, args)
    return table


def _scaled_channels(channels: int, width: float, max_channels: int) -> int:
    """min(channels, max) * width, rounded up to a multiple of 8."""
    return int(np.ceil(min(channels, max_channels) * width / 8) * 8)


def _layers(variant: str, nc: int) -> list[nn.Module]:
    depth, width, max_channels = SCALES[variant]
    channels_out: list[int] = []
    layers: list[nn.Module] = []
    for index, (source, repeats, block, args) in enumerate(layer_table(variant)):
        c1 = channels_out[-1] if index else 3
        repeats = max(round(repeats * depth), 1) if repeats > 1 else repeats
        if block in ("Conv", "C2f", "C2fCIB", "SCDown", "SPPF", "PSA"):
            c2 = _scaled_channels(args[0], width, max_channels)
        if block == "Conv":
            layer = Conv(c1, c2, *args[1:])
        elif block == "C2f":
            layer = C2f(c1, c2, repeats, *args[1:])
        elif block == "C2fCIB":
            layer = C2fCIB(c1, c2, repeats, *args[1:])
        elif block == "SCDown":
            layer = SCDown(c1, c2, *args[1:])
        elif block == "SPPF":
            layer = SPPF(c1, c2, *args[1:])
        elif block == "PSA":
            layer = PSA(c1, c2)
        elif block == "Upsample":
            layer, c2 = nn.Upsample(scale_factor=2, mode="nearest"), c1
        elif block == "Concat":
            layer, c2 = Concat(1), sum(channels_out[j] for j in source)
        else:  # v10Detect
            layer, c2 = v10Detect(nc, tuple(channels_out[j] for j in source)), 0
        layer.f, layer.i = source, index
        layers.append(layer)
        channels_out.append(c2)
    return layers


HALF_DTYPES = (torch.float16, torch.bfloat16)


def build(variant: str, nc: int = 80, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> DetectionModel:
    """YOLOv10`variant` with `nc` classes, torch's default initialisation, in `dtype` on `device`
    (float16, bfloat16: the BatchNorm modules float32, the rest in the half dtype)."""
    model = DetectionModel(variant, nc).to(device=device, dtype=dtype)
    if dtype in HALF_DTYPES:
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.float()
    return model


def host(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy copy of a tensor; a bfloat16 one as ml_dtypes' bfloat16 (through float32: exact)."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.float().numpy().astype(ml_dtypes.bfloat16)
    return tensor.numpy().copy()


def tensor(array, dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> torch.Tensor:
    """A torch tensor of a NumPy array (ml_dtypes' bfloat16 through float32: exact), in `dtype`."""
    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.astype(np.float32)).to(device=device, dtype=dtype or torch.bfloat16)
    return torch.as_tensor(array, device=device, dtype=dtype)


def to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    """The state dict as NumPy arrays (copies), in state_dict order."""
    return {name: host(value) for name, value in model.state_dict().items()}


def load_numpy(model: nn.Module, state: Mapping[str, np.ndarray]) -> None:
    """Copy every entry of `state` (name -> array) into `model`, converting to each tensor's dtype and
    device. Refuses, naming them, missing, extra or misshapen entries; nothing is written then."""
    own = model.state_dict()
    missing = [name for name in own if name not in state]
    extra = [name for name in state if name not in own]
    misshapen = [f"{name} {tuple(np.shape(state[name]))} (expected {tuple(own[name].shape)})"
                 for name in own if name in state and tuple(np.shape(state[name])) != tuple(own[name].shape)]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if extra:
        problems.append(f"unexpected {', '.join(extra)}")
    if misshapen:
        problems.append(f"misshapen {', '.join(misshapen)}")
    if problems:
        raise ValueError("state dict does not fit the model: " + "; ".join(problems))
    with torch.no_grad():
        for name, target in own.items():
            target.copy_(tensor(state[name]).to(dtype=target.dtype))


def cuda_graph(model: nn.Module, x: torch.Tensor) -> torch.cuda.CUDAGraph:
    """model(x) under no_grad captured in a torch.cuda.CUDAGraph (after three warm-up calls on a side
    stream, as torch's documentation asks): the PyTorch twin of our Plan.capture; replay() reruns it."""
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(x)
    return graph


def parameter_count(model: nn.Module) -> int:
    """Every parameter's element count, the fixed DFL weight included (as ultralytics counts)."""
    return sum(p.numel() for p in model.parameters())
