"""The editing benchmark times what it says: its "off" step is the stock forward bit for bit, its "on" step
changes the output, and band modulation's baseline is shared attention with the band law off."""

import json

import bench_edit  # benchmarks/ is on the test path (pyproject)
import edit_cases
import timing
import torch


def test_off_is_stock_and_on_edits(tmp_path, monkeypatch):
    monkeypatch.setitem(bench_edit.SIZES, "small", (8, 16, 1, 1, 1, 64))
    out = tmp_path / "edit.json"
    assert bench_edit.main(["--repeats", "1", "--dtype", "fp32", "--device", "cpu", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"].split()[0] for r in rows] == ["pe", "band", "looserope"]
    assert all(r["off_equals_stock"] and r["max_change"] > 0 for r in rows)
    assert rows[0]["implied_attention_work"] == 1.0 and all(r["implied_attention_work"] > 1 for r in rows[1:])


def test_plain_shared_attention_is_band_at_strength_zero():
    from mmpos.pipelines import BandConfig, EditContext, EditSession
    from mmpos.pipelines.edits.band.rule import SharedBandAttention

    transformer = bench_edit.build_transformer(1, 1, 1, 64, torch.float32, torch.device("cpu"))
    inputs = bench_edit._inputs("flux", 3, 8, 16, 64, torch.float32, torch.device("cpu"))
    scheduler = bench_edit._scheduler_at_first_step("cpu")

    def step(rule):
        with torch.no_grad(), EditSession(transformer, EditContext(rules={0: rule, 1: rule}), scheduler):
            return transformer(**inputs)[0]

    plain = step(edit_cases.plain_shared_attention(BandConfig()))
    assert torch.equal(plain, step(SharedBandAttention(BandConfig(strength=0.0), edit_cases.AXES)))
    assert not torch.equal(plain, step(SharedBandAttention(BandConfig(), edit_cases.AXES)))


def test_family_band_cases_off_is_stock_and_on_edits(tmp_path, monkeypatch):
    monkeypatch.setitem(bench_edit.SIZES, "small", (4, 8, 1, 1, 1, 32))
    out = tmp_path / "families.json"
    assert (
        bench_edit.main(["--repeats", "1", "--dtype", "fp32", "--device", "cpu", "--families", "--out", str(out)]) == 0
    )
    rows = [r for r in json.loads(out.read_text())["rows"] if r["case"].startswith("band")]
    assert [r["case"].split()[1] for r in rows] == ["(FLUX.2,", "(Qwen-Image,"]
    assert all(r["off_equals_stock"] and r["max_change"] > 0 and r["implied_attention_work"] > 1 for r in rows)


def test_family_cases_off_is_stock_and_on_edits():
    import family_edit_cases

    rows = [
        row
        for family in ("flux2", "qwen")
        for row in family_edit_cases.family_rows(
            family, (8, 16, 1, 1, 1, 32), torch.float32, torch.device("cpu"), 1, timing.timed
        )
    ]
    assert [r["case"].split(" (")[0] for r in rows] == ["pe transplant", "looserope"] * 2
    assert all(r["off_equals_stock"] and r["max_change"] > 0 for r in rows)
    assert [r["implied_attention_work"] > 1 for r in rows] == [False, True] * 2
