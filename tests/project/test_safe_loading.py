"""No loader runs code from a file a user was given: a pickle payload (an object whose ``__reduce__`` creates a
marker file) placed where each loader reads is never executed, and is refused with an error naming the file.
Also: ViT checkpoints hold no pickle at all, and checkpoints of the earlier accelerate layout still resume, to the
same losses."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mmpos._safe_state import UnsafeStateError, join_optimizer_state, load_torch_file, read_json, read_tensors
from mmpos.cli import main as mmpos_main
from mmpos.training import train_vit
from mmpos.training.scaffold.folders import UnreadableCheckpointError, checkpoints
from mmpos.training.task_configs import WorldImageConfig
from mmpos.training.vit_eval_cli import eval_main
from tests.training.test_train_vit import read_log, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]


class Payload:
    """Unpickling this creates ``marker`` (what an attacker's file would do with a shell command)."""

    def __init__(self, marker: Path):
        self.marker = Path(marker)

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def plant(path: Path, marker: Path, wrap=lambda p: {"model": p}) -> Path:
    """Write a torch file at ``path`` whose unpickling creates ``marker``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(wrap(Payload(marker)), path)
    return path


def test_the_payload_is_real_and_load_torch_file_refuses_it(tmp_path):
    marker = tmp_path / "marker"
    path = plant(tmp_path / "evil.pt", marker)
    with pytest.raises(UnsafeStateError, match=r"evil\.pt: refused"):
        load_torch_file(path)
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the control: a pickle-loading reader runs it
    assert marker.exists()


# ------------------------------------------------------------------------------------------------ ViT trainer


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    """A finished 4-update run with EMA and gradient accumulation (checkpoints at 2 and 4), and its data (3 batches
    per epoch: an epoch ends on an accumulation of one batch)."""
    from mmpos.world.positional import write_positional_folder

    root = tmp_path_factory.mktemp("safe_vit")
    write_positional_folder(root / "data" / "train", 32, seed=0, task="relation", image_size=32)
    write_positional_folder(root / "data" / "val", 12, seed=1, task="relation", image_size=32)
    config = tiny_config(
        root / "data",
        steps=4,
        checkpoint_every=2,
        ema_decay=0.9,
        grad_accum=2,
        batch_size=10,
        eval_sizes=[32],
        eval_extrapolation=["none"],
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tests' resumed runs (one_thread): the same reductions, bit for bit
    try:
        train_vit(replace(config, out=str(root / "whole")))
    finally:
        torch.set_num_threads(threads)
    return config, root


def test_vit_checkpoints_hold_no_pickle(vit_run):
    _, root = vit_run
    names = {p.name for p in checkpoints(root / "whole")[-1].iterdir()}
    assert names == {
        "model.safetensors",
        "optimizer.safetensors",
        "optimizer.json",
        "ema.safetensors",
        "config.yaml",
        "progress.json",
        "rng_0.json",
    }


def _copy_run(root: Path, name: str, keep_step: int) -> Path:
    """The run as it was right after the ``keep_step`` checkpoint."""
    import shutil

    run = root / name
    shutil.copytree(root / "whole", run)
    for folder in checkpoints(run):
        if folder.name != f"checkpoint-{keep_step}":
            shutil.rmtree(folder)
    for leftover in ("results.json", "results.png", "model.safetensors"):
        (run / leftover).unlink()
    lines = (run / "log.csv").read_text().splitlines()
    (run / "log.csv").write_text("\n".join(lines[: keep_step + 1]) + "\n")
    return run


def to_previous_layout(folder: Path) -> Path:
    """Rewrite a scaffold checkpoint ``RUN/checkpoint-N`` as the ViT trainer wrote it before the scaffold:
    ``RUN/checkpoints/step_000000N`` with ``trainer_state.json`` and plain ``rng_<r>.json`` files."""
    progress = read_json(folder / "progress.json")
    data = dict(progress["data"])
    step = data.pop("accelerator_step")
    (folder / "trainer_state.json").write_text(
        json.dumps(
            {
                "format": 1,
                "progress": data,
                "scheduler": progress["scheduler"],
                "accelerator_step": step,
                "scaler": progress["scaler"],
            }
        )
    )
    for rng in folder.glob("rng_*.json"):
        rng.write_text(json.dumps(read_json(rng)["rng"]))
    for new in ("progress.json", "config.yaml"):
        (folder / new).unlink()
    old = folder.parent / "checkpoints" / f"step_{progress['step']:07d}"
    old.parent.mkdir(exist_ok=True)
    folder.rename(old)
    return old


def to_accelerate_layout(folder: Path) -> None:
    """Rewrite a checkpoint as ``accelerator.save_state`` wrote it before (scheduler, progress and EMA registered
    for checkpointing: ``custom_checkpoint_0/1/2.pkl``; optimizer and RNG as torch pickles)."""
    from accelerate.utils import save

    if (folder / "progress.json").is_file():
        folder = to_previous_layout(folder)
    saved = read_json(folder / "trainer_state.json")
    optimizer = join_optimizer_state(
        read_tensors(folder / "optimizer.safetensors"), read_json(folder / "optimizer.json"), {"param_groups": []}
    )
    save(optimizer, folder / "optimizer.bin")
    save(saved["scheduler"], folder / "custom_checkpoint_0.pkl")
    save(saved["progress"], folder / "custom_checkpoint_1.pkl")
    save(read_tensors(folder / "ema.safetensors"), folder / "custom_checkpoint_2.pkl")
    rng = read_json(folder / "rng_0.json")
    version, internal, gauss = rng["python"]
    name, keys, pos, has_gauss, cached = rng["numpy"]
    torch_state = torch.frombuffer(bytearray(__import__("base64").b64decode(rng["torch"])), dtype=torch.uint8)
    save(
        {
            "step": saved["accelerator_step"],
            "random_state": (version, tuple(internal), gauss),
            "numpy_random_seed": (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached),
            "torch_manual_seed": torch_state,
        },
        folder / "random_states_0.pkl",
    )
    for new in ("optimizer.safetensors", "optimizer.json", "ema.safetensors", "trainer_state.json", "rng_0.json"):
        (folder / new).unlink()


def test_an_accelerate_layout_checkpoint_resumes_to_the_same_losses(vit_run):
    config, root = vit_run
    run = _copy_run(root, "old_layout", 2)
    to_accelerate_layout(checkpoints(run)[-1])
    random.seed(123)  # generators elsewhere: the checkpoint's RNG states must be what counts
    np.random.seed(123)
    train_vit(replace(config, out=str(run)), resume=True)
    assert read_log(run) == read_log(root / "whole")  # (update, loss) to the printed digit
    assert (run / "model.safetensors").read_bytes() == (root / "whole" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("layout", ["scaffold", "previous"])
def test_new_layout_resume_is_bit_identical_with_ema_and_accumulation(vit_run, layout):
    """The scaffold's ``checkpoint-2`` and the layout before it (``checkpoints/step_0000002``) resume alike."""
    config, root = vit_run
    run = _copy_run(root, f"new_layout_{layout}", 2)
    if layout == "previous":
        to_previous_layout(checkpoints(run)[-1])
        assert [c.name for c in checkpoints(run)] == ["step_0000002"]
    train_vit(replace(config, out=str(run)), resume=True)
    assert read_log(run) == read_log(root / "whole")  # (update, loss) to the printed digit
    assert (run / "model.safetensors").read_bytes() == (root / "whole" / "model.safetensors").read_bytes()
    assert checkpoints(run)[-1].name == "checkpoint-4"  # a resumed old run continues in the new layout


def _vit_commands(run: Path, out: Path, config_path: Path):
    base = ["train", "vit", "--config", str(config_path), "--out", str(run)]
    return {
        "train --resume": lambda: mmpos_main(base + ["--resume"]),
        "eval_vit RUN": lambda: eval_main([str(run), "--out", str(out)]),
    }


@pytest.mark.parametrize("command", ["train --resume", "eval_vit RUN"])
def test_a_tampered_custom_checkpoint_never_runs(vit_run, tmp_path, capsys, command):
    import yaml

    config, root = vit_run
    run = _copy_run(root, f"tampered_{command.replace(' ', '_').replace('-', '')}", 4)
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(asdict(config)))
    # in a checkpoint of this version the file is not read at all
    marker = tmp_path / "marker"
    plant(checkpoints(run)[-1] / "custom_checkpoint_0.pkl", marker, wrap=lambda p: p)
    assert _vit_commands(run, tmp_path / "eval_new", config_path)[command]() == 0
    assert not marker.exists()
    # in one of the earlier accelerate layout it is read, without pickle: refused, named, exit code 2
    (checkpoints(run)[-1] / "custom_checkpoint_0.pkl").unlink()
    to_accelerate_layout(checkpoints(run)[-1])
    plant(checkpoints(run)[-1] / "custom_checkpoint_0.pkl", marker, wrap=lambda p: p)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        _vit_commands(run, tmp_path / "eval_old", config_path)[command]()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "custom_checkpoint_0.pkl: refused" in err and len(err.strip().splitlines()) == 1, err
    assert not marker.exists()


