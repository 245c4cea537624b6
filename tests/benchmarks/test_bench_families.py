"""The families benchmark runs on its smallest setting and checks native == stock for what it times."""

import json

from bench_families import main


def test_bench_families_runs_and_native_equals_stock(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert main(["--scale", "1", "--repeats", "1", "--families", "flux2", "qwen", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["family"] for r in rows] == ["flux2", "qwen"]
    assert all(r["native_equals_stock"] and r["native_x"] > 0 and r["dype_x"] > 0 for r in rows)
    assert "native/stock" in capsys.readouterr().out
