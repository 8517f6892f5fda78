"""The HDF5 golden store: writing it from the PyTorch programs, reading it back,
and the digest that tells a stale file from a fresh one.

Layout::

    /                      attrs: schema_version, torch_version, cases_digest
    /<op>/<case>/          attrs: attrs (JSON), dtype, tolerance (JSON), description
    /<op>/<case>/inputs/<name>
    /<op>/<case>/expected/<name>

HDF5 has no bfloat16: a bfloat16 tensor is stored as its 16-bit patterns (uint16) with
the dataset attribute dtype = "bfloat16", and read back as ml_dtypes' bfloat16.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import os
from typing import Any, Iterable

import numpy as np

from kernels.core import BFLOAT16

from .case import Case, Golden
from .cases import CASE_MODULES, all_cases

SCHEMA_VERSION = 2  # 2: bfloat16 datasets (uint16 bits + a dtype attribute)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The one committed copy, at the root of a checkout; the generator writes it.
DEFAULT_PATH = os.path.join(ROOT, "goldens.h5")
# Where an installed package (pip install ., a wheel) has it: setup.py copies DEFAULT_PATH there
# at build time, so there is no second copy to keep in step.
PACKAGE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "goldens.h5")


def golden_candidates() -> list[str]:
    """Where the golden file is looked for, in order: a checkout's root, then the installed package."""
    return [DEFAULT_PATH, PACKAGE_PATH]


def find_goldens() -> str | None:
    """The golden file of this checkout or installed package, or None where there is none."""
    return next((path for path in golden_candidates() if os.path.isfile(path)), None)


def program_text(module: Any) -> str:
    """What a case module's code says, without its comments and docstrings: a canonical dump of its
    syntax tree, less its harness `run` (which calls the kernels and never feeds a golden)."""
    tree = ast.parse(inspect.getsource(module))
    tree.body = [node for node in tree.body if _defined_name(node) != "run"]
    return _canonical(tree)


def _defined_name(node: ast.AST) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def _canonical(node: Any) -> str:
    # Not ast.dump: its text changes between Python versions (3.13 leaves out empty fields, 3.12
    # added type_params), and the digest must not depend on the Python that computes it. Positions
    # are left out, and so are string statements (docstrings), which do nothing.
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                value = [item for item in value if not _is_string_statement(item)]
            if value is None or value == []:
                continue
            fields.append(f"{name}={_canonical(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(_canonical(item) for item in node) + "]"
    return repr(node)


def _is_string_statement(node: Any) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def cases_digest(modules: Iterable[Any] | None = None) -> str:
    """SHA-256 over what makes the goldens: each case module's code (see program_text: comments,
    docstrings and the harness `run` left out) and each case's content."""
    digest = hashlib.sha256()
    for op, module in sorted((modules or CASE_MODULES).items()):
        digest.update(op.encode())
        digest.update(program_text(module).encode())
        for case in module.TABLE:
            digest.update(f"{case.name}|{case.attrs_json()}|{case.dtype.name}|{case.tolerance_json()}".encode())
            for name in sorted(case.inputs):
                array = case.inputs[name]
                digest.update(f"{name}|{array.dtype.str}|{array.shape}".encode())
                digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------- generation (needs torch)


def run_program(module: Any, case: Case) -> dict[str, np.ndarray]:
    """Run the case's PyTorch program in float64 on the CPU and round its results to the case's dtype."""
    import torch

    tensors = {name: torch.from_numpy(array.astype(np.float64)) for name, array in case.inputs.items()}
    expected = module.torch_program(case, tensors)
    out = {}
    for name, tensor in expected.items():
        value = tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
        target = case.extra.get("expected_dtypes", {}).get(name, case.dtype)
        if np.dtype(target).kind in "iub":
            value = np.rint(value) if np.dtype(target).kind != "b" else value != 0
        out[name] = np.ascontiguousarray(value.astype(target))
    return out


def _dataset(group: Any, name: str, array: np.ndarray) -> None:
    # No timestamps, no compression, fixed layout: regeneration gives the same bytes.
    if array.dtype == BFLOAT16:
        group.create_dataset(name, data=array.view(np.uint16), track_times=False)
        group[name].attrs["dtype"] = "bfloat16"
    else:
        group.create_dataset(name, data=array, track_times=False)


def _read(dataset: Any) -> np.ndarray:
    """A stored tensor as written: bfloat16 datasets back from their bit patterns."""
    array = dataset[()]
    return array.view(BFLOAT16) if dataset.attrs.get("dtype") == "bfloat16" else array


