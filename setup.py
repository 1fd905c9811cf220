"""Only what pyproject.toml cannot say: the packages are found (every worker.* package, so none is
left out of the wheel), plus sql/, which ships as worker.sql (see package-dir there)."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["worker", "worker.*"]), "worker.sql"])
