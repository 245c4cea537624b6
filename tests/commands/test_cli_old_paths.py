"""The CLI helpers that moved into the command tree still import from their old paths for one release, each
access warning (``DeprecationWarning``) and giving the very object of the new home."""

import importlib
import sys

import pytest

MOVED = [  # (old module, name, new module, new name)
    ("mmpos.cli", "DefaultsHelpFormatter", "mmpos._arguments", "DefaultsHelpFormatter"),
    ("mmpos.cli", "show_defaults", "mmpos._arguments", "show_defaults"),
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
    ("mmpos.world.edit_runs", "run_band", "mmpos.pipelines.edits.band.demo", "run_band"),
    ("mmpos.world.edit_runs", "run_transplant", "mmpos.pipelines.edits.transplant.demo", "run_transplant"),
    ("mmpos.world.edit_runs", "run_loose", "mmpos.pipelines.edits.loose.demo", "run_loose"),
    ("mmpos.world.edit_runs", "loose_for_steps", "mmpos.pipelines.edits.loose.demo", "loose_for_steps"),
    ("mmpos.world.edit_runs", "EditRun", "mmpos.pipelines.edits.method", "EditRun"),
    ("mmpos.world.edit_runs", "load_edit_pipeline", "mmpos.pipelines.world.sources", "load_world_edit"),
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
    """``mmpos.world.edit_runs.run_*`` take (pipe, pairs, steps, options, guidance, seed) as before;
    ``mmpos.pipelines.edit_methods.run_*`` take (args, config, tqdm) and warn."""
    import inspect

    from mmpos.pipelines import edit_methods

    for name in ("run_band", "run_transplant", "run_loose"):
        with pytest.warns(DeprecationWarning):
            world = getattr(importlib.import_module("mmpos.world.edit_runs"), name)
        assert list(inspect.signature(world).parameters)[:3] == [
            "pipe",
            "style_sets" if name == "run_band" else "pairs",
            "steps",
        ]
        assert list(inspect.signature(getattr(edit_methods, name)).parameters) == ["args", "config", "tqdm"]
    with pytest.warns(DeprecationWarning, match="mmpos.world.sources moved to mmpos.pipelines.world.sources"):
        sys.modules.pop("mmpos.world.sources", None)
        tasks = importlib.import_module("mmpos.world.sources").TASK_OF_METHOD
    assert tasks == {"generate": "t2i", "band": "t2i", "transplant": "fill", "loose": "kontext"}
