"""What a user installing the package meets: the console scripts resolve to the two command lines, the
`models` extra pins torch as the dev extra does, and `python -m conformance.models` without torch
(simulated: the import blocked) exits 2 naming the extra instead of a ModuleNotFoundError."""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys
import tomllib

PYPROJECT = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]


def test_console_scripts_are_the_two_command_lines():
    scripts = PYPROJECT["scripts"]
    targets = {}
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        targets[module] = getattr(importlib.import_module(module), function)
        assert callable(targets[module]), name
    assert set(targets) == {"conformance.__main__", "conformance.models.__main__"}


def test_models_extra_pins_the_dev_torch():
    extras = PYPROJECT["optional-dependencies"]
    torch_pins = {r for r in extras["dev"] if r.startswith("torch")}
    assert set(extras["models"]) == torch_pins == {"torch==2.13.0"}
    assert not any(r.startswith("torch") for r in PYPROJECT["dependencies"])


def _without_torch(*argv):
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['conformance.models', *sys.argv[1:]]; "
            "runpy.run_module('conformance.models', run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          cwd=pathlib.Path(__file__).parents[1])


def test_model_cli_without_torch_exits_2_naming_the_extra():
    result = _without_torch("yolov10n", "--device", "cpu")
    assert result.returncode == 2, result.stderr
    assert "needs torch, which is not installed: pip install 'yolov10-kernels[models]'" in result.stderr
    assert "Traceback" not in result.stderr
    help_text = _without_torch("--help")  # the help still prints, and says what is needed
    assert help_text.returncode == 0 and "pip install 'yolov10-kernels[models]'" in help_text.stdout
