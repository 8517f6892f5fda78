"""The GPU half of the shared machinery: streams, handles, the NVRTC module cache
and kernel launches. Imported lazily, so the CPU library never needs CuPy.

Every op's CUDA source is a `.cu` file next to its Python module, compiled by
NVRTC (with our options only: not through `cupy.RawModule`, which forces
-ftz=true) once per device, kept on disk for later processes (cache_folder),
templated on dtype through `name_expressions`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import glob
import hashlib
import json
import math
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np

from .core import BFLOAT16, CudaError, DeviceError, DTypeError, KernelError, ShapeError, thread_local

if TYPE_CHECKING:  # the ops' annotations name the handle; it lives above this module
    from .handle import GpuHandle  # noqa: F401

try:  # CuPy is the optional 'cuda' extra; its absence is reported when a GPU object is asked for.
    import cupy
    from cupy_backends.cuda.api.driver import launchKernel as _launch_kernel
except ImportError as error:  # pragma: no cover - depends on the machine
    cupy = _launch_kernel = None
    _IMPORT_ERROR: Exception | None = error
else:
    _IMPORT_ERROR = None

_HERE = os.path.dirname(os.path.abspath(__file__))

# Largest grid x dimension (y and z: MAX_GRID_YZ) and the block size used by the elementwise-style kernels.
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
# The shared memory a block may use without opting in to more (cudaFuncSetAttribute): 48 KiB on every
# CUDA device. The tiled kernels (pool_2d's MAX forward, conv_2d's depthwise forward) size their tiles to it.
SHARED_MEMORY_LIMIT = 48 * 1024
BLOCK = 256
MAX_RANK = 12  # dims one `struct Ints` (common.cuh) carries by value; reaches CUDA as KERNELS_MAX_RANK


# The most blocks grid_for gives a grid-stride kernel (the kernels stride past it).
GRID_BLOCKS = 65536


def sm_count(device: int) -> int:
    """The device's number of streaming multiprocessors (132 on an H200), asked once; a
    simulated_device's count inside one."""
    simulated = _SIMULATED.get()
    if simulated is not None:
        return simulated[0]
    return _device_sm_count(device)


@functools.lru_cache(maxsize=None)
def _device_sm_count(device: int) -> int:
    return int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])


@functools.lru_cache(maxsize=None)
def shared_memory_optin(device: int) -> int:
    """The shared memory one block of the device may use once its kernel opts in past
    SHARED_MEMORY_LIMIT (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB on an H200), asked once.
    launch() opts a kernel in where a launch's dynamic shared memory and the kernel's static shared memory
    together pass SHARED_MEMORY_LIMIT."""
    return int(cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                                    device))


# (sm_count, max_blocks) of the simulated device in this thread and context, or None (see simulated_device).
_SIMULATED: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("kernels_simulated_device",
                                                                                    default=None)


@contextlib.contextmanager
def simulated_device(sm_count: int = 1, max_blocks: int = 2) -> Iterator[None]:
    """Within the block (this thread and context only), plan GPU launches as for a small device:
    sm_count() answers `sm_count`, and every grid dimension that its kernel strides over (grid_for,
    capped) has at most `max_blocks` blocks. The same kernels run on the real device, with fewer
    blocks: their grid-stride loops go round, their unrolled bodies and multi-block paths run on
    small tensors. A correct kernel gives the same bits under any grid, so results never change.

    Plans are made when a state is initialised or first called and kept in it: a state made inside
    the block keeps the small device's plans after it, one made outside keeps the real device's.
    The conformance suite's "small" schedule runs each case inside one (conformance.harness)."""
    if int(sm_count) < 1 or int(max_blocks) < 1:
        raise ValueError(f"simulated_device: sm_count and max_blocks must be >= 1, found {sm_count}, {max_blocks}")
    token = _SIMULATED.set((int(sm_count), int(max_blocks)))
    try:
        yield
    finally:
        _SIMULATED.reset(token)


