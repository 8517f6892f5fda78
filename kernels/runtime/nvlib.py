"""The one loader of the NVIDIA libraries bound through ctypes (cuDNN, cuBLAS): each binding says
where its library may be (candidates, first found wins) and how to load one; the loader tries
them in order, once per process under a lock, binds and types the functions the binding declares,
and, where none can be used, raises one CudaError that lists every candidate and why it failed.
Nothing here needs CuPy or a device.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .core import CudaError


class Unusable(Exception):
    """A candidate that loaded but cannot serve (too old, say): the loader goes on to the next."""


def wheel_folders(subfolders: Sequence[str], soname: str) -> list[str]:
    """The folders `nvidia/<sub>` (for sub in subfolders) of the installed nvidia-* wheels that hold
    `soname`, found without importing anything of them (cuDNN's and cuBLAS's bindings look there)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return [os.path.join(root, sub) for root in roots for sub in subfolders
            if os.path.isfile(os.path.join(root, sub, soname))]


def bind_functions(target: Any, cdll: Any, functions: Mapping[str, tuple[Any, Sequence[Any]]], library: str,
                   path: str) -> None:
    """Set on `target` each ctypes function of `functions` (name -> (restype, argtypes)) from `cdll`,
    typed; CudaError(library, "SYMBOL_NOT_FOUND") names one the library lacks."""
    for name, (restype, argtypes) in functions.items():
        try:
            function = getattr(cdll, name)
        except AttributeError:
            raise CudaError(library, "SYMBOL_NOT_FOUND", f"{path} has no {name}") from None
        function.restype, function.argtypes = restype, list(argtypes)
        setattr(target, name, function)


class Loader:
    """The library of one binding, loaded on first call: `candidates()` lists paths (or bare sonames)
    in order; `load(candidate)` returns the loaded library or raises OSError or Unusable; `where`
    says in the error where the library was looked for."""

    def __init__(self, library: str, candidates: Callable[[], list[str]], load: Callable[[str], Any], where: str):
        self.library, self.candidates, self.load, self.where = library, candidates, load, where
        self._lock = threading.Lock()
        self.loaded: Any = None

    def __call__(self) -> Any:
        if self.loaded is None:
            with self._lock:  # one thread loads; the others find it loaded (a library object is truthy)
                self.loaded = self.loaded or self._first_usable()
        return self.loaded

    def _first_usable(self) -> Any:
        failures = []
        for candidate in self.candidates():
            if os.path.sep in candidate and not os.path.exists(candidate):
                failures.append(f"{candidate}: no such file")
                continue
            try:
                return self.load(candidate)
            except (OSError, Unusable) as error:
                failures.append(f"{candidate}: {error}")
        raise CudaError(self.library, "LIBRARY_NOT_FOUND", f"no usable {self.where} (tried: {'; '.join(failures)})")


def switch(name: str, choices: Mapping[str, str], environ: Any = None) -> str:
    """The choice the environment variable `name` (stripped) makes among `choices` (value -> choice; ""
    stands for unset or empty). Any other value: ValueError naming every accepted one, so that a typo
    does not silently pick one."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    if value not in choices:
        accepted = [("unset or empty" if key == "" else key) + f" ({choice})" for key, choice in choices.items()]
        raise ValueError(f"${name}={value!r}: expected {', '.join(accepted[:-1])} or {accepted[-1]}")
    return choices[value]


__all__ = ["Loader", "Unusable", "wheel_folders", "bind_functions", "switch"]
