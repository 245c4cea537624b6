"""The families benchmark runs on its smallest setting and checks native == stock for what it times."""

import json

import pytest
from bench_families import main, paired_overhead, paired_ratio


def test_bench_families_runs_and_native_equals_stock(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert main(["--scale", "1", "--repeats", "1", "--families", "flux2", "qwen", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["family"] for r in rows] == ["flux2", "qwen"]
    assert all(r["native_equals_stock"] and r["native_x"] > 0 and r["dype_x"] > 0 for r in rows)
    for r in rows:  # one round: the overhead is that round's difference, the ratio that round's quotient
        stock, native = r["stock_ms"], r["native_x"] * r["stock_ms"]
        assert r["native_overhead_ms"] == pytest.approx(native - stock, rel=1e-6, abs=1e-9)
        assert r["load_average"] >= 0
    assert "native/stock" in capsys.readouterr().out


def test_paired_overhead_is_the_median_of_the_rounds_differences():
    # rounds: stock 10, 30, 11 ms; native 11, 29, 14: differences +1, -1, +3 (the medians' difference would be +3)
    assert paired_overhead([11.0, 29.0, 14.0], [10.0, 30.0, 11.0]) == 1.0


def test_paired_ratio_is_the_median_of_the_rounds_ratios():
    # ratios 1.1, 0.9, 2.0: median 1.1 (the medians' ratio would be 22 / 11 = 2.0)
    assert paired_ratio([11.0, 27.0, 22.0], [10.0, 30.0, 11.0]) == pytest.approx(1.1)
