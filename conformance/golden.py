"""The HDF5 golden store: writing it from the PyTorch programs, reading it back,
and the digest that tells a stale file from a fresh one.

Layout::

    /                      attrs: schema_version, torch_version, cases_digest
    /<op>/<case>/          attrs: attrs (JSON), dtype, tolerance (JSON), description
    /<op>/<case>/inputs/<name>
    /<op>/<case>/expected/<name>

HDF5 has no bfloat16: a bfloat16 tensor is stored as its 16-bit patterns (uint16) with
the dataset attribute dtype = "bfloat16", and read back as ml_dtypes' bfloat16.

Every dataset carries a sha256 attribute (see checksum), checked when the file is read:
a damaged file raises GoldenFileError instead of handing a wrong expected value to a case.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import os
from typing import Any, Iterable

import numpy as np

from kernels.runtime.core import BFLOAT16, is_floating

from .case import Case, Golden
from .cases import CASE_MODULES, all_cases

SCHEMA_VERSION = 3  # 2: bfloat16 datasets (uint16 bits + a dtype attribute); 3: a sha256 attribute per dataset
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

    from . import exact  # mpmath: generating goldens needs it (the goldens extra), reading them does not

    tensors = {name: torch.from_numpy(array.astype(np.float64)) for name, array in case.inputs.items()}
    expected = module.torch_program(case, tensors)
    values = {name: tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
              for name, tensor in expected.items()}
    targets = {name: case.extra.get("expected_dtypes", {}).get(name, case.dtype) for name in values}
    references = exact_references(module, case) if needs_reference(case, values, targets) else {}
    out = {}
    for name, value in values.items():
        target = targets[name]
        if name in references:
            value = exact.settle(f"{case.key} {name}", value, references[name], target)
        elif np.dtype(target).kind in "iub":
            value = np.rint(value) if np.dtype(target).kind != "b" else value != 0
        out[name] = canonical_nan(np.ascontiguousarray(value.astype(target)))
    return out


# Cases up to this many input elements always get their exact reference (it costs little there); a
# larger case (a medium case, made to reach a size-gated path) only where PyTorch's float64 result
# leaves some value's rounding in doubt (exact.unambiguous): a float64 case always does.
REFERENCE_ALWAYS_ELEMENTS = 1 << 14


def needs_reference(case: Case, values: dict[str, np.ndarray], targets: dict[str, Any]) -> bool:
    """Whether the case's exact reference must be evaluated: its expected values are float64, or it is
    small, or one of PyTorch's float64 values lies so near a half-way point of its dtype (or so near
    zero, where a cancellation leaves only rounding noise) that another host's result could round it
    the other way."""
    from . import exact

    if any(np.dtype(t) == np.float64 for t in targets.values()):
        return True
    if sum(int(np.asarray(a).size) for a in case.inputs.values()) <= REFERENCE_ALWAYS_ELEMENTS:
        return True
    return not all(exact.unambiguous(values[name], target) for name, target in targets.items() if is_floating(target))


def exact_references(module: Any, case: Case) -> dict[str, np.ndarray]:
    """The case module's exact_program, where it has one: the expected tensors whose float64 value
    is not exact, evaluated at high precision (conformance.exact); {} where every result is exact."""
    from . import exact

    program = getattr(module, "exact_program", None)
    if program is None:
        return {}
    with exact.precision():
        values = {name: exact.hp(array) for name, array in case.inputs.items()
                  if is_floating(array.dtype) or array.dtype.kind in "iu"}
        return program(case, values) or {}


def canonical_nan(array: np.ndarray) -> np.ndarray:
    """Every NaN as the dtype's one quiet NaN of positive sign: the sign and payload a NaN comes out
    of a max or a sum with are the host's, and the comparison treats every NaN alike."""
    if not is_floating(array.dtype):
        return array
    nan = np.isnan(array.astype(np.float32)) if array.dtype == BFLOAT16 else np.isnan(array)
    if np.any(nan):
        array = array.copy()
        array[nan] = np.nan
    return array


