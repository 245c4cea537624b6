"""The CLI helpers that moved into the command tree still import from their old paths for one release, each
access warning (``DeprecationWarning``) and giving the very object of the new home."""

import importlib
import sys

import pytest

MOVED = [  # (old module, name, new module, new name)
    ("mmpos.pipelines.cli", "main", "mmpos.pipelines.commands", "main"),
    ("mmpos.pipelines.cli", "split_comma_box", "mmpos.pipelines.commands._options", "split_comma_box"),
    ("mmpos.pipelines.cli", "run_edit", "mmpos.pipelines.commands.edit", "run"),
    ("mmpos.pipelines.cli", "METHODS", "mmpos.pipelines.commands.edit", "METHODS"),
    ("mmpos.pipelines.cli", "report_written", "mmpos.pipelines.commands._options", "report_written"),
    ("mmpos.pipelines.video_cli", "build_parser", "mmpos.pipelines.commands.generate", "video_parser"),
    (
        "mmpos.pipelines.video_cli",
        "extrapolation_policies",
        "mmpos.pipelines.commands.generate.video",
        "extrapolation_policies",
    ),
    ("mmpos.pipelines.video_cli", "riflex_k", "mmpos.pipelines.commands.generate.video", "riflex_k"),
    ("mmpos.pipelines.world_video_cli", "run_world", "mmpos.pipelines.commands.generate.world_video", "run_world"),
    ("mmpos.pipelines.edit_methods", "target_box", "mmpos.pipelines.edits.transplant.cli", "target_box"),
]


@pytest.mark.parametrize("old, name, new, new_name", MOVED, ids=lambda v: str(v))
def test_an_old_path_warns_and_gives_the_new_object(old, name, new, new_name):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} moved to {new}.{new_name}"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), new_name)


def test_an_unknown_name_of_an_old_path_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        importlib.import_module("mmpos.pipelines.cli").nosuch


def test_the_old_entry_points_still_run(capsys):
    from mmpos.pipelines import cli, video_cli

    with pytest.warns(DeprecationWarning):
        assert cli.main(["list"]) == 0
    assert "rope_axial" in capsys.readouterr().out
    with pytest.warns(DeprecationWarning), pytest.raises(SystemExit) as exit_info:
        video_cli.run(["--height", "0"])
    assert exit_info.value.code == 2 and "mmpos generate video: error: argument --height" in capsys.readouterr().err


def test_the_old_registration_helper_registers_edit_and_generate():
    import argparse

    from mmpos.pipelines import cli

    parser = argparse.ArgumentParser(prog="mmpos")
    with pytest.warns(DeprecationWarning):
        cli.add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["generate", "video", "--frames", "9"])
    assert args.frames == "9" and args.generate_command == "video"


def test_the_old_runner_paths_keep_their_signatures():
    """``mmpos.pipelines.edit_methods.run_*`` take (args, config, tqdm) and warn."""
    import inspect

    from mmpos.pipelines import edit_methods

    for name in ("run_band", "run_transplant", "run_loose"):
        assert list(inspect.signature(getattr(edit_methods, name)).parameters) == ["args", "config", "tqdm"]


def test_mmpos_keeps_no_old_cli_or_runner_path():
    import mmpos.cli

    assert not hasattr(mmpos.cli, "DefaultsHelpFormatter") and not hasattr(mmpos.cli, "show_defaults")
    sys.modules.pop("mmpos.world.edit_runs", None)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mmpos.world.edit_runs")