# ATen's float64 transcendentals (tanh, erf, pow, exp) come from SIMD code chosen by the CPU it
# runs on (AVX2 and AVX-512 builds of Sleef round differently in the last place), so goldens made
# on two machines differed. The generator pins the scalar kernels, whose results are libm's alone.
CPU_CAPABILITY = "default"


def pin_cpu_capability() -> None:
    """Ask ATen for its scalar CPU kernels; must run before torch is imported."""
    os.environ["ATEN_CPU_CAPABILITY"] = CPU_CAPABILITY


def write_goldens(path: str = DEFAULT_PATH, ops: Iterable[str] | None = None) -> int:
    """Write every case's inputs and expected tensors to `path`; return the number of cases.
    Needs torch imported after pin_cpu_capability() (generate_goldens.py does it)."""
    import h5py
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    if capability != CPU_CAPABILITY.upper():
        raise RuntimeError(f"torch runs its {capability} CPU kernels; goldens need ATEN_CPU_CAPABILITY={CPU_CAPABILITY} "
                           "set before torch is imported (run generate_goldens.py)")
    torch.use_deterministic_algorithms(True)
    chosen = sorted(ops) if ops is not None else sorted(CASE_MODULES)
    temporary = f"{path}.{os.getpid()}.tmp"  # concurrent generators never share a file
    count = 0
    with h5py.File(temporary, "w", track_order=True, libver="earliest") as store:
        store.attrs["schema_version"] = SCHEMA_VERSION
        store.attrs["torch_version"] = torch.__version__.split("+")[0]
        store.attrs["cases_digest"] = cases_digest()
        for op in chosen:
            module = CASE_MODULES[op]
            op_group = store.create_group(op, track_order=True)
            op_group.attrs["cases_digest"] = cases_digest({op: module})
            for case in module.TABLE:
                group = op_group.create_group(case.name, track_order=True)
                group.attrs["attrs"] = case.attrs_json()
                group.attrs["dtype"] = case.dtype.name
                group.attrs["tolerance"] = case.tolerance_json()
                group.attrs["description"] = case.description
                inputs = group.create_group("inputs", track_order=True)
                for name, array in case.inputs.items():
                    _dataset(inputs, name, array)
                expected_group = group.create_group("expected", track_order=True)
                for name, array in run_program(module, case).items():
                    _dataset(expected_group, name, array)
                count += 1
    os.replace(temporary, path)
    return count


# --------------------------------------------------------------------------- reading


class GoldenStore:
    """Read access to goldens.h5, loaded once (by default the one find_goldens finds)."""

    def __init__(self, path: str | None = None):
        import h5py

        if path is None:
            path = find_goldens() or DEFAULT_PATH
        self.path = path
        self.goldens: dict[str, Golden] = {}
        self.attrs: dict[str, Any] = {}
        self.op_digests: dict[str, str] = {}
        if not os.path.exists(path):
            return
        with h5py.File(path, "r") as store:
            self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in store.attrs.items()}
            for op in store:
                self.op_digests[op] = store[op].attrs.get("cases_digest")
                for name in store[op]:
                    group = store[op][name]
                    self.goldens[f"{op}/{name}"] = Golden(
                        inputs={k: _read(group["inputs"][k]) for k in group["inputs"]},
                        expected={k: _read(group["expected"][k]) for k in group["expected"]},
                    )

    def staleness(self, op: str | None = None) -> str | None:
        """Why the file does not match the declarations, of every op or of one (None when it does)."""
        hint = "regenerate it with `python generate_goldens.py`"
        if not self.attrs:
            return f"{self.path} is missing or empty: {hint}"
        if self.attrs.get("schema_version") != SCHEMA_VERSION:
            return f"{self.path} has schema {self.attrs.get('schema_version')}, expected {SCHEMA_VERSION}: {hint}"
        if op is not None:
            if self.op_digests.get(op) != cases_digest({op: CASE_MODULES[op]}):
                return f"{self.path} is older than the case declarations of {op} (its cases_digest differs): {hint}"
        elif self.attrs.get("cases_digest") != cases_digest():
            return f"{self.path} is older than the case declarations (cases_digest differs): {hint}"
        missing = [c.key for c in all_cases() if c.key not in self.goldens and op in (None, c.op)]
        if missing:
            return f"{self.path} lacks {len(missing)} declared cases ({', '.join(missing[:5])}): {hint}"
        return None

    def get(self, case: Case) -> Golden:
        golden = self.goldens.get(case.key)
        if golden is None:
            raise KeyError(f"{case.key} is declared but not in {self.path}: regenerate it with `python generate_goldens.py`")
        return golden
