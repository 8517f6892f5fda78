"""conv_2d's cuDNN directions through cuDNN's backend API (kernels.runtime.cudnn.ConvolutionPlan: the
forward, and for a state made for backward the backward data and backward filter where they run in
cuDNN; the default, with KERNELS_CUDNN_BACKEND unset; "1" insists on it, "0" keeps the legacy calls).

Without a GPU: the pure pieces (which engines are refused, packed strides, alignment, the switch), the
backend constants against cudnn_graph.h, each direction's plan against a stand-in library (the
engine chosen, the graph's operation and roles, the variant pack, the errors naming the direction)
and, where cuDNN's library loads, backend tensor, convolution and each direction's operation
descriptors made, finalized and destroyed (no device is needed for those), a plan whose graph
cannot be finalized leaking nothing, the TF32 rounding the float32 tests emulate, and their operands' checks.

On a GPU (marked gpu): with the switch set to 1 or 0 before the state is made, for float32, float64, float16 and
bfloat16 and shapes whose forward runs in cuDNN (plan.choose_paths: groups 1 and not pointwise, or
groups > 1 and not depthwise; the gradients too for the half dtypes and groups > 1), the backend plans
- are really taken (the state holds them; their executions count the calls),
- give the same values as the legacy calls and as PyTorch's float64 conv2d and its gradients on
  exact-valued inputs (entries in {-1, 0, 1}: every product and partial sum is exact in float32, every
  result exact in every dtype, so any sum-of-products engine in any order gives the exact result; as
  the conformance cases, whose conv tolerance is EXACT; for the gradients, output gradients sparse
  enough that every sum of |products| stays within 256, so every partial sum is exact in bfloat16 too),
- compute float32 (forward by the plan and the legacy call, both gradients by the library's path) in
  float32, not TF32: on inputs of 12-13 significant bits, every partial sum still exact in float32, they give
  PyTorch's float64 values exactly, which the inputs rounded to TF32 would not (checked on the host; the
  entries above, {-1, 0, 1}, are exact in TF32 and cannot tell),
- stay within the error bound of a plain sum in the compute type on random data (which TF32,
  a reduced-precision reduction or inputs converted down would exceed),
- keep their variant pack while the pointers stay, build a new one when they change, and hand
  calls they cannot take (misaligned pointers, another handle) to the legacy calls,
- leave every descriptor destroyed after cleanup, also when init fails,
- keep the bias, the fused activations and the backward right,
- are taken with the switch unset, and give way to the legacy call there, direction by direction,
  where no engine qualifies.
"""

import ctypes
import os
import re

import numpy as np
import pytest

from kernels import Activation, Conv2DAttrs, CudaError, TensorShape, conv_2d
from kernels.runtime import cudnn
from kernels.runtime.core import BFLOAT16

from .conftest import Dev, require, unit_roundoffs

DTYPES = [pytest.param(np.dtype(np.float32), id="f32"), pytest.param(np.dtype(np.float64), id="f64"),
          pytest.param(np.dtype(np.float16), id="f16"), pytest.param(BFLOAT16, id="bf16")]

# (input dims, attrs): each one's forward runs in cuDNN (groups 1 not pointwise; groups > 1 not depthwise).
CASES = [
    pytest.param((2, 8, 12, 10), Conv2DAttrs(16, 3, 3, padding_h=1, padding_w=1), id="k3_p1_batch2"),
    pytest.param((2, 8, 11, 9), Conv2DAttrs(12, 3, 3, 2, 2, 1, 1), id="k3_s2_p1_odd"),
    pytest.param((1, 8, 9, 13), Conv2DAttrs(8, 3, 3, 1, 1, 2, 2, 2, 2), id="k3_d2_p2"),
    pytest.param((2, 8, 10, 12), Conv2DAttrs(8, 3, 3, padding_h=1, padding_w=1, groups=2), id="g2_k3"),
    pytest.param((2, 8, 7, 9), Conv2DAttrs(12, 1, 3, 1, 2, 0, 1, groups=4), id="g4_k1x3_s1x2"),
    pytest.param((1, 32, 160, 160), Conv2DAttrs(32, 3, 3, padding_h=1, padding_w=1), id="c2f_k3_160"),
]


# ------------------------------------------------------------------ without a GPU


def test_packed_strides():
    assert cudnn.packed_strides((2, 8, 12, 10)) == (960, 120, 10, 1)
    assert cudnn.packed_strides((16, 4, 3, 1)) == (12, 3, 1, 1)
    assert cudnn.packed_strides((3, 0, 2, 2)) == (4, 4, 2, 1)  # a zero extent steps as one


@pytest.mark.parametrize("dtype", DTYPES)
def test_engine_rejection(dtype):
    reject = cudnn.engine_rejection
    for note, name in ((cudnn.NUMERICAL_NOTE_FFT, "FFT"), (cudnn.NUMERICAL_NOTE_WINOGRAD, "WINOGRAD"),
                       (cudnn.NUMERICAL_NOTE_WINOGRAD_TILE_4x4, "WINOGRAD_TILE_4x4"),
                       (cudnn.NUMERICAL_NOTE_WINOGRAD_TILE_6x6, "WINOGRAD_TILE_6x6"),
                       (cudnn.NUMERICAL_NOTE_WINOGRAD_TILE_13x13, "WINOGRAD_TILE_13x13"),
                       (cudnn.NUMERICAL_NOTE_NONDETERMINISTIC, "NONDETERMINISTIC"),
                       (cudnn.NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION, "REDUCED_PRECISION_REDUCTION"),
                       (cudnn.NUMERICAL_NOTE_DOWN_CONVERT_INPUTS, "DOWN_CONVERT_INPUTS")):
        for tf32 in (False, True):
            assert reject([note], dtype, tf32) == name
            assert reject([cudnn.NUMERICAL_NOTE_STRICT_NAN_PROP, note], dtype, tf32) == name
    assert reject([], dtype, False) is None
    assert reject([cudnn.NUMERICAL_NOTE_STRICT_NAN_PROP], dtype, False) is None
    tensor_core = [cudnn.NUMERICAL_NOTE_TENSOR_CORE]
    half = dtype in (np.dtype(np.float16), BFLOAT16)
    assert reject(tensor_core, dtype, False) == (None if half else "TENSOR_CORE")
    # TF32 lets float32 on the tensor cores, never float64
    assert reject(tensor_core, dtype, True) == (None if dtype != np.float64 else "TENSOR_CORE")


def test_aligned():
    assert cudnn.aligned(16, 0, 512, 4096 + 16)
    assert not cudnn.aligned(16, 512, 516)
    assert cudnn.aligned(4, 516)
    assert cudnn.aligned(16)


def test_backend_mode(monkeypatch):
    """Unset or empty: auto (the default); "1": on; "0": off; anything else is refused by name."""
    assert cudnn.backend_mode({}) == "auto"
    assert cudnn.backend_mode({cudnn.BACKEND_ENV: ""}) == "auto"
    assert cudnn.backend_mode({cudnn.BACKEND_ENV: " \n"}) == "auto"
    assert cudnn.backend_mode({cudnn.BACKEND_ENV: "1"}) == "on"
    assert cudnn.backend_mode({cudnn.BACKEND_ENV: " 1\n"}) == "on"
    assert cudnn.backend_mode({cudnn.BACKEND_ENV: "0"}) == "off"
    for value in ("yes", "true", "2", "off"):
        with pytest.raises(ValueError, match=f"KERNELS_CUDNN_BACKEND={value!r}: expected unset or empty"):
            cudnn.backend_mode({cudnn.BACKEND_ENV: value})
    monkeypatch.setenv(cudnn.BACKEND_ENV, "0")
    assert cudnn.backend_mode() == "off"
    monkeypatch.delenv(cudnn.BACKEND_ENV)
    assert cudnn.backend_mode() == "auto"


def test_backend_functions_typed():
    """Every backend function is declared as cudnn_graph.h has it (int64_t counts, enums as int)."""
    functions = cudnn.FUNCTIONS
    assert functions["cudnnBackendSetAttribute"][1][3] is ctypes.c_int64
    assert functions["cudnnBackendGetAttribute"][1][3] is ctypes.c_int64
    assert functions["cudnnBackendGetAttribute"][1][4] == ctypes.POINTER(ctypes.c_int64)
    for name, arity in (("cudnnBackendCreateDescriptor", 2), ("cudnnBackendDestroyDescriptor", 1),
                        ("cudnnBackendFinalize", 1), ("cudnnBackendSetAttribute", 5),
                        ("cudnnBackendGetAttribute", 6), ("cudnnBackendExecute", 3)):
        restype, argtypes = functions[name]
        assert restype is ctypes.c_int and len(argtypes) == arity, name


