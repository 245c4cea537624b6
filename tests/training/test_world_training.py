"""The world trainers (image models, world video, NVS) on the training scaffold's checkpoints and on N processes.

One process draws what it drew before the port (a reference loop written here from the recipe's steps gives the
same losses and weights, bit for bit); a run stopped and resumed equals an uninterrupted one bit for bit; the
earlier state layouts still resume; 2 processes (torchrun, gloo) read disjoint slices of the global batch, keep
equal weights, equal one process at twice the batch, and only rank 0 writes."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mmpos.training.scaffold.folders import checkpoints
from mmpos.training.task_configs import NVSConfig, WorldImageConfig, WorldVideoConfig
from tests.fixtures.torchrun import rank_records
from tests.fixtures.torchrun import torchrun as run_workers

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parents[1] / "workers" / "world_ddp_worker.py"

TINY_VAE = dict(block_out_channels=(8, 16), norm_num_groups=4)
TINY_TRANSFORMER = dict(
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=8,
    num_attention_heads=2,
    joint_attention_dim=16,
    pooled_projection_dim=16,
    axes_dims_rope=(2, 2, 4),
)
TINY_TEXT = dict(width=16, num_layers=1, num_heads=2)
BASE = dict(
    image_size=32,
    num_examples=16,
    batch_size=4,
    device="cpu",
    num_samples=1,
    log_every=1,
    warmup_steps=2,
    max_minutes=5.0,
    lr=1e-3,
    max_steps=4,
    sample_steps=1,
    checkpoint_every=2,
)


class Stop(Exception):
    """Stands for a kill: the process's state is lost, only what is on disk remains."""


@pytest.fixture(scope="module")
def vae_folder(tmp_path_factory):
    from mmpos.training.tasks.world_image import train

    out = tmp_path_factory.mktemp("vae")
    train(WorldImageConfig(**{**BASE, "task": "vae", "vae": TINY_VAE, "max_steps": 1}), out, progress=False)
    return out


def image_config(task: str, vae_folder=None, **changes) -> dict:
    if task == "vae":
        return {**BASE, "task": "vae", "vae": TINY_VAE, **changes}
    return {
        **BASE,
        "task": task,
        "transformer": TINY_TRANSFORMER,
        "text_encoder": TINY_TEXT,
        "vae_path": str(vae_folder),
        **changes,
    }


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
    from mmpos.training.tasks.world_image import WorldTrainer
    from mmpos.training.world.checkpoints import DenoiserWithText, load_trained_vae
    from mmpos.training.world.losses import denoiser_loss
    from mmpos.training.world.training_data import TrainingData

    config = WorldImageConfig(**image_config(task, vae_folder))
    trainer = WorldTrainer(config, tmp_path, progress=False)
    losses = recorded_losses(trainer)
    trainer.run({"stop": False})

    torch.manual_seed(config.seed)
    vae = load_trained_vae(vae_folder, "cpu")
    transformer = build_transformer(task, vae.config.latent_channels, vae_scale_factor(vae), **TINY_TRANSFORMER)
    model = DenoiserWithText(transformer, build_text_encoder(transformer, **TINY_TEXT))
    data = TrainingData(config, "cpu", vae, model.text_encoder)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / config.warmup_steps))
    generator, expected = torch.Generator().manual_seed(config.seed), []
    for _ in range(config.max_steps):
        index = torch.randint(0, data.num, (config.batch_size,), generator=generator)
        sigmas = torch.sigmoid(torch.randn(len(index), generator=generator))
        noise = torch.randn(data.latents[index].shape, generator=generator)
        tokens = data.tokens_for(index, generator, config.caption_dropout, config.style_dropout)
        loss = denoiser_loss(model, data, index, sigmas, noise, tokens)
        expected.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    assert losses == expected
    assert_same(
        {k: v for k, v in state_of(trainer).items() if k.startswith("model.")},
        {f"model.{k}": v for k, v in model.state_dict().items()},
    )


