"""``mmpos bench`` without its optional peer (rotary-embedding-torch, the ``bench`` extra): a note, not a crash."""

import sys

import bench_rotary
import pytest

TINY = ((1, 2, 5, 8), (4, 4))  # B, H, L (1 cls + 2 x 2 patches), D; axes dims


@pytest.fixture
def tiny_shape(monkeypatch):
    monkeypatch.setitem(bench_rotary.SHAPES, "tiny", TINY)
    monkeypatch.setattr(bench_rotary, "_NOTED", set())


def _run(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench_rotary.main(["--shapes", "tiny", "--dtypes", "fp32", "--repeats", "1", "--out", str(out)]) == 0
    return capsys.readouterr().out, out.read_text()


def test_a_missing_peer_is_skipped_with_a_note(tiny_shape, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "rotary_embedding_torch", None)  # import raises ImportError
    printed, results = _run(tmp_path, capsys)
    assert printed.count("note: rotary-embedding-torch is not installed") == 1 and "mmpos-toolbox[bench]" in printed
    assert "rotary-embedding-torch" not in results
    assert '"method": "mmpos"' in results and '"method": "diffusers apply_rotary_emb"' in results


def test_an_installed_peer_is_measured(tiny_shape, tmp_path, capsys):
    pytest.importorskip("rotary_embedding_torch")
    printed, results = _run(tmp_path, capsys)
    assert "note:" not in printed and '"method": "rotary-embedding-torch"' in results