def simulated() -> tuple[int, int] | None:
    """(sm_count, max_blocks) of the simulated_device block around the caller, or None outside one:
    a part of the key of launch plans cached outside a state."""
    return _SIMULATED.get()


def capped(blocks: int, limit: int) -> int:
    """The blocks of one grid dimension that its kernel strides over: `blocks`, at least one, at most
    `limit` (the hardware's or the plan's cap) and, inside simulated_device, at most its max_blocks."""
    simulated = _SIMULATED.get()
    if simulated is not None:
        limit = min(limit, simulated[1])
    return max(1, min(blocks, limit))


def gpu_unavailable_reason() -> str | None:
    """Why GPU kernels cannot run here (no CuPy, no CUDA device), or None when they can."""
    if cupy is None:
        return f"CuPy is not installed ({_IMPORT_ERROR})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # CUDARuntimeError without a driver or device
        return f"no CUDA device ({str(error).splitlines()[0]})"
    if count == 0:
        return "no CUDA device"
    return None


def _require_cupy() -> None:
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise DeviceError(f"GPU kernels are unavailable: {reason}")


_ENTERED = thread_local(devices=None)  # per host thread: the devices current before each GpuStream entered


class GpuStream:
    """A CUDA stream of one device; every GPU kernel enqueues its work on one.

    As a context manager it makes its device and itself current (for CuPy) in the calling
    thread, restoring both on exit; blocks may nest. Every GPU kernel call runs inside its
    stream (core.gpu_kernel), so nothing a kernel does depends on what the caller has current.
    """

    def __init__(self, device: int = 0):
        _require_cupy()
        self.device = int(device)
        with cupy.cuda.Device(self.device):
            self.cupy_stream = cupy.cuda.Stream(non_blocking=True)

    @property
    def ptr(self) -> int:
        return self.cupy_stream.ptr

    def synchronize(self) -> None:
        self.cupy_stream.synchronize()

    def __enter__(self) -> "GpuStream":
        runtime = cupy.cuda.runtime
        previous = runtime.getDevice()
        if previous != self.device:
            runtime.setDevice(self.device)
        stack = _ENTERED.devices
        if stack is None:
            stack = _ENTERED.devices = []
        stack.append(previous)
        self.cupy_stream.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cupy_stream.__exit__(*exc)
        previous = _ENTERED.devices.pop()
        if previous != self.device:
            cupy.cuda.runtime.setDevice(previous)

    def __repr__(self) -> str:
        return f"GpuStream(device={self.device}, ptr={self.ptr:#x})"


# --------------------------------------------------------------------------- device memory of states and handles

_ALLOCATIONS_LOCK = threading.Lock()
_ALLOCATIONS = {"count": 0, "bytes": 0}


class _Allocation:
    """Device memory from cudaMalloc, outside CuPy's stream-ordered pool, freed with cudaFree when
    the last array over it goes. cudaFree waits for the device, so the memory is never handed to
    other work while some stream still reads or writes it; a pool block would be, to any work on
    the stream that was current when it was allocated."""

    __slots__ = ("ptr", "nbytes", "device")

    def __init__(self, nbytes: int, device: int):
        try:
            with cupy.cuda.Device(device):
                self.ptr = cupy.cuda.runtime.malloc(nbytes)
        except cupy.cuda.runtime.CUDARuntimeError as error:
            raise CudaError("CUDA", str(error).split(":")[0], f"cudaMalloc of {nbytes} bytes on GPU {device}") from error
        self.nbytes, self.device = nbytes, device
        with _ALLOCATIONS_LOCK:
            _ALLOCATIONS["count"] += 1
            _ALLOCATIONS["bytes"] += nbytes

    def __del__(self) -> None:
        ptr = getattr(self, "ptr", None)
        if ptr is None:
            return
        try:
            with cupy.cuda.Device(self.device):
                cupy.cuda.runtime.free(ptr)
        except Exception:  # interpreter shutdown: the driver frees the context's memory itself
            return
        with _ALLOCATIONS_LOCK:
            _ALLOCATIONS["count"] -= 1
            _ALLOCATIONS["bytes"] -= self.nbytes


