"""conv_2d on the GPU: the paths plan.choose_paths picks at init, each one deterministic, a plain
sum of products in FMA math (no FFT, no Winograd, no atomics; no TF32 unless the state's handle
allows it; half data on tensor cores with float32 compute):

- "gemm" (pointwise): cuBLAS GEMMs (pedantic math) for the forward and both gradients;
- "columns" (other groups == 1): the forward in cuDNN, both gradients by conv_2d.cu's im2col /
  col2im and cuBLAS GEMMs, a chunk of images at a time in the handle's workspace;
- "depthwise": conv_2d.cu's own kernels throughout;
- "cudnn": cuDNN's convolution API (kernels/runtime/cudnn.py). Each direction run in cuDNN (the
  forward; the float16 and bfloat16 gradients of a state made for backward: cudnn.GRADIENT_PLAN_DTYPES
  says why not float32's) goes through cuDNN's backend API: an
  execution plan built at init (cudnn.ConvolutionPlan), one cudnnBackendExecute a call. That
  direction's legacy call (cudnnConvolutionForward / BackwardData / BackwardFilter, its algorithm
  also chosen at init) serves where no engine qualifies, for a call the plan cannot take (pointers
  not 16-byte aligned, another handle's cuDNN handle), and for every call with
  KERNELS_CUDNN_BACKEND=0 (cudnn.backend_mode).

init, forward and backward run after the package's checks (init_kernel, gpu_forward_kernel,
gpu_backward_kernel, which run inside their stream). Everything is enqueued on the given stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .. import activation
from ..runtime import core, cublas, cudnn, gpu, gpu_paths
from .plan import (
    DEPTHWISE_BLOCK,
    DEPTHWISE_FILTER_TAPS_DENSE_BLOCKS,
    DEPTHWISE_ROWS_SHAPES,
    DEPTHWISE_SHARES,
    IMPLICIT_GEMM_BELOW_FLOPS,
    Fold,
    Gemm,
    choose_paths,
    forward_flops,
    plan_backward_data,
    plan_backward_filter,
    plan_depthwise,
    plan_forward,
    workspace_elements,
    workspace_limit,
)

if TYPE_CHECKING:
    from .attrs import Conv2DState

# Shared with conv_2d.cu, which gets them as -D options (CudaModule's defines): the block sizes of the
# kernels that reduce in a shared-memory tree of that many doubles (powers of two), and the fields of
# struct ConvGeometry (see _make_geometry for their order).
CONV_BIAS_GRAD_BLOCK = 512
CONV_DEPTHWISE_FILTER_BLOCK = 256
CONV_GEOMETRY_FIELDS = 13

# The bias gradient and the depthwise kernels in every float type (the half ones too); the column
# kernels only in float and double (half convolutions other than depthwise run in cuDNN).
_ALL_TYPES = gpu.HALF_TYPES + gpu.FLOAT_TYPES


def _rows_kernel(cuda_type: str, index: str, shape: tuple[int, int, int], turned: bool,
                 share: tuple[int, int]) -> str:
    """The name of conv_depthwise_forward_rows for a (kernel_h, kernel_w, stride) of DEPTHWISE_ROWS_SHAPES;
    `turned`: the stride-1 input gradient (the forward of the filter turned by 180 degrees); `share`: a
    thread's (rows, columns) of outputs."""
    kh, kw, stride = shape
    return (f"conv_depthwise_forward_rows<{cuda_type}, {index}, {kh}, {kw}, {stride}, "
            f"{'true' if turned else 'false'}, {share[0]}, {share[1]}>")


def _rows_kernels(share: Callable[[Any, tuple[int, int, int]], tuple[int, int]]) -> list[str]:
    """Every instantiation of conv_depthwise_forward_rows, each at the share of a thread share(dtype, shape)."""
    return [_rows_kernel(gpu.cuda_type(dtype), i, shape, turned, share(dtype, shape))
            for shape in DEPTHWISE_ROWS_SHAPES for turned in (False, True) if shape[2] == 1 or not turned
            for dtype in core.ALL_FLOAT_DTYPES for i in gpu.INDEX_TYPES]


def _share(dtype: Any, shape: tuple[int, int, int]) -> tuple[int, int]:
    """(rows, columns) of outputs a thread of the rows kernel computes for this dtype and (kernel_h, kernel_w,
    stride) of DEPTHWISE_ROWS_SHAPES (plan.DEPTHWISE_SHARES)."""
    return DEPTHWISE_SHARES[(np.dtype(dtype).itemsize, shape[0])]


