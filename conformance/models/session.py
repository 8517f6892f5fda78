"""One whole-network comparison: our kernel model (`kernels.models.YOLOv10`) against the PyTorch
reference (`conformance.models.reference`), from one seeded random initialisation.

The steps, each compared tensor by tensor (conformance.models.comparison):

1. ours = YOLOv10(variant); ours.init_random(seed); its state dict is copied into the reference.
2. `steps` training steps, each on a fresh seeded input and output gradient: the training-forward
   outputs of both heads, then backward from the gradient: the input's gradient and every
   parameter's. No optimizer runs, so the weights stay as loaded; the BatchNorm running
   statistics move with each step.
3. The running statistics (mean, variance, num_batches_tracked) after the steps.
4. An eval forward on a fresh input: both heads' raw outputs, and the top-300 detections.
5. Timing (optional): eval forward and training step, ours and PyTorch's, median wall time of a
   few runs with the device synchronized.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ml_dtypes
import numpy as np
import torch

from kernels.runtime.core import is_floating

from . import reference
from .comparison import BOUNDS, Row, compare_detections, compare_tensor, relative_l2

BRANCHES = ("one2many", "one2one")


@dataclass(frozen=True)
class Settings:
    """What one comparison runs: the variant (n, s, m, b, l, x), our device (cpu, gpu, gpu:N),
    dtype, input batch and size, training steps, seed and timing runs (0: no timing)."""

    variant: str
    device: str = "cpu"
    dtype: str = "float32"
    batch: int = 1
    height: int = 640
    width: int = 640
    steps: int = 2
    seed: int = 0
    timing_runs: int = 5
    num_classes: int = 80

    def describe(self) -> str:
        return (f"yolov10{self.variant} on {self.device}, {self.dtype}, input {self.batch}x3x{self.height}x{self.width}, "
                f"seed {self.seed}, {self.steps} training step{'s' if self.steps != 1 else ''}")


@dataclass
class Report:
    """The rows of one comparison, its timing (name -> {ours_ms, torch_ms, ratio}) and its duration."""

    settings: Settings
    rows: list[Row] = field(default_factory=list)
    timing: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0
    loss_scales: dict[int, float] = field(default_factory=dict)  # training step -> output gradients' scale, where not 1

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self.rows)

    def worst(self) -> dict[str, Row]:
        """Per kind, the row with the largest rel L2 relative to its bound (a failed one first)."""
        worst: dict[str, Row] = {}
        for row in self.rows:
            def badness(r: Row) -> tuple:
                return (not r.ok, r.rel_l2 / r.bound if r.bound else r.rel_l2)
            if row.kind not in worst or badness(row) > badness(worst[row.kind]):
                worst[row.kind] = row
        return worst


def torch_device(device: str) -> torch.device:
    """Our device name (cpu, gpu, gpu:N) as torch's (cpu, cuda:N)."""
    if device == "cpu":
        return torch.device("cpu")
    return torch.device(f"cuda:{device.partition(':')[2] or 0}")


class DeviceIO:
    """Moves arrays between the host and our model's device, and waits for the device."""

    def __init__(self, device: str):
        self.cupy = None
        if device != "cpu":
            import cupy

            self.cupy = cupy
            self.ordinal = int(device.partition(":")[2] or 0)

    def put(self, array: np.ndarray):
        """A device copy of `array`, complete before any stream uses it."""
        if self.cupy is None:
            return np.array(array, copy=True)
        with self.cupy.cuda.Device(self.ordinal):
            on_device = self.cupy.asarray(array)
        self.sync()  # the model's stream need not wait for the stream the copy went on
        return on_device

    def get(self, array) -> np.ndarray:
        """A host copy of `array`, after everything enqueued on the device is done."""
        if self.cupy is None:
            return np.array(array, copy=True)
        self.sync()
        return self.cupy.asnumpy(array)

    def sync(self) -> None:
        if self.cupy is not None:
            with self.cupy.cuda.Device(self.ordinal):
                self.cupy.cuda.runtime.deviceSynchronize()


def kernel_model_class():
    """kernels.models.YOLOv10 (ImportError while the kernel model is not there)."""
    from kernels.models import YOLOv10

    return YOLOv10


