"""The `mmpos` command: demo figures, list, and --help on each subcommand."""
import subprocess
import sys

import pytest

from mmpos.cli import main
from mmpos.encodings import list_pes


def test_demo_writes_a_figure_per_encoding(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--size", "9", "--no-world"]) == 0
    written = sorted(p.stem for p in tmp_path.glob("*.png"))
    assert written == list_pes()
    assert all(p.stat().st_size > 10_000 for p in tmp_path.glob("*.png"))
    assert str(tmp_path.resolve()) in capsys.readouterr().out


def test_list_verbose_shows_options(capsys):
    assert main(["list", "-v"]) == 0
    out = capsys.readouterr().out
    assert "rope_axial" in out and "axes_dims = None" in out and "head_dim (required)" in out


@pytest.mark.parametrize("command", [[], ["demo"], ["list"], ["bench"]])
def test_help_on_each_subcommand(command):
    result = subprocess.run([sys.executable, "-m", "mmpos.cli", *command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "usage: mmpos" in result.stdout


def test_logit_map_peaks_at_zero_offset_for_rotary_encodings():
    import torch

    from mmpos.demo import demo_encoding
    from mmpos.viz import logit_map

    for name in ("rope_axial", "rope_1d", "rope_mixed"):
        values = logit_map(demo_encoding(name), size=9)
        assert values[4, 4] == pytest.approx(1.0) and (values <= 1 + 1e-12).all()
    assert torch.equal(logit_map(demo_encoding("nope"), size=5), torch.ones(5, 5, dtype=torch.float64))