def _library_or_skip():
    try:
        cudnn.library()
    except CudaError as error:
        pytest.skip(f"cuDNN's library does not load here: {error}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_backend_descriptors_without_a_device(dtype):
    """Tensor and convolution descriptors finalize without a GPU; what they were given reads back; each
    one is counted while alive and destroyed once."""
    _library_or_skip()
    start = cudnn.live_descriptors()
    owner = []
    try:
        tensor = cudnn.tensor_descriptor(7, (2, 8, 12, 10), dtype, owner=owner)
        conv = cudnn.convolution_descriptor((1, 2), (2, 1), (1, 3), dtype, owner=owner)
        assert cudnn.live_descriptors()["backend"] == start["backend"] + 2
        int64 = ctypes.c_int64
        assert tensor.get(cudnn.ATTR_TENSOR_DIMENSIONS, cudnn.TYPE_INT64, int64, 4) == [2, 8, 12, 10]
        assert tensor.count(cudnn.ATTR_TENSOR_DIMENSIONS, cudnn.TYPE_INT64) == 4
        assert tensor.get(cudnn.ATTR_TENSOR_STRIDES, cudnn.TYPE_INT64, int64, 4) == [960, 120, 10, 1]
        assert tensor.get(cudnn.ATTR_TENSOR_UNIQUE_ID, cudnn.TYPE_INT64, int64, 1) == [7]
        assert tensor.get(cudnn.ATTR_TENSOR_DATA_TYPE, cudnn.TYPE_DATA_TYPE, ctypes.c_int, 1) == \
            [cudnn.data_type(dtype)]
        assert conv.get(cudnn.ATTR_CONVOLUTION_PRE_PADDINGS, cudnn.TYPE_INT64, int64, 2) == [1, 2]
        assert conv.get(cudnn.ATTR_CONVOLUTION_POST_PADDINGS, cudnn.TYPE_INT64, int64, 2) == [1, 2]
        assert conv.get(cudnn.ATTR_CONVOLUTION_FILTER_STRIDES, cudnn.TYPE_INT64, int64, 2) == [2, 1]
        assert conv.get(cudnn.ATTR_CONVOLUTION_DILATIONS, cudnn.TYPE_INT64, int64, 2) == [1, 3]
        assert conv.get(cudnn.ATTR_CONVOLUTION_COMP_TYPE, cudnn.TYPE_DATA_TYPE, ctypes.c_int, 1) == \
            [cudnn.compute_type(dtype)]
    finally:
        for descriptor in owner:
            descriptor.destroy()
            descriptor.destroy()  # idempotent
    assert cudnn.live_descriptors() == start


# direction: (operation descriptor type, its alpha, beta and convolution attributes, then those of the tensors
# in the x, w and y roles: the input or its gradient, the filter or its gradient, the output or its gradient),
# as cudnn_graph.h names them.
OPERATIONS = {
    "forward": (cudnn.BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                cudnn.ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, cudnn.ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                cudnn.ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, cudnn.ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                cudnn.ATTR_OPERATION_CONVOLUTION_FORWARD_W, cudnn.ATTR_OPERATION_CONVOLUTION_FORWARD_Y),
    "backward_data": (cudnn.BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                      cudnn.ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, cudnn.ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                      cudnn.ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, cudnn.ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                      cudnn.ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, cudnn.ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY),
    "backward_filter": (cudnn.BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                        cudnn.ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                        cudnn.ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                        cudnn.ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                        cudnn.ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, cudnn.ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                        cudnn.ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY),
}
DIRECTIONS = [pytest.param(direction, id=direction) for direction in OPERATIONS]
BACKWARD = [pytest.param(direction, id=direction) for direction in ("backward_data", "backward_filter")]


def test_backend_constants_as_the_header():
    """Every backend enum value here (descriptor types, attribute names and types, heuristics modes, notes)
    is the value cudnn_graph.h gives its CUDNN_ name, where the loaded library's include/ folder is at hand."""
    _library_or_skip()
    header = os.path.join(os.path.dirname(os.path.dirname(cudnn.library().path)), "include", "cudnn_graph.h")
    if not os.path.isfile(header):
        pytest.skip(f"no cudnn_graph.h beside the loaded library ({header})")
    with open(header) as file:
        values = {name: int(value) for name, value in re.findall(r"\b(CUDNN_\w+)(?:\s+CUDNN_DEPRECATED_ENUM)?\s*=\s*(\d+)",
                                                                file.read())}
    prefixes = ("BACKEND_", "ATTR_", "TYPE_", "HEUR_MODE_", "NUMERICAL_NOTE_", "BEHAVIOR_NOTE_")
    ours = {name: value for name, value in vars(cudnn).items()
            if name.startswith(prefixes) and isinstance(value, int) and name != "BACKEND_ALIGNMENT"}
    assert len(ours) > 60
    assert {name: values.get("CUDNN_" + name) for name in ours} == ours
    assert ours["BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR"] == 12  # the ones this change added
    assert ours["ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY"] == 717


# The g4_k1x3_s1x2 case: grouped, and no two of x, w, y alike.
_GROUPED = {"x": (2, 8, 7, 9), "w": (12, 2, 1, 3), "y": (2, 12, 7, 5), "padding": (0, 1), "stride": (1, 2),
            "dilation": (1, 1)}


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backend_operations_without_a_device(dtype, direction):
    """Each direction's operation finalizes in the real library without a device, its alpha 1 and beta 0
    read back; with the x and y roles swapped its shapes no longer agree (BAD_PARAM): the roles are
    the attributes cuDNN checks. Everything made is destroyed."""
    _library_or_skip()
    start = cudnn.live_descriptors()
    kind, alpha, beta = OPERATIONS[direction][:3]
    scalar = ctypes.c_double if dtype == np.float64 else ctypes.c_float
    scalar_type = cudnn.TYPE_DOUBLE if dtype == np.float64 else cudnn.TYPE_FLOAT
    owner = []
    try:
        x, w, y = (cudnn.tensor_descriptor(uid, _GROUPED[name], dtype, owner=owner)
                   for uid, name in ((cudnn.X_UID, "x"), (cudnn.W_UID, "w"), (cudnn.Y_UID, "y")))
        conv = cudnn.convolution_descriptor(_GROUPED["padding"], _GROUPED["stride"], _GROUPED["dilation"], dtype,
                                            owner=owner)
        op = cudnn.operation_descriptor(direction, x, w, y, conv, dtype, owner=owner)
        assert op.kind == kind and op is owner[-1]
        assert op.get(alpha, scalar_type, scalar, 1) == [1.0]
        assert op.get(beta, scalar_type, scalar, 1) == [0.0]
        made = len(owner)
        with pytest.raises(CudaError, match="CUDNN_STATUS_BAD_PARAM"):
            cudnn.operation_descriptor(direction, y, w, x, conv, dtype, owner=owner)
        assert len(owner) == made + 1 and owner[-1].kind == kind  # the owner destroys the failed one
        with pytest.raises(ValueError, match="direction: expected forward, backward_data or backward_filter"):
            cudnn.operation_descriptor("backward", x, w, y, conv, dtype, owner=owner)
        assert len(owner) == made + 1
    finally:
        for descriptor in owner:
            descriptor.destroy()
    assert cudnn.live_descriptors() == start


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_backend_failures_leak_nothing(direction):
    """A descriptor whose finalize fails is destroyed before the CudaError; a plan whose graph cannot be
    built (no cuDNN handle: 0) destroys all it made."""
    _library_or_skip()
    start = cudnn.live_descriptors()
    with pytest.raises(CudaError):
        cudnn.tensor_descriptor(1, (2, 8, -3, 10), np.float32)
    assert cudnn.live_descriptors() == start
    with pytest.raises(CudaError):
        cudnn.ConvolutionPlan(direction, 0, np.float32, (1, 2, 5, 5), (3, 2, 3, 3), (1, 3, 5, 5), (1, 1), (1, 1),
                              (1, 1), False, 2**20)
    assert cudnn.live_descriptors() == start


def test_convolution_plan_refuses_an_unknown_direction():
    """Refused by name before anything is made (no library needed)."""
    start = cudnn.live_descriptors()
    for direction in ("backward", "Forward", "wgrad"):
        with pytest.raises(ValueError, match=f"direction: expected forward, backward_data or backward_filter, "
                                             f"found {direction!r}"):
            cudnn.ConvolutionPlan(direction, 0x5000, *_PLAN_ARGS)
    assert cudnn.live_descriptors() == start


# ------------------------------------------------------------------ on a GPU


@pytest.fixture
def gdev():
    require("gpu")
    d = Dev("gpu")
    yield d
    d.handle.close()


def _plan(state, direction):
    """The state's backend plan of a direction (None: that direction's legacy call, or not in cuDNN)."""
    return getattr(state.descriptors, f"{direction}_plan")


def _make_state(dev, attrs, dims, dtype, monkeypatch, backend):
    """A state made with KERNELS_CUDNN_BACKEND set to 1 (backend) or 0 (the legacy call): a plan for each
    direction in cuDNN (the backward ones only for a state made for backward, and only in
    cudnn.GRADIENT_PLAN_DTYPES), none for the others."""
    monkeypatch.setenv(cudnn.BACKEND_ENV, "1" if backend else "0")
    output_dims = conv_2d.output_dims(attrs, dims)
    state = conv_2d.init_kernel(dev.handle, attrs, TensorShape(dims, dtype), TensorShape(output_dims, dtype))
    # read at init only: the state keeps its choice whatever the variable says later
    monkeypatch.setenv(cudnn.BACKEND_ENV, "0" if backend else "1")
    assert state.paths["forward"] == "cudnn"
    for direction in OPERATIONS:
        in_cudnn = state.paths[direction] == "cudnn" and (direction == "forward" or attrs.backward)
        planned = direction == "forward" or np.dtype(dtype) in cudnn.GRADIENT_PLAN_DTYPES
        assert (_plan(state, direction) is not None) == (backend and in_cudnn and planned), direction
        assert (direction in state.algorithms) == in_cudnn, direction  # the legacy algorithm, kept as the fallback
    return state


def _reference(x, w, attrs):
    """conv_2d's forward (no bias) in float64, by PyTorch's conv2d (the conformance goldens' program)."""
    import torch

    y = torch.nn.functional.conv2d(torch.from_numpy(np.asarray(x, np.float64)),
                                   torch.from_numpy(np.asarray(w, np.float64)),
                                   stride=(attrs.stride_h, attrs.stride_w), padding=(attrs.padding_h, attrs.padding_w),
                                   dilation=(attrs.dilation_h, attrs.dilation_w), groups=attrs.groups)
    return y.numpy()


def _reference_backward(direction, x, w, output_grad, attrs):
    """input_grad (backward_data) or filter_grad (backward_filter) of conv_2d (no activation) in float64, by
    PyTorch's torch.nn.grad.conv2d_input / conv2d_weight (what autograd of conv2d computes)."""
    import torch
    from torch.nn.grad import conv2d_input, conv2d_weight

    x, w, output_grad = (torch.from_numpy(np.asarray(a, np.float64)) for a in (x, w, output_grad))
    options = dict(stride=(attrs.stride_h, attrs.stride_w), padding=(attrs.padding_h, attrs.padding_w),
                   dilation=(attrs.dilation_h, attrs.dilation_w), groups=attrs.groups)
    if direction == "backward_data":
        return conv2d_input(x.shape, w, output_grad, **options).numpy()
    return conv2d_weight(x, w.shape, output_grad, **options).numpy()


def _terms(direction, dims, attrs):
    """How many products each result of a backward direction sums, element by element: that gradient of
    all-ones tensors (exact counts in float64). An input element meets at most one output position per tap
    of each of its group's O / groups filters (fewer at the edges and, with strides, between them), a
    filter tap one input element per output position of every image; terms an engine adds beyond these
    are products with the padding's zeros or with the zeros between strides: exact, no rounding."""
    n = dims[0]
    _, o, out_h, out_w = conv_2d.output_dims(attrs, dims)
    ones = [np.ones(shape) for shape in (dims, conv_2d.filter_dims(attrs, dims[1]), (n, o, out_h, out_w))]
    counts = _reference_backward(direction, *ones, attrs)
    most = o // attrs.groups * attrs.kernel_h * attrs.kernel_w if direction == "backward_data" else n * out_h * out_w
    assert 0 < counts.max() <= most
    return counts


# Every integer of at most this magnitude is exact in every dtype (bfloat16 has 8 significant bits).
_EXACT_LIMIT = 256


def _exact_output_grad(dims, attrs, seed):
    """An output gradient of entries in {-1, 0, 1}, at most _EXACT_LIMIT of them nonzero in each output
    channel (over the whole batch): a filter gradient then sums at most that many nonzero products of
    {-1, 0, 1} entries, so every partial sum, in any order, is an integer within the limit."""
    rng = np.random.default_rng(seed)
    output_grad = rng.integers(-1, 2, size=conv_2d.output_dims(attrs, dims))
    for channel in range(output_grad.shape[1]):
        plane = output_grad[:, channel].copy().ravel()
        nonzero = np.flatnonzero(plane)
        plane[rng.permutation(nonzero)[_EXACT_LIMIT:]] = 0
        output_grad[:, channel] = plane.reshape(output_grad[:, channel].shape)
    return output_grad


def _exact_inputs(dims, attrs, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-1, 2, size=dims).astype(dtype)
    w = rng.integers(-1, 2, size=conv_2d.filter_dims(attrs, dims[1])).astype(dtype)
    bias = rng.integers(-4, 5, size=attrs.out_channels).astype(dtype) if attrs.use_bias else None
    return x, w, bias


def _forward(dev, state, attrs, x, w, bias=None, output=None):
    """One forward into a NaN-poisoned output (or `output`); (host copy, device output)."""
    if output is None:
        output = dev.array(np.full(state.shapes["output_shape"].dims, np.nan, x.dtype))
    arrays = [dev.array(a) if isinstance(a, np.ndarray) else a for a in (x, w, bias)]
    conv_2d.forward_kernel(dev.stream, dev.handle, state, attrs, *arrays, output)
    dev.stream.synchronize()
    return dev.host(output), output


def _backward(dev, state, attrs, x, w, output_grad):
    """One backward into NaN-poisoned input_grad and filter_grad: their host copies."""
    grads = [dev.array(np.full(shape, np.nan, x.dtype)) for shape in (x.shape, w.shape)]
    conv_2d.backward_kernel(dev.stream, dev.handle, state, attrs, None, dev.array(output_grad.astype(x.dtype)),
                            dev.array(x), grads[0], dev.array(w), grads[1], None)
    dev.stream.synchronize()
    return {"backward_data": dev.host(grads[0]), "backward_filter": dev.host(grads[1])}


def _same(got, expected, err_msg=""):
    """Equal values (a zero's sign aside: engines may start a sum from a product -0.0); a NaN the call
    left in the poisoned output fails it (the expectations hold none)."""
    assert not np.isnan(np.asarray(expected, np.float64)).any()
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(expected, np.float64), err_msg=err_msg)