_DEFINES = {"CONV_BIAS_GRAD_BLOCK": CONV_BIAS_GRAD_BLOCK, "CONV_DEPTHWISE_FILTER_BLOCK": CONV_DEPTHWISE_FILTER_BLOCK,
            "CONV_GEOMETRY_FIELDS": CONV_GEOMETRY_FIELDS}
_CUDA = gpu.CudaModule("conv_2d.cu", [f"conv_bias_grad<{t}>" for t in _ALL_TYPES] + [
    f"{kernel}<{t}, {i}>" for kernel in ("conv_im2col", "conv_col2im") for t in gpu.FLOAT_TYPES
    for i in gpu.INDEX_TYPES] + [
    f"conv_depthwise_filter_grad<{t}, {i}>" for t in _ALL_TYPES for i in gpu.INDEX_TYPES] + [
    f"conv_depthwise_input_grad<{t}, {i}, {kh}, {kw}, {stride}>"
    for kh, kw, stride in ((0, 0, 0),) + tuple(shape for shape in DEPTHWISE_ROWS_SHAPES if shape[2] != 1)
    for t in _ALL_TYPES for i in gpu.INDEX_TYPES] + [f"conv_sum_images<{t}>" for t in gpu.FLOAT_TYPES] + [
    f"{kernel}<{t}, {i}>" for kernel in ("conv_depthwise_forward", "conv_depthwise_forward_tiled",
                                         "conv_bias_activation") for t in _ALL_TYPES for i in gpu.INDEX_TYPES] + [
    f"conv_depthwise_filter_grad_taps<{t}, {i}, {kh}, {kw}, {stride}, {blocks}>"
    for kh, kw, stride in DEPTHWISE_ROWS_SHAPES for t in _ALL_TYPES for i in gpu.INDEX_TYPES
    for blocks in ((1, DEPTHWISE_FILTER_TAPS_DENSE_BLOCKS) if kh == 3 else (1,))] + _rows_kernels(_share),
    defines=_DEFINES)


def rows_variant(rows: int, columns: int) -> gpu.CudaModule:
    """conv_2d.cu's rows kernels alone (conv_depthwise_forward_rows), every instantiation at one share of a
    thread, (rows, columns), for the test that every share writes the same bits and for
    tools/depthwise_times.py; not in gpu.MODULES (the library's own modules). To use it, set it as this
    module's _CUDA, and DEPTHWISE_SHARES to map each of its keys to (rows, columns): variant_shares."""
    module = gpu.CudaModule("conv_2d.cu", _rows_kernels(lambda dtype, shape: (rows, columns)), defines=_DEFINES)
    gpu.MODULES.remove(module)
    return module


def variant_shares(rows: int, columns: int) -> dict[tuple[int, int], tuple[int, int]]:
    """DEPTHWISE_SHARES with every dtype and kernel at one share: that of rows_variant(rows, columns)."""
    return dict.fromkeys(DEPTHWISE_SHARES, (rows, columns))