# ---------------------------------------------------------------- image models: resume
@pytest.mark.parametrize("task", ["vae", "t2i"])
def test_image_trainer_killed_and_resumed_equals_uninterrupted(tmp_path, vae_folder, task):
    from mmpos.training.tasks.world_image import WorldTrainer

    config = image_config(task, vae_folder, max_steps=5)
    whole = WorldTrainer(WorldImageConfig(**config), tmp_path / "whole", progress=False)
    whole_losses = recorded_losses(whole)
    whole.run({"stop": False})

    killed = WorldTrainer(WorldImageConfig(**config), tmp_path / "run", progress=False)
    original = killed.loss
    killed.loss = lambda index, generator: (
        (_ for _ in ()).throw(Stop()) if killed.step == 3 else original(index, generator)
    )
    with pytest.raises(Stop):
        killed.run({"stop": False})
    assert [p.name for p in checkpoints(tmp_path / "run" / f"train-{task}")] == ["checkpoint-2"]
    resumed = WorldTrainer(WorldImageConfig(**config), tmp_path / "run", progress=False)
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
    (folder / "progress.json").write_text(
        json.dumps(
            {"step": trainer.step, "trained_seconds": 1.0, "history": trainer.history, "initial_validation": 0.5}
        )
    )
    return folder


