"""What a user or a contributor adopting mmpos relies on: one version, the declared licence and its text, the
type marker in the package, mypy clean on the core packages, and the docs site building in strict mode.

The mypy and docs-site checks need the ``dev`` extra (``pip install -e '.[dev]'``, ``make quality`` / ``make docs``)
and are skipped without it.
"""

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_once_and_read_from_the_metadata():
    import mmpos

    assert mmpos.__version__ == importlib.metadata.version(mmpos.DISTRIBUTION) == PYPROJECT["project"]["version"]
    written = re.findall(r"^__version__\s*=", (ROOT / "mmpos" / "__init__.py").read_text(), re.M)
    assert not written, "mmpos/__init__.py writes a version of its own (pyproject.toml is the one source)"


def test_the_distribution_name_is_ours_not_the_taken_one():
    """``mmpos`` on the package index is an unrelated project (checked 2026-12-03): ``pip install mmpos`` would install
    someone else's code. The distribution is ``mmpos-toolbox`` (free on the index that day); the import name stays."""
    import mmpos

    assert PYPROJECT["project"]["name"] == mmpos.DISTRIBUTION == "mmpos-toolbox"
    assert importlib.metadata.distribution(mmpos.DISTRIBUTION).read_text("top_level.txt") in (None, "mmpos\n")


def test_the_licence_file_is_the_declared_licence():
    declared = PYPROJECT["project"]["license"]
    assert (declared.get("text") if isinstance(declared, dict) else declared) == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a stub


def test_the_type_marker_ships_in_the_package():
    assert (ROOT / "mmpos" / "py.typed").is_file()
    setup = (ROOT / "setup.py").read_text()
    assert re.search(r'"mmpos":\s*\["py\.typed"\]', setup), "setup.py's package_data does not ship mmpos/py.typed"


def test_the_mypy_files_are_the_core_packages_and_exist():
    files = PYPROJECT["tool"]["mypy"]["files"]
    assert files and all((ROOT / f).is_dir() for f in files)
    strict = [o for o in PYPROJECT["tool"]["mypy"]["overrides"] if o.get("disallow_untyped_defs")]
    assert {f"{f.replace('/', '.')}.*" for f in files} <= {m for o in strict for m in o["module"]}


@pytest.mark.slow
def test_mypy_finds_nothing_in_the_core_packages():
    pytest.importorskip("mypy", reason="mypy is in the dev extra (pip install -e '.[dev]')")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_docs_hook_points_links_at_the_site():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import mkdocs_hooks as hooks
    except ImportError:  # the hook imports mkdocs
        pytest.skip("mkdocs is in the dev extra (pip install -e '.[dev]')")
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    linked: set[str] = set()
    readme = "[a](docs/video.md#x) [b](assets/nvs/examples.png) [c](nowhere.md) [d](https://x.org/y.md)"
    assert hooks._rewrite(readme, ROOT, "", linked) == (
        "[a](video.md#x) [b](repo/assets/nvs/examples.png) [c](nowhere.md) [d](https://x.org/y.md)"
    )
    assert linked == {"assets/nvs/examples.png"}  # copied into the site; a missing file is left for --strict
    page = "[r](../../README.md) [f](../../assets/nvs/examples.png) [i](index.md) [h](../README.md)"
    assert hooks._rewrite(page, ROOT / "docs" / "api", "api", set()) == (  # a page of docs/api/
        "[r](../overview.md) [f](../repo/assets/nvs/examples.png) [i](index.md) [h](../README.md)"
    )


@pytest.mark.slow
def test_the_docs_site_builds_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocstrings", reason="mkdocs and mkdocstrings are in the dev extra")
    done = subprocess.run(  # the mkdocs this interpreter imports (its script need not be on PATH)
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "pipelines" / "index.html").read_text()
    for name in ("PosBridgeFillPipeline.__call__", "BandModulationFluxPipeline.__call__"):
        assert name in api, f"the API reference has no entry for {name}"
    assert "set_pe" in (tmp_path / "site" / "api" / "diffusers" / "index.html").read_text()


def test_every_source_folder_is_a_package():
    """setup.py's ``find_packages`` skips a folder without ``__init__.py``: its modules would be missing from the wheel."""
    folders = {p.parent for root in ("mmpos", "pipelines") for p in (ROOT / root).rglob("*.py")}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file())
    assert not missing, f"folders of Python modules without __init__.py (left out of the wheel): {missing}"
