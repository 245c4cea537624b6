"""Package layout: ``mmpos/`` is the library; ``pipelines/`` installs as ``mmpos.pipelines``.

Metadata lives in pyproject.toml; only the package-dir mapping needs code.
"""
from setuptools import find_packages, setup

library = find_packages(include=["mmpos", "mmpos.*"])
pipelines = ["mmpos.pipelines"] + [f"mmpos.pipelines.{p}" for p in find_packages("pipelines")]

setup(
    packages=library + pipelines,
    package_dir={"mmpos": "mmpos", "mmpos.pipelines": "pipelines"},
)
