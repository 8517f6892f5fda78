"""concat: inputs[] -> output, side by side along `axis`; any rank, any numeric dtype.

Backward cuts output_grad back into the inputs' gradients (a None one is skipped).
Concat forward is split backward and concat backward is split forward: the one
implementation of both directions lives here (`PieceLayout`, `cpu_join`/`cpu_cut`,
`gpu_join`/`gpu_cut`) and :mod:`kernels.split` uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..runtime import core, cpu, cpu_paths, gpu, gpu_paths
from ..runtime.core import MOVABLE_DTYPES, ShapeError, TensorShape, fail
from ..runtime.spec import Arg, declare_op

OP = "concat"


@dataclass(frozen=True)
class ConcatAttrs:
    axis: int
    num_inputs: int

    def __post_init__(self) -> None:
        core.set_attr(self, "axis", core.attr_int(OP, "axis", self.axis))
        core.set_attr(self, "num_inputs", core.attr_int(OP, "num_inputs", self.num_inputs, minimum=2))


# --------------------------------------------------------------------------- the shared primitive


@dataclass(frozen=True)
class PieceLayout:
    """A whole tensor and its pieces along `axis` (non-negative), each piece `sizes[i]` long there
    and starting at `offsets[i]`.

    Every tensor is viewed as `outer` rows: a piece's row is `piece_bytes[i]` long and
    starts `offset_bytes[i]` into the whole's row of `row_bytes`. `unit` is the widest
    copy unit that divides every row length and offset. Computed once, in init_kernel.
    """

    axis: int
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    outer: int
    piece_bytes: tuple[int, ...]
    offset_bytes: tuple[int, ...]
    row_bytes: int
    unit: int
    # GPU launch plans, made on first use for each (direction, method, pieces present, address
    # alignment): what the hot path would otherwise recompute every call.
    plans: dict = field(default_factory=dict, compare=False, hash=False, repr=False)


def piece_layout(whole: TensorShape, sizes: Sequence[int], axis: int) -> PieceLayout:
    """The layout of `whole` cut along `axis` (already normalized) into pieces of `sizes`."""
    sizes = tuple(int(s) for s in sizes)
    offsets = tuple(int(sum(sizes[:i])) for i in range(len(sizes)))
    slice_bytes = core.numel(whole.dims[axis + 1:]) * whole.dtype.itemsize  # bytes of one step along the axis
    piece_bytes = tuple(size * slice_bytes for size in sizes)
    row_bytes = sum(sizes) * slice_bytes
    return PieceLayout(axis=axis, sizes=sizes, offsets=offsets, outer=core.numel(whole.dims[:axis]),
                       piece_bytes=piece_bytes, offset_bytes=tuple(offset * slice_bytes for offset in offsets),
                       row_bytes=row_bytes, unit=gpu.widest_unit(row_bytes, *piece_bytes))


def _slices(layout: PieceLayout) -> list[tuple]:
    """Each piece's index in the whole, made once per layout."""
    slices = layout.plans.get("cpu_slices")
    if slices is None:
        lead = (slice(None),) * layout.axis
        slices = layout.plans["cpu_slices"] = [lead + (slice(offset, offset + size),)
                                               for offset, size in zip(layout.offsets, layout.sizes)]
    return slices


# The size-gated paths of _cpu_move, for concat and split alike (kernels.runtime.cpu_paths).
ROWS_PATH, PIECES_PATH, PIECES_THREADS_PATH = cpu_paths.declare(OP, {
    "rows": "a whole past PARALLEL_MIN_BYTES with dims before the axis: parts of its rows, every piece's in each",
    "pieces": "a whole past PARALLEL_MIN_BYTES without such dims (one image's channels): each piece cut along the axis",
    "pieces.threads": "the pieces' cuts shared out to the threads",
})


