"""The world trainers (image models, world video, NVS) on the training scaffold's checkpoints and on N processes.

One process draws what it drew before the port (a reference loop written here from the recipe's steps gives the
same losses and weights, bit for bit); a run stopped and resumed equals an uninterrupted one bit for bit; the
earlier state layouts still resume; 2 processes (torchrun, gloo) read disjoint slices of the global batch, keep
equal weights, equal one process at twice the batch, and only rank 0 writes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mmpos.training.scaffold_folders import checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("world_ddp_worker.py")

TINY_VAE = dict(block_out_channels=(8, 16), norm_num_groups=4)
TINY_TRANSFORMER = dict(num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
                        joint_attention_dim=16, pooled_projection_dim=16, axes_dims_rope=(2, 2, 4))
TINY_TEXT = dict(width=16, num_layers=1, num_heads=2)
BASE = dict(image_size=32, num_examples=16, batch_size=4, device="cpu", num_samples=1, log_every=1,
            warmup_steps=2, max_minutes=5.0, lr=1e-3, max_steps=4, sample_steps=1, checkpoint_every=2)


class Stop(Exception):
    """Stands for a kill: the process's state is lost, only what is on disk remains."""


@pytest.fixture(scope="module")
def vae_folder(tmp_path_factory):
    from mmpos.training.world.training import train

    out = tmp_path_factory.mktemp("vae")
    train({**BASE, "task": "vae", "vae": TINY_VAE, "max_steps": 1}, out, progress=False)
    return out


def image_config(task: str, vae_folder=None, **changes) -> dict:
    if task == "vae":
        return {**BASE, "task": "vae", "vae": TINY_VAE, **changes}
    return {**BASE, "task": task, "transformer": TINY_TRANSFORMER, "text_encoder": TINY_TEXT,
            "vae_path": str(vae_folder), **changes}


def recorded_losses(trainer) -> list:
    """Wrap ``trainer.loss`` to record every loss, unrounded."""
    losses, original = [], trainer.loss

    def loss(index, generator):
        value = original(index, generator)
        losses.append(value.item())
        return value

    trainer.loss = loss
    return losses


def state_of(trainer) -> dict:
    tensors = {f"model.{k}": v.detach().clone() for k, v in trainer.raw.state_dict().items()}
    tensors.update({f"ema.{k}": v.detach().clone() for k, v in trainer.ema.state_dict().items()})
    return tensors


def assert_same(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if atol == 0.0:
            assert torch.equal(a[name], b[name]), name
        else:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)


# ---------------------------------------------------------------- image models: one process as before
@pytest.mark.parametrize("task", ["t2i", "fill"])
def test_image_trainer_draws_what_the_recipe_draws(tmp_path, vae_folder, task):
    """A reference loop (the recipe: one generator seeded ``seed``, per step indices, sigmas, noise, caption
    dropout; AdamW, warm-up, clip 1.0) gives the trainer's losses and weights bit for bit."""
    from mmpos.models.world.image import build_text_encoder, build_transformer, vae_scale_factor
    from mmpos.training.world.checkpoints import DenoiserWithText, load_trained_vae
    from mmpos.training.world.losses import denoiser_loss
    from mmpos.training.world.trainer import DEFAULTS, WorldTrainer
    from mmpos.training.world.training_data import TrainingData

    config = {**DEFAULTS, **image_config(task, vae_folder)}
    trainer = WorldTrainer(config, tmp_path, progress=False)
    losses = recorded_losses(trainer)
    trainer.run({"stop": False})

    torch.manual_seed(config["seed"])
    vae = load_trained_vae(vae_folder, "cpu")
    transformer = build_transformer(task, vae.config.latent_channels, vae_scale_factor(vae), **TINY_TRANSFORMER)
    model = DenoiserWithText(transformer, build_text_encoder(transformer, **TINY_TEXT))
    data = TrainingData(config, "cpu", vae, model.text_encoder)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / config["warmup_steps"]))
    generator, expected = torch.Generator().manual_seed(config["seed"]), []
    for _ in range(config["max_steps"]):
        index = torch.randint(0, data.num, (config["batch_size"],), generator=generator)
        sigmas = torch.sigmoid(torch.randn(len(index), generator=generator))
        noise = torch.randn(data.latents[index].shape, generator=generator)
        tokens = data.tokens_for(index, generator, config["caption_dropout"], config["style_dropout"])
        loss = denoiser_loss(model, data, index, sigmas, noise, tokens)
        expected.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    assert losses == expected
    assert_same({k: v for k, v in state_of(trainer).items() if k.startswith("model.")},
                {f"model.{k}": v for k, v in model.state_dict().items()})


