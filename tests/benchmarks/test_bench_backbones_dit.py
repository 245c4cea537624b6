"""The DiT backbone benchmark runs end to end on a tiny preset and writes one row per encoding (HARoPE twice: its
map folded into qkv and per token), with HARoPE started away from its identity (so that its exponentials are
exercised)."""

import json

import backbones_dit as dit  # benchmarks/ is on the test path (pyproject)
import torch


def test_tiny_run_writes_a_row_per_encoding(tmp_path, monkeypatch):
    monkeypatch.setitem(dit.PRESETS, "dit-b2", (dict(hidden_size=32, num_heads=2, patch_size=2, sample_size=8), 1))
    out = tmp_path / "dit.json"
    assert dit.main(["--rounds", "1", "--depth", "1", "--batch-size", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["encoding"] for r in rows] == dit.ENCODINGS + ["harope (map per token)"] and rows[0]["vs_nope"] == 1.0
    assert all(r["tokens"] == 16 and r["ms"] > 0 for r in rows)


def test_harope_starts_away_from_the_identity():
    model = dit.build_model("harope", "dit-b2", 1, torch.device("cpu"))
    pe = model.rotary_pes[0]
    assert pe.u_skew.abs().sum() > 0 and not torch.allclose(pe.matrices()[0], torch.eye(pe.head_dim))