gpu_paths.declare("conv_2d", {
    "cudnn.forward": "the forward in cuDNN (groups > 1 but not depthwise, or a column matrix too large; 'columns')",
    "cudnn.backward_data": "input_grad in cuDNN (groups > 1 but not depthwise, or a column matrix too large)",
    "cudnn.backward_filter": "filter_grad in cuDNN (groups > 1 but not depthwise, or a column matrix too large)",
    "cudnn.add_bias": "the bias added by cuDNN's AddTensor (float and double; every path but depthwise, which adds "
                      "it in its kernel)",
    "half.add_bias": "float16 and bfloat16 with backward: the bias added by conv_bias_activation (no activation: "
                     "widened, added in float, rounded)",
    "gemm.forward": "pointwise (1x1, stride 1, no padding, groups 1): the forward as one cuBLAS batched GEMM",
    "gemm.backward_data": "pointwise: input_grad as one cuBLAS batched GEMM",
    "columns.backward_data": "groups 1: input_grad by a cuBLAS GEMM into columns, then conv_col2im, a chunk at a time",
    "columns.im2col": "groups 1, not pointwise: filter_grad's columns made by conv_im2col",
    "filter_grad.per_image": "filter_grad one image a GEMM (chunk 1), beta 0 then 1: the sum in image order",
    "filter_grad.chunked": "filter_grad per image into the workspace (chunk > 1), then conv_sum_images in image order",
    "depthwise.forward_rows": "depthwise, one filter a channel, 3x3 (stride 1 or 2) or 7x7 (stride 1), dilation 1: "
                              "conv_depthwise_forward_rows, a thread computing R rows of Q consecutive "
                              "outputs (plan.DEPTHWISE_SHARES by element and kernel size)",
    "depthwise.forward": "groups == channels > 1: conv_depthwise_forward_tiled (a tile of an output plane a "
                         "block, its input region staged in shared memory), the bias added in the kernel",
    "depthwise.forward_untiled": "depthwise, no tile's input region fits shared memory (a large dilation): "
                                 "conv_depthwise_forward, a thread per output",
    "depthwise.forward_activation": "depthwise, a state without backward: the activation applied in the kernel too",
    "epilogue": "a state without backward, not depthwise: the bias and activation in one conv_bias_activation",
    "depthwise.input_grad": "depthwise: conv_depthwise_input_grad",
    "depthwise.input_grad_rows": "depthwise with the forward's rows kernel at stride 1: conv_depthwise_forward_rows "
                                 "of the output gradient with the filter turned (FLIP)",
    "depthwise.input_grad_fixed": "depthwise with the forward's rows kernel at stride 2: conv_depthwise_input_grad "
                                  "compiled for its kernel and stride",
    "depthwise.filter_grad": "depthwise: conv_depthwise_filter_grad, a block per filter tap",
    "depthwise.filter_grad_taps": "depthwise with rows and a channel for every two SMs: "
                                  "conv_depthwise_filter_grad_taps, a block per channel for all its taps",
    "depthwise.filter_grad_taps_capped": "the same at 3x3 with more channels than 4 blocks on every SM: its form "
                                         "capped at the registers of 5 blocks an SM (plan.depthwise_filter_taps_blocks)",
    "bias_grad": "conv_bias_grad: a block per output channel, a tree sum in double",
    "empty_sum": "zero input channels, or an input of zero size: the output and gradients are zeros (memsets)",
})
_GRID_SLACK = 65536 * gpu.BLOCK  # index room for a grid-stride loop's last step (grid_for caps at 65536 blocks)
_GEOMETRY = np.dtype([("v", np.int64, (CONV_GEOMETRY_FIELDS,))])  # struct ConvGeometry in conv_2d.cu


class _QueryStream:
    """Stands in for a stream where cuDNN is only asked (algorithm heuristics, workspace sizes):
    binds the handle to the default stream, on which nothing is enqueued; every kernel call
    binds it to its own stream again."""

    ptr = 0


def _convolvable(state: Conv2DState) -> bool:
    """cuDNN cannot describe zero-size tensors: those convolutions are done without it."""
    return all(state.shapes[name].numel > 0 for name in ("input_shape", "output_shape", "filter_shape"))


def init(handle: Any, state: Conv2DState) -> None:
    """Make the cuDNN descriptors, pick the paths and cuDNN's algorithms from the shapes, and reserve the
    workspace in the handle (calls never allocate). On failure, release what was made and raise."""
    import cupy

    attrs = state.attrs
    dtype = state.shapes["input_shape"].dtype
    output = state.shapes["output_shape"]
    d = state.descriptors
    try:
        with cupy.cuda.Device(state.device):
            if output.numel > 0:
                d.y = cudnn.TensorDescriptor(output.dims, dtype)
                if attrs.use_bias:
                    d.bias = cudnn.TensorDescriptor((1, attrs.out_channels, 1, 1), dtype)
            if _convolvable(state):
                x = d.x = cudnn.TensorDescriptor(state.shapes["input_shape"].dims, dtype)
                w = d.w = cudnn.FilterDescriptor(state.shapes["filter_shape"].dims, dtype)
                conv = d.conv = cudnn.ConvolutionDescriptor(
                    (attrs.padding_h, attrs.padding_w), (attrs.stride_h, attrs.stride_w),
                    (attrs.dilation_h, attrs.dilation_w), attrs.groups, dtype)
                y = d.y
                found = cudnn.convolution_output_dims(conv, x, w)
                if found != output.dims:
                    raise core.CudaError("cuDNN", "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
                                         f"{state.op}: cuDNN computes output dims {found}, the formula {output.dims}")
                choose_paths(state)
                if state.paths["forward"] == "depthwise":
                    plan_depthwise(state, gpu.sm_count(state.device))
                cudnn_handle = handle.cudnn(_QueryStream)
                # Tensor cores: for half data always (float32 compute), for float32 only with TF32 allowed.
                tensor_ops = dtype in core.HALF_DTYPES or state.tf32
                # cuDNN is asked only for the directions it will run: a state without backward runs only the
                # forward (for the half dtypes the heuristics are slow:
                # docs/performance.md#cudnn-heuristics-per-direction).
                # The forward keeps IMPLICIT_GEMM below IMPLICIT_GEMM_BELOW_FLOPS (plan.py says why).
                small = forward_flops(state) < IMPLICIT_GEMM_BELOW_FLOPS
                limit = workspace_limit(state)
                for direction, descriptors, preferred in (
                        ("forward", (x, w, y), cudnn.FWD_ALGO_IMPLICIT_GEMM if small else None),
                        ("backward_data", (w, y, x), None), ("backward_filter", (x, y, w), None)):
                    if state.paths[direction] == "cudnn" and (direction == "forward" or attrs.backward):
                        state.algorithms[direction] = cudnn.find_algorithm(
                            direction, cudnn_handle, descriptors, conv, dtype, limit, preferred, tensor_ops)
                # A backend plan for each direction cuDNN runs (those find_algorithm was asked for above; the
                # gradients only in cudnn.GRADIENT_PLAN_DTYPES, which says why), kept in d.<direction>_plan; the
                # legacy algorithm stays for the calls a plan cannot take.
                mode = cudnn.backend_mode()
                for direction in (list(state.algorithms) if mode != "off" else []):
                    if direction != "forward" and dtype not in cudnn.GRADIENT_PLAN_DTYPES:
                        continue
                    try:
                        plan = cudnn.ConvolutionPlan(
                            direction, cudnn_handle, dtype, x.dims, w.dims, output.dims,
                            (attrs.padding_h, attrs.padding_w), (attrs.stride_h, attrs.stride_w),
                            (attrs.dilation_h, attrs.dilation_w), state.tf32, limit)
                    except core.CudaError as error:
                        # "auto": no engine qualifies (or cuDNN supports no such graph, a NOT_SUPPORTED_*
                        # status): that direction's legacy call serves
                        if mode == "on" or not error.status.startswith("CUDNN_STATUS_NOT_SUPPORTED"):
                            raise
                    else:
                        setattr(d, f"{direction}_plan", plan)
                sizes = [algorithm.workspace for algorithm in state.algorithms.values()]
                sizes += [plan.workspace for plan in (d.forward_plan, d.backward_data_plan, d.backward_filter_plan)
                          if plan is not None]
                sizes.append(workspace_elements(state) * dtype.itemsize)
                state.workspace_size = max(sizes)
                handle.reserve(state.workspace_size)  # calls never allocate
    except BaseException:
        state.release()
        raise