# ---------------------------------------------------------------- image models: resume
@pytest.mark.parametrize("task", ["vae", "t2i"])
def test_image_trainer_killed_and_resumed_equals_uninterrupted(tmp_path, vae_folder, task):
    from mmpos.training.world.trainer import WorldTrainer

    config = image_config(task, vae_folder, max_steps=5)
    whole = WorldTrainer(config, tmp_path / "whole", progress=False)
    whole_losses = recorded_losses(whole)
    whole.run({"stop": False})

    killed = WorldTrainer(config, tmp_path / "run", progress=False)
    original = killed.loss
    killed.loss = lambda index, generator: (_ for _ in ()).throw(Stop()) if killed.step == 3 else \
        original(index, generator)
    with pytest.raises(Stop):
        killed.run({"stop": False})
    assert [p.name for p in checkpoints(tmp_path / "run" / f"train-{task}")] == ["checkpoint-2"]
    resumed = WorldTrainer(config, tmp_path / "run", progress=False)
    resumed.load_state()
    assert resumed.step == 2
    losses = recorded_losses(resumed)
    resumed.run({"stop": False})
    assert losses == whole_losses[2:]
    assert resumed.history == whole.history
    assert_same(state_of(resumed), state_of(whole))


def write_earlier_layout(trainer) -> Path:
    """``train_state-<task>/`` as the trainer wrote it before the scaffold: accelerate's ``save_state`` of the
    prepared model, optimiser and scheduler, ``ema.pt`` and ``progress.json``."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    accelerator.prepare(trainer.raw, trainer.optimizer.optimizer, trainer.scheduler)
    folder = trainer.state_dir
    accelerator.save_state(str(folder))
    torch.save(trainer.ema.state_dict(), folder / "ema.pt")
    (folder / "progress.json").write_text(json.dumps({"step": trainer.step, "trained_seconds": 1.0,
                                                      "history": trainer.history, "initial_validation": 0.5}))
    return folder


def test_an_earlier_train_state_folder_resumes(tmp_path):
    from mmpos.training.world.trainer import WorldTrainer

    config = image_config("vae", max_steps=3, checkpoint_every=100)
    first = WorldTrainer(config, tmp_path, progress=False)
    first.config["max_steps"] = 2
    first.run({"stop": False})
    folder = write_earlier_layout(first)
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= \
        {p.name for p in folder.iterdir()}
    resumed = WorldTrainer(config, tmp_path, progress=False)
    resumed.load_state()
    assert (resumed.step, resumed.history, resumed.initial_validation) == (2, first.history, 0.5)
    assert_same(state_of(resumed), state_of(first))
    assert resumed.scheduler.state_dict()["last_epoch"] == 2
    resumed.run({"stop": False})  # goes on, its draws re-seeded at seed + step as the earlier layout's runs were
    assert resumed.step == 3 and [p.name for p in checkpoints(tmp_path / "train-vae")] == []
    resumed.save_state()
    assert [p.name for p in checkpoints(tmp_path / "train-vae")] == ["checkpoint-3"]


# ---------------------------------------------------------------- 2 processes
def torchrun(kind: str, spec: dict, records: Path, port: int, processes: int = 2):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(WORKER.parent)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
               str(port), str(WORKER), kind, json.dumps(spec), str(records)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((records / f"rank{r}.json").read_text()) for r in range(processes)]


def check_ranks(records: Path, single: dict, atol: float) -> list:
    weights = [load_file(str(records / f"rank{r}.safetensors")) for r in (0, 1)]
    assert_same(weights[0], weights[1])  # equal across ranks, bit for bit
    assert_same(weights[0], single, atol=atol)  # and equal to one process at twice the batch
    return weights


def test_image_trainer_two_processes_equal_one_at_twice_the_batch(tmp_path, vae_folder):
    from mmpos.training.world.trainer import WorldTrainer

    config = image_config("t2i", vae_folder, batch_size=2, max_steps=3)
    ranks = torchrun("image", {"config": config, "out": str(tmp_path / "two")}, tmp_path, 29561)
    one = WorldTrainer({**config, "batch_size": 4}, tmp_path / "one", progress=False)
    one.run({"stop": False})
    check_ranks(tmp_path, {k: v.cpu() for k, v in state_of(one).items()}, atol=1e-5)
    assert all(r["num_processes"] == 2 for r in ranks)
    assert [s for s, _ in ranks[0]["losses"]] == [s for s, _ in one.history]
    for (_, two_loss), (_, one_loss) in zip(ranks[0]["losses"], one.history):  # logged: the mean over ranks
        assert abs(two_loss - one_loss) < 1e-4
    assert set(ranks[1]["written"]) == {"rng_1.json"}  # rank 1 writes only its generators
    assert {"rng_0.json", "model.safetensors", "world-t2i"} <= set(ranks[0]["written"])
    for checkpoint in checkpoints(tmp_path / "two" / "train-t2i"):
        assert {"rng_0.json", "rng_1.json", "world_progress.json"} <= {p.name for p in checkpoint.iterdir()}
    assert (tmp_path / "two" / "world-t2i" / "model_index.json").is_file()
