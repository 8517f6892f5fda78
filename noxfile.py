"""The tests under each end of the declared dependency ranges: `nox` runs both sessions.

- `lowest`: every requirement of pyproject.toml (the runtime ones and the `dev` extra) pinned to
  the floor it declares, so a floor that is too low fails here rather than on a user's machine.
- `newest`: the newest releases the same ranges allow, under coverage.py, with the branch
  coverage report of the kernels' CPU code (below 100% it fails).
- `mutants` (only when named: `nox -s mutants`): mutation testing of the ops' CPU code against the
  conformance suite alone (mutmut, pinned).
- `checks_mutants` (only when named): mutation testing of the ops' argument checks against the
  bad-input tests and the CPU conformance cases.

Arguments after `--` go to pytest (`nox -s lowest -- tests/test_golden.py`). The floors are read
from pyproject.toml, so they are declared once; docs/architecture.md#tested-dependency-ranges
says which versions and interpreters are tested.
"""

import json
import pathlib
import shutil
import tomllib

import nox
from packaging.requirements import Requirement

nox.options.sessions = ["lowest", "newest"]
nox.options.error_on_missing_interpreters = True

# The one interpreter the sessions are tested on (PyTorch's pinned wheel exists for it on this project's machines).
PYTHON = "3.11"
PYPROJECT = pathlib.Path(__file__).parent / "pyproject.toml"


def requirements() -> list[Requirement]:
    """The runtime requirements and the `dev` extra's, as pyproject.toml declares them."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    return [Requirement(text) for text in project["dependencies"] + project["optional-dependencies"]["dev"]]


def floor_pins(declared: list[Requirement]) -> list[str]:
    """`name==floor` for each requirement: its `>=` (or `==`) bound. A requirement without one has no
    lowest version to test, so it is refused rather than left to float."""
    pins = []
    for requirement in declared:
        floors = [spec.version for spec in requirement.specifier if spec.operator in (">=", "==")]
        if len(floors) != 1:
            raise ValueError(f"pyproject.toml: {requirement}: expected one '>=' or '==' bound to pin, found {len(floors)}")
        pins.append(f"{requirement.name}=={floors[0]}")
    return pins


def pytest_args(session: nox.Session) -> list[str]:
    # Benchmarks run once each as smoke tests, untimed, as in every other run of the suite here.
    return ["-q", "--benchmark-disable", *session.posargs]


@nox.session(python=PYTHON)
def lowest(session: nox.Session) -> None:
    """The suite with every declared requirement at its floor."""
    session.install("-e", ".[dev]", *floor_pins(requirements()))
    session.run("python", "-m", "pip", "list", "--format=freeze", silent=False)
    session.run("python", "-m", "pytest", *pytest_args(session))


@nox.session(python=PYTHON)
def mutants(session: nox.Session) -> None:
    """Not run by `nox` alone (nor by CI: about 90 minutes on 2 cores): mutation testing of every op's CPU
    code against the conformance suite alone, with mutmut as pyproject.toml's [tool.mutmut] sets it up.
    It lists the mutants no golden notices; `mutmut show NAME` in the session prints one."""
    session.install("-e", ".[dev]", "mutmut==3.8.1")
    session.run("mutmut", "run", *session.posargs)
    session.run("mutmut", "results")


def _with_mutmut_settings(pyproject: str, settings: dict) -> str:
    """pyproject.toml's text with its [tool.mutmut] table replaced by `settings` over the same table's."""
    current = tomllib.loads(pyproject)["tool"]["mutmut"]
    kept, skipping = [], False
    for line in pyproject.splitlines():
        if line.startswith("["):
            skipping = line.strip() == "[tool.mutmut]"
        if not skipping:
            kept.append(line)
    table = ["[tool.mutmut]"] + [f"{key} = {json.dumps(value)}" for key, value in {**current, **settings}.items()]
    return "\n".join(kept + [""] + table) + "\n"


@nox.session(python=PYTHON)
def checks_mutants(session: nox.Session) -> None:
    """Not run by `nox` alone (nor by CI: about 30 minutes on 2 cores): mutation testing of every op's argument
    checks against the bad-input tests, the registry's and the CPU conformance cases, in a copy of the tree
    whose [tool.mutmut] takes pyproject.toml's [tool.kernels.checks-mutants] keys. Lists the survivors."""
    root = pathlib.Path(__file__).parent
    copy = pathlib.Path(session.create_tmp()) / "checks-mutants"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".git", ".nox", ".venv", "mutants", "__pycache__",
                                                             "*.egg-info"))
    settings = tomllib.loads(PYPROJECT.read_text())["tool"]["kernels"]["checks-mutants"]
    selection = settings["pytest_add_cli_args_test_selection"]
    settings["pytest_add_cli_args_test_selection"] = [  # globs expanded here: pytest takes paths
        path for entry in selection
        for path in (sorted(str(p.relative_to(root)) for p in root.glob(entry)) if "*" in entry else [entry])]
    (copy / "pyproject.toml").write_text(_with_mutmut_settings(PYPROJECT.read_text(), settings))
    session.install("-e", f"{copy}[dev]", "mutmut==3.8.1")
    session.chdir(copy)
    session.run("mutmut", "run", *session.posargs)
    session.run("mutmut", "results")


@nox.session(python=PYTHON)
def newest(session: nox.Session) -> None:
    """The suite with the newest releases the declared ranges allow, and the coverage report."""
    session.install("--upgrade", "-e", ".[dev]")
    session.run("python", "-m", "pip", "list", "--format=freeze", silent=False)
    session.run("coverage", "erase")
    session.run("coverage", "run", "-m", "pytest", *pytest_args(session))
    session.run("coverage", "report")