def test_other_tampered_parts_of_an_old_checkpoint_are_refused(vit_run, tmp_path):
    config, root = vit_run
    for part in ("optimizer.bin", "random_states_0.pkl", "custom_checkpoint_1.pkl", "custom_checkpoint_2.pkl"):
        run = _copy_run(root, f"part_{part}", 4)
        to_accelerate_layout(checkpoints(run)[-1])
        marker = tmp_path / f"marker_{part}"
        plant(checkpoints(run)[-1] / part, marker, wrap=lambda p: p)
        with pytest.raises(UnreadableCheckpointError, match=part.replace(".", r"\.") + ": refused"):
            train_vit(replace(config, out=str(run)), resume=True)
        assert not marker.exists()


# ------------------------------------------------------------------------------------------------ NVS


@pytest.fixture(scope="module")
def triples():
    from mmpos.world.nvs_data import make_triples

    return make_triples("train", 1, 2, size=16, objects=3)


def test_nvs_checkpoints_with_a_payload_are_refused(triples, tmp_path):
    from mmpos.training.task_configs import NVSConfig
    from mmpos.training.tasks.nvs import load_trained, train_nvs

    marker = tmp_path / "marker"
    recipe = NVSConfig("ucpe", seed=1, steps=2, batch_size=2, warmup=1, dim=48, depth=1)
    evil = plant(tmp_path / "ucpe_s1.pt", marker)
    with pytest.raises(UnsafeStateError, match=r"ucpe_s1\.pt: refused"):
        train_nvs(recipe, triples, str(evil), log=lambda _: None)  # resume
    start = NVSConfig(**dict(vars(recipe), init_from=str(evil)))
    with pytest.raises(UnsafeStateError, match=r"ucpe_s1\.pt: refused"):
        train_nvs(start, triples, str(tmp_path / "new.pt"), log=lambda _: None)  # init_from
    with pytest.raises(UnsafeStateError, match=r"ucpe_s1\.pt: refused"):
        load_trained(str(evil))
    assert not marker.exists()
    # a genuine checkpoint still loads
    train_nvs(recipe, triples, str(tmp_path / "good.pt"), log=lambda _: None)
    assert load_trained(str(tmp_path / "good.pt"), image_size=16) is not None