@pytest.mark.gpu
@pytest.mark.parametrize("dims, attrs", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backend_forward_is_exact_as_legacy(gdev, monkeypatch, dims, attrs, dtype):
    x, w, _ = _exact_inputs(dims, attrs, dtype, seed=1)
    expected = _reference(x, w, attrs).astype(dtype)
    legacy = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend=False)
    backend = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend=True)
    try:
        plan = backend.descriptors.forward_plan
        assert plan.engine >= 0 and plan.choices[-1].rejected is None
        assert plan.workspace <= backend.workspace_size
        got_legacy, _ = _forward(gdev, legacy, attrs, x, w)
        got_backend, _ = _forward(gdev, backend, attrs, x, w)
        assert plan.executions == 1 and plan.packs == 1
        _same(got_legacy, expected)
        _same(got_backend, expected,
                                      err_msg=f"engine {plan.engine}, passed over {plan.choices[:-1]}")
    finally:
        conv_2d.cleanup_kernel(gdev.handle, legacy)
        conv_2d.cleanup_kernel(gdev.handle, backend)


@pytest.mark.gpu
@pytest.mark.parametrize("dims, attrs", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backend_forward_within_the_sum_bound(gdev, monkeypatch, dims, attrs, dtype):
    """Random data (inputs rounded to the dtype first). Any order of a plain sum of k products in a compute
    type of unit roundoff u (each product rounded, or fused into its addition) errs by at most
    gamma_k = k u / (1 - k u) times sum |x| |w| (Higham, 3.1). Rounded once more to a half dtype of unit
    roundoff v, the error is at most gamma_k (1 + v) sum |x| |w| + v |reference|: the bound checked.
    TF32 (inputs cut to 10 mantissa bits), a float16 accumulation or inputs converted down exceed it by
    orders of magnitude at these sizes (k <= 288)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(dims).astype(dtype)
    w = rng.standard_normal(conv_2d.filter_dims(attrs, dims[1])).astype(dtype)
    reference = _reference(x, w, attrs)
    magnitude = _reference(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)), attrs)
    for backend in (False, True):
        state = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend)
        try:
            got, _ = _forward(gdev, state, attrs, x, w)
            if backend:
                assert state.descriptors.forward_plan.executions == 1
        finally:
            conv_2d.cleanup_kernel(gdev.handle, state)
        k = (dims[1] // attrs.groups) * attrs.kernel_h * attrs.kernel_w
        _within_sum_bound(got, reference, magnitude, k, dtype, f"backend={backend}")


def _within_sum_bound(got, reference, magnitude, k, dtype, label):
    """|got - reference| <= gamma_k (1 + v) magnitude + v |reference| everywhere (see the forward's bound
    test), `magnitude` being the sum of the products' magnitudes and k their count (a number, or one for
    each element); a NaN left in a poisoned output fails."""
    u, v = unit_roundoffs(dtype)
    bound = k * u / (1 - k * u) * (1 + v) * magnitude + v * np.abs(reference)
    error = np.abs(np.asarray(got, np.float64) - reference)
    assert np.all(np.isfinite(error)), f"{label}: non-finite results"
    worst = np.argmax(error - bound)
    assert np.all(error <= bound), (f"{label}: error {error.flat[worst]:.3g} > bound {bound.flat[worst]:.3g} "
                                    f"at {np.unravel_index(worst, error.shape)}")


@pytest.mark.gpu
@pytest.mark.parametrize("dims, attrs", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backend_backward_is_exact_as_legacy(gdev, monkeypatch, dims, attrs, dtype):
    """Exact-valued x, w and output gradient (_exact_output_grad): every sum of |products| of both gradients
    is within _EXACT_LIMIT (checked), so every partial sum in any order is exact in every dtype, and the
    backend plans, the legacy calls and PyTorch's float64 gradients agree exactly. Where a direction does
    not run in cuDNN (float32 and float64 with groups 1: the columns path), or runs in cuDNN's legacy call
    (float32 and float64 with groups > 1: cudnn.GRADIENT_PLAN_DTYPES), the state has no plan for it and
    the values are checked all the same."""
    x, w, _ = _exact_inputs(dims, attrs, dtype, seed=11)
    output_grad = _exact_output_grad(dims, attrs, seed=12)
    legacy = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend=False)
    backend = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend=True)
    try:
        got_legacy = _backward(gdev, legacy, attrs, x, w, output_grad)
        got_backend = _backward(gdev, backend, attrs, x, w, output_grad)
        planned = 0
        for direction in ("backward_data", "backward_filter"):
            reference = _reference_backward(direction, x, w, output_grad, attrs)
            magnitude = _reference_backward(direction, np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)),
                                            np.abs(output_grad), attrs)
            assert magnitude.max() <= _EXACT_LIMIT, direction
            assert np.abs(reference).max() > 0, direction  # not all zeros
            _same(got_legacy[direction], reference, err_msg=f"legacy {direction}")
            plan = _plan(backend, direction)
            if backend.paths[direction] != "cudnn":
                assert plan is None and backend.paths[direction] == "columns"
                assert dtype in (np.float32, np.float64) and attrs.groups == 1
            elif np.dtype(dtype) not in cudnn.GRADIENT_PLAN_DTYPES:
                assert plan is None and dtype in (np.float32, np.float64) and attrs.groups > 1
            else:
                planned += 1
                assert plan.direction == direction
                assert plan.engine >= 0 and plan.choices[-1].rejected is None
                assert plan.workspace <= backend.workspace_size
                assert (plan.executions, plan.packs) == (1, 1)
            detail = "" if plan is None else f": engine {plan.engine}, passed over {plan.choices[:-1]}"
            _same(got_backend[direction], reference, err_msg=direction + detail)
        assert planned == (2 if dtype in (np.float16, BFLOAT16) else 0)
        assert backend.descriptors.forward_plan.executions == 0  # no forward was called
    finally:
        conv_2d.cleanup_kernel(gdev.handle, legacy)
        conv_2d.cleanup_kernel(gdev.handle, backend)


# ------------------------------------------------------------------ float32 is not TF32
# The exact tests above use entries in {-1, 0, 1}, which TF32 holds exactly: an engine computing float32 in TF32
# passes them. These use float32 values of 12 and 13 significant bits, which TF32 changes, with every partial sum
# exact in float32 all the same.


def _tf32(a):
    """float32 `a` rounded as TF32 holds it: the 23-bit mantissa to its top 10 bits, to nearest, ties to even (on
    the uint32 view: add 0xfff plus the lowest kept bit, then clear the 13 dropped bits; a carry out of the mantissa
    steps the exponent). For finite values; zeros and values TF32 holds stay, negative values mirror positive ones."""
    bits = np.array(a, np.float32).view(np.uint32)
    one = np.uint32(1)
    rounded = (bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & one)) & ~np.uint32(0x1FFF)
    return rounded.view(np.float32)


def test_tf32_rounding():
    """Hand-checked: near 1 TF32 steps by 2^-10, near 2 by 2^-9, near 2^-20 by 2^-30."""
    for value, rounded in ((1 + 2**-11, 1.0),  # a tie: to the even neighbour, down
                           (1 + 3 * 2**-11, 1 + 2**-9),  # a tie: to the even neighbour, up
                           (1 + 2**-11 + 2**-23, 1 + 2**-10),  # just above a tie: up
                           (1 + 3 * 2**-12, 1 + 2**-10),  # above a tie: up
                           (1.5 + 2**-12, 1.5),  # below a tie: down
                           (1 + 2**-10, 1 + 2**-10),  # TF32 already
                           (2 + 2**-10, 2.0),  # a tie at 2: down to even
                           (2 - 2**-23, 2.0),  # up, the carry stepping the exponent
                           (2.0**-20 * (1 + 2**-11), 2.0**-20),
                           (0.0, 0.0)):
        assert np.float32(value) == value and np.float32(rounded) == rounded
        for sign in (1, -1):
            got = _tf32(np.float32(sign * value))
            assert got.dtype == np.float32 and got == sign * rounded, (sign * value, got)
    assert np.signbit(_tf32(np.float32(-0.0)))
    values = np.array([[1 + 2**-11, -(1 + 3 * 2**-11)], [1.5 + 2**-12, 0.0]], np.float32)
    assert _tf32(values).tolist() == [[1.0, -(1 + 2**-9)], [1.5, 0.0]]
    assert values.tolist() == [[1 + 2**-11, -(1 + 3 * 2**-11)], [1.5 + 2**-12, 0.0]]  # not rounded in place


# Magnitudes m 2^-12 with m < 2^13 (1 + 2^-11, 1 + 3 2^-12, 1.5 + 2^-12, 1 + 3 2^-11) that TF32 changes whatever its
# rounding (each has bits below 2^-10): a tie down, above a tie, below a tie, a tie up.
_TF32_INEXACT = np.array([4098, 4099, 6145, 4102]) * 2.0**-12
# Any multiple of 2^-12 of at most this magnitude (2^24 of them: 24 significant bits) is exact in float32.
_GRID_EXACT_LIMIT = 2.0**24 * 2.0**-12


def _tf32_operands(dims, attrs, seed, backward):
    """Float32 operands (x, w, output_grad) whose every product is a _TF32_INEXACT multiple times one of {-1, 0, 1}:
    forward, x's nonzero entries scaled by _TF32_INEXACT, w in {-1, 0, 1} (_exact_inputs), no output gradient;
    backward, x and w both scaled, the output gradient _exact_output_grad's (in {-1, 0, 1}, at most _EXACT_LIMIT
    nonzero in each output channel). Every partial sum of a result is then a multiple of 2^-12 within the sum S of
    its products' magnitudes (each < 2), exact in float32 while S <= _GRID_EXACT_LIMIT = 4096:
    forward, at most (C / groups) kh kw = 288 products (c2f_k3_160): S < 576;
    backward_data, at most (O / groups) kh kw = 288: S < 576;
    backward_filter, N Ho Wo products (25600 in c2f_k3_160), but at most _EXACT_LIMIT = 256 of them nonzero (the
    rest exact zeros): S < 512. _exact_not_tf32 checks S on the values."""
    x, w, _ = _exact_inputs(dims, attrs, np.dtype(np.float32), seed)
    rng = np.random.default_rng(seed + 1)
    x = (x * rng.choice(_TF32_INEXACT, size=x.shape)).astype(np.float32)
    if not backward:
        return x, w, None
    w = (w * rng.choice(_TF32_INEXACT, size=w.shape)).astype(np.float32)
    return x, w, _exact_output_grad(dims, attrs, seed + 2)


def _exact_not_tf32(direction, x, w, output_grad, attrs):
    """PyTorch's float64 result of a direction, checked on the host (no GPU): every partial sum exact in float32
    (operands multiples of 2^-12 below 2 in magnitude, S <= _GRID_EXACT_LIMIT), and the operands rounded to TF32
    (_tf32) giving a different result somewhere. Those are multiples of 2^-12 within 2 too, so a TF32 engine's
    float32 sums would be exact: it would return that other result, and fail."""

    def result(x, w, output_grad):
        if direction == "forward":
            return _reference(x, w, attrs)
        return _reference_backward(direction, x, w, output_grad, attrs)

    operands = [a for a in (x, w, output_grad) if a is not None]
    for a in operands:
        grid = np.asarray(a, np.float64) * 2.0**12
        assert np.array_equal(grid, np.round(grid)) and np.abs(grid).max() < 2**13
    reference = result(x, w, output_grad)
    magnitude = result(*(None if a is None else np.abs(np.asarray(a, np.float64)) for a in (x, w, output_grad)))
    assert magnitude.max() <= _GRID_EXACT_LIMIT, direction
    assert np.abs(reference).max() > 0, direction  # not all zeros
    rounded = result(*(None if a is None else _tf32(a) for a in (x, w, output_grad)))
    assert np.any(rounded != reference), f"{direction}: TF32 would give the same result"
    return reference


@pytest.mark.parametrize("dims, attrs", CASES)
def test_tf32_operands_exact_and_tf32_sensitive(dims, attrs):
    """On the host: the GPU tests' operands below pass _exact_not_tf32 in every case, every direction."""
    x, w, _ = _tf32_operands(dims, attrs, seed=21, backward=False)
    _exact_not_tf32("forward", x, w, None, attrs)
    x, w, output_grad = _tf32_operands(dims, attrs, seed=23, backward=True)
    for direction in ("backward_data", "backward_filter"):
        _exact_not_tf32(direction, x, w, output_grad, attrs)


