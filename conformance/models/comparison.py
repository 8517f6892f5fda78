"""Whole-network comparison metrics: per tensor the largest ulp distance (in the run's dtype) and
the relative L2 error ||got - expected|| / ||expected||, checked against a bound per kind of
tensor; and the detections, matched as sets where near-tied scores may legitimately swap.

The bounds and the reasons for them are in BOUNDS; docs/conformance.md#whole-network-comparison
says the same for users.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kernels.runtime.core import is_floating

from ..compare import ulp_distance, ulp_of

# Kinds of compared tensors, in report order.
KINDS = (
    "train_output",   # raw head outputs of a training forward (batch statistics)
    "input_grad",     # gradient of the input image
    "param_grad",     # gradient of a parameter
    "running_stat",   # BatchNorm running mean and variance after the training steps
    "counter",        # BatchNorm num_batches_tracked: an integer, exact
    "eval_head",      # raw head outputs of an eval forward (running statistics)
    "box",            # detection boxes (x1, y1, x2, y2 in input pixels) of matched detections
    "score",          # detection scores of matched detections
    "identity",       # which (anchor, class) pairs were detected: exact up to ties at the cutoff
)


def _half_floors(u: float) -> dict[str, float]:
    """The half dtypes' floors in units u of the dtype's rounding (see BOUNDS): 8 u for eval heads, boxes,
    scores and running statistics, 64 u for training outputs and the input gradient, 128 u for parameter
    gradients."""
    return {"train_output": 64 * u, "input_grad": 64 * u, "param_grad": 128 * u, "running_stat": 8 * u,
            "counter": 0.0, "eval_head": 8 * u, "box": 8 * u, "score": 8 * u, "identity": 0.0}


# Relative-L2 bounds per dtype and kind: the floor of each tensor's bound. A tensor's bound is
# the larger of this and CONDITION_FACTOR times the reference's own spread on it (below), so
# the floors bind only where PyTorch happens to be far more accurate than the error structure
# of the computation allows another float32 program to be:
#
# - Forward outputs (training and eval heads): about 70 convolutions in sequence, each summing
#   9 to 2300 float32 products, and BatchNorms that amplify the error of channels with a small
#   batch variance. PyTorch's own float32 error on the heads of a well-conditioned run (n at
#   2x3x96x128) is 2e-7 to 4e-5. Floor 1e-4.
# - Running statistics: batch means and unbiased variances over N*H*W values of a layer's float32
#   input, blended 0.03 into the running value. Floor 1e-4.
# - Gradients flow back through the same layers, and BatchNorm's backward subtracts the batch means
#   of dy and of dy * x_hat (cancellation that amplifies its input's rounding). The input gradient
#   sums every path back to the image: floor 3e-4. A parameter gradient is a sum over N*H*W
#   positions: floor 1e-3.
# - Boxes (anchor centre -+ a DFL expectation, times the stride) and scores (a sigmoid) do not
#   magnify the relative error of the one-to-one head outputs they are decoded from. Floor 1e-4.
#
# float64: the same structure with an epsilon 2^-29 times float32's; floors 1e-11 for forwards,
# statistics, boxes and scores and 1e-10 for gradients, again only where the spread is smaller.
BOUNDS: dict[str, dict[str, float]] = {
    "float32": {
        "train_output": 1e-4,
        "input_grad": 3e-4,
        "param_grad": 1e-3,
        "running_stat": 1e-4,
        "counter": 0.0,
        "eval_head": 1e-4,
        "box": 1e-4,
        "score": 1e-4,
        "identity": 0.0,
    },
    "float64": {
        "train_output": 1e-11,
        "input_grad": 1e-10,
        "param_grad": 1e-10,
        "running_stat": 1e-11,
        "counter": 0.0,
        "eval_head": 1e-11,
        "box": 1e-11,
        "score": 1e-11,
        "identity": 0.0,
    },
    # float16 and bfloat16 (mixed precision: half activations and conv weights, float32 BatchNorms,
    # float32 accumulation inside every op on both sides): floors in units u of the dtype's rounding
    # (2^-11 for float16, 2^-8 for bfloat16). Measured on the CPU against the mixed-precision
    # reference (yolov10n, 2x3x96x128, seeds 0 and 1; tools: python -m conformance.models --dtype ...):
    # eval heads 1.0 u (float16 5.1e-4, bfloat16 3.7e-3), boxes and scores <= 1 u, running statistics
    # 0.7 u; training outputs and gradients as far from PyTorch as PyTorch's half run is from its
    # float64 run (ours / its spread <= 1.9 on every tensor), which at this size is 0.07 (float16) to
    # 0.6 (bfloat16): BatchNorm over 24 values per channel at P5 amplifies each rounding, and the
    # tensor's spread bound (CONDITION_FACTOR) covers them. Floors: 8 u for eval, boxes, scores and
    # statistics, 64 u for training outputs and the input gradient, 128 u for parameter gradients.
    # At 1x3x64x64 float16 parameter gradients pass 65504 (inf) where the training BatchNorms
    # normalize 4 values per channel: without loss scaling half training cannot hold them there.
    # yolov10x at 2x3x96x128: bfloat16 passes (ours <= 1.7 x spread); float16 fails two step-2
    # conv weight gradients with one inf each (float64 maxima 58226 and 48450, PyTorch's float16
    # spread on them 116%: ours rounds past 65504 where PyTorch's stays below).
    "float16": _half_floors(2.0 ** -11),
    "bfloat16": _half_floors(2.0 ** -8),
}


# How far two correct programs may differ depends on the tensor: at a 2x2 P5 level a training
# BatchNorm normalises each channel over 4 values and amplifies rounding a thousandfold, and a
# gradient that is zero in exact arithmetic (a BatchNorm's bias before a conv and another
# BatchNorm, which removes any shift) is nothing but rounding. So each tensor's spread is measured
# on the reference itself, from the same weights and inputs: in float32, its float32 run against
# its float64 run (float32's own error); in float64, two float64 runs whose convolutions sum in
# different orders (NCHW and channels-last layouts). A tensor's bound is the larger of its kind's
# floor and CONDITION_FACTOR times that spread: ours may differ from PyTorch a few times as much
# as PyTorch differs from itself, not more.
#
# Measured with tools/measure_model_error.py, whose stand-in for ours is the reference with
# oneDNN off (PyTorch's own im2col + GEMM convolutions, another summation order, much like a
# NumPy implementation): over n and x at 1x3x64x64 (seeds 0 and 1) and 2x3x96x128 (seed 0), the
# stand-in's float32 error against the reference is at most 5.4 times the reference's spread on
# the same tensor (a P5 head output, the input gradient, a BatchNorm weight gradient). 32 is six times
# that: room for an implementation whose summation order is further from PyTorch's. In float64
# the stand-in gives PyTorch's bits (its float64 convolutions are im2col + GEMM already), so the
# ratio there is not measured by it; the same factor is used, with the float64 spread measured
# directly between two summation orders rather than inferred from float32.
CONDITION_FACTOR = 32.0
# A spread this large means the dtype cannot resolve the tensor at this size (float32 in training
# mode at 1x3x64x64 for the large variants): such a row passes only grossly wrong values, and says so.
ILL_CONDITIONED = 0.1


@dataclass
class Row:
    """One compared tensor: its name, kind, the largest ulp distance (in the run's dtype), the
    relative L2 error, the bound, whether the error is within it, a note where needed, and the
    reference's spread on the tensor (NaN where not measured)."""

    name: str
    kind: str
    max_ulp: float
    rel_l2: float
    bound: float
    ok: bool
    note: str = ""
    reference_spread: float = float("nan")

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        ulp = "inf" if not np.isfinite(self.max_ulp) else f"{self.max_ulp:.0f}"
        status = "ok" if self.ok else "FAIL"
        own = "" if np.isnan(self.reference_spread) else f"{self.reference_spread:.2e}"
        text = f"{self.name:<56} {ulp:>11} {self.rel_l2:>10.3e} {own:>9} {self.bound:>9.2e}  {status}"
        return f"{text}  {self.note}" if self.note else text


HEADER = f"{'tensor':<56} {'max ulp':>11} {'rel L2':>10} {'spread':>9} {'bound':>9}  ok"


def max_ulp(got: np.ndarray, expected: np.ndarray, dtype: np.dtype) -> float:
    """The largest distance in ulps of `dtype` between the two (both rounded to it); inf for a NaN
    on one side only."""
    if got.size == 0:
        return 0.0
    return float(np.max(ulp_distance(got.astype(dtype), expected.astype(dtype))))


def relative_l2(got: np.ndarray, expected: np.ndarray) -> float:
    """||got - expected|| / ||expected|| in float64: 0 when both are zero, inf when only expected is,
    NaN when either holds a NaN."""
    got64, expected64 = got.astype(np.float64).ravel(), expected.astype(np.float64).ravel()
    difference = float(np.linalg.norm(got64 - expected64))
    norm = float(np.linalg.norm(expected64))
    if np.isnan(difference) or np.isnan(norm):
        return float("nan")
    if norm == 0.0:
        return 0.0 if difference == 0.0 else float("inf")
    return difference / norm


def tensor_bound(kind: str, bounds: dict[str, float], spread: float | None) -> float:
    """The bound on one tensor's relative L2 error: its kind's, raised to CONDITION_FACTOR times the
    reference's spread on it where that is larger (kinds bound at 0 stay exact)."""
    bound = bounds[kind]
    if spread is not None and bound > 0 and np.isfinite(spread):
        bound = max(bound, CONDITION_FACTOR * spread)
    return bound


def compare_tensor(name: str, kind: str, got, expected: np.ndarray, dtype: np.dtype,
                   bounds: dict[str, float], spread: float | None = None) -> Row:
    """A row for one tensor: shape first, then the ulp distance and relative L2 error against its
    bound (tensor_bound; integers and the kinds bound at 0 must be equal)."""
    bound = tensor_bound(kind, bounds, spread)
    measured = float("nan") if spread is None else spread
    if got is None:
        return Row(name, kind, float("inf"), float("inf"), bound, False, "missing on our side", measured)
    got = np.asarray(got)
    if got.shape != expected.shape:
        return Row(name, kind, float("inf"), float("inf"), bound, False, f"shape {got.shape}, expected {expected.shape}",
                   measured)
    if not is_floating(expected.dtype) or bound == 0:
        equal = bool(np.array_equal(got, expected))
        note = "" if equal else f"got {got.ravel()[:4].tolist()}, expected {expected.ravel()[:4].tolist()}"
        return Row(name, kind, 0.0 if equal else float("inf"), 0.0 if equal else float("inf"), bound, equal, note, measured)
    rel = relative_l2(got, expected)
    note = "ill-conditioned here: only a gross error would fail" if measured >= ILL_CONDITIONED else ""
    return Row(name, kind, max_ulp(got, expected, dtype), rel, bound, bool(rel <= bound), note, measured)


@dataclass
class DetectionMatch:
    """How one image's detections on the two sides correspond."""

    matched_ours: np.ndarray     # row indices on our side of the (anchor, class) pairs both selected
    matched_ref: np.ndarray      # the reference rows of the same pairs
    reordered: int               # positions whose pair differs though both sides selected it (near ties)
    cutoff_swaps: int            # pairs only one side selected, within the tie window of the k-th score
    unexplained: list[str]       # pairs only one side selected, away from the cutoff: a failure


def match_detections(ours: np.ndarray, ref: np.ndarray, ref_anchor: np.ndarray, ref_boxes: np.ndarray,
                     tie_window: float) -> DetectionMatch:
    """Match one image's detections (k, 6: box, score, class) by (anchor, class).

    The reference knows each detection's anchor; ours is identified by its box, as the anchor whose
    reference box (`ref_boxes`, every anchor's, (A, 4)) is nearest (max-norm). Sorted by score, two
    detections whose scores differ by less than the rounding of the two sides may come out in either
    order, and at the k-th score the last selected pair may differ: a pair selected by one side only
    is accepted when its score is within `tie_window` of the reference's k-th score, and reported.
    """
    distance = np.max(np.abs(ours[:, None, :4].astype(np.float64) - ref_boxes[None, :, :].astype(np.float64)), axis=2)
    ours_anchor = np.argmin(distance, axis=1)
    ours_pairs = [(int(a), int(c)) for a, c in zip(ours_anchor, ours[:, 5])]
    ref_pairs = [(int(a), int(c)) for a, c in zip(ref_anchor, ref[:, 5])]
    ref_row = {pair: row for row, pair in enumerate(ref_pairs)}
    cutoff = float(ref[-1, 4]) if len(ref) else 0.0
    matched_ours, matched_ref, unexplained = [], [], []
    cutoff_swaps = 0
    seen = set()
    for row, pair in enumerate(ours_pairs):
        if pair in seen:
            unexplained.append(f"anchor {pair[0]} class {pair[1]} detected twice")
            continue
        seen.add(pair)
        if pair in ref_row:
            matched_ours.append(row)
            matched_ref.append(ref_row[pair])
        elif float(ours[row, 4]) <= cutoff + tie_window:
            cutoff_swaps += 1
        else:
            unexplained.append(f"anchor {pair[0]} class {pair[1]} score {float(ours[row, 4]):.6g} only on our side")
    for row, pair in enumerate(ref_pairs):
        if pair not in seen:
            if float(ref[row, 4]) <= cutoff + tie_window:
                cutoff_swaps += 1
            else:
                unexplained.append(f"anchor {pair[0]} class {pair[1]} score {float(ref[row, 4]):.6g} only in the reference")
    reordered = sum(o != r for o, r in zip(ours_pairs, ref_pairs))
    return DetectionMatch(np.array(matched_ours, dtype=np.int64), np.array(matched_ref, dtype=np.int64),
                          reordered, cutoff_swaps, unexplained)


def compare_detections(prefix: str, ours, ref: np.ndarray, ref_anchor: np.ndarray, ref_preds: np.ndarray,
                       dtype: np.dtype, bounds: dict[str, float], spread: float | None = None) -> list[Row]:
    """Rows for the eval detections (B, k, 6): the scores and boxes of the (anchor, class) pairs both
    sides selected, and the pairs themselves (exact, except near-tied pairs in another order and
    swaps at the k-th score, which are counted in the note; see match_detections).
    `ref_preds` is the reference's decode of every anchor (B, A, 4 + nc); `spread` the reference's
    spread on the one-to-one head outputs the detections are decoded from (the sigmoid and the DFL
    expectation do not magnify relative error), which raises the box and score bounds as it does
    a tensor's."""
    if ours is None:
        return [Row(f"{prefix}.{part}", kind, float("inf"), float("inf"), bounds[kind], False, "missing on our side")
                for part, kind in (("scores", "score"), ("boxes", "box"), ("identity", "identity"))]
    ours = np.asarray(ours)
    if ours.shape != ref.shape:
        note = f"shape {ours.shape}, expected {ref.shape}"
        return [Row(f"{prefix}.{part}", kind, float("inf"), float("inf"), bounds[kind], False, note)
                for part, kind in (("scores", "score"), ("boxes", "box"), ("identity", "identity"))]
    pairs_ours, pairs_ref, problems = [], [], []
    reordered = cutoff_swaps = 0
    for image in range(ref.shape[0]):
        # The tie window: a pair can cross the cutoff only if the two sides' scores differ by about
        # the gap between its score and the cutoff. The sorted scores show how far the two sides'
        # scores differ: twice the largest difference, and an ulp of the cutoff for exact ties.
        mine, theirs = -np.sort(-ours[image, :, 4].astype(np.float64)), -np.sort(-ref[image, :, 4].astype(np.float64))
        cutoff = abs(float(theirs[-1])) if theirs.size else 0.0
        tie_window = 2 * float(np.max(np.abs(mine - theirs), initial=0.0)) + ulp_of(cutoff, np.dtype(dtype))
        match = match_detections(ours[image], ref[image], ref_anchor[image], ref_preds[image, :, :4], tie_window)
        pairs_ours.append(ours[image, match.matched_ours, :5])
        pairs_ref.append(ref[image, match.matched_ref, :5])
        reordered += match.reordered
        cutoff_swaps += match.cutoff_swaps
        problems += [f"image {image}: {text}" for text in match.unexplained]
    pairs_ours, pairs_ref = np.concatenate(pairs_ours), np.concatenate(pairs_ref)
    rows = [compare_tensor(f"{prefix}.scores", "score", pairs_ours[:, 4], pairs_ref[:, 4], dtype, bounds, spread),
            compare_tensor(f"{prefix}.boxes", "box", pairs_ours[:, :4], pairs_ref[:, :4], dtype, bounds, spread)]
    note = f"{ref.shape[0] * ref.shape[1]} detections; {reordered} reordered near ties; {cutoff_swaps} swapped at the cutoff"
    if problems:
        note += f"; {len(problems)} unmatched: " + "; ".join(problems[:3])
    failed = float("inf") if problems else 0.0
    rows.append(Row(f"{prefix}.identity", "identity", failed, failed, bounds["identity"], not problems, note))
    return rows
