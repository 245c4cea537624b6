"""The training scaffold (mmpos.training.scaffold) through its ported tasks, the DiT and the camera adapter:
one config style, a kill and a resume bit-identical to an uninterrupted run (mid-epoch, the data stream
included), the NaN stop, a checkpoint that mixes steps refused, and 2 processes (torchrun, gloo) equal to one
process at twice the batch, with equal weights and EMA on both ranks and only rank 0 writing."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mmpos.training.scaffold.config import (
    ConfigError,
    TrainConfig,
    build_parser,
    check_value,
    option,
    parse_config,
    positive,
)
from mmpos.training.scaffold.folders import checkpoints
from tests.fixtures.torchrun import rank_records
from tests.fixtures.torchrun import torchrun as run_workers
from tests.fixtures.world_clips import write_world_clips

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parents[1] / "workers" / "scaffold_ddp_worker.py"
TINY_DIT = [
    "--tiny",
    "--data",
    "shapes",
    "--samples",
    "24",
    "--resolution",
    "8",
    "--num-classes",
    "4",
    "--pe",
    "rope_mixed",
    "--sample-steps",
    "0",
    "--ema-decay",
    "0.5",
    "--lr",
    "1e-2",
]


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dit_argv(out, steps, batch=4, *extra):
    return TINY_DIT + [
        "--batch-size",
        str(batch),
        "--steps",
        str(steps),
        "--checkpoint-every",
        "2",
        "--out",
        str(out),
        *extra,
    ]


# ---------------------------------------------------------------- one config style
@dataclass
class Toy(TrainConfig):
    width: int = option(64, "hidden width", check=positive)
    options: dict = option({}, "a mapping")


def test_config_layers_and_refusals(tmp_path, capsys):
    file = tmp_path / "toy.yaml"
    file.write_text("width: 32\nlr: 2e-3\noptions: {theta: 100}\n")
    parser = build_parser(Toy, "toy")
    config, args = parse_config(Toy, parser, ["--config", str(file), "--width", "48", "--set", "lr=1e-3"])
    assert (config.width, config.lr, config.options, args.resume) == (48, 1e-3, {"theta": 100}, None)
    assert parse_config(Toy, parser, ["--resume"])[1].resume == "latest"
    file.write_text("widht: 32\n")
    for argv, message in (
        (["--config", str(file)], "unknown config key 'widht'"),
        (["--set", "depth=2"], "unknown config key 'depth'"),
        (["--set", "width=0"], "width: expected a positive number, got 0"),
        (["--set", "lr=fast"], "lr: expected float, got 'fast'"),
        (["--width", "1.5"], "argument --width: expected int, got 1.5"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            parse_config(Toy, build_parser(Toy, "toy"), argv)
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and message in err and len(err.splitlines()) == 1, err
    with pytest.raises(ConfigError, match="grad_clip: expected float or none, got 'x'"):
        check_value(Toy, "grad_clip", "x")


# ---------------------------------------------------------------- kill and resume
def digest(folder: Path) -> dict:
    return {
        name: (folder / name).read_bytes() for name in ("model.safetensors", "ema.safetensors", "optimizer.safetensors")
    }


def log_of(out: Path) -> list:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (no except clause catches it)."""


