"""The CP table-memory benchmark: its formula equals the bytes it measures in one process; ``--cases`` selects."""

import bench_cp_tables as bench  # benchmarks/ is on the test path (pyproject)
import pytest


@pytest.mark.parametrize("family, pe", [("qwen", "native"), ("qwen", "rope_axial"), ("ltx", "native")])
def test_formula_equals_the_measured_cached_bytes_in_one_process(monkeypatch, family, pe):
    """What the seam keeps after its first call, counted storage by storage, is what the shapes give."""
    if family == "ltx":  # LTX-Video's tables span heads * head_dim: 4 heads keep the test small
        monkeypatch.setitem(
            bench.CONFIGS, "ltx", dict(bench.LTX_CONFIG, num_attention_heads=4, cross_attention_dim=256)
        )
    measured = bench.measure(family, pe, None)
    assert measured["cached"] > 0 and measured["peak"] >= measured["cached"]
    assert measured["cached"] == bench.formula_bytes(family, pe, measured["tokens"], bench.heads(family))


def test_cases_select_families_or_cases_and_an_unknown_one_is_named():
    assert bench.selected(["ltx", "qwen/rope_axial"]) == [("qwen", "rope_axial"), ("ltx", "native")]
    assert bench.selected(None) == bench.CASES
    with pytest.raises(ValueError, match="--cases ltx/rope_mixed: expected"):
        bench.selected(["qwen", "ltx/rope_mixed"])