def device_empty(dims: Sequence[int], dtype: Any, device: int) -> Any:
    """An uninitialised CuPy array on `device` for memory that a state or handle keeps across
    calls (statistics, pre-activations, partial sums, workspaces): see _Allocation for why it
    does not come from CuPy's pool. Made at init or on a state's first call, never after."""
    dtype = np.dtype(dtype)
    nbytes = max(math.prod(int(d) for d in dims) * dtype.itemsize, 1)
    allocation = _Allocation(nbytes, int(device))
    memory = cupy.cuda.UnownedMemory(allocation.ptr, nbytes, allocation, int(device))
    return cupy.ndarray(tuple(dims), dtype, cupy.cuda.MemoryPointer(memory, 0))


def live_allocations() -> dict[str, int]:
    """How many device_empty allocations are alive, and their bytes (for leak tests)."""
    with _ALLOCATIONS_LOCK:
        return dict(_ALLOCATIONS)


def gpu_stream(device: int = 0) -> GpuStream:
    """A new non-blocking CUDA stream on `device`."""
    return GpuStream(device)


# --------------------------------------------------------------------------- NVRTC modules

_CUDA_TYPES = {
    np.dtype(np.float16): "half_t",  # half.cuh's storage structs: computed in float
    BFLOAT16: "bfloat16_t",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.int8): "signed char",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int16): "short",
    np.dtype(np.uint16): "unsigned short",
    np.dtype(np.int32): "int",
    np.dtype(np.uint32): "unsigned int",
    np.dtype(np.int64): "long long",
    np.dtype(np.uint64): "unsigned long long",
}

# Data movement only needs the element's size: one unsigned type per size.
_BITS_TYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long", 16: "ulonglong2"}


BITS_TYPES = tuple(_BITS_TYPES.values())
FLOAT_TYPES = ("float", "double")
HALF_TYPES = ("half_t", "bfloat16_t")
INDEX_TYPES = ("int", "long long")


def cuda_type(dtype: Any) -> str:
    """The CUDA C++ type of a NumPy arithmetic dtype."""
    try:
        return _CUDA_TYPES[np.dtype(dtype)]
    except KeyError:
        raise DTypeError(f"no CUDA arithmetic type for dtype {np.dtype(dtype).name}") from None


def bits_type(dtype: Any) -> str:
    """An unsigned CUDA type as wide as the dtype: what copies of any dtype move."""
    return _BITS_TYPES[np.dtype(dtype).itemsize]


MODULES: list["CudaModule"] = []  # every op's CUDA source, for the compile check
# -D options of every module (see CudaModule.options); the activation module adds its codes.
SHARED_DEFINES: dict[str, int] = {"KERNELS_MAX_RANK": MAX_RANK}