def test_an_earlier_train_state_folder_resumes(tmp_path):
    from mmpos.training.tasks.world_image import WorldTrainer

    config = image_config("vae", max_steps=3, checkpoint_every=100)
    first = WorldTrainer(WorldImageConfig(**config), tmp_path, progress=False)
    first.config.max_steps = 2
    first.run({"stop": False})
    folder = write_earlier_layout(first)
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= {
        p.name for p in folder.iterdir()
    }
    resumed = WorldTrainer(WorldImageConfig(**config), tmp_path, progress=False)
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
    path = os.pathsep.join([str(WORKER.parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    done = run_workers(WORKER, [kind, json.dumps(spec), records], port, processes, PYTHONPATH=path)
    assert done.returncode == 0, done.stderr[-4000:]
    return rank_records(records, processes)


def check_ranks(
    records: Path, single: dict, atol: float, round_off_only: tuple = (), sign_flips_within: float = 0.0
) -> list:
    """Weights equal across ranks bit for bit, and equal to one process at twice the batch to ``atol`` (except the
    parameters named by ``round_off_only``: their gradient is zero in exact arithmetic, and Adam scales the
    round-off of either run up to the learning rate). ``sign_flips_within``: also let at most 0.1% of the
    elements differ by up to this much (``2 lr steps``: Adam's first updates are ``lr sign(g)``, so an element whose
    gradient is at the round-off level may step the other way when the two runs sum the batch in another order)."""
    weights = [load_file(str(records / f"rank{r}.safetensors")) for r in (0, 1)]
    assert_same(weights[0], weights[1])
    compared = {k: v for k, v in weights[0].items() if not any(part in k for part in round_off_only)}
    assert len(compared) > len(weights[0]) // 2
    if not sign_flips_within:
        assert_same(compared, {k: single[k] for k in compared}, atol=atol)
        return weights
    diffs = [(compared[k].float() - single[k].float()).abs().flatten() for k in compared]
    diff = torch.cat(diffs)
    assert diff.max() <= sign_flips_within, float(diff.max())
    assert int((diff > atol).sum()) <= 1e-3 * diff.numel(), int((diff > atol).sum())
    return weights


def test_image_trainer_two_processes_equal_one_at_twice_the_batch(tmp_path, vae_folder):
    from mmpos.training.tasks.world_image import WorldTrainer

    config = image_config("t2i", vae_folder, batch_size=2, max_steps=3)
    ranks = torchrun("image", {"config": config, "out": str(tmp_path / "two")}, tmp_path, 29561)
    one = WorldTrainer(WorldImageConfig(**{**config, "batch_size": 4}), tmp_path / "one", progress=False)
    one.run({"stop": False})
    flips = 2 * WorldImageConfig(**config).lr * 3  # measured: 22 of 50,593 elements above 1e-6, at most 1.7e-5
    check_ranks(tmp_path, {k: v.cpu() for k, v in state_of(one).items()}, atol=1e-5, sign_flips_within=flips)
    assert all(r["num_processes"] == 2 for r in ranks)
    assert [s for s, _ in ranks[0]["losses"]] == [s for s, _ in one.history]
    for (_, two_loss), (_, one_loss) in zip(ranks[0]["losses"], one.history):  # logged: the mean over ranks
        assert abs(two_loss - one_loss) < 1e-4
    assert set(ranks[1]["written"]) == {"rng_1.json"}  # rank 1 writes only its generators
    assert {"rng_0.json", "model.safetensors", "world-t2i"} <= set(ranks[0]["written"])
    for checkpoint in checkpoints(tmp_path / "two" / "train-t2i"):
        assert {"rng_0.json", "rng_1.json", "world_progress.json"} <= {p.name for p in checkpoint.iterdir()}
    assert (tmp_path / "two" / "world-t2i" / "model_index.json").is_file()


# ---------------------------------------------------------------- world video
VIDEO_SMALL = dict(num_attention_heads=2, attention_head_dim=12, ffn_dim=16, num_layers=1)


def video_run(out: Path, recipe: dict, stop_before: int | None = None):
    """``(state, stage)`` of a tiny world-video stage trained into ``out`` (``stop_before``: a kill at that step)."""
    from diffusers import AutoencoderKL

    from mmpos.models.world import video as video_model
    from mmpos.training.tasks import world_video as video_training
    from mmpos.world.video_data import make_clips

    clips = make_clips("test", 2, 2)
    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(8, 8),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        norm_num_groups=4,
    )
    captured, original_init, schedule = {}, video_training.VideoStage.__init__, video_training.learning_rate

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        captured["stage"] = self

    def learning_rate(recipe, step):
        if step == stop_before:
            raise Stop()
        return schedule(recipe, step)

    saved_config = dict(video_model.TRANSFORMER_CONFIG)
    video_model.TRANSFORMER_CONFIG.update(VIDEO_SMALL)
    video_training.VideoStage.__init__, video_training.learning_rate = init, learning_rate
    try:
        torch.manual_seed(1)
        base = None if recipe["stage"] in ("vae", "base") else video_model.world_video_transformer()
        state = video_training.train_stage(WorldVideoConfig(**recipe), clips, out, vae, base=base, log=lambda _: None)
    finally:
        video_training.VideoStage.__init__, video_training.learning_rate = original_init, schedule
        video_model.TRANSFORMER_CONFIG.clear()
        video_model.TRANSFORMER_CONFIG.update(saved_config)
    return state, captured["stage"]


def trained(stage) -> dict:
    return {k: v.detach().clone() for k, v in stage.trained.state_dict().items()}


@pytest.mark.parametrize("stage", ["vae", "base"])
def test_video_trainer_killed_and_resumed_equals_uninterrupted(tmp_path, stage):
    recipe = dict(stage=stage, steps=4, batch_size=2, checkpoint_every=2, warmup=1)
    whole, whole_stage = video_run(tmp_path / "whole", recipe)
    with pytest.raises(Stop):
        video_run(tmp_path / "run", recipe, stop_before=3)
    assert [p.name for p in checkpoints(tmp_path / "run")] == ["checkpoint-2"]
    resumed, resumed_stage = video_run(tmp_path / "run", recipe)
    assert resumed["losses"] == whole["losses"] and resumed["finished"]
    assert_same(trained(resumed_stage), trained(whole_stage))
    assert (tmp_path / "run" / ("vae" if stage == "vae" else "transformer") / "config.json").is_file()


def test_video_trainer_resumes_an_earlier_state_pt(tmp_path):
    from mmpos.training.tasks.world_video import read_stage_state

    recipe = dict(stage="base", steps=4, batch_size=2, checkpoint_every=2, warmup=1)
    whole, whole_stage = video_run(tmp_path / "whole", recipe)
    with pytest.raises(Stop):
        video_run(tmp_path / "run", recipe, stop_before=3)
    latest = checkpoints(tmp_path / "run")[-1]  # rewritten as the earlier layout's state.pt, then removed
    from mmpos._safe_state import join_optimizer_state, read_json, read_tensors

    progress = read_json(latest / "video_progress.json")
    optimizer = join_optimizer_state(
        read_tensors(latest / "optimizer.safetensors"), read_json(latest / "optimizer.json"), {"param_groups": []}
    )
    torch.save(
        dict(progress, model=read_tensors(latest / "model.safetensors"), optimizer=optimizer),
        tmp_path / "run" / "state.pt",
    )
    for folder in checkpoints(tmp_path / "run"):
        import shutil

        shutil.rmtree(folder)
    assert read_stage_state(tmp_path / "run")["step"] == 2
    resumed, resumed_stage = video_run(tmp_path / "run", recipe)
    assert resumed["losses"] == whole["losses"]
    assert_same(trained(resumed_stage), trained(whole_stage))
    assert [p.name for p in checkpoints(tmp_path / "run")] == ["checkpoint-4"]


def test_video_camera_adapter_two_processes_equal_one_at_twice_the_batch(tmp_path):
    """Each process conditions its slice of the clips on their own trajectories (the adapter's hooks on the frozen
    base)."""
    recipe = dict(stage="ucpe", steps=2, batch_size=1, checkpoint_every=1, warmup=1)
    ranks = torchrun("video", {"out": str(tmp_path / "two"), "recipe": recipe}, tmp_path, 29567)
    one, one_stage = video_run(tmp_path / "one", {**recipe, "batch_size": 2})
    check_ranks(tmp_path, {f"model.{k}": v for k, v in trained(one_stage).items()}, atol=1e-5)
    assert ranks[0]["losses"] == pytest.approx(one["losses"], abs=1e-5)
    assert set(ranks[1]["written"]) == {"rng_1.json"}
    assert (tmp_path / "two" / "camera_adapter" / "config.json").is_file()


def test_video_trainer_two_processes_equal_one_at_twice_the_batch(tmp_path):
    recipe = dict(stage="base", steps=2, batch_size=1, checkpoint_every=1, warmup=1)
    ranks = torchrun("video", {"out": str(tmp_path / "two"), "recipe": recipe}, tmp_path, 29563)
    one, one_stage = video_run(tmp_path / "one", {**recipe, "batch_size": 2})
    # the empty prompt is one constant text: the cross-attention's keys are all equal, so its queries and keys (and
    # norm2, before the queries) get no gradient but round-off
    check_ranks(
        tmp_path,
        {f"model.{k}": v for k, v in trained(one_stage).items()},
        atol=1e-5,
        round_off_only=("attn2.to_q", "attn2.to_k", "attn2.norm_q", "attn2.norm_k", ".norm2."),
    )
    assert ranks[0]["losses"] == pytest.approx(one["losses"], abs=1e-5)  # the mean over the ranks
    assert set(ranks[1]["written"]) == {"rng_1.json"}
    assert {"rng_0.json", "model.safetensors"} <= set(ranks[0]["written"])
    assert (tmp_path / "two" / "transformer" / "config.json").is_file()


# ---------------------------------------------------------------- NVS
def nvs_run(out: Path, recipe: dict, stop_before: int | None = None):
    """``(model, state, accelerator state)`` of a tiny NVS run into ``out/run.pt`` (``stop_before``: a kill)."""
    from accelerate import PartialState

    from mmpos.training.tasks import nvs as nvs_training
    from mmpos.world.nvs_data import make_triples

    triples = make_triples("train", 1, 2, size=16, objects=3)
    schedule = nvs_training.learning_rate

    def learning_rate(recipe, step):
        if step == stop_before:
            raise Stop()
        return schedule(recipe, step)

    nvs_training.learning_rate = learning_rate
    try:
        model, state = nvs_training.train_nvs(
            NVSConfig(**recipe, checkpoint_every=2), triples, str(out / "run.pt"), log=lambda _: None
        )
    finally:
        nvs_training.learning_rate = schedule
    return model, state, PartialState()


NVS_RECIPE = dict(encoding="ucpe", seed=1, steps=5, batch_size=2, warmup=2, dim=48, depth=1)


def test_nvs_trainer_killed_and_resumed_equals_uninterrupted(tmp_path):
    whole, whole_state, _ = nvs_run(tmp_path / "whole", NVS_RECIPE)
    with pytest.raises(Stop):
        nvs_run(tmp_path / "cut", NVS_RECIPE, stop_before=3)
    assert [p.name for p in checkpoints(tmp_path / "cut" / "run")] == ["checkpoint-2"]
    resumed, state, _ = nvs_run(tmp_path / "cut", NVS_RECIPE)
    assert state["losses"] == whole_state["losses"] and state["step"] == 5
    assert_same(resumed.state_dict(), whole.state_dict())


def test_nvs_trainer_resumes_an_earlier_pt_file(tmp_path):
    from mmpos._safe_state import join_optimizer_state, read_json, read_tensors

    whole, whole_state, _ = nvs_run(tmp_path / "whole", NVS_RECIPE)
    with pytest.raises(Stop):
        nvs_run(tmp_path / "cut", NVS_RECIPE, stop_before=3)
    latest = checkpoints(tmp_path / "cut" / "run")[-1]  # the same state as the earlier layout's file
    optimizer = join_optimizer_state(
        read_tensors(latest / "optimizer.safetensors"), read_json(latest / "optimizer.json"), {"param_groups": []}
    )
    torch.save(
        dict(
            read_json(latest / "nvs_progress.json"),
            model=read_tensors(latest / "model.safetensors"),
            optimizer=optimizer,
        ),
        tmp_path / "cut" / "run.pt",
    )
    import shutil

    shutil.rmtree(tmp_path / "cut" / "run")
    resumed, state, _ = nvs_run(tmp_path / "cut", NVS_RECIPE)
    assert state["losses"] == whole_state["losses"]
    assert_same(resumed.state_dict(), whole.state_dict())


def test_nvs_trainer_stops_at_a_nan_loss_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    """``eval_nvs train --lr 1e8`` trained on with NaN and saved NaN weights (issue 35): now the NaN stop."""
    from mmpos._validation import NonFiniteLossError
    from mmpos.training.tasks import nvs as nvs_training

    original, calls = nvs_training.NovelViewTransformer.forward, []

    def forward(self, batch):  # the third update's loss is NaN
        calls.append(1)
        return original(self, batch) * (float("nan") if len(calls) == 3 else 1.0)

    monkeypatch.setattr(nvs_training.NovelViewTransformer, "forward", forward)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 3.*checkpoint-2, is kept"):
        nvs_run(tmp_path, NVS_RECIPE)
    assert [p.name for p in checkpoints(tmp_path / "run")] == ["checkpoint-2"]
    monkeypatch.undo()
    _, state, _ = nvs_run(tmp_path, NVS_RECIPE)  # the kept checkpoint resumes
    assert state["step"] == 5 and all(torch.isfinite(torch.tensor(state["losses"])))


def test_nvs_trainer_two_processes_equal_one_at_twice_the_batch(tmp_path):
    recipe = {**NVS_RECIPE, "steps": 3, "batch_size": 1}
    ranks = torchrun("nvs", {"out": str(tmp_path / "two"), "recipe": recipe}, tmp_path, 29565)
    one, state, _ = nvs_run(tmp_path / "one", {**recipe, "batch_size": 2})
    check_ranks(tmp_path, {f"model.{k}": v for k, v in one.state_dict().items()}, atol=1e-5)
    assert ranks[0]["losses"] == pytest.approx(state["losses"], abs=1e-5)
    assert set(ranks[1]["written"]) == {"rng_1.json"}
    assert [p.name for p in checkpoints(tmp_path / "two" / "run")] == ["checkpoint-2", "checkpoint-3"]


# ---------------------------------------------------------------- command lines
def load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_eval_nvs_train_refuses_an_earlier_run_resumes_overwrites_and_stops_at_nan(tmp_path, capsys):
    from mmpos.world.nvs_data import make_triples

    eval_nvs = load_script("eval_nvs")
    torch.save({"train": make_triples("train", 1, 2, size=16, objects=3)}, tmp_path / "data.pt")
    train = ["--out", str(tmp_path), "train", "--encoding", "ucpe", "--steps", "2", "--batch-size", "2"]
    eval_nvs.main(train)
    run = tmp_path / "checkpoints" / "ucpe_s0"
    assert [p.name for p in checkpoints(run)] == ["checkpoint-2"]
    with pytest.raises(SystemExit) as refused:
        eval_nvs.main(train)
    assert refused.value.code == 2 and "pass --resume to continue it or --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit) as changed:  # --resume with another recipe
        eval_nvs.main(train[:-2] + ["--batch-size", "1", "--resume"])
    assert (
        changed.value.code == 2
        and "--resume: batch_size is 1 but the run was started with 2" in capsys.readouterr().err
    )
    eval_nvs.main(train[:5] + ["--steps", "3", "--batch-size", "1", "--overwrite"])
    assert [p.name for p in checkpoints(run)] == ["checkpoint-3"]
    with pytest.raises(SystemExit) as diverged:  # issue 35: trained on with NaN and exited 0
        eval_nvs.main(train[:5] + ["--steps", "6", "--lr", "1e12", "--overwrite"])
    err = capsys.readouterr().err
    assert diverged.value.code == 1 and "loss is" in err and "stopped before this step's update" in err, err
    with pytest.raises(SystemExit) as negative:
        eval_nvs.main(train[:5] + ["--steps", "-1", "--overwrite"])
    assert negative.value.code == 2 and "--steps: expected a positive integer, got '-1'" in capsys.readouterr().err


def test_train_world_video_refuses_a_run_with_checkpoints(tmp_path, capsys):
    script = load_script("train_world_video")
    (tmp_path / "checkpoint-2").mkdir()
    with pytest.raises(SystemExit) as refused:
        script.main(["--stage", "vae", "--out", str(tmp_path)])
    message = capsys.readouterr().err
    assert refused.value.code == 2 and "holds an earlier run (checkpoint-2); pass --resume to continue it" in message
    with pytest.raises(SystemExit) as both:
        script.main(["--stage", "vae", "--out", str(tmp_path), "--resume", "--overwrite"])
    assert both.value.code == 2 and "pass one" in capsys.readouterr().err


def test_train_world_overwrite_replaces_the_earlier_checkpoints(tmp_path):
    import yaml

    config = tmp_path / "vae.yaml"
    config.write_text(yaml.safe_dump(json.loads(json.dumps(image_config("vae", max_steps=2)))))
    script = load_script("train_world")
    out = tmp_path / "out"
    assert script.main(["--config", str(config), "--out", str(out), "--quiet"]) == 0
    (out / "train-vae" / "checkpoint-2" / "stale").write_text("from the earlier run")
    with pytest.raises(SystemExit):
        script.main(["--config", str(config), "--out", str(out), "--quiet"])
    assert script.main(["--config", str(config), "--out", str(out), "--quiet", "--max-steps", "1", "--overwrite"]) == 0
    assert [p.name for p in checkpoints(out / "train-vae")] == ["checkpoint-1"]
    assert json.loads((out / "world-vae" / "model_card.json").read_text())["steps"] == 1


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--set", "lr=abc"], "lr: expected float, got 'abc'"),
        (["--set", "ema_decay=2"], "ema_decay: expected a number in [0, 1)"),
        (["--set", "bogus=1"], "unknown config key 'bogus'"),
        (["--set", "task=t2x"], "task: expected one of vae, t2i, fill, kontext"),
        (["--set", "batch_size=0"], "batch_size: expected a positive number"),
    ],
)
def test_train_world_checks_every_config_key(tmp_path, capsys, argv, named):
    config = tmp_path / "vae.yaml"
    config.write_text("task: vae\nimage_size: 32\n")
    with pytest.raises(SystemExit) as refused:
        load_script("train_world").main(["--config", str(config), "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and named in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / "train-vae").exists()


def test_train_world_refuses_an_unknown_key_in_the_file_and_a_changed_run_on_resume(tmp_path, capsys):
    import yaml

    config = tmp_path / "vae.yaml"
    config.write_text("task: vae\nlearning_rate: 0.1\n")
    script, out = load_script("train_world"), tmp_path / "out"
    with pytest.raises(SystemExit):
        script.main(["--config", str(config), "--out", str(out)])
    assert "vae.yaml: unknown config key 'learning_rate'" in capsys.readouterr().err
    config.write_text(yaml.safe_dump(json.loads(json.dumps(image_config("vae", max_steps=1)))))
    assert script.main(["--config", str(config), "--out", str(out), "--quiet"]) == 0
    with pytest.raises(SystemExit) as changed:
        script.main(["--config", str(config), "--out", str(out), "--quiet", "--resume", "--set", "lr=0.5"])
    err = capsys.readouterr().err
    assert changed.value.code == 2 and "--resume: lr is 0.5 but the run was started with 0.001" in err, err
    assert script.main(["--config", str(config), "--out", str(out), "--quiet", "--resume", "--max-steps", "2"]) == 0
    (out / "train-vae" / "checkpoint-2" / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(SystemExit) as unreadable:
        script.main(["--config", str(config), "--out", str(out), "--quiet", "--resume", "--max-steps", "3"])
    err = capsys.readouterr().err
    assert unreadable.value.code == 2 and "model.safetensors: 9 bytes, recorded" in err and "Traceback" not in err
    assert [p.name for p in checkpoints(out / "train-vae")] == ["checkpoint-1", "checkpoint-2"]