@pytest.mark.parametrize("command", [["train", "--encoding", "ucpe", "--steps", "1"], ["report"]])
def test_eval_nvs_refuses_a_tampered_data_file(tmp_path, command):
    marker = tmp_path / "marker"
    plant(tmp_path / "out" / "data.pt", marker, wrap=lambda p: {"train": p, "test": p})
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "eval_nvs.py"), "--out", str(tmp_path / "out"), *command],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "data.pt: refused" in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists()


# ------------------------------------------------------------------------------------------------ world video


@pytest.fixture(scope="module")
def clips():
    from mmpos.world.video_data import make_clips

    return make_clips("test", 2, 2)


def tiny_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=(8, 8),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=4,
    )


def test_world_video_state_with_a_payload_is_refused(clips, tmp_path):
    from mmpos.pipelines.world.video_export import stage_summary
    from mmpos.training.task_configs import WorldVideoConfig
    from mmpos.training.tasks.world_video import train_stage

    marker = tmp_path / "marker"
    run = tmp_path / "run"
    plant(run / "state.pt", marker, wrap=lambda p: {"recipe": p, "finished": True})
    recipe = WorldVideoConfig("vae", steps=1, batch_size=2)
    with pytest.raises(UnsafeStateError, match=r"state\.pt: refused"):  # --resume
        train_stage(recipe, clips, run, tiny_vae(), log=lambda _: None)
    with pytest.raises(UnsafeStateError, match=r"state\.pt: refused"):  # --init-from
        train_stage(
            WorldVideoConfig("base", steps=1, batch_size=2, init_from=str(run)),
            clips,
            tmp_path / "next",
            tiny_vae(),
            log=lambda _: None,
        )
    with pytest.raises(UnsafeStateError, match=r"state\.pt: refused"):  # export_world_video.py --runs
        stage_summary(run)
    assert not marker.exists()


