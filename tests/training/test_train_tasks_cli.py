"""``mmpos train TASK`` for the registered tasks (:data:`mmpos.training.tasks.TASKS`): every scaffold task is a
sub-command with its config's flags, declared without torch (static choices, equal to the torch-side registries),
and runs the same training as its script, loss for loss."""

import pytest

from mmpos.cli import main
from mmpos.training.tasks import TASKS, task_config, task_module
from tests.training.test_training_scaffold import dit_argv, load_script, log_of


def test_the_static_choices_are_the_torch_side_registries():
    from mmpos.camera.lens_augment import LENS_MODELS
    from mmpos.integrations.diffusers.camera_adapter import ADAPTER_KINDS
    from mmpos.models.dit import DIT_PRESETS
    from mmpos.training import task_configs as configs

    assert configs.DIT_PRESET_NAMES == tuple(sorted(DIT_PRESETS))
    assert configs.ADAPTER_KIND_NAMES == tuple(ADAPTER_KINDS)
    assert configs.LENS_MODEL_NAMES == tuple(LENS_MODELS)


@pytest.mark.parametrize("name", [name for name, entry in TASKS.items() if entry.config is not None])
def test_each_scaffold_task_is_a_train_sub_command(name, capsys):
    entry = TASKS[name]
    task = getattr(task_module(name), entry.task)
    assert task.outputs == entry.outputs and task_config(name).__module__ == "mmpos.training.task_configs"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", name, "--help"])
    assert exit_info.value.code == 0
    flags = capsys.readouterr().out
    assert all(f"--{field.replace('_', '-')}" in flags for field in task_config(name).__dataclass_fields__)


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
