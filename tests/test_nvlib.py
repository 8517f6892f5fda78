"""The one loader of the NVIDIA libraries (kernels.runtime.nvlib), which cuDNN's and cuBLAS's bindings
share, on the CPU: candidates in order, the first usable kept, one error naming every failure."""

import pytest

from kernels import CudaError


def test_the_nvidia_loader_tries_every_candidate_once_and_binds_what_loads(tmp_path):
    """kernels.runtime.nvlib, the loader cuDNN and cuBLAS share: the first usable candidate wins and is
    kept; a missing file, an OSError and an unusable library are each named in the one error."""
    import ctypes
    import ctypes.util

    from kernels.runtime import nvlib

    class Bound:
        def __init__(self, path):
            nvlib.bind_functions(self, ctypes.CDLL(path), {"strlen": (ctypes.c_size_t, [ctypes.c_char_p])}, "libc",
                                 path)

    def load(candidate):
        if candidate == "old":
            raise nvlib.Unusable("version 8")
        return Bound(candidate)

    libc = ctypes.util.find_library("c")
    tried = []
    loader = nvlib.Loader("libc", lambda: tried.append(1) or [str(tmp_path / "gone.so"), "old", libc], load, "libc")
    assert loader() is loader() and loader.loaded is not None and len(tried) == 1
    assert loader.loaded.strlen(b"kernels") == 7
    failing = nvlib.Loader("cuFake", lambda: [str(tmp_path / "gone.so"), "old", "libnothing-here.so.1"], load,
                           "libfake in the wheel")
    with pytest.raises(CudaError, match=r"LIBRARY_NOT_FOUND.*no usable libfake in the wheel \(tried: .*gone.so: no "
                                        r"such file; old: version 8; libnothing-here.so.1: .*\)"):
        failing()
    with pytest.raises(CudaError, match="SYMBOL_NOT_FOUND.*has no no_such_function"):
        nvlib.bind_functions(object(), ctypes.CDLL(libc), {"no_such_function": (None, [])}, "libc", libc)


def test_the_wheel_folders_are_none_where_the_nvidia_package_cannot_be_looked_up(monkeypatch):
    import importlib.util

    from kernels.runtime import nvlib

    def broken(name):
        raise ValueError(f"{name}.__spec__ is None")

    monkeypatch.setattr(importlib.util, "find_spec", broken)
    assert nvlib.wheel_folders(("cudnn/lib",), "libcudnn.so.9") == []