class CudaModule:
    """One `.cu` source of an op and the template instantiations it is compiled with.

    `function(name)` returns the compiled kernel, compiling the whole module with
    NVRTC on first use on each device and caching it for the life of the process.
    """

    def __init__(self, filename: str, name_expressions: Sequence[str], options: Sequence[str] = (),
                 defines: Mapping[str, int] | None = None, directory: str | None = None):
        if directory is None:  # the folder of the op module that declares it, where its .cu sits beside it
            directory = os.path.dirname(os.path.abspath(sys._getframe(1).f_globals["__file__"]))
        self.path = os.path.join(directory, filename)
        self.name_expressions = tuple(name_expressions)
        # -ftz=false: subnormal floats kept (IEEE), as PyTorch's CUDA kernels keep them. CuPy's RawModule
        # appends -ftz=true to every compile (the last option wins), which flushed bfloat16 subnormals
        # (float32 subnormals once widened) to zero: the sources are compiled here instead.
        self._options = ("--std=c++17", "-ftz=false", f"-I{_HERE}") + tuple(options)
        self._defines = dict(defines or {})
        self._functions: dict[tuple[str, int], Any] = {}
        MODULES.append(self)

    @property
    def options(self) -> tuple[str, ...]:
        """NVRTC's options. Constants that Python and CUDA share are defined in Python, once, and
        reach the source as -D options: SHARED_DEFINES (for every module: KERNELS_MAX_RANK, the
        activation codes) and the module's own `defines` (block sizes, unroll factors, op codes)."""
        defines = {**SHARED_DEFINES, **self._defines}
        return self._options + tuple(f"-D{name}={int(value)}" for name, value in sorted(defines.items()))

    def compile_ptx(self, arch: str = "compute_90") -> str:
        """Compile every instantiation to PTX with NVRTC, without a device: a check for tests and editors."""
        return self._compile_offline("ptx", arch).decode()

    def compile_cubin(self, arch: str = "sm_90") -> bytes:
        """Compile every instantiation to machine code with NVRTC, without a device: this runs ptxas too,
        so it also catches what PTX does not (too much shared memory, too many registers)."""
        return self._compile_offline("cubin", arch)

    def _compile_offline(self, method: str, arch: str) -> bytes:
        compiled, _ = _nvrtc_compile(self.path, self.name_expressions, self.options, method, arch)
        return compiled

    def function(self, name_expression: str, device: int | None = None) -> Any:
        """The compiled kernel (a `cupy.cuda.function.Function`) of one instantiation on `device`
        (the current device by default), looked up once and cached: calls are on the hot path."""
        if device is None:
            device = cupy.cuda.runtime.getDevice()
        key = (name_expression, device)
        function = self._functions.get(key)
        if function is None:
            if name_expression not in self.name_expressions:
                raise KernelError(f"{os.path.basename(self.path)}: {name_expression} is not among its name_expressions")
            with cupy.cuda.Device(device):
                module, lowered = _compiled_module(self.path, self.name_expressions, self.options, device)
                function = module.get_function(lowered[name_expression])  # by its mangled name
            self._functions[key] = function
        return function


def _nvrtc_compile(path: str, name_expressions: tuple[str, ...], options: tuple[str, ...], method: str,
                  arch: str) -> tuple[bytes, dict[str, str]]:
    """NVRTC's PTX or cubin of a source and the lowered (mangled) name of each name expression."""
    from cupy.cuda import compiler

    with open(path) as source_file:
        program = compiler._NVRTCProgram(source_file.read(), path, (), (), name_expressions=name_expressions,
                                         method=method)
    try:
        compiled, mapping = program.compile(options + (f"-arch={arch}",))
    except compiler.CompileException as error:
        raise CudaError("NVRTC", "NVRTC_ERROR_COMPILATION", f"{os.path.basename(path)}: {error}") from error
    return (compiled if isinstance(compiled, bytes) else compiled.encode()), dict(mapping or {})