def _device_buffer(state: Conv2DState, like: Any) -> Any:
    """A buffer the state keeps until cleanup (the pre-activation, its gradient), made on first use
    (gpu.device_empty: outside CuPy's pool, freed only when the device is done with it)."""
    return gpu.device_empty(like.shape, like.dtype, state.device)


def _zero(stream: Any, array: Any) -> None:
    if array.nbytes:
        array.data.memset_async(0, array.nbytes, stream.cupy_stream)


def _workspace(handle: Any, state: Conv2DState) -> tuple[int, int]:
    """The handle's workspace (reserved by init_kernel): (pointer, bytes)."""
    workspace = handle.workspace(state.workspace_size)
    return workspace.data.ptr, workspace.nbytes


def _run_gemm(stream: Any, handle: Any, state: Conv2DState, dtype: np.dtype, step: Gemm, pointers: dict[str, int]) -> None:
    itemsize = dtype.itemsize
    a, b, c = (pointers[buffer] + offset * itemsize for buffer, offset in (step.a, step.b, step.c))
    cublas.gemm_strided_batched(stream, handle, dtype, step.trans_a, step.trans_b, step.m, step.n, step.k, a, step.lda,
                                step.stride_a, b, step.ldb, step.stride_b, step.beta, c, step.ldc, step.stride_c,
                                step.batch, state.op, state.tf32)


# Made once per state, on first use: the shapes and attrs never change after init.


def _forward_plan(state: Conv2DState) -> list[Gemm]:
    if state.forward_plan is None:
        state.forward_plan = plan_forward(state)
    return state.forward_plan


def _backward_data_plan(state: Conv2DState) -> list[Gemm | Fold]:
    if state.backward_data_plan is None:
        state.backward_data_plan = plan_backward_data(state)
    return state.backward_data_plan


def _backward_filter_plan(state: Conv2DState) -> list[Gemm | Fold]:
    if state.backward_filter_plan is None:
        state.backward_filter_plan = plan_backward_filter(state)
    return state.backward_filter_plan


def _geometry(state: Conv2DState) -> Any:
    """struct ConvGeometry of conv_2d.cu, by value: C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw."""
    if state.geometry is None:
        state.geometry = _make_geometry(state)
    return state.geometry