def test_dit_killed_mid_epoch_resumes_bit_identical(tmp_path, monkeypatch):
    """24 samples / global batch 4: 6 updates per epoch; killed inside update 5 (checkpoint-4 is the last),
    resumed to update 8 (crossing the epoch) with the same weights, EMA, optimizer and losses as a run never killed."""
    from mmpos.training.tasks.dit import DiTTask

    script = load_script("train_dit")
    assert script.main(dit_argv(tmp_path / "straight", 8)) == 0
    calls, original = [], DiTTask.loss

    def dies_in_update_5(self, *args):
        calls.append(1)
        if len(calls) == 5:
            raise Killed
        return original(self, *args)

    monkeypatch.setattr(DiTTask, "loss", dies_in_update_5)
    with pytest.raises(Killed):
        script.main(dit_argv(tmp_path / "killed", 8))
    monkeypatch.setattr(DiTTask, "loss", original)
    killed = tmp_path / "killed"
    assert [c.name for c in checkpoints(killed)] == ["checkpoint-2", "checkpoint-4"]
    assert script.main(dit_argv(killed, 8)[:-2] + ["--output-dir", str(killed), "--resume"]) == 0
    assert digest(killed / "checkpoint-8") == digest(tmp_path / "straight" / "checkpoint-8")
    assert log_of(killed) == log_of(tmp_path / "straight") and len(log_of(killed)) == 8
    progress = json.loads((killed / "checkpoint-8" / "progress.json").read_text())
    assert progress["data"] == {"epoch": 1, "batch": 2, "global_batch": 4, "length": 24, "seed": 0}
    saved = {p.name for p in (killed / "checkpoint-8").iterdir()}
    assert saved == {
        "model.safetensors",
        "optimizer.safetensors",
        "optimizer.json",
        "ema.safetensors",
        "config.yaml",
        "progress.json",
        "rng_0.json",
    }  # no pickle
    assert (killed / "model_ema" / "config.json").is_file()