BACKENDS = [pytest.param(False, id="legacy"), pytest.param(True, id="plan")]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dims, attrs", CASES)
def test_float32_forward_is_not_tf32(gdev, monkeypatch, dims, attrs, backend):
    """Float32 inputs of 12-13 significant bits, every partial sum exact (_tf32_operands): exactly PyTorch's float64
    result, which the inputs rounded to TF32 would not give (_exact_not_tf32)."""
    dtype = np.dtype(np.float32)
    x, w, _ = _tf32_operands(dims, attrs, seed=21, backward=False)
    expected = _exact_not_tf32("forward", x, w, None, attrs).astype(dtype)
    state = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend)
    try:
        got, _ = _forward(gdev, state, attrs, x, w)
        plan = state.descriptors.forward_plan
        if backend:
            assert plan.executions == 1
    finally:
        conv_2d.cleanup_kernel(gdev.handle, state)
    detail = "legacy call" if plan is None else f"engine {plan.engine}, passed over {plan.choices[:-1]}"
    _same(got, expected, err_msg=detail)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dims, attrs", CASES)
def test_float32_backward_is_not_tf32(gdev, monkeypatch, dims, attrs, backend):
    """Both float32 gradients by the library's path for them (the columns path for groups 1, cuDNN's legacy call
    for groups > 1: float32 is not in cudnn.GRADIENT_PLAN_DTYPES, which _make_state checks), from operands of 12-13
    significant bits whose every partial sum is exact (_tf32_operands): exactly PyTorch's float64 gradients, which
    the operands rounded to TF32 would not give (_exact_not_tf32)."""
    dtype = np.dtype(np.float32)
    x, w, output_grad = _tf32_operands(dims, attrs, seed=23, backward=True)
    expected = {direction: _exact_not_tf32(direction, x, w, output_grad, attrs).astype(dtype)
                for direction in ("backward_data", "backward_filter")}
    state = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend)
    try:
        got = _backward(gdev, state, attrs, x, w, output_grad)
        paths = {direction: state.paths[direction] for direction in got}
        plans = {direction: _plan(state, direction) for direction in got}
    finally:
        conv_2d.cleanup_kernel(gdev.handle, state)
    for direction, values in got.items():
        plan = plans[direction]
        if plan is not None:
            assert plan.executions == 1
        detail = paths[direction] if plan is None else f"engine {plan.engine}, passed over {plan.choices[:-1]}"
        _same(values, expected[direction], err_msg=f"{direction}: {detail}")


