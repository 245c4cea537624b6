"""``docs/adding_an_encoding.md`` runs as written, and its example passes the registry sweep."""
import re
from pathlib import Path

import pytest

import test_registry_sweep as sweep
from mmpos.encodings import registry

PAGE = Path(__file__).resolve().parents[1] / "docs" / "adding_an_encoding.md"
SWEEP = [sweep.test_kind_capabilities_and_example_options_agree, sweep.test_relative_property_matches_the_claim,
         sweep.test_inputs_are_not_modified, sweep.test_gradcheck, sweep.test_option_validation_names_the_option,
         sweep.test_forward_inside_a_timm_vit, sweep.test_forward_inside_a_tiny_flux]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.fixture
def page_namespace():
    namespace = {"__name__": "adding_an_encoding"}
    yield namespace
    registry._REGISTRY.pop("rope_golden", None)


def test_the_worked_example_runs_and_passes_the_sweep(page_namespace, capsys):
    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), page_namespace)
    assert "torch.Size([1, 3])" in capsys.readouterr().out
    assert "rope_golden" in registry.list_pes()
    for check in SWEEP:  # every check applies to a relative 2D rotary encoding: none may skip
        try:
            check("rope_golden")
        except pytest.skip.Exception as skipped:
            pytest.fail(f"{check.__name__} skipped rope_golden: {skipped}")