def test_resume_refuses_a_mixed_checkpoint_and_a_changed_model(tmp_path, capsys):
    script = load_script("train_dit")
    out = tmp_path / "run"
    assert script.main(dit_argv(out, 4)) == 0
    (out / "checkpoint-4" / "rng_0.json").write_text((out / "checkpoint-2" / "rng_0.json").read_text())
    with pytest.raises(SystemExit) as exit_info:
        script.main(dit_argv(out, 6, 4, "--resume"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "checkpoint-4: cannot be resumed" in err and "rng_0.json" in err
    with pytest.raises(SystemExit) as exit_info:
        script.main(dit_argv(out, 6, 4, "--resume", str(out / "checkpoint-2"), "--pe", "rope_axial"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--resume: pe is 'rope_axial' but the run was started with 'rope_mixed'" in err


def test_dit_stops_at_the_first_nan_loss_keeping_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    from mmpos.training.tasks.dit import DiTTask

    calls, original = [], DiTTask.loss

    def nan_at_update_3(self, *args):
        calls.append(1)
        loss = original(self, *args)
        return loss * float("nan") if len(calls) == 3 else loss

    monkeypatch.setattr(DiTTask, "loss", nan_at_update_3)
    out = tmp_path / "run"
    assert load_script("train_dit").main(dit_argv(out, 6)) == 1
    err = capsys.readouterr().err
    assert "NonFiniteLossError: loss is nan at step 3" in err and "checkpoint-2, is kept" in err
    assert [c.name for c in checkpoints(out)] == ["checkpoint-2"] and not (out / "model").exists()
    assert [row["step"] for row in log_of(out)] == [1, 2]


def test_camera_adapter_stops_at_a_nan_loss(tmp_path, monkeypatch, capsys):
    from mmpos.training.tasks.camera_adapter import CameraAdapterTask

    data = write_world_clips(tmp_path / "clips", 2)
    original = CameraAdapterTask.loss
    monkeypatch.setattr(CameraAdapterTask, "loss", lambda self, *a: original(self, *a) * float("inf"))
    argv = [
        "--data",
        str(data),
        "--out",
        str(tmp_path / "run"),
        "--steps",
        "2",
        "--frames",
        "5",
        "--max-sequence-length",
        "16",
        "--head-dim",
        "16",
    ]
    assert load_script("train_camera_adapter").main(argv) == 1
    assert "NonFiniteLossError: loss is inf at step 1" in capsys.readouterr().err
    assert not checkpoints(tmp_path / "run")


# ---------------------------------------------------------------- 2 processes
def torchrun(task: str, argv: list, records: Path, port: int, processes: int = 2, **env):
    done = run_workers(WORKER, [task, json.dumps(argv), records], port, processes, **env)
    if env.get("SCAFFOLD_NODE_LOCAL_OUT"):
        return done
    assert done.returncode == 0, done.stderr[-4000:]
    return rank_records(records, processes)


# The DiT's adaLN-zero: the modulation starts at zero, so the timestep embedding gets no gradient at the first update
# and gradients made of cancelling terms after it; AdamW normalises them, so their round-off (another summation
# order: two halves all-reduced against one batch) reaches the weights at ~lr / 10 (measured 1.8e-5 at lr 1e-4 after
# 4 updates with one thread, below 1e-5 with two). Those weights are compared to ROUND_OFF_DOMINATED_ATOL.
ROUND_OFF_DOMINATED = ("time_embed.", "adaLN_modulation.")
ROUND_OFF_DOMINATED_ATOL = 1e-4


def check_two_processes_equal_one(
    records: Path, ranks: list, single: dict, out: Path, tolerance: float, round_off_dominated=()
):
    weights = [load_file(str(records / f"rank{r}.safetensors")) for r in (0, 1)]
    assert ranks[0]["num_processes"] == 2
    for name in weights[0]:  # weights and EMA equal across ranks, bit for bit
        assert torch.equal(weights[0][name], weights[1][name]), name
    for name, value in single.items():  # and equal to one process at twice the batch
        atol = ROUND_OFF_DOMINATED_ATOL if any(part in name for part in round_off_dominated) else tolerance
        torch.testing.assert_close(weights[0][name], value, rtol=0, atol=atol, msg=name)
    assert set(ranks[1]["written"]) == {"rng_1.json"}  # rank 1 writes only its generators
    assert "rng_0.json" in ranks[0]["written"] and "model.safetensors" in ranks[0]["written"]
    for checkpoint in checkpoints(out):
        assert {"rng_0.json", "rng_1.json"} <= {p.name for p in checkpoint.iterdir()}


def single_process_weights(result) -> dict:
    tensors = {f"model.{k}": v.detach().cpu() for k, v in result.model.state_dict().items()}
    if result.ema is not None:
        tensors.update({f"ema.{k}": v.detach().cpu() for k, v in result.ema.state_dict().items()})
    return tensors


def test_dit_two_processes_equal_one_at_twice_the_batch(tmp_path):
    from mmpos.training.scaffold.loop import train
    from mmpos.training.tasks.dit import DiTConfig, DiTTask

    ranks = torchrun("dit", dit_argv(tmp_path / "two", 4, 2), tmp_path, 29531)
    config, _ = parse_config(DiTConfig, build_parser(DiTConfig, "t"), dit_argv(tmp_path / "one", 4, 4))
    result = train(DiTTask(config))
    single = single_process_weights(result)
    check_two_processes_equal_one(tmp_path, ranks, single, tmp_path / "two", 1e-5, ROUND_OFF_DOMINATED)
    two, one = log_of(tmp_path / "two"), log_of(tmp_path / "one")  # logged: the mean over ranks
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    assert all(abs(a["loss"] - b["loss"]) < 1e-5 for a, b in zip(two, one))


def test_an_out_folder_the_processes_do_not_share_stops_the_run_at_start(tmp_path):
    done = torchrun("dit", dit_argv(tmp_path / "run", 2, 2), tmp_path, 29535, SCAFFOLD_NODE_LOCAL_OUT="1")
    assert done.returncode != 0
    assert "UnshareOutError" in done.stderr and "processes [1] do not see what process 0 wrote" in done.stderr
    assert not checkpoints(tmp_path / "run" / "node0") and not (tmp_path / "run" / "node1").exists()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MMPOS_SLOW") != "1", reason="slow: two tiny Wans under torchrun (MMPOS_SLOW=1)")
def test_camera_adapter_two_processes_equal_one_at_twice_the_batch(tmp_path):
    from mmpos.training.scaffold.loop import train
    from mmpos.training.tasks.camera_adapter import CameraAdapterConfig, CameraAdapterTask

    data = write_world_clips(tmp_path / "clips", 4)

    def argv(out, batch):
        return [
            "--data",
            str(data),
            "--out",
            str(out),
            "--steps",
            "2",
            "--checkpoint-every",
            "1",
            "--frames",
            "5",
            "--max-sequence-length",
            "16",
            "--head-dim",
            "16",
            "--max-zoom",
            "1.3",
            "--lr",
            "1e-2",
            "--batch-size",
            str(batch),
        ]

    ranks = torchrun("camera", argv(tmp_path / "two", 1), tmp_path, 29533)
    config, _ = parse_config(CameraAdapterConfig, build_parser(CameraAdapterConfig, "t"), argv(tmp_path / "one", 2))
    result = train(CameraAdapterTask(config))
    check_two_processes_equal_one(tmp_path, ranks, single_process_weights(result), tmp_path / "two", 1e-5)


# ---------------------------------------------------------------- checkpoints of the earlier scripts
@pytest.mark.parametrize("ema_file", ["ema.safetensors", "custom_checkpoint_0.pkl"])
def test_a_dit_checkpoint_of_the_earlier_script_resumes(tmp_path, ema_file):
    """``accelerator.save_state`` + the EMA, as scripts/train_dit.py wrote them before the scaffold: the weights,
    the EMA and the step come back (resumed at its last step, the run writes exactly those weights)."""
    from accelerate import Accelerator
    from accelerate.utils import save
    from safetensors.torch import save_model

    from mmpos.models import EMA, DiT
    from mmpos.training.scaffold.loop import train
    from mmpos.training.tasks.dit import DiTConfig, DiTTask

    config, _ = parse_config(DiTConfig, build_parser(DiTConfig, "t"), dit_argv(tmp_path / "old", 2))
    task = DiTTask(config)
    model = task.build_model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    ema = EMA(model, 0.5)
    ema.num_updates += 2
    with torch.no_grad():
        for p in ema.parameters():
            p.mul_(0.5)
    accelerator = Accelerator(cpu=True)
    prepared, optimizer = accelerator.prepare(model, task.build_optimizer(model))
    folder = tmp_path / "old" / "checkpoint-2"
    accelerator.save_state(str(folder))
    if ema_file == "ema.safetensors":
        save_model(ema, str(folder / ema_file))
    else:
        save(ema.state_dict(), folder / ema_file)
    result = train(DiTTask(config), resume="latest")
    assert result.losses == {}  # already at its last step
    for name, value in model.state_dict().items():
        assert torch.equal(result.model.state_dict()[name], value), name
    for name, value in ema.state_dict().items():
        assert torch.equal(result.ema.state_dict()[name], value), name
    exported = DiT.from_pretrained(tmp_path / "old" / "model_ema")
    assert all(torch.equal(exported.state_dict()[k], v) for k, v in ema.model.state_dict().items())


@pytest.mark.parametrize("engine", ["FSDP", "DEEPSPEED"])
def test_every_trainer_refuses_a_sharded_engine_by_name(monkeypatch, tmp_path, engine):
    """accelerate launched with an FSDP / DeepSpeed config: the trainers (whole-model checkpoints, DDP) stop with a
    one-line error naming the engine, instead of writing checkpoints of shards (docs/scaling.md)."""
    import accelerate
    from accelerate.utils import DistributedType

    from mmpos.training import ViTConfig
    from mmpos.training.scaffold import loop, processes
    from mmpos.training.scaffold.config import ConfigError
    from mmpos.training.tasks import vit as vit_train
    from mmpos.training.tasks.dit import DiTConfig

    class ShardingAccelerator:  # what accelerate's state says under `accelerate launch --config_file fsdp2.yaml`
        def __init__(self, **kwargs):
            self.distributed_type = DistributedType[engine]

    monkeypatch.setattr(accelerate, "Accelerator", ShardingAccelerator)
    calls = {  # every trainer's accelerator comes from the one factory, processes.make_accelerator
        "the DiT trainer": lambda: loop.task_accelerator(DiTConfig()),
        "the world trainers": lambda: processes.make_accelerator("no", "the world trainers"),
        "the ViT trainer": lambda: vit_train._make_accelerator(ViTConfig(), tmp_path),
    }
    for trainer, call in calls.items():
        with pytest.raises(ValueError, match=f"^{trainer} trains one whole model .* distributed_type {engine}: launch"):
            call()
    with pytest.raises(ConfigError):  # the ViT command line's one-line error (exit code 2)
        calls["the ViT trainer"]()
