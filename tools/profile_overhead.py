"""Where the host time of one GPU call goes: cProfile over many forward calls of a few
ops on YOLOv10 shapes, plus the cost of the CuPy primitives they use, the parts of one
launch-bound call (checks, the stream's entry, the launch by CuPy and by ctypes'
cuLaunchKernel, PyTorch's whole call beside), and cuBLAS's host time a GEMM in each
math mode. Run on the GPU machine: python3 tools/profile_overhead.py
(docs/performance.md#host-time-of-one-gpu-call)."""

import cProfile
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, ".")
import cupy  # noqa: E402

import kernels  # noqa: E402
from kernels import TensorShape as S  # noqa: E402

stream, handle = kernels.gpu_stream(), kernels.gpu_handle()
f32 = np.float32


def rnd(*dims):
    with stream:  # uploaded on the kernels' stream, so the calls below read it complete
        return cupy.asarray(np.random.default_rng(0).standard_normal(dims).astype(f32))


def setups():
    k = kernels
    x = rnd(1, 128, 20, 20)
    a = k.Pool2DAttrs(kernel_h=5, kernel_w=5, stride_h=1, stride_w=1, padding_h=2, padding_w=2, pool_type="MAX")
    o = cupy.empty_like(x)
    st = k.pool_2d.init_kernel(handle, a, S.of(x), S.of(o))
    yield "pool_2d sppf 1x128x20x20", lambda: k.pool_2d.forward_kernel(stream, handle, st, a, x, o)
    xs = [rnd(1, 320, 20, 20) for _ in range(4)]
    oc = cupy.empty((1, 1280, 20, 20), f32)
    ac = k.ConcatAttrs(axis=1, num_inputs=4)
    sc = k.concat.init_kernel(handle, ac, [S.of(t) for t in xs], S.of(oc))
    yield "concat sppf 4x1x320x20x20", lambda: k.concat.forward_kernel(stream, handle, sc, ac, xs, oc)
    xi, w, b = rnd(1, 64, 80, 80), rnd(64, 64, 1, 1), rnd(64)
    oo = cupy.empty((1, 64, 80, 80), f32)
    acv = k.Conv2DAttrs(out_channels=64, kernel_h=1, kernel_w=1, stride_h=1, stride_w=1, padding_h=0, padding_w=0,
                        use_bias=True)
    scv = k.conv_2d.init_kernel(handle, acv, S.of(xi), S.of(oo))
    yield "conv_2d head 1x1 bias", lambda: k.conv_2d.forward_kernel(stream, handle, scv, acv, xi, w, b, oo)
    x3, w3 = rnd(1, 32, 160, 160), rnd(32, 32, 3, 3)
    o3 = cupy.empty((1, 32, 160, 160), f32)
    a3 = k.Conv2DAttrs(out_channels=32, kernel_h=3, kernel_w=3, padding_h=1, padding_w=1)
    s3 = k.conv_2d.init_kernel(handle, a3, S.of(x3), S.of(o3))
    yield "conv_2d c2f 3x3", lambda: k.conv_2d.forward_kernel(stream, handle, s3, a3, x3, w3, None, o3)
    g3, gx3, gw3 = rnd(1, 32, 160, 160), cupy.empty_like(x3), cupy.empty_like(w3)
    yield "conv_2d c2f 3x3 backward", lambda: k.conv_2d.backward_kernel(stream, handle, s3, a3, o3, g3, x3, gx3, w3,
                                                                         gw3, None)
    xd, wd = rnd(1, 64, 80, 80), rnd(64, 1, 3, 3)
    od = cupy.empty((1, 64, 40, 40), f32)
    ad = k.Conv2DAttrs(out_channels=64, kernel_h=3, kernel_w=3, stride_h=2, stride_w=2, padding_h=1, padding_w=1,
                       groups=64)
    sd = k.conv_2d.init_kernel(handle, ad, S.of(xd), S.of(od))
    yield "conv_2d scdown depthwise 3x3 s2", lambda: k.conv_2d.forward_kernel(stream, handle, sd, ad, xd, wd, None, od)
    l, r = rnd(1, 80, 160, 160), rnd(1, 80, 160, 160)
    ob = cupy.empty_like(l)
    ab = k.ElementBinaryAttrs(op_type="ADD")
    sb = k.element_binary.init_kernel(handle, ab, S.of(l), S.of(r), S.of(ob))
    yield "element_binary add", lambda: k.element_binary.forward_kernel(stream, handle, sb, ab, l, r, ob)
    q, kv = rnd(1, 5, 64, 400), rnd(1, 5, 400, 400)
    om = cupy.empty((1, 5, 64, 400), f32)
    am = k.BatchMatmulAttrs()
    sm = k.batch_matmul.init_kernel(handle, am, S.of(q), S.of(kv), S.of(om))
    yield "batch_matmul psa values", lambda: k.batch_matmul.forward_kernel(stream, handle, sm, am, q, kv, om)
    import torch

    tq, tkv = torch.from_numpy(cupy.asnumpy(q)).cuda(), torch.from_numpy(cupy.asnumpy(kv)).cuda()
    tom = torch.empty((1, 5, 64, 400), device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    yield "torch.matmul psa values out=", lambda: torch.matmul(tq, tkv, out=tom)
    tl, tr = torch.from_numpy(cupy.asnumpy(l)).cuda(), torch.from_numpy(cupy.asnumpy(r)).cuda()
    tob = torch.empty_like(tl)
    yield "torch.add 1x80x160x160 out=", lambda: torch.add(tl, tr, out=tob)
    t = rnd(1, 5, 128, 400)
    ot = cupy.empty((1, 5, 400, 128), f32)
    at = k.TransposeAttrs((0, 1, 3, 2))
    stt = k.transpose.init_kernel(handle, at, S.of(t), S.of(ot))
    yield "transpose psa", lambda: k.transpose.forward_kernel(stream, handle, stt, at, t, ot)


def per_call(function, count=300):
    """Host us a call and us a call with the GPU's work, back to back; the device synchronized (every
    stream: PyTorch's rows run on its own) before and after."""
    device = cupy.cuda.Device()
    function()
    device.synchronize()
    start = time.perf_counter()
    for _ in range(count):
        function()
    host = (time.perf_counter() - start) / count
    device.synchronize()
    total = (time.perf_counter() - start) / count
    return host * 1e6, total * 1e6


def synced(function, count=300):
    """us a call, each call followed by a device synchronize (as the benchmarks time a row): median."""
    device, times = cupy.cuda.Device(), []
    function()
    device.synchronize()
    for _ in range(count):
        start = time.perf_counter()
        function()
        device.synchronize()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def idle(function, count=300):
    """Host us of one call made with the GPU idle (the device synchronized before it, as
    KERNELS_BENCH_PARTS times a row's host part): median."""
    device, times = cupy.cuda.Device(), []
    function()
    for _ in range(count):
        device.synchronize()
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    device.synchronize()
    return float(np.median(times)) * 1e6


def idle_profile(function, count=200):
    """cProfile of `count` calls, each made with the GPU idle (the synchronizes not profiled)."""
    device, profile = cupy.cuda.Device(), cProfile.Profile()
    for _ in range(count):
        device.synchronize()
        profile.enable()
        function()
        profile.disable()
    device.synchronize()
    return profile


print(f"{'call':<32}{'host us/call':>14}{'with GPU us/call':>18}")
print(f"{'stream.synchronize()':<32}{per_call(stream.synchronize)[0]:>14.1f}")
x = cupy.empty(1024, f32)
print(f"{'x.device.id':<32}{per_call(lambda: x.device.id)[0]:>14.1f}")
print(f"{'x.flags.c_contiguous':<32}{per_call(lambda: x.flags.c_contiguous)[0]:>14.1f}")
print(f"{'x.data.device_id':<32}{per_call(lambda: x.data.device_id)[0]:>14.1f}")
print(f"{'x._c_contiguous':<32}{per_call(lambda: x._c_contiguous)[0]:>14.1f}")
expected, check_tensor = S.of(x), kernels.runtime.core.check_tensor
print(f"{'core.check_tensor':<32}{per_call(lambda: check_tensor('op', 'x', x, expected, stream.device))[0]:>14.1f}")
print(f"{'with stream: pass':<32}{per_call(lambda: stream.__enter__() and stream.__exit__(None, None, None))[0]:>14.1f}")

def cudnn_calls():
    """Host time of the bare cuDNN calls of a 3x3 conv (the legacy call and the backend plan's), and of
    a 1x1 conv's bias add, next to a cuBLAS GEMM of that 1x1's size."""
    from kernels.runtime import cudnn

    k = kernels
    x3, w3 = rnd(1, 32, 160, 160), rnd(32, 32, 3, 3)
    o3 = cupy.empty((1, 32, 160, 160), f32)
    a3 = k.Conv2DAttrs(out_channels=32, kernel_h=3, kernel_w=3, padding_h=1, padding_w=1)
    s3 = k.conv_2d.init_kernel(handle, a3, S.of(x3), S.of(o3))
    k.conv_2d.forward_kernel(stream, handle, s3, a3, x3, w3, None, o3)
    d3, h = s3.descriptors, handle.cudnn(stream)
    ws, wsb = k.conv_2d.gpu._workspace(handle, s3)
    one, zero = cudnn.scalar(f32, 1), cudnn.scalar(f32, 0)
    yield "cudnnConvolutionForward 3x3", lambda: cudnn.convolution_forward(
        h, one, d3.x, x3.data.ptr, d3.w, w3.data.ptr, d3.conv, s3.algorithms["forward"], ws, wsb, zero, d3.y,
        o3.data.ptr)
    if d3.forward_plan is not None:
        yield "cudnnBackendExecute 3x3", lambda: d3.forward_plan.run(h, x3.data.ptr, w3.data.ptr, o3.data.ptr, ws)
    xi, w, b = rnd(1, 64, 80, 80), rnd(64, 64, 1, 1), rnd(64)
    oo = cupy.empty((1, 64, 80, 80), f32)
    a = k.Conv2DAttrs(out_channels=64, kernel_h=1, kernel_w=1, use_bias=True)
    st = k.conv_2d.init_kernel(handle, a, S.of(xi), S.of(oo))
    k.conv_2d.forward_kernel(stream, handle, st, a, xi, w, b, oo)
    d = st.descriptors
    yield "cudnnAddTensor bias", lambda: cudnn.add_tensor(h, one, d.bias, b.data.ptr, one, d.y, oo.data.ptr)
    yield "cudnnSetStream", lambda: handle.cudnn(stream)
    from kernels.runtime import cublas

    yield "cublas gemm 64x6400x64", lambda: cublas.gemm_strided_batched(
        stream, handle, np.dtype(f32), False, False, 6400, 64, 64, xi.data.ptr, 6400, 0, w.data.ptr, 64, 0, 0.0,
        oo.data.ptr, 6400, 0, 1, "profile")
    print("algorithms:", {k_: (v.algo, v.math_type) for k_, v in s3.algorithms.items()})


def launch_parts():
    """One launch-bound call (element_binary ADD on 4x4 float32) and its parts."""
    import ctypes

    from kernels.runtime import core, gpu

    k = kernels
    x, y = rnd(4, 4), rnd(4, 4)
    o = cupy.empty((4, 4), f32)
    attrs = k.ElementBinaryAttrs(op_type="ADD")
    st = k.element_binary.init_kernel(handle, attrs, S.of(x), S.of(y), S.of(o))
    call = lambda: k.element_binary.forward_kernel(stream, handle, st, attrs, x, y, o)  # noqa: E731
    call()
    yield "element_binary add 4x4", call

    def replayed():  # a hundred calls in one replaying block: a hundredth of this row is one call's
        with core.replaying(stream):
            for _ in range(100):
                call()
    yield "  100 of them, one replaying", replayed
    rows = [(name, array, st.shapes[shape], True) for name, array, shape in
            (("lhs", x, "lhs_shape"), ("rhs", y, "rhs_shape"), ("output", o, "output_shape"))]
    yield "  core.check_call, 3 arrays", lambda: core.check_call("element_binary", stream, handle, st, attrs, rows)
    # The kernel and arguments the state's launch was packed from (element_binary's _forward_launch, same shapes).
    eb_gpu = k.element_binary.gpu
    kernel = eb_gpu._function("binary_same", np.dtype(f32), "int")
    grid = gpu.grid_for(x.size, per_thread=eb_gpu.VECTOR_BYTES // 4)
    tail = (np.int32(x.size), np.int32(attrs.op_type.value))
    args = (x, y, o) + tail + (np.int32(eb_gpu._vector_ok(x, y, o)),)
    yield "  CuPy Function call", lambda: kernel((grid,), (gpu.BLOCK,), args, 0, stream.cupy_stream)
    packed = st.gpu_forward[1][eb_gpu._vector_ok(x, y, o)]
    yield "  the state's PackedLaunch", lambda: packed(stream, x, y, o)
    # cuLaunchKernel through ctypes, its arguments packed once in one buffer (the arrays' slots
    # rewritten each call): what a launch from Python costs without CuPy's packing.
    cuda = ctypes.CDLL("libcuda.so.1")
    launch, u = cuda.cuLaunchKernel, ctypes.c_uint
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    words = np.zeros(len(args), np.uint64)  # one 8-byte slot an argument (each is at most 8 bytes)
    for i, value in enumerate(args):
        raw = np.array([value.data.ptr], np.uint64) if isinstance(value, cupy.ndarray) else np.array(value).reshape(1)
        words[i:i + 1].view(np.uint8)[:raw.nbytes] = raw.view(np.uint8)
    pointers = (ctypes.c_void_p * len(args))(*[words.ctypes.data + 8 * i for i in range(len(args))])
    function_ptr, stream_ptr = kernel.ptr, stream.ptr

    def ctypes_launch():
        words[0], words[1], words[2] = x.data.ptr, y.data.ptr, o.data.ptr
        status = launch(function_ptr, grid, 1, 1, gpu.BLOCK, 1, 1, 0, stream_ptr, pointers, None)
        if status:
            raise RuntimeError(f"cuLaunchKernel: {status}")
    o.fill(np.nan)
    ctypes_launch()
    stream.synchronize()
    assert bool(cupy.array_equal(o, x + y)), "the ctypes launch computed something else"
    yield "  cuLaunchKernel by ctypes", ctypes_launch
    # The same prepacked buffer through CuPy's own Cython binding of cuLaunchKernel: no ctypes argument
    # conversion, the eleven arguments plain integers.
    from cupy_backends.cuda.api import driver as cupy_driver

    pointers_ptr = ctypes.addressof(pointers)

    def driver_launch():
        words[0], words[1], words[2] = x.data.ptr, y.data.ptr, o.data.ptr
        cupy_driver.launchKernel(function_ptr, grid, 1, 1, gpu.BLOCK, 1, 1, 0, stream_ptr, pointers_ptr, 0)
    o.fill(np.nan)
    driver_launch()
    stream.synchronize()
    assert bool(cupy.array_equal(o, x + y)), "the driver-binding launch computed something else"
    yield "  cuLaunchKernel by CuPy's binding", driver_launch
    yield "  slot writes alone", lambda: words.__setitem__(slice(0, 3), (x.data.ptr, y.data.ptr, o.data.ptr))
    import torch

    a, b, c = (torch.ones(4, 4, device="cuda") for _ in range(3))
    yield "torch.add 4x4", lambda: torch.add(a, b)
    yield "torch.add 4x4 out=", lambda: torch.add(a, b, out=c)


def cublas_math_modes():
    """cuBLAS's host time of one SGEMM (the 1x1 head conv's) in each math mode the handle could take,
    and whether the modes give the same bits there. Each row's mode is set before it is timed (the rows
    are timed one after the other); the handle is left in pedantic math, as the library keeps it."""
    import ctypes

    from kernels.runtime import cublas

    a, b = rnd(64, 6400), rnd(64, 64)
    lib, blas = cublas.library(), handle.cublas()
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    outputs = []
    for name, mode in (("pedantic", cublas.CUBLAS_PEDANTIC_MATH), ("default", 0),
                       ("default, no reduced-precision reduction", 16)):
        out = cupy.empty((64, 6400), f32)

        def gemm(out=out):
            status = lib.cublasSgemmStridedBatched(blas.ptr, 0, 0, 6400, 64, 64, ctypes.byref(alpha), a.data.ptr,
                                                   6400, 0, b.data.ptr, 64, 0, ctypes.byref(beta), out.data.ptr,
                                                   6400, 0, 1)
            cublas.check(status, "cublasSgemmStridedBatched")
        blas.bind(stream.ptr)
        cublas.check(lib.cublasSetMathMode(blas.ptr, mode), "cublasSetMathMode")
        gemm()
        outputs.append(out)
        yield f"sgemm 64x6400x64 {name}", gemm
    cublas.check(lib.cublasSetMathMode(blas.ptr, cublas.CUBLAS_PEDANTIC_MATH), "cublasSetMathMode")
    blas.math_mode = cublas.CUBLAS_PEDANTIC_MATH
    stream.synchronize()
    print("math modes give the same bits:", all(bool(cupy.array_equal(outputs[0], o)) for o in outputs))


print(f"{'call':<32}{'host us/call':>14}{'with GPU us/call':>18}{'GPU idle us/call':>18}")
for name, function in launch_parts():
    host, total = per_call(function, 3000 if "replaying" not in name else 30)
    print(f"{name:<32}{host:>14.1f}{total:>18.1f}{idle(function, 1000 if 'replaying' not in name else 30):>18.1f}")
for name, function in cublas_math_modes():
    host, total = per_call(function)
    print(f"{name:<32}{host:>14.1f}{total:>18.1f}")
for name, function in cudnn_calls():
    host, total = per_call(function)
    print(f"{name:<32}{host:>14.1f}{total:>18.1f}")
profiles = []
print(f"{'call':<32}{'host us/call':>14}{'with GPU us/call':>18}{'synced us/call':>16}{'GPU idle us/call':>18}")
for name, function in setups():
    host, total = per_call(function)
    print(f"{name:<32}{host:>14.1f}{total:>18.1f}{synced(function):>16.1f}{idle(function):>18.1f}")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(200):
        function()
    profile.disable()
    stream.synchronize()
    profiles.append((name, profile))
    profiles.append((name + ", each call with the GPU idle", idle_profile(function)))
for name, profile in profiles:
    print(f"\n=== {name}")
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)