@pytest.mark.gpu
@pytest.mark.parametrize("dims, attrs", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backend_backward_within_the_sum_bound(gdev, monkeypatch, dims, attrs, dtype):
    """Random data (inputs rounded to the dtype first), the forward's bound with each result's count of
    products (_terms): backward_data at most (O / groups) kh kw, backward_filter N Ho Wo (25600 for the
    160x160 case, where the bound is loose enough for TF32 to pass; not in the other cases). A second
    call gives the same bits (an engine summing with atomics would not, whatever its notes say)."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal(dims).astype(dtype)
    w = rng.standard_normal(conv_2d.filter_dims(attrs, dims[1])).astype(dtype)
    output_grad = rng.standard_normal(conv_2d.output_dims(attrs, dims)).astype(dtype)
    wide = [np.abs(a.astype(np.float64)) for a in (x, w, output_grad)]
    for backend in (False, True):
        state = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend)
        try:
            got = _backward(gdev, state, attrs, x, w, output_grad)
            again = _backward(gdev, state, attrs, x, w, output_grad)  # the same bits every run
            plans = {direction: _plan(state, direction) for direction in got}
        finally:
            conv_2d.cleanup_kernel(gdev.handle, state)
        for direction in got:
            if plans[direction] is not None:
                assert plans[direction].executions == 2
            assert got[direction].tobytes() == again[direction].tobytes(), f"backend={backend} {direction}"
            _within_sum_bound(got[direction], _reference_backward(direction, x, w, output_grad, attrs),
                              _reference_backward(direction, *wide, attrs), _terms(direction, dims, attrs), dtype,
                              f"backend={backend} {direction}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [p for p in DTYPES if p.values[0] in cudnn.GRADIENT_PLAN_DTYPES])
def test_backward_calls_the_plans_cannot_take_go_to_the_legacy_calls(gdev, monkeypatch, dtype):
    """An output gradient 1 element into a buffer (not 16-byte aligned) and another GpuHandle: both
    gradients by the legacy calls, right; then an aligned call on the state's handle takes both plans."""
    import kernels

    dims, attrs = (2, 8, 10, 12), Conv2DAttrs(8, 3, 3, padding_h=1, padding_w=1, groups=2)
    state = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend=True)
    plans = [_plan(state, direction) for direction in ("backward_data", "backward_filter")]
    other_handle = kernels.gpu_handle(0)
    try:
        x, w, _ = _exact_inputs(dims, attrs, dtype, seed=15)
        output_grad = _exact_output_grad(dims, attrs, seed=16).astype(dtype)
        expected = {direction: _reference_backward(direction, x, w, output_grad, attrs)
                    for direction in ("backward_data", "backward_filter")}
        flat = gdev.array(np.concatenate([np.zeros(1, dtype), output_grad.ravel()]))
        shifted = flat[1:].reshape(output_grad.shape)
        assert shifted.flags.c_contiguous and shifted.data.ptr % 16 != 0
        for handle, grad in ((gdev.handle, shifted), (other_handle, gdev.array(output_grad))):
            grads = [gdev.array(np.full(shape, np.nan, dtype)) for shape in (x.shape, w.shape)]
            conv_2d.backward_kernel(gdev.stream, handle, state, attrs, None, grad, gdev.array(x), grads[0],
                                    gdev.array(w), grads[1], None)
            gdev.stream.synchronize()
            assert [(plan.executions, plan.packs) for plan in plans] == [(0, 0), (0, 0)]
            _same(gdev.host(grads[0]), expected["backward_data"])
            _same(gdev.host(grads[1]), expected["backward_filter"])
        got = _backward(gdev, state, attrs, x, w, output_grad)  # the plans still take an aligned call
        assert [(plan.executions, plan.packs) for plan in plans] == [(1, 1), (1, 1)]
        for direction, values in got.items():
            _same(values, expected[direction])
    finally:
        conv_2d.cleanup_kernel(gdev.handle, state)
        other_handle.close()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_variant_pack_kept_while_the_pointers_stay(gdev, monkeypatch, dtype):
    dims, attrs = (2, 8, 12, 10), Conv2DAttrs(16, 3, 3, padding_h=1, padding_w=1)
    state = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend=True)
    plan = state.descriptors.forward_plan
    try:
        x1, w1, _ = _exact_inputs(dims, attrs, dtype, seed=2)
        x2, w2, _ = _exact_inputs(dims, attrs, dtype, seed=3)
        a_x, a_w = gdev.array(x1), gdev.array(w1)
        output = gdev.array(np.full(state.shapes["output_shape"].dims, np.nan, dtype))
        live = cudnn.live_descriptors()
        first, _ = _forward(gdev, state, attrs, a_x, a_w, output=output)
        assert (plan.executions, plan.packs) == (1, 1)
        gdev.assign(output, np.full(output.shape, np.nan, dtype))
        again, _ = _forward(gdev, state, attrs, a_x, a_w, output=output)  # the same pointers: the same pack
        assert (plan.executions, plan.packs) == (2, 1)
        _same(first, _reference(x1, w1, attrs).astype(dtype))
        _same(again, first)
        other, _ = _forward(gdev, state, attrs, x2, w2)  # new arrays: a new pack, the old one destroyed
        assert (plan.executions, plan.packs) == (3, 2)
        _same(other, _reference(x2, w2, attrs).astype(dtype))
        gdev.assign(output, np.full(output.shape, np.nan, dtype))
        back, _ = _forward(gdev, state, attrs, a_x, a_w, output=output)
        assert (plan.executions, plan.packs) == (4, 3)
        _same(back, first)
        # one pack alive at a time: the one the first call made (none before it) was destroyed for the next
        assert cudnn.live_descriptors() == dict(live, backend=live["backend"] + 1)
    finally:
        conv_2d.cleanup_kernel(gdev.handle, state)


