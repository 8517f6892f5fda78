"""Every CUDA source compiles with NVRTC for Hopper (compute_90 PTX and sm_90
machine code), every template instantiation included. Needs CuPy and NVRTC, not a device; skipped without them."""

import pytest

import kernels  # noqa: F401  (imports every op, which registers its CUDA module)
from kernels import gpu


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