def _make_geometry(state: Conv2DState, turned: bool = False) -> Any:
    """The state's ConvGeometry; `turned` (stride 1, dilation 1): that of the forward whose result is the input
    gradient, the output gradient's planes in, the input's planes out, padding kernel - 1 - padding."""
    attrs = state.attrs
    _, c, h, w = state.shapes["input_shape"].dims
    _, _, out_h, out_w = state.shapes["output_shape"].dims
    padding = (attrs.padding_h, attrs.padding_w)
    if turned:
        h, w, out_h, out_w = out_h, out_w, h, w
        padding = (attrs.kernel_h - 1 - attrs.padding_h, attrs.kernel_w - 1 - attrs.padding_w)
    geometry = np.zeros((), dtype=_GEOMETRY)
    geometry["v"] = (c, h, w, out_h, out_w, attrs.kernel_h, attrs.kernel_w, attrs.stride_h, attrs.stride_w,
                     *padding, attrs.dilation_h, attrs.dilation_w)
    return geometry[()]


def _run_fold(stream: Any, state: Conv2DState, step: Fold, arrays: dict[str, Any], workspace: Any) -> None:
    attrs = state.attrs
    n, c, h, w = state.shapes["input_shape"].dims
    _, o, out_h, out_w = state.shapes["output_shape"].dims
    images = step.stop - step.first
    dtype = state.shapes["input_shape"].dtype
    if step.kind == "sum":
        gpu_paths.reach("conv_2d.filter_grad.chunked")
        size = arrays["filter_grad"].size
        partials = workspace[state.partials_at * dtype.itemsize:(state.partials_at + images * size) * dtype.itemsize]
        gpu.launch(stream, _CUDA.function(f"conv_sum_images<{gpu.cuda_type(dtype)}>"), gpu.grid_for(size), gpu.BLOCK,
                   (partials.view(dtype), arrays["filter_grad"], np.int64(images), np.int64(size),
                    np.int32(step.first > 0)))
        return
    count = images * c * attrs.kernel_h * attrs.kernel_w * out_h * out_w
    # Room for the grid-stride step past the last index too.
    index = gpu.index_type(count + _GRID_SLACK, images * c * h * w + _GRID_SLACK)
    index_scalar = np.int32 if index == "int" else np.int64
    columns = workspace[:count * dtype.itemsize].view(dtype)  # the chunk's columns, at the workspace's start
    gpu_paths.reach("conv_2d.columns.im2col" if step.kind == "im2col" else "conv_2d.columns.backward_data")
    if step.kind == "im2col":
        images_array = arrays["input"][step.first:step.stop]
        total = count
    else:
        images_array = arrays["input_grad"][step.first:step.stop]
        total = images * c * h * w
    kernel = _CUDA.function(f"conv_{step.kind}<{gpu.cuda_type(dtype)}, {index}>")
    first, second = (images_array, columns) if step.kind == "im2col" else (columns, images_array)
    gpu.launch(stream, kernel, gpu.grid_for(total), gpu.BLOCK, (first, second, index_scalar(images), _geometry(state)))


def _run_depthwise(stream: Any, state: Conv2DState, which: Literal["forward", "input", "filter"], grad: Any,
                   input: Any, filter: Any, target: Any, bias: Any = None, fused: Any = None) -> None:
    """conv_depthwise_forward_rows where the state has rows, else conv_depthwise_forward_tiled
    (conv_depthwise_forward where the state has no tile; grad unused; the
    activation `fused` applied in it too, where not None) or conv_depthwise_{input,filter}_grad of conv_2d.cu
    into target, enqueued on the stream. The launch is made once per state (and, for the forward, per bias
    given and activation fused: _depthwise_launch) and kept in state.launches."""
    launches = state.launches
    if which == "forward":
        if fused is not None:
            gpu_paths.reach("conv_2d.depthwise.forward_activation")
        gpu_paths.reach("conv_2d.depthwise.forward_rows" if state.rows is not None else
                        "conv_2d.depthwise.forward_untiled" if state.tile is None else "conv_2d.depthwise.forward")
        key = ("depthwise_forward", bias is not None, fused)
        launch = launches.get(key)
        if launch is None:
            launch = launches[key] = _depthwise_launch(stream, state, which, bias is not None, fused)
        # Without a bias the filter fills its slot: the kernel reads it only where the flag says.
        launch(stream, input, filter, filter if bias is None else bias, target)
        return
    key = ("depthwise_" + which,)
    launch = launches.get(key)
    if launch is None:
        launch = launches[key] = _depthwise_launch(stream, state, which, False, None)
    if which == "input" and _turned(state):
        gpu_paths.reach("conv_2d.depthwise.input_grad_rows")
        launch(stream, grad, filter, filter, target)
    elif which == "input":
        gpu_paths.reach("conv_2d.depthwise.input_grad" + ("" if state.rows is None else "_fixed"))
        launch(stream, grad, filter, target)
    else:
        gpu_paths.reach("conv_2d.depthwise.filter_grad" if not state.filter_taps else
                        "conv_2d.depthwise.filter_grad_taps" if state.filter_taps_blocks == 1 else
                        "conv_2d.depthwise.filter_grad_taps_capped")
        launch(stream, grad, input, target)


