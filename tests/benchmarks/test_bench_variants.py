"""The variants benchmark: its dense reference formulation is the same rotation; a tiny run writes ratios."""

import json

import bench_variants as variants  # benchmarks/ is on the test path (pyproject)
import torch

import mmpos


def test_dense_reference_formulation_equals_comrope():
    pe = mmpos.create_pe("comrope_ld", head_dim=16, num_heads=2, block_size=4, num_prefix_tokens=1, seed=0).double()
    q, k = torch.randn(2, 2, 2, 7, 16, dtype=torch.float64)
    coords = torch.rand(6, 2, dtype=torch.float64)
    for ours, dense in zip(pe(q, k, coords), variants.dense_comrope(pe, q, k, coords)):
        assert torch.allclose(ours, dense, atol=1e-13, rtol=0)


def test_saved_bytes_counts_each_storage_once_and_skips_excluded():
    x = torch.randn(1000, requires_grad=True)
    w = torch.randn(1000, requires_grad=True)
    with variants.SavedBytes(exclude=[x]) as saved:
        y = x * w  # saves x (excluded) and w
        (y * w).sum()  # saves y and w again (same storage)
    assert saved.nbytes == 2 * 1000 * 4


def test_tiny_run_writes_ratios(tmp_path, monkeypatch):
    tiny = {"vit-b": (2, 2, 5, 16, (2, 2), 1), "flux": (1, 2, 9, 128, (3, 3), 0)}
    monkeypatch.setitem(variants.SHAPES, "quick", tiny)
    out = tmp_path / "bench.json"
    assert variants.main(["--quick", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    methods = {(r["shape"], r["method"]) for r in results}
    assert ("flux", "comrope_ld b=4 dense d x d") in methods and ("vit-b", "harope, forward (no grad)") in methods
    ap4 = next(r for r in results if r["shape"] == "flux" and r["method"] == "comrope_ap b=4")
    assert ("vit-b", "comrope_ld b=2, no grad") in methods
    assert ap4["dense_memory_over_this"] > 1 and ap4["time_vs_plain_axial"] > 0