@pytest.mark.gpu
def test_calls_the_plan_cannot_take_go_to_the_legacy_call(gdev, monkeypatch):
    """A view 4 bytes into a buffer (not 16-byte aligned) and another GpuHandle: the legacy call, right."""
    import kernels

    dtype = np.dtype(np.float32)
    dims, attrs = (2, 8, 12, 10), Conv2DAttrs(16, 3, 3, padding_h=1, padding_w=1)
    state = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend=True)
    plan = state.descriptors.forward_plan
    other_handle = kernels.gpu_handle(0)
    try:
        x, w, _ = _exact_inputs(dims, attrs, dtype, seed=4)
        expected = _reference(x, w, attrs).astype(dtype)
        flat = gdev.array(np.concatenate([np.zeros(1, dtype), x.ravel()]))
        shifted = flat[1:].reshape(dims)
        assert shifted.flags.c_contiguous and shifted.data.ptr % 16 == 4
        got, _ = _forward(gdev, state, attrs, shifted, w)
        assert (plan.executions, plan.packs) == (0, 0)
        _same(got, expected)
        output = gdev.array(np.full(state.shapes["output_shape"].dims, np.nan, dtype))
        conv_2d.forward_kernel(gdev.stream, other_handle, state, attrs, gdev.array(x), gdev.array(w), None, output)
        gdev.stream.synchronize()
        assert (plan.executions, plan.packs) == (0, 0)
        _same(gdev.host(output), expected)
        got, _ = _forward(gdev, state, attrs, x, w)  # and the plan still takes an aligned call
        assert (plan.executions, plan.packs) == (1, 1)
        _same(got, expected)
    finally:
        conv_2d.cleanup_kernel(gdev.handle, state)
        other_handle.close()


def _forward_backward(dev, state, attrs, x, w, bias, output_grad):
    arrays = [None if a is None else dev.array(a) for a in (x, w, bias, output_grad)]
    dtype = x.dtype
    output = dev.array(np.full(state.shapes["output_shape"].dims, np.nan, dtype))
    conv_2d.forward_kernel(dev.stream, dev.handle, state, attrs, *arrays[:3], output)
    results = [output]
    if attrs.backward:
        grads = [dev.array(np.full(shape, np.nan, dtype)) for shape in (x.shape, w.shape)]
        grads.append(None if bias is None else dev.array(np.full(bias.shape, np.nan, dtype)))
        conv_2d.backward_kernel(dev.stream, dev.handle, state, attrs, output, arrays[3], arrays[0], grads[0],
                                arrays[1], grads[1], grads[2])
        results += grads
        results.append(state.pre_grad_buffer)  # the activation's gradient, which the convolution's take (or None)
    dev.stream.synchronize()
    return [None if r is None else dev.host(r) for r in results]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_bias, activation, backward", [
    (True, None, True), (True, Activation.SILU, True), (True, Activation.SILU, False), (False, Activation.RELU, False),
], ids=["bias", "bias_silu_backward", "bias_silu_inference", "relu_inference"])
def test_bias_activation_and_backward_as_legacy(gdev, monkeypatch, dtype, use_bias, activation, backward):
    """The same pre-activation values (exact inputs) through the same bias and activation code: the same
    output, bias gradient and activation gradient. The convolution's gradients run in cuDNN (groups 2), by
    the plans or the legacy calls: from an exact output gradient (no activation) exactly PyTorch's; from a
    fused activation's gradient (not exact) within the sum bound of PyTorch's from that gradient."""
    dims = (2, 8, 11, 9)
    attrs = Conv2DAttrs(12, 3, 3, 2, 1, 1, 1, groups=2, use_bias=use_bias, activation=activation,
                        backward=backward)
    x, w, bias = _exact_inputs(dims, attrs, dtype, seed=6)
    output_grad = np.random.default_rng(7).integers(-2, 3, conv_2d.output_dims(attrs, dims)).astype(dtype)
    results = {}
    for backend in (False, True):
        state = _make_state(gdev, attrs, dims, dtype, monkeypatch, backend)
        try:
            results[backend] = _forward_backward(gdev, state, attrs, x, w, bias, output_grad)
            if backend:
                assert state.descriptors.forward_plan.executions == 1
                if backward and np.dtype(dtype) in cudnn.GRADIENT_PLAN_DTYPES:  # (else _make_state checked
                    # that the state has no backward plans)
                    assert [_plan(state, d).executions for d in ("backward_data", "backward_filter")] == [1, 1]
        finally:
            conv_2d.cleanup_kernel(gdev.handle, state)
    if activation is None:
        expected = _reference(x, w, attrs) + bias.astype(np.float64)[:, None, None]
        _same(results[True][0], expected.astype(dtype))
    if backward:
        for backend in (False, True):
            _, input_grad, filter_grad, _, pre_grad = results[backend]
            grad = output_grad if activation is None else pre_grad
            for direction, got in (("backward_data", input_grad), ("backward_filter", filter_grad)):
                reference = _reference_backward(direction, x, w, grad, attrs)
                magnitude = _reference_backward(direction, np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)),
                                                np.abs(grad.astype(np.float64)), attrs)
                if activation is None:  # every partial sum an integer within _EXACT_LIMIT: exact in every dtype
                    assert magnitude.max() <= _EXACT_LIMIT
                    _same(got, reference, err_msg=f"backend={backend} {direction}")
                else:
                    _within_sum_bound(got, reference, magnitude, _terms(direction, dims, attrs), dtype,
                                      f"backend={backend} {direction}")
    # The output, bias_grad and the activation's gradient: the same code on the same values. The convolution's
    # gradients too where exact (no activation).
    for index, (legacy, got) in enumerate(zip(results[False], results[True])):
        if legacy is not None and (activation is None or index not in (1, 2)):
            _same(got, legacy, err_msg=f"result {index}")


@pytest.mark.gpu
def test_descriptors_destroyed_at_cleanup_and_on_failed_init(gdev, monkeypatch):
    dtype = np.dtype(np.float32)
    warm = _make_state(gdev, Conv2DAttrs(4, 3, 3), (1, 2, 5, 5), dtype, monkeypatch, backend=True)
    conv_2d.cleanup_kernel(gdev.handle, warm)  # the cuDNN handle and library made first
    start = cudnn.live_descriptors()
    states = []
    for param in CASES:
        dims, attrs = param.values
        for dtype_param in DTYPES:
            states.append(_make_state(gdev, attrs, dims, dtype_param.values[0], monkeypatch, backend=True))
    assert cudnn.live_descriptors()["backend"] > start["backend"]
    x, w, _ = _exact_inputs((2, 8, 12, 10), CASES[0].values[1], dtype, seed=8)
    _forward(gdev, states[0], CASES[0].values[1], x, w)  # a variant pack too
    planned = next(state for state in states if state.descriptors.backward_filter_plan is not None)
    dims, attrs = planned.shapes["input_shape"].dims, planned.attrs
    x, w, _ = _exact_inputs(dims, attrs, planned.shapes["input_shape"].dtype, seed=8)
    _backward(gdev, planned, attrs, x, w, _exact_output_grad(dims, attrs, seed=8))  # the backward plans' packs
    assert [_plan(planned, direction).packs for direction in ("backward_data", "backward_filter")] == [1, 1]
    for state in states:
        conv_2d.cleanup_kernel(gdev.handle, state)
        assert all(_plan(state, direction) is None for direction in OPERATIONS)
    assert cudnn.live_descriptors() == start
    # An init whose plan finds no engine (every one refused) raises cuDNN's error and leaks nothing.
    monkeypatch.setattr(cudnn, "engine_rejection", lambda *args: "refused by the test")
    with pytest.raises(CudaError, match="CUDNN_STATUS_NOT_SUPPORTED") as raised:
        _make_state(gdev, CASES[0].values[1], (2, 8, 12, 10), dtype, monkeypatch, backend=True)
    assert "refused by the test" in str(raised.value)
    assert cudnn.live_descriptors() == start


# ------------------------------------------------------------------ ConvolutionPlan against a stand-in library