def _turned(state: Conv2DState) -> bool:
    """Whether the depthwise input gradient is the forward's rows kernel with the filter turned (stride 1)."""
    return state.rows is not None and state.rows[2] == 1


def _depthwise_launch(stream: Any, state: Conv2DState, which: Literal["forward", "input", "filter"], has_bias: bool,
                      fused: Any) -> gpu.PackedLaunch:
    """The PackedLaunch of _run_depthwise's kernel for `which`: its arrays those _run_depthwise gives, then the
    scalars (for the forward, the bias flag and the code of the activation `fused`), from the state alone."""
    attrs = state.attrs
    n, c, h, w = state.shapes["input_shape"].dims
    o = attrs.out_channels
    dtype = state.shapes["input_shape"].dtype
    output_numel = state.shapes["output_shape"].numel
    index = gpu.index_type(n * c * h * w + _GRID_SLACK, output_numel + _GRID_SLACK,
                           o * attrs.kernel_h * attrs.kernel_w + 65536)
    index_scalar = np.int32 if index == "int" else np.int64
    sizes = (index_scalar(n), index_scalar(o // c), _geometry(state))
    t = gpu.cuda_type(dtype)

    def function(name: str) -> Any:
        return _CUDA.function(name, stream.device)

    if which == "forward":
        flags = (np.int32(has_bias), activation.code(fused))
        out_h, out_w = state.shapes["output_shape"].dims[2:]
        if state.rows is not None:
            rows, columns = _share(dtype, state.rows)
            threads = n * o * -(-out_h // rows) * -(-out_w // columns)
            return gpu.packed(function(_rows_kernel(t, index, state.rows, False, (rows, columns))),
                              gpu.grid_for(threads), gpu.BLOCK, 4, flags + sizes)
        if state.tile is None:
            return gpu.packed(function(f"conv_depthwise_forward<{t}, {index}>"), gpu.grid_for(output_numel),
                              gpu.BLOCK, 4, flags + sizes)
        tile_h, tile_w, shared = state.tile
        return gpu.packed(function(f"conv_depthwise_forward_tiled<{t}, {index}>"),
                          (n * o, -(-out_h // tile_h), -(-out_w // tile_w)), DEPTHWISE_BLOCK, 4,
                          flags + sizes + (np.int32(tile_h), np.int32(tile_w)), shared_mem=shared)
    if which == "input" and _turned(state):
        if state.turned_geometry is None:
            state.turned_geometry = _make_geometry(state, turned=True)
        rows, columns = _share(dtype, state.rows)
        threads = n * c * -(-h // rows) * -(-w // columns)
        return gpu.packed(function(_rows_kernel(t, index, state.rows, True, (rows, columns))),
                          gpu.grid_for(threads), gpu.BLOCK, 4,
                          (np.int32(0), activation.code(None), index_scalar(n), index_scalar(1),
                           state.turned_geometry))
    if which == "input":
        kh, kw, stride = (0, 0, 0) if state.rows is None else state.rows
        return gpu.packed(function(f"conv_depthwise_input_grad<{t}, {index}, {kh}, {kw}, {stride}>"),
                          gpu.grid_for(n * c * h * w), gpu.BLOCK, 3, sizes)
    if state.filter_taps:
        kh, kw, stride = state.rows
        blocks = state.filter_taps_blocks
        return gpu.packed(function(f"conv_depthwise_filter_grad_taps<{t}, {index}, {kh}, {kw}, {stride}, {blocks}>"),
                          gpu.capped(c, 65535), CONV_DEPTHWISE_FILTER_BLOCK, 3, sizes)
    return gpu.packed(function(f"conv_depthwise_filter_grad<{t}, {index}>"),
                      gpu.capped(o * attrs.kernel_h * attrs.kernel_w, 65535), CONV_DEPTHWISE_FILTER_BLOCK, 3, sizes)


def _run_plan(stream: Any, handle: Any, state: Conv2DState, steps: list[Gemm | Fold], arrays: dict[str, Any],
              workspace: Any = None) -> None:
    """Enqueue a plan's GEMMs (kernels.runtime.cublas) and folds on the stream."""
    dtype = state.shapes["input_shape"].dtype
    pointers = {name: array.data.ptr for name, array in arrays.items() if array is not None}
    if workspace is not None:
        pointers["workspace"] = workspace.data.ptr
    for step in steps:
        if isinstance(step, Gemm):
            if step.c[0] == "filter_grad":  # one image a GEMM straight into filter_grad (chunk 1)
                gpu_paths.reach("conv_2d.filter_grad.per_image")
            _run_gemm(stream, handle, state, dtype, step, pointers)
        else:
            _run_fold(stream, state, step, arrays, workspace)


def _epilogue_launch(stream: Any, state: Conv2DState, has_bias: bool, fused: Any) -> gpu.PackedLaunch:
    """The PackedLaunch of conv_bias_activation over the output (target, then bias, the call's arrays): the
    bias added where `has_bias`, the activation `fused` applied where not None."""
    n, o, out_h, out_w = state.shapes["output_shape"].dims
    count = n * o * out_h * out_w
    index = gpu.index_type(count + _GRID_SLACK)
    scalar = np.int32 if index == "int" else np.int64
    dtype = state.shapes["output_shape"].dtype
    return gpu.packed(_CUDA.function(f"conv_bias_activation<{gpu.cuda_type(dtype)}, {index}>", stream.device),
                      gpu.grid_for(count), gpu.BLOCK, 2,
                      (np.int32(has_bias), activation.code(fused), scalar(count), scalar(out_h * out_w), scalar(o)))


def forward(stream: Any, handle: Any, state: Conv2DState, attrs: Any, input: Any, filter: Any, bias: Any,
            output: Any) -> None:
    """output = activation(conv(input, filter) + bias), enqueued on the stream; with an activation, the
    pre-activation is kept in the state's buffer (state.pre) for the backward."""
    target = output  # without backward, a fused activation is applied in the output itself
    # Without backward, the bias and activation are one epilogue: in the depthwise kernel, else one
    # conv_bias_activation launch (rather than cuDNN's AddTensor, then activation.cu's pass).
    epilogue = attrs.activation is not None and not attrs.backward
    if attrs.activation is not None and attrs.backward:
        if state.pre_buffer is None:
            state.pre_buffer = _device_buffer(state, output)
        target = state.pre_buffer
    if output.size:
        dtype = output.dtype
        convolvable = _convolvable(state)
        depthwise = convolvable and state.paths["forward"] == "depthwise"
        if depthwise:  # the bias too, and the activation where it is the epilogue
            _run_depthwise(stream, state, "forward", None, input, filter, target, bias,
                           attrs.activation if epilogue else None)
        elif convolvable and state.paths["forward"] == "gemm":
            gpu_paths.reach("conv_2d.gemm.forward")
            _run_plan(stream, handle, state, _forward_plan(state), {"input": input, "filter": filter, "output": target})
        if not convolvable:  # an empty sum: zero input channels, or an input of zero size inside the padding
            gpu_paths.reach("conv_2d.empty_sum")
            _zero(stream, target)
        elif state.paths["forward"] == "cudnn":
            gpu_paths.reach("conv_2d.cudnn.forward")
            cudnn_handle = handle.cudnn(stream)
            workspace, workspace_bytes = _workspace(handle, state)
            d = state.descriptors
            plan = d.forward_plan
            if plan is None or not plan.run(cudnn_handle, input.data.ptr, filter.data.ptr, target.data.ptr,
                                             workspace):
                cudnn.convolution_forward(cudnn_handle, cudnn.scalar(dtype, 1), d.x, input.data.ptr,
                                          d.w, filter.data.ptr, d.conv, state.algorithms["forward"],
                                          workspace, workspace_bytes, cudnn.scalar(dtype, 0), d.y, target.data.ptr)
        # The epilogue kernel: bias and activation of a state without backward; for the half dtypes also
        # the bias alone (added in float, rounded), where float and double take cuDNN's AddTensor.
        half_bias = bias is not None and dtype in core.HALF_DTYPES
        if (epilogue or half_bias) and not depthwise:
            gpu_paths.reach("conv_2d.epilogue" if epilogue else "conv_2d.half.add_bias")
            fused = attrs.activation if epilogue else None
            key = ("epilogue", bias is not None, fused)
            launch = state.launches.get(key)
            if launch is None:
                launch = state.launches[key] = _epilogue_launch(stream, state, bias is not None, fused)
            launch(stream, target, target if bias is None else bias)  # without a bias, target fills its slot
        elif bias is not None and not depthwise:
            gpu_paths.reach("conv_2d.cudnn.add_bias")
            cudnn.add_tensor(handle.cudnn(stream), cudnn.scalar(dtype, 1), state.descriptors.bias, bias.data.ptr,
                             cudnn.scalar(dtype, 1), state.descriptors.y, target.data.ptr)
        if attrs.activation is not None and not epilogue:
            activation.gpu_forward(stream, attrs.activation, target, output)
    if attrs.activation is not None and attrs.backward:
        state.pre = target


def backward(stream: Any, handle: Any, state: Conv2DState, attrs: Any, output_grad: Any, input: Any, input_grad: Any,
             filter: Any, filter_grad: Any, bias_grad: Any) -> None:
    """Write input_grad, filter_grad and bias_grad (those not None), enqueued on the stream."""
    dtype = output_grad.dtype
    grad = output_grad
    if attrs.activation is not None:
        if state.pre_grad_buffer is None:
            state.pre_grad_buffer = _device_buffer(state, output_grad)
        grad = state.pre_grad_buffer
        activation.gpu_backward(stream, attrs.activation, state.pre, output_grad, grad)
    if bias_grad is not None and bias_grad.size:
        gpu_paths.reach("conv_2d.bias_grad")
        launch = state.launches.get(("bias_grad",))
        if launch is None:
            n, o, out_h, out_w = state.shapes["output_shape"].dims
            launch = state.launches[("bias_grad",)] = gpu.packed(
                _CUDA.function(f"conv_bias_grad<{gpu.cuda_type(dtype)}>", stream.device), gpu.capped(o, 65535),
                CONV_BIAS_GRAD_BLOCK, 2, (np.int64(n), np.int64(o), np.int64(out_h * out_w)))
        launch(stream, grad, bias_grad)
    wants_input = input_grad is not None and input_grad.size > 0
    wants_filter = filter_grad is not None and filter_grad.size > 0
    if not (wants_input or wants_filter):
        return
    if not _convolvable(state):  # nothing flows through an empty convolution
        gpu_paths.reach("conv_2d.empty_sum")
        for array in (input_grad, filter_grad):
            if array is not None:
                _zero(stream, array)
        return
    if state.paths["backward_data"] == "depthwise":  # both gradients by conv_2d.cu's depthwise kernels
        if wants_input:
            _run_depthwise(stream, state, "input", grad, input, filter, input_grad)
        if wants_filter:
            _run_depthwise(stream, state, "filter", grad, input, filter, filter_grad)
        return
    workspace_array = handle.workspace(state.workspace_size)  # one buffer for every step below, in stream order
    workspace, workspace_bytes = workspace_array.data.ptr, workspace_array.nbytes
    arrays = {"input": input, "filter": filter, "grad": grad, "input_grad": input_grad, "filter_grad": filter_grad}
    if wants_input and state.paths["backward_data"] == "gemm":
        gpu_paths.reach("conv_2d.gemm.backward_data")
    if wants_input and state.paths["backward_data"] != "cudnn":
        _run_plan(stream, handle, state, _backward_data_plan(state), arrays, workspace_array)
    if wants_filter and state.paths["backward_filter"] != "cudnn":
        _run_plan(stream, handle, state, _backward_filter_plan(state), arrays, workspace_array)
    if not ((wants_input and state.paths["backward_data"] == "cudnn")
            or (wants_filter and state.paths["backward_filter"] == "cudnn")):
        return
    cudnn_handle = handle.cudnn(stream)
    d = state.descriptors
    one, zero = cudnn.scalar(dtype, 1), cudnn.scalar(dtype, 0)
    # The backend plan where the state has one and it takes the call (its pointers by role: x, w, y), else
    # the legacy call.
    if wants_input and state.paths["backward_data"] == "cudnn":
        gpu_paths.reach("conv_2d.cudnn.backward_data")
        plan = d.backward_data_plan
        if plan is None or not plan.run(cudnn_handle, input_grad.data.ptr, filter.data.ptr, grad.data.ptr,
                                         workspace):
            cudnn.convolution_backward_data(cudnn_handle, one, d.w, filter.data.ptr, d.y, grad.data.ptr,
                                            d.conv, state.algorithms["backward_data"], workspace, workspace_bytes,
                                            zero, d.x, input_grad.data.ptr)
    if wants_filter and state.paths["backward_filter"] == "cudnn":
        gpu_paths.reach("conv_2d.cudnn.backward_filter")
        plan = d.backward_filter_plan
        if plan is None or not plan.run(cudnn_handle, input.data.ptr, filter_grad.data.ptr, grad.data.ptr,
                                         workspace):
            cudnn.convolution_backward_filter(cudnn_handle, one, d.x, input.data.ptr, d.y, grad.data.ptr,
                                              d.conv, state.algorithms["backward_filter"], workspace,
                                              workspace_bytes, zero, d.w, filter_grad.data.ptr)