def _cpu_move(layout: PieceLayout, whole: Any, pieces: Sequence[Any], to_whole: bool) -> None:
    """Copy each piece that is not None to (to_whole) or from its slice of whole along the axis. Shared out
    to the threads past cpu.PARALLEL_MIN_BYTES: where the dims before the axis hold at least as many rows
    as the parts (cpu.parallel_parts), each part copies its rows of every piece (cpu.cpu_parts); else
    (the channel joins of one image) each piece is cut along the axis itself into that many parts,
    each a contiguous block."""
    if whole.nbytes < cpu.PARALLEL_MIN_BYTES:  # small (most calls): one copy a piece, nothing more
        for piece, where in zip(pieces, _slices(layout)):
            if piece is not None:
                np.copyto(*((whole[where], piece) if to_whole else (piece, whole[where])))
        return
    lead = (slice(None),) * layout.axis
    moves = [(piece, offset) for piece, offset in zip(pieces, layout.offsets) if piece is not None]

    def copy(part: slice, piece: Any, offset: int) -> None:
        target = lead + (slice(offset + part.start, offset + part.stop),)
        if to_whole:
            np.copyto(whole[target], piece[lead + (part,)])
        else:
            np.copyto(piece[lead + (part,)], whole[target])

    ways = cpu.parallel_parts(2 * whole.nbytes)
    outer_dims = whole.shape[:layout.axis]
    if any(size >= ways for size in outer_dims) or ways < 2:
        cpu_paths.reach(ROWS_PATH)

        def rows(part: Any, *piece_parts: Any) -> None:
            for (_, offset), piece in zip(moves, piece_parts):
                where = lead + (slice(offset, offset + piece.shape[layout.axis]),)
                if to_whole:
                    np.copyto(part[where], piece)
                else:
                    np.copyto(piece, part[where])

        cpu.cpu_parts(rows, whole, *(piece for piece, _ in moves), skip_axis=layout.axis)
        return
    tasks = [(slice(size * i // ways, size * (i + 1) // ways), piece, offset)
             for piece, offset in moves for size in (piece.shape[layout.axis],) for i in range(min(ways, size))]
    cpu_paths.reach(PIECES_PATH)

    def run(first: int, last: int) -> None:
        cpu_paths.reach_part(PIECES_THREADS_PATH, first, last, len(tasks))
        for task in tasks[first:last]:
            copy(*task)

    cpu.cpu_parallel(run, len(tasks), 2 * whole.nbytes)


def cpu_join(layout: PieceLayout, pieces: Sequence[Any], whole: Any) -> None:
    """whole = the pieces side by side along the axis (NumPy), shared out to the threads (_cpu_move)."""
    _cpu_move(layout, whole, pieces, True)


def cpu_cut(layout: PieceLayout, whole: Any, pieces: Sequence[Any]) -> None:
    """Each piece that is not None = its slice of whole along the axis (NumPy), shared out to the threads."""
    _cpu_move(layout, whole, pieces, False)


# "kernel": one launch per call for up to 12 pieces (concat.cu), the pieces' addresses passed by
# value in one `struct Ints` argument (no pointer table in device memory, so no copy to the device
# per call). "memcpy2d": one cudaMemcpy2DAsync per piece (~5 us of host time each). "auto": per
# shape class, chosen once per plan from the H200 timings (median per call incl. sync):
# - small joins (SPPF's four 1x320x20x20 on channels, a whole of 2 MB): memcpy2d 34.7 us, kernel
#   35.0 us, a tie; the kernel's host cost is one launch whatever the number of pieces, and the hot
#   path below (one pass over the pieces, the pointer argument kept while the addresses repeat) is
#   leaner than that measurement's -> the kernel (to be re-measured);
# - large one-row joins of at most MEMCPY2D_MAX_PIECES pieces (four 1x256x160x160, a whole of 105 MB)
#   are bound by the copy bandwidth, where memcpy2d won -> memcpy2d from MEMCPY2D_MIN_BYTES of whole;
# - cuts (SPPF's backward: kernel 24.2 us, PyTorch 43.2) and joins of many rows -> the kernel.
# Kept switchable so that the benchmarks compare the methods.
GPU_METHOD = "auto"
MEMCPY2D_MAX_PIECES = 4
MEMCPY2D_MIN_BYTES = 16 << 20  # whole bytes from which a one-row join is bandwidth-bound on the H200 (see above)
# The H200's SMs: a device's threshold is MEMCPY2D_MIN_BYTES in proportion to its SM count (a join
# is bandwidth-bound once each SM has that share to move), so a small device takes memcpy2d sooner.
MEMCPY2D_MEASURED_SMS = 132
MAX_PIECES = gpu.MAX_RANK  # pieces per launch: as many as one `struct Ints` holds
UNROLL = 4  # units a thread moves per round (concat.cu's CONCAT_UNROLL)
# Resident blocks of 256 threads an SM holds: below that many blocks on the device a grid moves
# one unit a thread, above it UNROLL units a thread, loads in flight before stores.
BLOCKS_PER_SM = 8
# An index runs up to UNROLL grid strides past the count; 32-bit arithmetic must hold that too.
_GRID_SPAN = UNROLL * 65536 * gpu.BLOCK

# The GPU paths of the join/cut primitive (concat, and split, which runs it the other way round).
gpu_paths.declare(OP, {
    "memcpy2d": "one cudaMemcpy2DAsync per piece (auto: a join of one row, <= 4 pieces, >= 16 MiB of whole on 132 SMs)",
    "kernel.join": "concat_copy<..., ToWhole=true>: pieces -> whole (concat forward, split backward)",
    "kernel.cut": "concat_copy<..., ToWhole=false>: whole -> pieces (split forward, concat backward)",
    **{f"kernel.unit{unit}": f"concat_copy moving {unit}-byte units (the widest that sizes and addresses allow)"
       for unit in (16, 8, 4, 2, 1)},
    "kernel.one_row": "outer == 1: a piece's unit index is a plain offset into the whole (no division)",
    "kernel.rows": "outer > 1: a piece's unit index is split into row and column",
    "kernel.batches": "more than 12 pieces present: one launch per 12",
    "kernel.unrolled": "a piece longer than CONCAT_UNROLL - 1 grid strides: the unrolled main loop runs",
    "kernel.tail": "a piece not a multiple of CONCAT_UNROLL grid strides: the one-unit tail loop runs",
})

_CUDA = gpu.CudaModule("concat.cu", [
    f"concat_copy<{bits}, {index}, {direction}>"
    for bits in gpu.BITS_TYPES for index in gpu.INDEX_TYPES for direction in ("true", "false")
], defines={"CONCAT_UNROLL": UNROLL})


def gpu_join(stream: Any, layout: PieceLayout, pieces: Sequence[Any], whole: Any, method: str | None = None) -> None:
    """whole = the pieces side by side along the axis, enqueued on the stream."""
    _gpu_move(stream, layout, whole, pieces, True, method or GPU_METHOD)


def gpu_cut(stream: Any, layout: PieceLayout, whole: Any, pieces: Sequence[Any], method: str | None = None) -> None:
    """Each piece that is not None = its slice of whole, enqueued on the stream."""
    _gpu_move(stream, layout, whole, pieces, False, method or GPU_METHOD)


def _blocks(units: int, sm_count: int) -> int:
    return min(gpu.grid_for(units), max(gpu.grid_for(units, per_thread=UNROLL), BLOCKS_PER_SM * sm_count))


def _gpu_move(stream, layout: PieceLayout, whole, pieces, to_whole: bool,
              method: str) -> None:  # pragma: no cover - GPU: launches, 2D copies
    """The hot path: look the plan up by what can change between calls (which pieces are None,
    the addresses' alignment), then only build the pointer tables and launch."""
    whole_ptr = whole.data.ptr
    bits, present, widths = whole_ptr, 0, layout.piece_bytes
    ptrs = [0] * len(pieces)  # each piece's address read once (0 for a None one)
    for i, piece in enumerate(pieces):
        if piece is not None:
            ptrs[i] = ptr = piece.data.ptr
            present |= 1 << i
            if widths[i]:  # an empty piece's address does not matter
                bits |= ptr
    key = (to_whole, method, present, bits & 15)
    plan = layout.plans.get(key)
    if plan is None:
        plan = layout.plans[key] = _gpu_move_plan(layout, to_whole, method, present, bits & 15,
                                                  gpu.sm_count(stream.device))
    method, steps, paths = plan
    for path in paths:
        gpu_paths.reach(path)
    if method == "memcpy2d":
        runtime = gpu.cupy.cuda.runtime
        for i, offset, destination_pitch, source_pitch, width, height in steps:
            piece_ptr, at_whole = ptrs[i], whole_ptr + offset
            destination, source = (at_whole, piece_ptr) if to_whole else (piece_ptr, at_whole)
            try:
                runtime.memcpy2DAsync(destination, destination_pitch, source, source_pitch, width, height,
                                      runtime.memcpyDeviceToDevice, stream.ptr)
            except runtime.CUDARuntimeError as error:
                raise core.CudaError("CUDA", str(error).split(":")[0], str(error)) from error
        return
    for kernel, grid, batch, tail, last in steps:
        # The pointer argument of the addresses of the last call is kept (last[0]: (addresses, argument)):
        # a model's buffers repeat from call to call, and comparing a tuple costs less than packing one.
        addresses = tuple([ptrs[i] for i in batch])
        kept = last[0]
        if kept is not None and kept[0] == addresses:
            pointers = kept[1]
        else:
            pointers = gpu.ints_arg(addresses)
            last[0] = (addresses, pointers)
        gpu.launch(stream, kernel, grid, gpu.BLOCK, (whole, tail[0], tail[1], pointers, tail[2], tail[3]))


def kernel_paths(layout: PieceLayout, to_whole: bool, unit: int, active: Sequence[int], sm_count: int) -> tuple[str, ...]:
    """The named GPU paths (kernels.runtime.gpu_paths) that the kernel method's launches take for the
    `active` pieces moved in `unit`-byte units: direction, unit, row form, batching, and which of
    copy_piece's loops run (CONCAT_UNROLL units a thread while (UNROLL - 1) grid strides remain, one
    at a time after). Pure: no device."""
    paths = [OP + (".kernel.join" if to_whole else ".kernel.cut"), f"{OP}.kernel.unit{unit}",
             OP + (".kernel.one_row" if layout.outer == 1 else ".kernel.rows")]
    if len(active) > MAX_PIECES:
        paths.append(OP + ".kernel.batches")
    unrolled = tail = False
    for start in range(0, len(active), MAX_PIECES):  # each launch's grid is sized by its longest piece
        counts = [layout.outer * (layout.piece_bytes[i] // unit) for i in active[start:start + MAX_PIECES]]
        stride = _blocks(max(counts), sm_count) * gpu.BLOCK
        unrolled = unrolled or any(count > (UNROLL - 1) * stride for count in counts)
        tail = tail or any(count % (UNROLL * stride) for count in counts)
    return tuple(paths + [OP + ".kernel.unrolled"] * unrolled + [OP + ".kernel.tail"] * tail)


def _gpu_move_plan(layout: PieceLayout, to_whole: bool, method: str, present: int, misalignment: int,
                   sm_count: int) -> tuple:
    """(method, steps, paths): the launches (or 2D copies) of one direction, for the pieces in the `present`
    bit mask and addresses whose low 4 bits OR to `misalignment`: everything but the addresses, made once;
    `paths` are the named GPU paths they take (kernels.runtime.gpu_paths)."""
    widths, offsets = layout.piece_bytes, layout.offset_bytes
    active = [i for i in range(len(widths)) if present >> i & 1 and widths[i] and layout.outer]
    if method == "auto":
        memcpy = (to_whole and layout.outer == 1 and len(active) <= MEMCPY2D_MAX_PIECES
                  and layout.row_bytes * MEMCPY2D_MEASURED_SMS >= MEMCPY2D_MIN_BYTES * sm_count)
        method = "memcpy2d" if memcpy else "kernel"
    if method == "memcpy2d":
        return method, [(i, offsets[i], *((layout.row_bytes, widths[i]) if to_whole else (widths[i], layout.row_bytes)),
                         widths[i], layout.outer) for i in active], (OP + ".memcpy2d",) if active else ()
    # A unit divides every address iff it divides their OR (units are powers of two up to 16).
    unit = gpu.widest_unit(layout.unit, misalignment)
    index = gpu.index_type(layout.outer * layout.row_bytes + _GRID_SPAN)
    scalar = np.int32 if index == "int" else np.int64
    kernel = _CUDA.function(f"concat_copy<{gpu.unit_type(unit)}, {index}, {'true' if to_whole else 'false'}>")
    plan = []
    for start in range(0, len(active), MAX_PIECES):
        batch = tuple(active[start:start + MAX_PIECES])
        units = [widths[i] // unit for i in batch]
        grid = (_blocks(layout.outer * max(units), sm_count), len(batch))
        tail = (scalar(layout.row_bytes // unit), scalar(layout.outer), gpu.ints_arg(units),
                gpu.ints_arg([offsets[i] // unit for i in batch]))
        plan.append((kernel, grid, batch, tail, [None]))
    return method, plan, kernel_paths(layout, to_whole, unit, active, sm_count) if active else ()


# --------------------------------------------------------------------------- init and checks


def output_dims(attrs: ConcatAttrs, input_dims: Sequence[Sequence[int]]) -> tuple[int, ...]:
    axis = core.normalize_axis(OP, "axis", attrs.axis, len(input_dims[0]))
    dims = list(input_dims[0])
    dims[axis] = sum(d[axis] for d in input_dims)
    return tuple(dims)


def init_kernel(handle: Any, attrs: ConcatAttrs, input_shapes: list[TensorShape], output_shape: TensorShape) -> core.KernelState:
    """Check that the inputs differ only along the axis and that output_shape is their concat."""
    input_shapes = core.check_list(OP, "input_shapes", input_shapes)
    state = core.make_state(OP, handle, attrs, ConcatAttrs, input_shapes=input_shapes, output_shape=output_shape)
    core.check_list(OP, "input_shapes", input_shapes, attrs.num_inputs)
    first = input_shapes[0]
    core.check_dtype(OP, "input_shapes[0]", first, MOVABLE_DTYPES)
    if first.rank < 1:
        raise fail(ShapeError, OP, "input_shapes[0]", "rank >= 1", f"rank 0 {first.dims}")
    axis = core.normalize_axis(OP, "axis", attrs.axis, first.rank)
    for i, shape in enumerate(input_shapes[1:], start=1):
        core.check_same_dtype(OP, f"input_shapes[{i}]", shape, first, "input_shapes[0]")
        others = first.dims[:axis] + ("any",) + first.dims[axis + 1:]
        if shape.rank != first.rank or shape.dims[:axis] + shape.dims[axis + 1:] != first.dims[:axis] + first.dims[axis + 1:]:
            raise fail(ShapeError, OP, f"input_shapes[{i}]", f"dims {others} (as input_shapes[0] but along axis {axis})",
                       shape.dims)
    core.check_dims(OP, "output_shape", output_shape, output_dims(attrs, [s.dims for s in input_shapes]))
    core.check_same_dtype(OP, "output_shape", output_shape, first, "input_shapes[0]")
    state.saved["layout"] = piece_layout(output_shape, [s.dims[axis] for s in input_shapes], axis)
    return state


def _check_forward(stream, handle, state, attrs, inputs, output) -> list[Any]:
    return core.check_many_to_one_forward(OP, stream, handle, state, attrs, inputs, output)


def _check_backward(stream, handle, state, attrs, output, output_grad, inputs, input_grads) -> list[Any]:
    return core.check_many_to_one_backward(OP, stream, handle, state, attrs, output, output_grad, inputs, input_grads)


# --------------------------------------------------------------------------- CPU


@cpu.cpu_kernel
def cpu_forward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: ConcatAttrs,
                       inputs: Sequence[core.Array], output: core.Array) -> None:
    """output = concatenate(inputs, axis)."""
    inputs = _check_forward(stream, handle, state, attrs, inputs, output)
    cpu_join(state.saved["layout"], inputs, output)


@cpu.cpu_kernel
def cpu_backward_kernel(stream: cpu.CpuStream, handle: cpu.CpuHandle, state: core.KernelState, attrs: ConcatAttrs,
                        output: core.Array | None, output_grad: core.Array, inputs: Sequence[core.Array] | None,
                        input_grads: Sequence[core.Array | None]) -> None:
    """input_grads[i] = output_grad's slice of input i along the axis (None ones skipped)."""
    input_grads = _check_backward(stream, handle, state, attrs, output, output_grad, inputs, input_grads)
    cpu_cut(state.saved["layout"], output_grad, input_grads)


# --------------------------------------------------------------------------- GPU


@core.gpu_kernel
def gpu_forward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: ConcatAttrs,
                       inputs: Sequence[core.Array], output: core.Array) -> None:
    """output = concatenate(inputs, axis), one launch per 12 inputs, enqueued on the stream."""
    inputs = _check_forward(stream, handle, state, attrs, inputs, output)
    gpu_join(stream, state.saved["layout"], inputs, output)


@core.gpu_kernel
def gpu_backward_kernel(stream: gpu.GpuStream, handle: gpu.GpuHandle, state: core.KernelState, attrs: ConcatAttrs,
                        output: core.Array | None, output_grad: core.Array, inputs: Sequence[core.Array] | None,
                        input_grads: Sequence[core.Array | None]) -> None:
    """input_grads[i] = output_grad's slice of input i (None ones skipped), enqueued on the stream."""
    input_grads = _check_backward(stream, handle, state, attrs, output, output_grad, inputs, input_grads)
    gpu_cut(stream, state.saved["layout"], output_grad, input_grads)


# --------------------------------------------------------------------------- the declaration

SPEC = declare_op(
    OP, globals(),
    attrs=ConcatAttrs,
    shapes=("input_shapes", "output_shape"),
    forward=(Arg("inputs", "input", many=True), Arg("output", "output")),
    backward=(Arg("output", "output", required=False), Arg("output_grad", "output_grad"),
              Arg("inputs", "input", many=True, required=False),
              Arg("input_grads", "grad", many=True, required=False, of="inputs")),
    dtypes=MOVABLE_DTYPES,
    forward_doc="Write output = the inputs concatenated along the axis, on the stream's device.",
    backward_doc="Write each input_grads[i] that is not None from output_grad, on the stream's device.",
)
forward_kernel, backward_kernel, cleanup_kernel = SPEC.forward_kernel, SPEC.backward_kernel, SPEC.cleanup_kernel
cpu_init_kernel, gpu_init_kernel, cpu_cleanup_kernel, gpu_cleanup_kernel = SPEC.twins
