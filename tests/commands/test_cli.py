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


def _leaf_parsers(parser, path=()):
    """``(command words, parser)`` for every runnable subcommand under ``parser``."""
    import argparse

    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
    for action in subparsers:
        for name, sub in action.choices.items():
            yield from _leaf_parsers(sub, (*path, name))


def test_every_subcommand_help_states_its_defaults():
    import argparse

    from mmpos.cli import build_parser
    from mmpos.pipelines.commands.generate import video_parser
    from mmpos.training.vit_eval_cli import eval_parser

    parsers = [
        *_leaf_parsers(build_parser()),
        (("generate", "video"), video_parser()),
        (("eval", "vit"), eval_parser()),
    ]
    assert len(parsers) >= 18
    for words, parser in parsers:
        assert "default" in parser.format_help(), words
        formatter = parser.formatter_class(parser.prog)
        for action in parser._actions:  # every option with a value says its default or that it is required
            if (
                not action.option_strings
                or action.help == argparse.SUPPRESS
                or isinstance(action, (argparse._HelpAction, argparse._StoreConstAction))
            ):  # flags (store_true): off
                continue
            text = formatter._get_help_string(action) or ""
            assert "default" in text or "required" in text or action.required, (words, action.option_strings)


def test_encoding_figures_state_their_settings_and_average_the_heads():
    import torch

    from mmpos.demo import demo_encoding
    from mmpos.viz import logit_map
    from mmpos.viz.spectrum import figure_settings

    mhrope = demo_encoding("mhrope")  # head 0 reads only time (t = 0 here): its map alone is flat
    assert float(logit_map(mhrope, size=9).min()) < 0.95
    coords = torch.zeros(81, 3, dtype=torch.float64)
    coords[:, 1:] = torch.cartesian_prod(torch.arange(9.0), torch.arange(9.0)).double()
    ones = torch.ones(1, mhrope.num_heads, 81, mhrope.head_dim, dtype=torch.float64)
    q, k = mhrope(ones, ones, coords)
    per_head = torch.einsum("hld,hd->hl", k[0], q[0, :, 40]) / mhrope.head_dim
    assert torch.allclose(logit_map(mhrope, size=9).flatten(), per_head.mean(0))
    assert "mean over 4 heads" in figure_settings(mhrope) and "t = 0" in figure_settings(mhrope)
    assert "raster order" in figure_settings(demo_encoding("rope_1d"))
    assert "at initialisation" in figure_settings(demo_encoding("ape_learned"))
    assert "at initialisation" not in figure_settings(demo_encoding("rope_axial"))
