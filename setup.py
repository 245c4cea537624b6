"""Package layout: ``mmpos/`` is the library; ``pipelines/`` installs as ``mmpos.pipelines``; the shipped data
(``configs/``, the world models under ``assets/``) installs as ``mmpos/configs`` and ``mmpos/assets``, where the
code finds them after a non-editable ``pip install .`` (a checkout reads them in place).

Metadata lives in pyproject.toml; only the package-dir mapping needs code.
"""

from setuptools import find_packages, setup

library = find_packages(include=["mmpos", "mmpos.*"])
pipelines = ["mmpos.pipelines"] + [f"mmpos.pipelines.{p}" for p in find_packages("pipelines")]
SHIPPED_ASSETS = ["world-vae", "world-t2i", "world-fill", "world-kontext", "cameras"]
data = {
    "mmpos": ["py.typed"],  # PEP 561: the package ships its type hints
    "mmpos.configs": ["*.yaml", "*.md", "*/*.yaml", "*/*/*.yaml"],
    "mmpos.assets": ["README.md"] + [f"{folder}/**/*" for folder in SHIPPED_ASSETS],
}

setup(
    packages=library + pipelines + [name for name in data if name != "mmpos"],
    package_dir={
        "mmpos": "mmpos",
        "mmpos.pipelines": "pipelines",
        "mmpos.configs": "configs",
        "mmpos.assets": "assets",
    },
    package_data=data,
)