def head_shapes(settings: Settings) -> list[tuple[int, int, int, int]]:
    """The raw head outputs' shapes, P3 to P5."""
    channels = 4 * reference.REG_MAX + settings.num_classes
    return [(settings.batch, channels, settings.height // s, settings.width // s) for s in reference.STRIDES]


def run(settings: Settings, model_class: Callable[..., Any] | None = None) -> Report:
    """Compare our model (model_class, default kernels.models.YOLOv10) with the reference."""
    start = time.perf_counter()
    model_class = model_class or kernel_model_class()
    dtype = np.dtype(settings.dtype)
    bounds = BOUNDS[dtype.name]
    io = DeviceIO(settings.device)
    device = torch_device(settings.device)
    if device.type == "cuda":
        # float32 is float32 on both sides: no TF32 in PyTorch's convolutions and matmuls.
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    report = Report(settings)
    ours = model_class(settings.variant, num_classes=settings.num_classes, device=settings.device, dtype=settings.dtype)
    try:
        ours.init_random(seed=settings.seed)
        state = {name: io.get(array) for name, array in ours.state_dict().items()}
        ref = reference.build(settings.variant, settings.num_classes, dtype=getattr(torch, dtype.name), device=device)
        reference.load_numpy(ref, state)
        # A second reference run measures how far two programs may differ on each tensor
        # (comparison.CONDITION_FACTOR): for float32, float16 and bfloat16 the reference in float64 (the
        # dtype's own error; for the half dtypes, the mixed-precision reference's), for float64 the
        # reference in float64 in channels-last layout (convolutions that sum in another order).
        other = reference.build(settings.variant, settings.num_classes, dtype=torch.float64, device=device)
        if dtype == np.float64:
            other = other.to(memory_format=torch.channels_last)
            other.channels_last = True
        reference.load_numpy(other, state)
        pair = _Pair(ref, other)
        rng = np.random.default_rng(settings.seed)
        shape = (settings.batch, 3, settings.height, settings.width)
        for step in range(1, settings.steps + 1):
            image = rng.random(shape).astype(dtype)
            output_grads = {branch: [rng.standard_normal(s).astype(dtype) for s in head_shapes(settings)] for branch in BRANCHES}
            output_grads, scale, expected, spread = _reference_step_in_range(pair, device, image, output_grads, dtype)
            if scale != 1:
                report.loss_scales[step] = scale
            got = _our_training_step(ours, io, image, output_grads)
            report.rows += _compare(f"train.{step}/", got, expected, spread, "train_output", dtype, bounds)
        got = {name: io.get(array) for name, array in ours.state_dict().items() if _is_statistic(name)}
        expected, spread = pair.run(_reference_statistics)
        report.rows += _compare("stats/", got, expected, spread, "train_output", dtype, bounds)
        image = rng.random(shape).astype(dtype)
        report.rows += _eval(ours, pair, io, device, image, dtype, bounds)
        del other, pair
        if settings.timing_runs > 0:
            output_grads = {branch: [rng.standard_normal(s).astype(dtype) for s in head_shapes(settings)] for branch in BRANCHES}
            report.timing = _timing(ours, ref, io, device, image, output_grads, settings.timing_runs)
    finally:
        ours.close()
    report.seconds = time.perf_counter() - start
    return report


class _Pair:
    """The reference and its second run; `run` gives the first's results and, per result, the
    relative L2 distance between the two runs (the reference's spread on it)."""

    def __init__(self, ref: torch.nn.Module, other: torch.nn.Module):
        self.ref, self.other = ref, other

    def run(self, produce: Callable[[torch.nn.Module], dict[str, np.ndarray]]):
        expected, other = produce(self.ref), produce(self.other)
        spread = {name: relative_l2(value, other[name]) for name, value in expected.items() if is_floating(value.dtype)}
        return expected, spread


# A step's gradients must stay this far below the dtype's largest value (16: room for ours to sum in
# another order than the reference and still not overflow where it does not).
HEADROOM = 16.0


def gradient_limit(dtype: np.dtype) -> float:
    """The largest gradient a step in `dtype` may reach: the dtype's largest value / HEADROOM."""
    # ml_dtypes.finfo, not np.finfo: NumPy's refuses bfloat16 before ml_dtypes 0.7 (the floor is older).
    return float(ml_dtypes.finfo(dtype).max) / HEADROOM


def _reference_step_in_range(pair: _Pair, device: torch.device, image: np.ndarray,
                             output_grads: dict[str, list[np.ndarray]], dtype: np.dtype):
    """The reference's training step from the output gradients times a loss scale: 1, or for a dtype
    whose gradients would overflow (float16 has 65504 at most), the largest of 1/16, 1/256, ... that
    keeps every gradient of the reference's finite and within 1/HEADROOM of the dtype's maximum, as
    mixed-precision training's loss scaling does (PyTorch's GradScaler backs off on an overflow too).
    Each try restores both reference models' buffers (the running statistics a training forward moves).
    Returns (the output gradients it used, scale, expected, spread)."""
    limit = gradient_limit(dtype)
    buffers = [{name: t.clone() for name, t in model.named_buffers()} for model in (pair.ref, pair.other)]
    scale = 1.0
    while True:
        grads = output_grads if scale == 1 else {
            branch: [(g * scale).astype(dtype) for g in value] for branch, value in output_grads.items()}
        expected, spread = pair.run(functools.partial(_reference_training_step_results, device=device, image=image,
                                                      output_grads=grads))
        largest = max(float(np.max(np.abs(value), initial=0.0)) for name, value in expected.items()
                      if name.startswith("grad/"))
        if np.isfinite(largest) and largest <= limit:
            return grads, scale, expected, spread
        if scale < 2.0 ** -40:
            raise ArithmeticError(f"the reference's gradients overflow {np.dtype(dtype).name} at every loss scale")
        scale /= 16
        for model, saved in zip((pair.ref, pair.other), buffers):
            with torch.no_grad():
                for name, t in model.named_buffers():
                    t.copy_(saved[name])


def _is_statistic(name: str) -> bool:
    return name.endswith(("running_mean", "running_var", "num_batches_tracked"))


def _reference_statistics(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: _host(t) for name, t in model.state_dict().items() if _is_statistic(name)}


def _kind(name: str, output_kind: str) -> str:
    """A result's kind (comparison.KINDS) by its name; head outputs are `output_kind`."""
    if name == "grad/input":
        return "input_grad"
    if name.startswith("grad/"):
        return "param_grad"
    if name.endswith("num_batches_tracked"):
        return "counter"
    if name.endswith(("running_mean", "running_var")):
        return "running_stat"
    return output_kind


def _compare(prefix: str, got: dict[str, np.ndarray], expected: dict[str, np.ndarray], spread: dict[str, float],
             output_kind: str, dtype: np.dtype, bounds: dict[str, float]) -> list[Row]:
    """A row per expected result, in its order, and a failed one per result only we produced."""
    rows = [compare_tensor(prefix + name, _kind(name, output_kind), got.get(name), value, dtype, bounds, spread.get(name))
            for name, value in expected.items()]
    for name in got:
        if name not in expected:
            kind = _kind(name, output_kind)
            rows.append(Row(prefix + name, kind, float("inf"), float("inf"), bounds[kind], False,
                            "produced by our model only (the reference has no such tensor or does not train it)"))
    return rows


def _our_training_step(ours, io: DeviceIO, image: np.ndarray, output_grads: dict[str, list[np.ndarray]]) -> dict[str, np.ndarray]:
    """Our training forward and backward: outputs, input gradient and parameter gradients by name."""
    ours.train()
    got = ours(io.put(image))
    results = {f"{branch}.{level}": io.get(t) for branch in BRANCHES for level, t in enumerate(got[branch])}  # buffers: copy now
    input_grad = ours.backward({branch: [io.put(g) for g in output_grads[branch]] for branch in BRANCHES})["input"]
    results["grad/input"] = io.get(input_grad)
    results.update({f"grad/{name}": io.get(g) for name, g in ours.grads.items()})
    return results


def _reference_training_step(ref: torch.nn.Module, x: torch.Tensor, output_grads: list[torch.Tensor]):
    """Training forward and backward of the reference from the leaf `x` (its gradient reset) and the
    head gradients (one2many P3-P5, then one2one): the outputs; gradients land in `.grad`."""
    ref.train()
    ref.zero_grad(set_to_none=True)
    x.grad = None
    outputs = ref(x)
    torch.autograd.backward([t for branch in BRANCHES for t in outputs[branch]], output_grads)
    return outputs


def _torch_inputs(device: torch.device, dtype: torch.dtype, image: np.ndarray, output_grads: dict[str, list[np.ndarray]],
                  channels_last: bool = False):
    """The image as a leaf that requires grad (in channels-last layout if asked), and the head
    gradients in backward's order, on `device`."""
    x = reference.tensor(image, dtype, device).clone()
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    return x, [reference.tensor(g, dtype, device) for branch in BRANCHES for g in output_grads[branch]]


def _dtype_of(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _channels_last(model: torch.nn.Module) -> bool:
    return getattr(model, "channels_last", False)


def _reference_training_step_results(model: torch.nn.Module, device: torch.device, image: np.ndarray,
                                     output_grads: dict[str, list[np.ndarray]]) -> dict[str, np.ndarray]:
    """The reference's training step as _our_training_step gives ours: outputs, input and parameter
    gradients (every trainable parameter's; zeros where it got none) by name."""
    x, grads = _torch_inputs(device, _dtype_of(model), image, output_grads, _channels_last(model))
    outputs = _reference_training_step(model, x, grads)
    results = {f"{branch}.{level}": _host(t) for branch in BRANCHES for level, t in enumerate(outputs[branch])}
    results["grad/input"] = _host(x.grad)
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            results[f"grad/{name}"] = _host(parameter.grad) if parameter.grad is not None else np.zeros(
                tuple(parameter.shape), _host(parameter).dtype)
    return results


def _reference_eval(model: torch.nn.Module, device: torch.device, image: np.ndarray) -> dict[str, np.ndarray]:
    """The reference's eval forward: raw heads by name, and under "detections", "anchors" and "preds"
    its top-k detections, their anchor indices and every anchor's decoded box and scores."""
    model.eval()
    with torch.no_grad():
        x = reference.tensor(image, _dtype_of(model), device)
        detections, heads = model(x.contiguous(memory_format=torch.channels_last) if _channels_last(model) else x)
        head = model.model[-1]
        preds = reference.decode(head, heads["one2one"])
        selected, anchors = reference.select_detections(preds, head.max_det, head.nc)
    if not torch.equal(selected, detections):  # the same program twice: a difference is a bug here
        raise AssertionError("the reference's detections differ between its forward and its decode")
    results = {f"{branch}.{level}": _host(t) for branch in BRANCHES for level, t in enumerate(heads[branch])}
    results.update(detections=_host(detections), anchors=_host(anchors), preds=_host(preds))
    return results


def _eval(ours, pair: _Pair, io: DeviceIO, device: torch.device, image: np.ndarray, dtype: np.dtype,
          bounds: dict[str, float]) -> list[Row]:
    ours.eval()
    got = ours(io.put(image))
    got_heads = {f"{branch}.{level}": io.get(t) for branch in BRANCHES for level, t in enumerate(got[branch])}
    got_detections = io.get(got["detections"])

    expected, spread = pair.run(functools.partial(_reference_eval, device=device, image=image))
    special = {name: expected.pop(name) for name in ("detections", "anchors", "preds")}
    rows = _compare("eval/", got_heads, expected, spread, "eval_head", dtype, bounds)
    head_spread = max(spread[f"one2one.{level}"] for level in range(len(reference.STRIDES)))
    rows += compare_detections("eval/detections", got_detections, special["detections"], special["anchors"],
                               special["preds"], dtype, bounds, head_spread)
    return rows


def _median_ms(call: Callable[[], Any], sync: Callable[[], None], runs: int) -> float:
    """Median wall time of `runs` calls after one warm-up, the device synchronized around each."""
    call()
    sync()
    times = []
    for _ in range(runs):
        sync()
        begin = time.perf_counter()
        call()
        sync()
        times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def _timing(ours, ref, io: DeviceIO, device: torch.device, image: np.ndarray,
            output_grads: dict[str, list[np.ndarray]], runs: int) -> dict[str, dict[str, float]]:
    def torch_sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    x_ours = io.put(image)
    grads_ours = {branch: [io.put(g) for g in output_grads[branch]] for branch in BRANCHES}
    x_torch, grads_torch = _torch_inputs(device, _dtype_of(ref), image, output_grads)

    def ours_step() -> None:
        ours(x_ours)
        ours.backward(grads_ours)

    def torch_eval() -> None:
        with torch.no_grad():
            ref(x_torch)

    ours.eval()
    ref.eval()
    timing = {"eval_forward": {"ours_ms": _median_ms(lambda: ours(x_ours), io.sync, runs),
                               "torch_ms": _median_ms(torch_eval, torch_sync, runs)}}
    ours.train()
    timing["training_step"] = {"ours_ms": _median_ms(ours_step, io.sync, runs),
                               "torch_ms": _median_ms(lambda: _reference_training_step(ref, x_torch, grads_torch),
                                                      torch_sync, runs)}
    for entry in timing.values():
        entry["ratio"] = entry["ours_ms"] / entry["torch_ms"]
    return timing


def _host(tensor: torch.Tensor) -> np.ndarray:
    return reference.host(tensor)
