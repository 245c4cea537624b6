"""``mmpos train TASK`` for the registered tasks (:data:`mmpos.training.tasks.TASKS`): every task with a config
class is a sub-command with its config's flags, declared without torch (static choices, equal to the torch-side
registries; ``--help`` states every default, and ``mmpos train --help`` imports no torch), and runs the same
training as its script, loss for loss."""

import dataclasses
import json
import subprocess
import sys

import pytest

from mmpos.cli import main
from mmpos.training.tasks import TASKS, task_config, task_module
from tests.training.test_training_scaffold import dit_argv, load_script, log_of


def test_the_static_choices_are_the_torch_side_registries():
    from mmpos.camera.lens_augment import LENS_MODELS
    from mmpos.integrations.diffusers.camera_adapter import ADAPTER_KINDS
    from mmpos.models.dit import DIT_PRESETS
    from mmpos.models.world.architectures import ARCHITECTURES
    from mmpos.models.world.image import TASKS as IMAGE_TASKS
    from mmpos.models.world.nvs import NVS_ENCODINGS
    from mmpos.training import task_configs as configs

    assert configs.DIT_PRESET_NAMES == tuple(sorted(DIT_PRESETS))
    assert configs.ADAPTER_KIND_NAMES == tuple(ADAPTER_KINDS)
    assert configs.LENS_MODEL_NAMES == tuple(LENS_MODELS)
    assert configs.WORLD_IMAGE_TASK_NAMES == ("vae", *IMAGE_TASKS)
    assert configs.WORLD_ARCHITECTURE_NAMES == tuple(ARCHITECTURES)
    assert set(configs.VIDEO_STAGE_NAMES) == {"vae", "base", *ADAPTER_KINDS}  # a camera stage trains an adapter
    assert configs.NVS_ENCODING_NAMES == NVS_ENCODINGS


def flag_of(field) -> str:
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


@pytest.mark.parametrize("name", [name for name, entry in TASKS.items() if entry.config is not None])
def test_each_task_with_a_config_is_a_train_sub_command(name, capsys):
    entry, module = TASKS[name], task_module(name)
    assert task_config(name).__module__ == "mmpos.training.task_configs"
    if entry.task is not None:  # on the scaffold's loop
        assert getattr(module, entry.task).outputs == entry.outputs
    else:  # its own update order
        assert callable(module.run_command)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", name, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    fields = dataclasses.fields(task_config(name))
    assert all(flag_of(field) in text for field in fields)
    from mmpos.training.scaffold.config import build_parser

    helps = {action.dest: action.help for action in build_parser(task_config(name), name)._actions}
    assert all("(default: " in helps[f.name] or helps[f.name].endswith("(required)") for f in fields), helps


def test_mmpos_train_help_imports_no_torch():
    probe = (
        "import contextlib, io, json, sys\n"
        "from mmpos.cli import main\n"
        "for argv in (['train', '--help'], ['train', 'world_image', '--help'], ['train', 'nvs', '--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'timm', 'diffusers'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_a_config_made_in_code_is_checked_as_a_command_line_is():
    from mmpos.training.scaffold.config import ConfigError
    from mmpos.training.task_configs import NVSConfig, WorldImageConfig, WorldVideoConfig

    with pytest.raises(ConfigError, match="stage: required, one of vae, base, ucpe, plucker, prope"):
        WorldVideoConfig()
    with pytest.raises(ConfigError, match="lr: expected a number >= 0"):
        NVSConfig("ucpe", lr=-1)
    with pytest.raises(ConfigError, match="task: expected one of vae, t2i, fill, kontext"):
        WorldImageConfig(task="t2x")
    assert NVSConfig("ucpe", lr=0).lr == 0  # continued training that keeps the weights


def test_mmpos_train_dit_is_the_script_loss_for_loss(tmp_path):
    assert load_script("train_dit").main(dit_argv(tmp_path / "script", 3)) == 0
    assert main(["train", "dit", *dit_argv(tmp_path / "command", 3)]) == 0
    script, command = log_of(tmp_path / "script"), log_of(tmp_path / "command")
    assert len(script) == 3 and all(isinstance(row["loss"], float) for row in script)
    assert [row["loss"] for row in command] == [row["loss"] for row in script]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch-size", "0"], "--batch-size"),
        (["--model", "DiT-Q/2"], "DiT-S/2"),
        (["--set", "nope=1"], "nope"),
    ],
)
def test_mmpos_train_dit_bad_values_are_one_line(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "dit", "--out", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err
    assert (
        exit_info.value.code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) <= 3
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "name, argv, message",
    [
        ("world_image", ["--set", "ema_decay=2"], "ema_decay: expected a number in [0, 1)"),
        ("world_video", ["--stage", "ucpe"], "--stage ucpe trains a camera adapter: pass --base"),
        ("world_video", ["--stage", "vae", "--resume", "checkpoint-2"], "pass --resume alone"),
        ("nvs", ["--encoding", "ucpe", "--data", "missing.pt"], "missing.pt"),
        ("nvs", ["--encoding", "rope"], "encoding: expected one of none, plucker"),
    ],
)
def test_the_world_trainers_refuse_in_one_line(name, argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", name, "--out", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err
    assert (
        exit_info.value.code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    )


def test_mmpos_train_nvs_is_the_script_loss_for_loss(tmp_path):
    import torch

    from mmpos.world.nvs_data import make_triples

    data = {"train": make_triples("train", 1, 2, size=16, objects=3)}
    for folder in ("script", "command"):
        (tmp_path / folder).mkdir()
        torch.save(data, tmp_path / folder / "data.pt")
    options = ["--encoding", "ucpe", "--steps", "2", "--batch-size", "2"]
    load_script("eval_nvs").main(["--out", str(tmp_path / "script"), "train", *options])
    run, data = str(tmp_path / "command" / "ucpe_s0"), str(tmp_path / "command" / "data.pt")
    assert main(["train", "nvs", "--out", run, "--data", data, *options]) == 0
    runs = [tmp_path / "script" / "checkpoints" / "ucpe_s0", tmp_path / "command" / "ucpe_s0"]
    losses = [json.loads((r / "checkpoint-2" / "nvs_progress.json").read_text())["losses"] for r in runs]
    assert len(losses[0]) == 2 and losses[0] == losses[1]
