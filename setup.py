"""The build as pyproject.toml declares it, plus one step: the repository's goldens.h5
(one committed copy, at the root, where generate_goldens.py writes it) is copied into
the built `conformance` package, so that an installed suite has its golden data
(conformance.golden.PACKAGE_PATH) and `python -m conformance` runs after `pip install .`."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithGoldens(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # an editable install reads the checkout's goldens.h5 in place
        self.copy_file("goldens.h5", os.path.join(self.build_lib, "conformance", "goldens.h5"))


setup(cmdclass={"build_py": BuildPyWithGoldens})