class _FakeBackend:
    """cudnnBackend* in Python, enough for ConvolutionPlan: descriptors hold their attributes; the
    heuristics offer `offers[mode]` (engine index, notes, plan status, workspace) in order."""

    _CTYPES = {cudnn.TYPE_INT64: ctypes.c_int64, cudnn.TYPE_FLOAT: ctypes.c_float, cudnn.TYPE_DOUBLE: ctypes.c_double,
               cudnn.TYPE_HANDLE: ctypes.c_void_p, cudnn.TYPE_VOID_PTR: ctypes.c_void_p,
               cudnn.TYPE_BACKEND_DESCRIPTOR: ctypes.c_void_p}

    def __init__(self, offers):
        self.offers, self.descriptors, self.executed, self.next = offers, {}, [], 4096
        self.loaded = self

    def __call__(self):
        return self

    def _ctype(self, kind):
        return self._CTYPES.get(kind, ctypes.c_int)

    def cudnnBackendCreateDescriptor(self, kind, pointer):
        self.next += 16
        self.descriptors[self.next] = {"kind": kind, "attrs": {}, "final": False}
        pointer._obj.value = self.next
        return 0

    def cudnnBackendDestroyDescriptor(self, ptr):
        return 0 if self.descriptors.pop(ptr, None) is not None else 2000

    def cudnnBackendSetAttribute(self, ptr, name, kind, count, array):
        values = ctypes.cast(array, ctypes.POINTER(self._ctype(kind)))
        self.descriptors[ptr]["attrs"][name] = (kind, [values[i] for i in range(count)])
        return 0

    def cudnnBackendFinalize(self, ptr):
        d = self.descriptors[ptr]
        if d["kind"] == cudnn.BACKEND_OPERATIONGRAPH_DESCRIPTOR and not d["attrs"][cudnn.ATTR_OPERATIONGRAPH_HANDLE][1][0]:
            return 2000
        if d["kind"] == cudnn.BACKEND_EXECUTION_PLAN_DESCRIPTOR:
            config = self.descriptors[d["attrs"][cudnn.ATTR_EXECUTION_PLAN_ENGINE_CONFIG][1][0]]
            if config["offer"][2]:
                return config["offer"][2]
        d["final"] = True
        return 0

    def cudnnBackendGetAttribute(self, ptr, name, kind, requested, returned, array):
        d = self.descriptors[ptr]
        if name == cudnn.ATTR_ENGINEHEUR_RESULTS:
            offers = self.offers.get(d["attrs"][cudnn.ATTR_ENGINEHEUR_MODE][1][0], [])
            returned._obj.value = len(offers)
            targets = ctypes.cast(array, ctypes.POINTER(ctypes.c_void_p)) if array is not None else None
            for i in range(min(requested, len(offers))):
                self.descriptors[targets[i]]["offer"] = offers[i]
            return 0
        if name == cudnn.ATTR_ENGINECFG_ENGINE:
            engine = ctypes.cast(array, ctypes.POINTER(ctypes.c_void_p))[0]
            self.descriptors[engine]["offer"] = d["offer"]
            values = [engine]
        elif name == cudnn.ATTR_ENGINE_GLOBAL_INDEX:
            values = [d["offer"][0]]
        elif name == cudnn.ATTR_ENGINE_NUMERICAL_NOTE:
            values = list(d["offer"][1])
        elif name == cudnn.ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
            config = self.descriptors[d["attrs"][cudnn.ATTR_EXECUTION_PLAN_ENGINE_CONFIG][1][0]]
            values = [config["offer"][3]]
        else:
            values = d["attrs"][name][1]
        returned._obj.value = len(values)
        target = ctypes.cast(array, ctypes.POINTER(self._ctype(kind)))
        for i, value in enumerate(values[:requested]):
            target[i] = value
        return 0

    def cudnnBackendExecute(self, handle, plan, pack):
        assert self.descriptors[plan]["final"] and self.descriptors[pack]["final"]
        self.executed.append((handle, self.descriptors[pack]["attrs"]))
        return 0

    def cudnnGetLastErrorString(self, buffer, size):
        buffer.value = b""

    def cudnnGetErrorString(self, status):
        return None


def _fake(monkeypatch, offers):
    fake = _FakeBackend(offers)
    monkeypatch.setattr(cudnn, "library", fake)
    return fake


_PLAN_ARGS = (np.float16, (2, 8, 12, 10), (16, 8, 3, 3), (2, 16, 12, 10), (1, 1), (1, 1), (1, 1), False, 1000)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_plan_takes_the_first_acceptable_engine(monkeypatch, direction):
    """Refused notes, a plan that does not finalize and a workspace over the limit are passed over,
    in heuristics order, then the fallback list; the graph is what the attrs say: one operation of the
    direction, its x, w and y roles given the tensors of those dims and ids."""
    fake = _fake(monkeypatch, {
        cudnn.HEUR_MODE_A: [(11, [cudnn.NUMERICAL_NOTE_WINOGRAD], 0, 0), (12, [], 3000, 0), (13, [], 0, 5000)],
        cudnn.HEUR_MODE_FALLBACK: [(14, [cudnn.NUMERICAL_NOTE_NONDETERMINISTIC], 0, 0),
                                   (15, [cudnn.NUMERICAL_NOTE_TENSOR_CORE], 0, 512), (16, [], 0, 0)]})
    start = cudnn.live_descriptors()
    plan = cudnn.ConvolutionPlan(direction, 0x5000, *_PLAN_ARGS)
    assert plan.direction == direction
    assert (plan.engine, plan.workspace) == (15, 512)  # half data: tensor cores allowed
    assert [(c.engine, c.rejected) for c in plan.choices] == [
        (11, "WINOGRAD"), (12, "plan: CUDNN_STATUS_NOT_SUPPORTED"), (13, "workspace 5000 > 1000"),
        (14, "NONDETERMINISTIC"), (15, None)]
    kinds = [d["kind"] for d in fake.descriptors.values()]
    assert kinds.count(cudnn.BACKEND_TENSOR_DESCRIPTOR) == 3 and kinds.count(cudnn.BACKEND_CONVOLUTION_DESCRIPTOR) == 1
    tensors = {d["attrs"][cudnn.ATTR_TENSOR_UNIQUE_ID][1][0]: d["attrs"] for d in fake.descriptors.values()
               if d["kind"] == cudnn.BACKEND_TENSOR_DESCRIPTOR}
    assert tensors[cudnn.W_UID][cudnn.ATTR_TENSOR_DIMENSIONS][1] == [16, 8, 3, 3]
    assert tensors[cudnn.W_UID][cudnn.ATTR_TENSOR_STRIDES][1] == [72, 9, 3, 1]
    assert tensors[cudnn.X_UID][cudnn.ATTR_TENSOR_BYTE_ALIGNMENT][1] == [cudnn.BACKEND_ALIGNMENT]
    assert tensors[cudnn.Y_UID][cudnn.ATTR_TENSOR_DATA_TYPE][1] == [cudnn.DATA_HALF]
    conv = next(d["attrs"] for d in fake.descriptors.values() if d["kind"] == cudnn.BACKEND_CONVOLUTION_DESCRIPTOR)
    assert conv[cudnn.ATTR_CONVOLUTION_COMP_TYPE][1] == [cudnn.DATA_FLOAT]
    assert conv[cudnn.ATTR_CONVOLUTION_CONV_MODE][1] == [cudnn.CROSS_CORRELATION]
    kind, alpha, beta, conv_attr, x_attr, w_attr, y_attr = OPERATIONS[direction]
    ops = [d for d in fake.descriptors.values() if d["kind"] in {o[0] for o in OPERATIONS.values()}]
    assert [d["kind"] for d in ops] == [kind]
    op = ops[0]["attrs"]
    assert op[alpha] == (cudnn.TYPE_FLOAT, [1.0])
    assert op[beta] == (cudnn.TYPE_FLOAT, [0.0])
    assert fake.descriptors[op[conv_attr][1][0]]["kind"] == cudnn.BACKEND_CONVOLUTION_DESCRIPTOR
    for attr, uid, dims in ((x_attr, cudnn.X_UID, [2, 8, 12, 10]), (w_attr, cudnn.W_UID, [16, 8, 3, 3]),
                            (y_attr, cudnn.Y_UID, [2, 16, 12, 10])):
        kind_, (tensor,) = op[attr]
        assert kind_ == cudnn.TYPE_BACKEND_DESCRIPTOR
        assert fake.descriptors[tensor]["attrs"][cudnn.ATTR_TENSOR_UNIQUE_ID][1] == [uid]
        assert fake.descriptors[tensor]["attrs"][cudnn.ATTR_TENSOR_DIMENSIONS][1] == dims
    graph = next(d["attrs"] for d in fake.descriptors.values() if d["kind"] == cudnn.BACKEND_OPERATIONGRAPH_DESCRIPTOR)
    assert graph[cudnn.ATTR_OPERATIONGRAPH_HANDLE][1] == [0x5000]
    assert fake.descriptors[graph[cudnn.ATTR_OPERATIONGRAPH_OPS][1][0]]["kind"] == kind
    plan.destroy()
    plan.destroy()
    assert cudnn.live_descriptors() == start and not fake.descriptors


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_plan_variant_pack_and_refusals(monkeypatch, direction):
    """run(handle, x, w, y, workspace) takes the pointers of the x, w and y roles whatever the direction
    (backward_data writes x, backward_filter w): the pack binds them to those roles' ids."""
    fake = _fake(monkeypatch, {cudnn.HEUR_MODE_A: [(7, [cudnn.NUMERICAL_NOTE_STRICT_NAN_PROP], 0, 0)]})
    start = cudnn.live_descriptors()
    plan = cudnn.ConvolutionPlan(direction, 0x5000, *_PLAN_ARGS)
    live = cudnn.live_descriptors()["backend"]
    assert plan.run(0x5000, 512, 1024, 2048, 4096)
    assert plan.run(0x5000, 512, 1024, 2048, 4096)
    assert (plan.executions, plan.packs) == (2, 1)
    assert cudnn.live_descriptors()["backend"] == live + 1
    handle, pack = fake.executed[-1]
    assert handle == 0x5000
    assert pack[cudnn.ATTR_VARIANT_PACK_UNIQUE_IDS][1] == [cudnn.X_UID, cudnn.W_UID, cudnn.Y_UID]
    assert pack[cudnn.ATTR_VARIANT_PACK_DATA_POINTERS][1] == [512, 1024, 2048]
    assert pack[cudnn.ATTR_VARIANT_PACK_WORKSPACE][1] == [4096]
    assert not plan.run(0x5000, 516, 1024, 2048, 4096)  # misaligned: nothing done, the pack kept
    assert not plan.run(0x5000, 512, 1024, 2056, 4096)
    assert not plan.run(0x6000, 512, 1024, 2048, 4096)  # another cuDNN handle
    assert (plan.executions, plan.packs) == (2, 1)
    assert plan.run(0x5000, 512, 1024, 2048, 8192)  # the workspace moved: a new pack, the old destroyed
    assert (plan.executions, plan.packs) == (3, 2) and cudnn.live_descriptors()["backend"] == live + 1
    assert fake.executed[-1][1][cudnn.ATTR_VARIANT_PACK_WORKSPACE][1] == [8192]
    plan.destroy()
    assert cudnn.live_descriptors() == start and not fake.descriptors


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_plan_without_an_engine_raises_naming_the_direction_and_leaks_nothing(monkeypatch, direction):
    fake = _fake(monkeypatch, {cudnn.HEUR_MODE_A: [(3, [cudnn.NUMERICAL_NOTE_FFT], 0, 0)]})
    start = cudnn.live_descriptors()
    args = (np.float32,) + _PLAN_ARGS[1:]
    with pytest.raises(CudaError, match=rf"CUDNN_STATUS_NOT_SUPPORTED.*no deterministic sum-of-products {direction} "
                                        r"engine for these shapes.*engine 3: FFT") as raised:
        cudnn.ConvolutionPlan(direction, 0x5000, *args)
    assert "heuristics" not in str(raised.value)  # the fallback mode offered nothing
    fake.offers = {cudnn.HEUR_MODE_A: [(4, [cudnn.NUMERICAL_NOTE_TENSOR_CORE], 0, 0)]}  # TF32 without tf32
    with pytest.raises(CudaError, match="engine 4: TENSOR_CORE"):
        cudnn.ConvolutionPlan(direction, 0x5000, *args)
    plan = cudnn.ConvolutionPlan(direction, 0x5000, *args[:-2], True, 1000)  # with tf32
    assert plan.engine == 4
    plan.destroy()
    with pytest.raises(CudaError):
        cudnn.ConvolutionPlan(direction, 0, *args)  # the graph does not finalize
    assert cudnn.live_descriptors() == start and not fake.descriptors