# Datasets from this many bytes (the medium cases' tensors, which reach the size-gated CPU paths) are
# stored compressed: their short periodic values shrink to a few percent.
COMPRESS_BYTES = 1 << 16
COMPRESSION = {"compression": "gzip", "compression_opts": 6, "shuffle": True}


def _dataset(group: Any, name: str, array: np.ndarray) -> None:
    # No timestamps, a fixed layout, and where compressed a fixed filter and level in one chunk of the
    # whole: regeneration gives the same bytes.
    data = array.view(np.uint16) if array.dtype == BFLOAT16 else array
    options = {**COMPRESSION, "chunks": data.shape} if data.nbytes >= COMPRESS_BYTES else {}
    group.create_dataset(name, data=data, track_times=False, **options)
    if array.dtype == BFLOAT16:
        group[name].attrs["dtype"] = "bfloat16"
    seal(group[name])


class GoldenFileError(Exception):
    """A golden file that cannot be trusted: not HDF5, truncated, missing a group, or a dataset that does
    not match its checksum. `path` is the file, `datasets` the HDF5 names of the damaged datasets (may be
    empty). Damage is never a kernel's failure, so the CLI exits 2 on it and the tests fail naming it."""

    def __init__(self, path: str, what: str, datasets: Iterable[str] = ()):
        self.path = str(path)
        self.datasets = tuple(datasets)
        super().__init__(f"damaged golden file {self.path}: {what}; replace it with a good copy or regenerate "
                         "it with `python generate_goldens.py`")


def checksum(array: np.ndarray) -> str:
    """SHA-256 over a tensor's dtype name, shape and values (little-endian bytes, so the byte order a
    reader happens to get does not count): a dataset's `sha256` attribute."""
    if array.dtype == BFLOAT16:
        data = array.view(np.uint16).astype("<u2")  # a dtype of ml_dtypes has no byte-order variants
    else:
        data = array.astype(array.dtype.newbyteorder("<"))
    digest = hashlib.sha256(f"{array.dtype.name}|{tuple(array.shape)}|".encode())
    digest.update(np.ascontiguousarray(data).tobytes())
    return digest.hexdigest()


def _stored(dataset: Any) -> np.ndarray:
    """A dataset's tensor as written, bfloat16 back from its bit patterns, unverified."""
    array = np.asarray(dataset[()])
    return array.view(BFLOAT16) if dataset.attrs.get("dtype") == "bfloat16" else array


def stored_checksum(dataset: Any) -> str:
    """The checksum of what a dataset holds now (its dtype attribute included)."""
    return checksum(_stored(dataset))


def seal(dataset: Any) -> None:
    """Store a dataset's checksum: the generator does it for each dataset it writes, and a test that
    edits a golden on purpose (to show a real failure) does it after the edit."""
    dataset.attrs["sha256"] = stored_checksum(dataset)


def _damage(dataset: Any, array: np.ndarray) -> str | None:
    """What is wrong with a dataset whose tensor (_stored) is `array`, or None when its checksum matches."""
    sealed = dataset.attrs.get("sha256")
    if sealed is None:
        return "has no sha256 checksum"
    if sealed != checksum(array):
        return "does not match its sha256 checksum"
    return None


def _read(dataset: Any, verify: bool = True) -> np.ndarray:
    """A stored tensor as written, bfloat16 datasets back from their bit patterns; with `verify`, a
    dataset that does not match its checksum raises GoldenFileError."""
    array = _stored(dataset)
    damage = _damage(dataset, array) if verify else None
    if damage is not None:
        raise GoldenFileError(dataset.file.filename, f"dataset {dataset.name} {damage}", [dataset.name])
    return array


# ATen's float64 transcendentals and sums come from SIMD code chosen by the CPU it runs on, and
# even its scalar kernels call the host's libm; conformance.exact makes every inexact golden the
# correctly rounded value instead, so no capability changes the file (tests/test_golden_invariance.py
# regenerates under each). The generator still asks for the scalar kernels: the fewest paths.
CPU_CAPABILITY = "default"


def pin_cpu_capability() -> None:
    """Ask ATen for its scalar CPU kernels; must run before torch is imported."""
    os.environ["ATEN_CPU_CAPABILITY"] = CPU_CAPABILITY


