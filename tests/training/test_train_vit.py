"""The ViT trainer on a generated ImageFolder: resume to identical losses, refusal to overwrite, evaluation at
two resolutions, frozen parts and weight decay, and a 2-process gloo run (torchrun)."""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from mmpos.cli import main as mmpos_main
from mmpos.training import ViTConfig, build_vit, train_vit
from mmpos.training.scaffold.config import ConfigError
from mmpos.training.scaffold.folders import RunExistsError, UnreadableCheckpointError, checkpoints
from mmpos.world.positional import write_positional_folder
from tests.fixtures.torchrun import rank_records
from tests.fixtures.torchrun import torchrun as run_workers

TINY_MODEL = {"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2, "class_token": False, "global_pool": "avg"}
WORKER = Path(__file__).parents[1] / "workers" / "vit_ddp_worker.py"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("world_relation")
    write_positional_folder(root / "train", 32, seed=0, task="relation", image_size=32)
    write_positional_folder(root / "val", 12, seed=1, task="relation", image_size=32)
    return root


def tiny_config(data_dir, **changes) -> ViTConfig:
    """Every random part on (RandAugment, erasing, mixup/CutMix, drop path, random crops) to test resume."""
    overrides = {
        "model": "vit_tiny_patch16_224",
        "model_kwargs": TINY_MODEL,
        "pe": "rope_mixed",
        "data_dir": str(data_dir),
        "img_size": 32,
        "batch_size": 8,
        "num_workers": 0,
        "steps": 6,
        "warmup_steps": 2,
        "checkpoint_every": 4,
        "log_every": 1,
        "scale": [0.5, 1.0],
        "drop_path": 0.1,
        "mean": [0.5] * 3,
        "std": [0.5] * 3,
        "eval_sizes": [32, 48],
        "eval_extrapolation": ["none", "pi"],
    }
    return ViTConfig(**{**overrides, **changes})


def read_log(run: Path) -> list[tuple[str, str]]:
    with open(run / "log.csv") as f:
        return [(row["step"], row["loss"]) for row in csv.DictReader(f)]


def test_resume_continues_with_identical_losses(data_dir, tmp_path):
    config = tiny_config(data_dir)
    whole = tmp_path / "whole"
    results = train_vit(replace(config, out=str(whole)))
    assert [c.name for c in checkpoints(whole)] == ["checkpoint-4", "checkpoint-6"]
    # an interrupted copy: the run as it was right after the update-4 checkpoint (mid-epoch: 4 batches/epoch)
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoint-6")
    for name in ("results.json", "model.safetensors"):
        (cut / name).unlink()
    log_lines = (whole / "log.csv").read_text().splitlines()
    (cut / "log.csv").write_text("\n".join(log_lines[:5]) + "\n")  # header + updates 1-4
    resumed = train_vit(replace(config, out=str(cut)), resume=True)
    assert read_log(cut) == read_log(whole)  # the same loss, to the printed digit, at updates 5 and 6
    assert len(read_log(whole)) == 6
    for run in (whole, cut):  # and the same weights
        assert (run / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()
    sizes = {(row["size"], row["extrapolation"]) for row in results["eval"]}
    assert sizes == {(32, "none"), (48, "none"), (48, "pi")}
    assert results["eval"] == resumed["eval"]
    assert json.loads((whole / "results.json").read_text())["steps"] == 6
    assert (whole / "results.png").stat().st_size > 0


def test_eval_vit_on_a_trained_run(data_dir, tmp_path, capsys):
    from mmpos.training.vit_eval_cli import eval_main

    run = tmp_path / "run"
    results = train_vit(tiny_config(data_dir, steps=2, checkpoint_every=2, out=str(run)))
    out = tmp_path / "eval" / "eval.json"
    eval_main(
        [
            str(run),
            "--sizes",
            "32",
            "64",
            "--aspects",
            "1",
            "1.5",
            "--extrapolation",
            "none",
            "pi",
            "--out",
            str(out.parent),
        ]
    )
    rows = json.loads(out.read_text())["run"]
    trained_32 = next(r for r in results["eval"] if r["size"] == 32)
    evaluated_32 = next(r for r in rows if r["size"] == 32 and r["aspect"] == 1)
    assert evaluated_32["top1"] == trained_32["top1"]  # the checkpoint is the trained model
    assert {(r["height"], r["width"], r["extrapolation"]) for r in rows} == {
        (32, 32, "none"),
        (32, 48, "none"),
        (32, 48, "pi"),
        (64, 64, "none"),
        (64, 64, "pi"),
        (64, 96, "none"),
        (64, 96, "pi"),
    }
    assert out.with_suffix(".png").exists()
    assert not (run / "eval_results.json").exists()  # eval_vit writes only --out
    with pytest.raises(SystemExit):  # and never over an existing file
        eval_main([str(run), "--out", str(out.parent)])
    other = tmp_path / "other"
    other.mkdir()
    (other / "eval.png").write_text("someone's plot")
    with pytest.raises(SystemExit) as exit_info:  # nor over the plot it would write
        eval_main([str(run), "--out", str(other)])
    assert exit_info.value.code == 2 and "eval.png exists" in capsys.readouterr().err
    assert (other / "eval.png").read_text() == "someone's plot" and not (other / "eval.json").exists()
    with pytest.raises(SystemExit) as exit_info:  # --out is a folder, as in every mmpos command
        eval_main([str(run), "--out", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2 and "expected a folder" in capsys.readouterr().err


def test_refuses_to_write_into_an_existing_run(data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("someone else's run")
    with pytest.raises(RunExistsError, match="--resume"):
        train_vit(tiny_config(data_dir, steps=1, out=str(run)))
    with pytest.raises(SystemExit) as exit_info:
        mmpos_main(["train", "vit", "--output-dir", str(run), "--set", f"data_dir={data_dir}"])
    assert exit_info.value.code == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (run / "notes.txt").exists()
    with pytest.raises(SystemExit) as exit_info:  # a file where the run folder should go
        mmpos_main(["train", "vit", "--output-dir", str(run / "notes.txt"), "--set", f"data_dir={data_dir}"])
    assert exit_info.value.code == 2 and "is a file" in capsys.readouterr().err


def test_unknown_config_key_is_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: vit_tiny_patch16_224\n")
    with pytest.raises(ConfigError, match="learning_rate"):
        ViTConfig.from_file(bad, learning_rate=0.1)
    bad.write_text("model: vit_tiny_patch16_224\nwarmup: 3\n")
    with pytest.raises(ConfigError, match="'warmup'"):
        ViTConfig.from_file(bad)
    with pytest.raises(ConfigError, match="ape"):
        ViTConfig(ape="maybe")


def test_unknown_model_is_refused_before_the_run_folder_is_made(tmp_path, capsys):
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        mmpos_main(["train", "vit", "--output-dir", str(run), "--model", "vit_nosuch_patch16"])
    assert exit_info.value.code == 2
    assert "vit_nosuch_patch16" in capsys.readouterr().err
    assert not run.exists()
    from mmpos.training.tasks.vit import check_model_name

    check_model_name("hf-hub:timm/vit_tiny_patch16_224")  # resolved when built: accepted now


def test_train_only_pe_head_and_no_decay_on_pe(data_dir):
    from mmpos.training.tasks.vit import _optimizer_and_scheduler

    config = tiny_config(data_dir, train_only="pe,head")
    model = build_vit(config, 4)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"blocks.0.attn.pe.freqs", "head.weight", "head.bias", "fc_norm.weight", "fc_norm.bias"}
    optimizer, _ = _optimizer_and_scheduler(config, model)
    decay_of = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    named = dict(model.named_parameters())
    assert decay_of[id(named["blocks.0.attn.pe.freqs"])] == 0.0
    assert decay_of[id(named["head.weight"])] == config.weight_decay
    assert id(named["blocks.0.attn.qkv.weight"]) not in decay_of  # frozen: not optimised at all


def test_ape_warm_start_choices(data_dir):
    model_kwargs = {**TINY_MODEL, "class_token": True, "global_pool": "token"}
    keep = build_vit(tiny_config(data_dir, model_kwargs=model_kwargs, ape="keep"), 4)
    drop = build_vit(tiny_config(data_dir, model_kwargs=model_kwargs, ape="drop"), 4)
    resample = build_vit(tiny_config(data_dir, model_kwargs=model_kwargs, ape="resample", pe=None), 4)
    assert keep.pos_embed is not None and drop.pos_embed is None
    assert resample.mmpos_pe == "ape_learned" and resample(torch.randn(1, 3, 48, 48)).shape == (1, 4)
    with pytest.raises(ConfigError, match="ape=resample"):
        build_vit(tiny_config(data_dir, ape="resample"), 4)


def test_two_process_gloo_run(data_dir, tmp_path):
    """torchrun --nproc_per_node 2 (gloo on CPU): the ranks read different samples and end with equal weights."""
    config = tiny_config(data_dir, steps=3, eval_sizes=[32], eval_extrapolation=["none"])
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(asdict(config)))
    done = run_workers(WORKER, [config_path, tmp_path / "run", tmp_path], 29517, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = rank_records(tmp_path)
    seen = [{tuple(pair) for pair in r["indices"]} for r in ranks]  # (epoch, index): 2 updates per epoch
    assert min(len(s) for s in seen) >= 3 * 8  # 3 updates of 8 (plus the loader's look-ahead)
    assert not seen[0] & seen[1]  # within an epoch, the ranks read disjoint samples
    assert {i for e, i in seen[0] | seen[1] if e == 0} == set(range(32))  # and together all of them
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert ranks[0]["num_processes"] == 2
    saved = {p.name for p in checkpoints(tmp_path / "run")[-1].iterdir()}
    assert {"rng_0.json", "rng_1.json", "model.safetensors"} <= saved  # every process's generators, no pickle
    assert not [name for name in saved if name.endswith((".pkl", ".bin", ".pt"))]


def test_open_clip_tower_trains_and_evaluates(data_dir, tmp_path):
    tiny = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 8, "vocab_size": 50, "width": 16, "heads": 2, "layers": 1},
    }
    config = tiny_config(data_dir, model="open_clip:ViT-B-32", model_kwargs=tiny, steps=2, mixup=0.0, cutmix=0.0)
    results = train_vit(replace(config, out=str(tmp_path / "clip")))
    rows = {(r["size"], r["extrapolation"]): r["top1"] for r in results["eval"]}
    assert set(rows) == {(32, "none"), (48, "none"), (48, "pi")} and all(v is not None for v in rows.values())
    frozen = build_vit(tiny_config(data_dir, model="open_clip:ViT-B-32", model_kwargs=tiny, train_only="pe,head"), 4)
    trainable = {n for n, p in frozen.named_parameters() if p.requires_grad}
    assert trainable == {"visual.transformer.resblocks.0.attn.pe.freqs", "head.weight", "head.bias"}


def test_a_truncated_checkpoint_is_named_on_resume(data_dir, tmp_path):
    config = tiny_config(data_dir, steps=4, eval_sizes=[32], eval_extrapolation=["none"])
    train_vit(replace(config, out=str(tmp_path / "run")))
    weights = checkpoints(tmp_path / "run")[-1] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:64])
    with pytest.raises(
        UnreadableCheckpointError,
        match=r"checkpoint-4: cannot be resumed \(.*checkpoint-4/model.safetensors: \d+ bytes, recorded \d+",
    ):
        train_vit(replace(config, out=str(tmp_path / "run")), resume=True)  # was: SafetensorError without the folder