@pytest.mark.gpu
def test_auto_mode_takes_the_plan_and_falls_back_where_none_qualifies(gdev, monkeypatch):
    """KERNELS_CUDNN_BACKEND unset (the default): the state holds the plan and its forward runs it; where
    no engine qualifies, the state keeps the legacy call and its results, leaking no descriptor; "1"
    raises there instead, and an error other than NOT_SUPPORTED is raised in auto mode too."""
    dtype = np.dtype(np.float32)
    dims, attrs = CASES[0].values
    x, w, _ = _exact_inputs(dims, attrs, dtype, seed=9)
    expected = _reference(x, w, attrs).astype(dtype)
    monkeypatch.delenv(cudnn.BACKEND_ENV, raising=False)
    output_shape = TensorShape(conv_2d.output_dims(attrs, dims), dtype)
    state = conv_2d.init_kernel(gdev.handle, attrs, TensorShape(dims, dtype), output_shape)
    try:
        plan = state.descriptors.forward_plan
        assert plan is not None
        got, _ = _forward(gdev, state, attrs, x, w)
        assert plan.executions == 1
        _same(got, expected)
    finally:
        conv_2d.cleanup_kernel(gdev.handle, state)
    start = cudnn.live_descriptors()
    monkeypatch.setattr(cudnn, "engine_rejection", lambda *args: "refused by the test")
    state = conv_2d.init_kernel(gdev.handle, attrs, TensorShape(dims, dtype), output_shape)
    try:
        assert all(_plan(state, direction) is None for direction in OPERATIONS)
        got, _ = _forward(gdev, state, attrs, x, w)
        _same(got, expected)
    finally:
        conv_2d.cleanup_kernel(gdev.handle, state)
    assert cudnn.live_descriptors() == start
    monkeypatch.setenv(cudnn.BACKEND_ENV, "1")
    with pytest.raises(CudaError, match="refused by the test"):
        conv_2d.init_kernel(gdev.handle, attrs, TensorShape(dims, dtype), output_shape)
    monkeypatch.delenv(cudnn.BACKEND_ENV)

    def bad_param(*args, **kwargs):
        raise CudaError("cuDNN", "CUDNN_STATUS_BAD_PARAM", "raised by the test")

    monkeypatch.setattr(cudnn, "ConvolutionPlan", bad_param)
    with pytest.raises(CudaError, match="raised by the test"):
        conv_2d.init_kernel(gdev.handle, attrs, TensorShape(dims, dtype), output_shape)
    assert cudnn.live_descriptors() == start


@pytest.mark.gpu
@pytest.mark.parametrize("direction", BACKWARD)
def test_auto_mode_falls_back_per_direction(gdev, monkeypatch, direction):
    """Switch unset: where no engine qualifies for one backward direction (or its graph fails with a
    NOT_SUPPORTED_* status), that direction alone keeps its legacy call (no plan, its gradient right) and
    the others their plans; "1" raises there, naming the direction, and the plans made before it are
    destroyed with the rest."""
    dtype = np.dtype(np.float16)
    dims, attrs = CASES[3].values  # g2_k3: every direction in cuDNN
    x, w, _ = _exact_inputs(dims, attrs, dtype, seed=17)
    output_grad = _exact_output_grad(dims, attrs, seed=18)
    expected = {d: _reference_backward(d, x, w, output_grad, attrs) for d in ("backward_data", "backward_filter")}
    output_shape = TensorShape(conv_2d.output_dims(attrs, dims), dtype)
    other = "backward_filter" if direction == "backward_data" else "backward_data"
    real_plan, real_rejection = cudnn.ConvolutionPlan, cudnn.engine_rejection

    def refusing(which, *args, **kwargs):  # the real plan, every engine refused for `direction` alone
        if which != direction:
            return real_plan(which, *args, **kwargs)
        monkeypatch.setattr(cudnn, "engine_rejection", lambda *a: "refused by the test")
        try:
            return real_plan(which, *args, **kwargs)
        finally:
            monkeypatch.setattr(cudnn, "engine_rejection", real_rejection)

    def unsupported(which, *args, **kwargs):
        if which == direction:
            raise CudaError("cuDNN", "CUDNN_STATUS_NOT_SUPPORTED_SHAPE", "raised by the test")
        return real_plan(which, *args, **kwargs)

    monkeypatch.delenv(cudnn.BACKEND_ENV, raising=False)
    warm = conv_2d.init_kernel(gdev.handle, attrs, TensorShape(dims, dtype), output_shape)
    conv_2d.cleanup_kernel(gdev.handle, warm)  # the cuDNN handle and library made first
    start = cudnn.live_descriptors()
    for stand_in in (refusing, unsupported):
        monkeypatch.setattr(cudnn, "ConvolutionPlan", stand_in)
        state = conv_2d.init_kernel(gdev.handle, attrs, TensorShape(dims, dtype), output_shape)
        try:
            assert _plan(state, direction) is None and direction in state.algorithms
            assert _plan(state, "forward") is not None and _plan(state, other) is not None
            got = _backward(gdev, state, attrs, x, w, output_grad)
            assert _plan(state, other).executions == 1
            for which, values in got.items():
                _same(values, expected[which], err_msg=f"{stand_in.__name__}: {which}")
        finally:
            conv_2d.cleanup_kernel(gdev.handle, state)
        assert cudnn.live_descriptors() == start
    monkeypatch.setattr(cudnn, "ConvolutionPlan", refusing)
    monkeypatch.setenv(cudnn.BACKEND_ENV, "1")
    with pytest.raises(CudaError, match=rf"CUDNN_STATUS_NOT_SUPPORTED.*no deterministic sum-of-products {direction} "
                                        r"engine.*refused by the test"):
        conv_2d.init_kernel(gdev.handle, attrs, TensorShape(dims, dtype), output_shape)
    assert cudnn.live_descriptors() == start