def write_goldens(path: str = DEFAULT_PATH, ops: Iterable[str] | None = None, capability: str = CPU_CAPABILITY) -> int:
    """Write every case's inputs and expected tensors to `path`; return the number of cases.
    Needs torch imported after pin_cpu_capability() (generate_goldens.py does it). `capability`
    names the ATen CPU kernels torch must be running (the invariance test asks for others: the
    exact references make the file the same under every one)."""
    import h5py
    import torch

    running = torch.backends.cpu.get_cpu_capability()
    if running != capability.upper():
        raise RuntimeError(f"torch runs its {running} CPU kernels; goldens need ATEN_CPU_CAPABILITY={capability} "
                           "set before torch is imported (run generate_goldens.py)")
    torch.use_deterministic_algorithms(True)
    chosen = sorted(ops) if ops is not None else sorted(CASE_MODULES)
    temporary = f"{path}.{os.getpid()}.tmp"  # concurrent generators never share a file
    try:
        count = _write(h5py, torch, temporary, chosen)
    except BaseException:
        if os.path.exists(temporary):  # a program that failed leaves no partial file beside the goldens
            os.remove(temporary)
        raise
    os.replace(temporary, path)
    return count


def _write(h5py: Any, torch: Any, temporary: str, chosen: list[str]) -> int:
    """write_goldens' file, written to `temporary`: the number of cases."""
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
    return count


# --------------------------------------------------------------------------- reading


class GoldenStore:
    """Read access to goldens.h5, loaded once (by default the one find_goldens finds). A file that is
    there but damaged raises GoldenFileError; one that is missing or stale loads, and staleness says why."""

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
        try:
            store = h5py.File(path, "r")
        except OSError as error:  # not HDF5, truncated, empty: h5py says which
            raise GoldenFileError(path, f"not a readable HDF5 file ({error})") from None
        with store:
            self._load(store)

    def _load(self, store: Any) -> None:
        """Every case's tensors, each dataset checked against its checksum; every damaged one is named."""
        where = "/"
        damaged: list[tuple[str, str]] = []  # (dataset, what is wrong)
        try:
            self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in store.attrs.items()}
            # A file of an older schema has no checksums to check: staleness() says to regenerate it.
            verify = self.attrs.get("schema_version") == SCHEMA_VERSION
            for op in store:
                where = f"/{op}"
                self.op_digests[op] = store[op].attrs.get("cases_digest")
                for name in store[op]:
                    where = f"/{op}/{name}"
                    group = store[op][name]
                    tensors: dict[str, dict[str, np.ndarray]] = {"inputs": {}, "expected": {}}
                    for part, read in tensors.items():
                        if part not in group:
                            raise GoldenFileError(self.path, f"{group.name} has no group {part}")
                        for key in group[part]:
                            where = f"/{op}/{name}/{part}/{key}"
                            dataset = group[part][key]
                            read[key] = _stored(dataset)
                            damage = _damage(dataset, read[key]) if verify else None
                            if damage is not None:
                                damaged.append((dataset.name, damage))
                    self.goldens[f"{op}/{name}"] = Golden(**tensors)
        except (OSError, KeyError, RuntimeError, ValueError) as error:  # HDF5 metadata that does not parse
            raise GoldenFileError(self.path, f"{where} cannot be read ({error})") from None
        names = [name for name, _ in damaged]
        if len(damaged) == 1:
            raise GoldenFileError(self.path, f"dataset {names[0]} {damaged[0][1]}", names)
        if damaged:
            named = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            raise GoldenFileError(self.path, f"{len(names)} datasets do not match their sha256 checksums ({named})",
                                  names)

    def staleness(self, op: str | None = None) -> str | None:
        """Why the file does not match the declarations, of every op or of one (None when it does)."""
        hint = "regenerate it with `python generate_goldens.py`"
        if not self.attrs:
            return f"{self.path} is missing or empty: {hint}"
        if self.attrs.get("schema_version") != SCHEMA_VERSION:
            return f"{self.path} has schema {self.attrs.get('schema_version')}, expected {SCHEMA_VERSION}: {hint}"
        if op is not None:
            if op not in self.op_digests:
                return f"{self.path} has no group {op}: {hint}"
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
