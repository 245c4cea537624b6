"""Every public function of the plotting and core packages is on an API reference page (issue 46 item 8): each
package's ``__all__`` is rendered by a ``::: package`` directive of a page in mkdocs.yml's nav."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ("mmpos.viz", "mmpos.coords", "mmpos.spectrum", "mmpos.ops", "mmpos.camera", "mmpos.encodings")


def rendered_modules() -> set[str]:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = re.findall(r"(api/[\w.]+\.md)", nav)
    return {
        line.split()[1]
        for page in pages
        for line in (ROOT / "docs" / page).read_text().splitlines()
        if line.startswith("::: ")
    }


@pytest.mark.parametrize("package", PUBLIC)
def test_every_public_name_has_a_reference_page(package):
    assert package in rendered_modules()
    names = importlib.import_module(package).__all__
    assert names, package
    if package == "mmpos.viz":
        assert "plot_spectrum" in names
