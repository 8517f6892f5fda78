"""Every CUDA source compiles with NVRTC for Hopper (compute_90 PTX and sm_90
machine code), every template instantiation included. Needs CuPy and NVRTC, not a device; skipped without them."""

import pytest

import kernels  # noqa: F401  (imports every op, which registers its CUDA module)
import kernels.models.detections  # noqa: F401  (the model's detection stage: detections.cu)
from kernels.runtime import gpu


def _nvrtc_reason():
    if gpu.cupy is None:
        return "CuPy is not installed"
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as error:
        return f"NVRTC is not available ({str(error).splitlines()[0]})"
    return None


@pytest.mark.parametrize("module", gpu.MODULES, ids=[m.path.rsplit("/", 1)[-1] for m in gpu.MODULES])
def test_compiles(module):
    reason = _nvrtc_reason()
    if reason:
        pytest.skip(reason)
    ptx = module.compile_ptx("compute_90")
    assert ptx.count(".entry") >= len(module.name_expressions)
    cubin = module.compile_cubin("sm_90")  # ptxas: shared memory and register limits of the H200
    assert cubin[:4] == b"\x7fELF"


_HALF_PROBE = r'''
#include "half.cuh"
template <class T>
__global__ void round_trip(const unsigned short* bits, float* wide, const float* values, unsigned short* rounded, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        T stored;
        stored.bits = bits[i];
        wide[i] = widen(stored);
        rounded[i] = narrow<T>(values[i]).bits;
    }
}
'''
_HALF_NAMES = ("round_trip<half_t>", "round_trip<bfloat16_t>")


def _half_probe_options():
    return ("--std=c++17", f"-I{gpu._HERE}")


def test_half_header_compiles():
    reason = _nvrtc_reason()
    if reason:
        pytest.skip(reason)
    from cupy.cuda import compiler

    program = compiler._NVRTCProgram(_HALF_PROBE, "half_probe.cu", (), (), name_expressions=_HALF_NAMES, method="cubin")
    cubin, _ = program.compile(_half_probe_options() + ("-arch=sm_90",))
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.gpu
def test_half_conversions_match_numpy_and_ml_dtypes_on_every_bit_pattern():
    """widen is exact for all 65536 patterns of each half type (NaNs stay NaN), and narrow rounds
    float32 values to nearest even as NumPy (float16) and ml_dtypes (bfloat16) do: on a grid of
    values between, exactly halfway between and beyond representable ones, overflow, subnormals."""
    import numpy as np

    from kernels.runtime.core import BFLOAT16

    reason = gpu.gpu_unavailable_reason()
    if reason:
        pytest.skip(reason)
    cupy = gpu.cupy
    module = cupy.RawModule(code=_HALF_PROBE, options=_half_probe_options(), name_expressions=_HALF_NAMES)
    bits = np.arange(65536, dtype=np.uint16)
    rng = np.random.default_rng(0)
    for name, dtype in zip(_HALF_NAMES, (np.dtype(np.float16), BFLOAT16)):
        stored = bits.view(dtype).astype(np.float32)
        finite = stored[np.isfinite(stored)].astype(np.float64)
        finite.sort()
        middles = (finite[:-1] + finite[1:]) / 2  # exact ties: round to even
        values = np.concatenate([stored, middles, middles * (1 + 2.0 ** -20), rng.standard_normal(65536) * 1e4,
                                 np.array([7e4, -7e4, 3.4e38, 1e-8, -1e-45, np.inf, -np.inf, np.nan])])
        values = values.astype(np.float32)
        count = len(values)  # > 65536: every bit pattern is widened, the patterns repeating
        in_bits = np.resize(bits, count)
        wide, rounded = cupy.empty(count, np.float32), cupy.empty(count, np.uint16)
        module.get_function(name)(((count + 255) // 256,), (256,),
                                  (cupy.asarray(in_bits), wide, cupy.asarray(values), rounded, np.int32(count)))
        expected_wide = in_bits.view(dtype).astype(np.float32)
        np.testing.assert_array_equal(cupy.asnumpy(wide), expected_wide)
        expected_rounded = values.astype(dtype)
        got = cupy.asnumpy(rounded).view(dtype)
        nan = np.isnan(expected_rounded.astype(np.float32))
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
        assert np.array_equal(got.view(np.uint16)[~nan], expected_rounded.view(np.uint16)[~nan]), name


def test_module_cache_key_follows_source_headers_options_and_arch(tmp_path, monkeypatch):
    """The on-disk cache of compiled modules (gpu.cache_folder) is keyed by all a cubin depends on:
    a changed option, architecture, instantiation or shared header gives another key."""
    reason = _nvrtc_reason()
    if reason:
        pytest.skip(reason)
    module = gpu.MODULES[0]
    key = gpu._cache_key(module.path, module.options, module.name_expressions, "sm_90")
    assert key == gpu._cache_key(module.path, module.options, module.name_expressions, "sm_90")
    assert key != gpu._cache_key(module.path, module.options + ("-DX=1",), module.name_expressions, "sm_90")
    assert key != gpu._cache_key(module.path, module.options, module.name_expressions, "sm_100")
    assert key != gpu._cache_key(module.path, module.options, module.name_expressions[:-1], "sm_90")
    header = tmp_path / "extra.cuh"
    header.write_text("// a header")
    monkeypatch.setattr(gpu, "_HERE", str(tmp_path))  # the headers now read: extra.cuh alone
    assert key != gpu._cache_key(module.path, module.options, module.name_expressions, "sm_90")
    assert "-ftz=false" in module.options  # CuPy's RawModule would force -ftz=true


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELS_CACHE_DIR", str(tmp_path))
    assert gpu.cache_folder() == str(tmp_path)
    monkeypatch.delenv("KERNELS_CACHE_DIR")
    assert gpu.cache_folder().endswith(".cache/yolov10-kernels")