def cache_folder() -> str:
    """Where compiled modules are kept between processes: $KERNELS_CACHE_DIR, else ~/.cache/yolov10-kernels."""
    return os.environ.get("KERNELS_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "yolov10-kernels")


def _cache_key(path: str, options: tuple[str, ...], name_expressions: tuple[str, ...], arch: str) -> str:
    """A digest of everything a module's machine code depends on: its source and every shared header,
    the options, the instantiations, the architecture and the NVRTC version."""
    from cupy_backends.cuda.libs import nvrtc

    digest = hashlib.sha256()
    for source in [path] + sorted(glob.glob(os.path.join(_HERE, "*.cuh"))):
        with open(source, "rb") as file:
            digest.update(file.read())
    digest.update(repr((options, name_expressions, arch, nvrtc.getVersion())).encode())
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def _compiled_module(path: str, name_expressions: tuple[str, ...], options: tuple[str, ...],
                     device: int) -> tuple[Any, dict[str, str]]:
    """The module of a source for a device (a cupy.cuda.function.Module) and the mangled name of each
    name expression, compiled by NVRTC with our options only (see CudaModule) and kept on disk
    (cache_folder) for the next process."""
    arch = f"sm_{cupy.cuda.Device(device).compute_capability}"  # e.g. "90"
    key = _cache_key(path, options, name_expressions, arch)
    stem = os.path.join(cache_folder(), key)
    try:
        with open(stem + ".cubin", "rb") as file:
            cubin = file.read()
        with open(stem + ".json") as file:
            mapping = json.load(file)
    except (OSError, ValueError):
        cubin, mapping = _nvrtc_compile(path, name_expressions, options, "cubin", arch)
        try:
            os.makedirs(cache_folder(), exist_ok=True)
            for suffix, data in ((".json", json.dumps(mapping).encode()), (".cubin", cubin)):
                temporary = f"{stem}{suffix}.{os.getpid()}.tmp"
                with open(temporary, "wb") as file:
                    file.write(data)
                os.replace(temporary, stem + suffix)  # the .cubin last: readers find the pair whole
        except OSError:
            pass  # a read-only home: compile again next time
    module = cupy.cuda.function.Module()
    module.load(cubin)
    return module, mapping


# The most dynamic shared memory each kernel (by its CUfunction) is known to launch with: checked against
# SHARED_MEMORY_LIMIT with the kernel's static shared memory, and let past it where the two together pass it.
_LAUNCHABLE: dict[int, int] = {}


def _let_launch(kernel: Any, shared_mem: int) -> None:
    """Let `kernel` launch with `shared_mem` bytes of dynamic shared memory: where those and its own static
    shared memory pass the SHARED_MEMORY_LIMIT a block gets unasked, the kernel is opted in to that much
    (cuFuncSetAttribute). Once per kernel and larger size."""
    static = cupy.cuda.driver.funcGetAttribute(cupy.cuda.driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, kernel.ptr)
    if static + shared_mem > SHARED_MEMORY_LIMIT:
        cupy.cuda.driver.funcSetAttribute(kernel.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          int(shared_mem))
    _LAUNCHABLE[kernel.ptr] = int(shared_mem)


def _opt_in(kernel: Any, shared_mem: int) -> None:
    """_let_launch, where `kernel` has not been let use `shared_mem` bytes yet (launch and PackedLaunch
    alike); a failed driver call raises CudaError."""
    if shared_mem and _LAUNCHABLE.get(kernel.ptr, 0) < shared_mem:
        try:
            _let_launch(kernel, shared_mem)
        except cupy.cuda.driver.CUDADriverError as error:
            raise cuda_error(error) from error


def launch(stream: GpuStream, kernel: Any, grid: Sequence[int] | int, block: Sequence[int] | int, args: Sequence[Any],
           shared_mem: int = 0) -> None:
    """Enqueue `kernel` (from CudaModule.function) on `stream` with `shared_mem` bytes of dynamic shared
    memory; where that and the kernel's static shared memory pass SHARED_MEMORY_LIMIT, the kernel is first
    let use that much (_let_launch: the caller keeps within shared_memory_optin less the kernel's own). A
    failed launch raises CudaError."""
    grid = (grid,) if isinstance(grid, int) else tuple(grid)
    block = (block,) if isinstance(block, int) else tuple(block)
    _opt_in(kernel, shared_mem)
    try:
        kernel(grid, block, args, shared_mem, stream.cupy_stream)
    except cupy.cuda.driver.CUDADriverError as error:
        raise cuda_error(error) from error


def cuda_error(error: Exception) -> CudaError:
    """CudaError for a failed CUDA call CuPy reported (its message opens with the CUDA status name)."""
    return CudaError("CUDA", str(error).split(":")[0], str(error))


# A parameter slot of PackedLaunch for an array's device address, given at each call.
ARRAY = object()


class Addresses:
    """A parameter slot of PackedLaunch for `count` device addresses in one `struct Ints` (common.cuh),
    given at each call as a sequence of `count` ints: the pieces of concat's launch, the terms of
    gradient_reduction's. Passed by value, so no pointer table is copied to the device."""

    __slots__ = ("count",)

    def __init__(self, count: int):
        if not 1 <= count <= MAX_RANK:
            raise KernelError(f"Addresses: 1 to {MAX_RANK} addresses in one struct Ints, asked for {count}")
        self.count = count


class PackedLaunch:
    """One kernel's launch with its parameters packed once: `arguments` are the kernel's parameters in
    order, each ARRAY (a slot for an array whose address the call gives), an Addresses (a slot for a
    struct of addresses the call gives) or a NumPy scalar or struct (an int, float or `ints_arg`, whose
    bytes are packed now). A call, `launch(stream, *given)`, one value a slot in order (an array or None
    for a null pointer; a sequence of ints for an Addresses), writes the addresses into their slots and
    enqueues the kernel through CuPy's binding of cuLaunchKernel. CuPy's Function call packs every
    argument again at each launch (a struct for each array): 1.5 us more for element_binary's broadcast
    launch (docs/performance.md#host-time-of-one-gpu-call).
    Made where the launch is planned, once per state (the kernel let use `shared_mem` then, as launch
    does); a lock keeps two threads' calls of one launch from writing each other's addresses. A failed
    launch, or a failed opt-in, raises CudaError."""

    __slots__ = ("_kernel", "_function", "_dims", "_shared_mem", "_words", "_slots", "_counts", "_parameters",
                 "_parameters_ptr", "_lock")

    def __init__(self, kernel: Any, grid: Sequence[int] | int, block: Sequence[int] | int,
                 arguments: Sequence[Any], shared_mem: int = 0):
        grid = (grid,) if isinstance(grid, int) else tuple(grid)
        block = (block,) if isinstance(block, int) else tuple(block)
        self._dims = tuple(int(d) for d in (grid + (1, 1))[:3] + (block + (1, 1))[:3])
        _opt_in(kernel, shared_mem)
        self._kernel, self._function, self._shared_mem = kernel, kernel.ptr, int(shared_mem)
        images, offsets, slots, counts, size = [], [], [], [], 0
        for i, argument in enumerate(arguments):
            if argument is ARRAY:
                image = np.zeros(1, np.uint64).view(np.uint8)
            elif isinstance(argument, Addresses):
                image = np.zeros((), _INTS).reshape(1).view(np.uint8)
            elif isinstance(argument, (np.generic, np.ndarray)):
                image = np.ascontiguousarray(np.asarray(argument)).reshape(-1).view(np.uint8)
            else:
                raise KernelError(f"PackedLaunch argument {i}: ARRAY, Addresses or a NumPy scalar, "
                                  f"found {type(argument).__name__}")
            if argument is ARRAY or isinstance(argument, Addresses):
                slots.append(size // 8)
                counts.append(argument.count if isinstance(argument, Addresses) else 0)
            images.append(image)
            offsets.append(size)
            size += -(-image.nbytes // 16) * 16  # each parameter on a 16-byte boundary
        self._words = np.zeros(max(size, 16) // 8, np.uint64)
        raw = self._words.view(np.uint8)
        for image, offset in zip(images, offsets):
            raw[offset:offset + image.nbytes] = image
        self._slots = tuple(slots)
        # None where every slot is an array's: the call then writes one word a slot, nothing else to look at.
        self._counts = tuple(zip(slots, counts)) if any(counts) else None
        self._parameters = np.array([self._words.ctypes.data + offset for offset in offsets] or [0], np.uint64)
        self._parameters_ptr = self._parameters.ctypes.data
        self._lock = threading.Lock()

    def __call__(self, stream: GpuStream, *given: Any) -> None:
        if len(given) != len(self._slots):
            raise KernelError(f"PackedLaunch: {len(self._slots)} arrays or address lists, given {len(given)}")
        words = self._words
        gx, gy, gz, bx, by, bz = self._dims
        lock = self._lock
        lock.acquire()  # rather than `with`: 0.05-0.1 us less a launch (docs/performance.md#fewer-layers-a-call)
        try:
            if self._counts is None:
                for slot, array in zip(self._slots, given):
                    words[slot] = 0 if array is None else array.data.ptr
            else:
                for (slot, count), value in zip(self._counts, given):
                    if not count:
                        words[slot] = 0 if value is None else value.data.ptr
                    elif len(value) == count:
                        words[slot:slot + count] = value
                    else:
                        raise KernelError(f"PackedLaunch: {count} addresses in slot {slot}, given {len(value)}")
            try:
                _launch_kernel(self._function, gx, gy, gz, bx, by, bz, self._shared_mem, stream.cupy_stream.ptr,
                               self._parameters_ptr, 0)
            except cupy.cuda.driver.CUDADriverError as error:
                raise cuda_error(error) from error
        finally:
            lock.release()


def packed(kernel: Any, grid: Sequence[int] | int, block: Sequence[int] | int, arrays: int, scalars: Sequence[Any],
           shared_mem: int = 0) -> PackedLaunch:
    """The PackedLaunch of a kernel whose parameters are `arrays` arrays, then `scalars`."""
    return PackedLaunch(kernel, grid, block, (ARRAY,) * arrays + tuple(scalars), shared_mem)


def packed_by_flag(kernel: Any, grid: Sequence[int] | int, block: Sequence[int] | int, arrays: int,
                   scalars: Sequence[Any], shared_mem: int = 0) -> tuple[PackedLaunch, PackedLaunch]:
    """packed() twice, for a kernel whose last parameter is an int32 flag each call picks (the arrays'
    alignment, say): the launch with flag 0, then the one with flag 1, to index by the flag."""
    return tuple(packed(kernel, grid, block, arrays, tuple(scalars) + (np.int32(flag),), shared_mem)
                 for flag in (0, 1))  # type: ignore[return-value]


def grid_for(count: int, block: int = BLOCK, per_thread: int = 1) -> int:
    """Blocks for a grid-stride kernel covering `count` items: enough to fill the device, capped
    at GRID_BLOCKS (at the simulated device's max_blocks inside simulated_device)."""
    return capped(-(-count // (block * per_thread)), GRID_BLOCKS)


def stream_wait(waiter: Any, waited: Any, device: int) -> None:
    """Make CuPy stream `waiter` wait, on the device and through an event, for the work enqueued so far on
    CuPy stream `waited` of GPU `device`; nothing waits on the host. The event is made and recorded with
    `device` current, whatever device the caller has current: cudaEventRecord needs the event and the
    stream on one device (cudaStreamWaitEvent does not)."""
    with cupy.cuda.Device(device):
        event = cupy.cuda.Event(disable_timing=True)
        event.record(waited)
    waiter.wait_event(event)


def copy_async(stream: GpuStream, destination: Any, source: Any) -> None:
    """Device-to-device copy of a whole contiguous array, enqueued on `stream`."""
    if source.nbytes:
        cupy.cuda.runtime.memcpyAsync(destination.data.ptr, source.data.ptr, source.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)


def index_type(*counts: int) -> str:
    """'int' where every count fits 32-bit index arithmetic, else 'long long'."""
    return "int" if max(counts, default=0) < 2**31 else "long long"


_INTS = np.dtype([("v", np.int64, (MAX_RANK,))])


def ints_arg(values: Sequence[int]) -> Any:
    """Up to MAX_RANK integers as one by-value kernel argument (`struct Ints` in common.cuh)."""
    if len(values) > MAX_RANK:
        raise ShapeError(f"more than {MAX_RANK} dims after collapsing ({len(values)}) are not supported on the GPU")
    packed = np.zeros((), dtype=_INTS)
    packed["v"][: len(values)] = values
    return packed[()]


def widest_unit(*values: int) -> int:
    """The widest copy unit (16, 8, 4, 2 or 1 bytes) that divides every value given:
    byte counts, byte offsets and device addresses. Data movement in 16-byte units
    reaches the copy bandwidth that 1- or 4-byte units do not."""
    unit = 16
    for value in values:
        while value % unit:
            unit //= 2
    return unit


def unit_type(unit: int) -> str:
    """The unsigned CUDA type of a copy unit of `unit` bytes (1, 2, 4, 8 or 16)."""
    return _BITS_TYPES[unit]