def test_world_video_clip_cache_with_a_payload_is_refused(tmp_path):
    from mmpos.training.tasks.world_video import cached_clips

    marker = tmp_path / "marker"
    plant(tmp_path / "clips-train.pt", marker, wrap=lambda p: {"frames": p})
    with pytest.raises(UnsafeStateError, match=r"clips-train\.pt: refused"):
        cached_clips(tmp_path, 1, 2, 32)
    assert not marker.exists()


def test_export_world_video_cli_names_the_tampered_state(tmp_path):
    marker = tmp_path / "marker"
    plant(tmp_path / "runs" / "vae" / "state.pt", marker, wrap=lambda p: {"finished": p})
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "export_world_video.py"),
            "--runs",
            str(tmp_path / "runs"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "state.pt: refused" in done.stderr, done.stderr[-2000:]
    assert not marker.exists()


# ------------------------------------------------------------------------------------------------ world trainer


@pytest.mark.parametrize("part, named", [("ema.pt", "ema.pt"), ("optimizer.bin", "train_state-vae")])
def test_world_trainer_state_with_a_payload_is_refused(tmp_path, part, named):
    from mmpos.training.tasks.world_image import WorldTrainer
    from tests.training.test_kill_safety import CONFIG
    from tests.training.test_world_training import write_earlier_layout

    trainer = WorldTrainer(
        WorldImageConfig(**{**CONFIG, "checkpoint_every": 100}), tmp_path, progress=False
    )  # the earlier layout
    write_earlier_layout(trainer)
    marker = tmp_path / "marker"
    plant(tmp_path / "train_state-vae" / part, marker, wrap=lambda p: p)
    with pytest.raises(ValueError, match=named):
        WorldTrainer(WorldImageConfig(**CONFIG), tmp_path, progress=False).load_state()
    assert not marker.exists()


def test_pickle_module_is_not_used_to_load(tmp_path):
    """No loader of the package or its scripts calls pickle.load / torch.load without weights_only=True."""
    import re

    offenders = []
    for path in [
        *ROOT.joinpath("mmpos").rglob("*.py"),
        *ROOT.joinpath("scripts").glob("*.py"),
        *ROOT.joinpath("pipelines").rglob("*.py"),
    ]:
        text = path.read_text()
        offenders += [f"{path}: pickle.load" for _ in re.finditer(r"pickle\.loads?\(", text)]
        for call in re.finditer(r"torch\.load\(([^()]|\([^()]*\))*\)", text):
            if "weights_only=True" not in call.group(0):
                offenders.append(f"{path}: {call.group(0)[:60]}")
    assert offenders == []
