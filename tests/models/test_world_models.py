"""World models: real diffusers pipelines on tiny configs, pipeline-exact training inputs, training, loading."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import FluxKontextPipeline

from mmpos.models.world.image import (
    TASKS,
    build_pipeline,
    build_text_encoder,
    build_transformer,
    build_vae,
    load_world_pipeline,
    prompt_kwargs,
    trained_image_size,
)
from mmpos.models.world.latents import latent_ids, pack, pack_pixel_mask
from mmpos.models.world.samples import generate, held_out_examples
from mmpos.models.world.text import WorldTextEncoder
from mmpos.training.model_cards import card_metadata, split_front_matter
from mmpos.training.task_configs import WorldImageConfig
from mmpos.training.tasks.world_image import train

TINY_VAE = dict(block_out_channels=(8, 16), norm_num_groups=4)
TINY_TRANSFORMER = dict(
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    axes_dims_rope=(4, 6, 6),
    joint_attention_dim=32,
    pooled_projection_dim=32,
)
TINY_TEXT = dict(width=32, num_layers=1, num_heads=2)
SIZE = 32


def tiny_pipeline(task):
    vae = build_vae(**TINY_VAE)
    transformer = build_transformer(task, **TINY_TRANSFORMER)
    pipe = build_pipeline(task, vae, transformer, build_text_encoder(transformer, **TINY_TEXT))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("task", TASKS)
def test_each_task_runs_in_its_real_diffusers_pipeline(task):
    pipe = tiny_pipeline(task)
    examples = held_out_examples(task, 2, SIZE)
    images = generate(pipe, task, examples, steps=2, guidance=2.0)
    width = 2 * SIZE if task == "fill" else SIZE  # fill examples are reference tile | scene canvases
    assert images.shape == (2, SIZE, width, 3) and images.dtype == np.uint8
    assert type(pipe).__module__.startswith("diffusers.pipelines.flux")


def test_fill_mask_packing_matches_flux_fill_pipeline():
    pipe = tiny_pipeline("fill")
    mask = (torch.rand(2, 1, SIZE, SIZE) > 0.5).float()
    masked = torch.zeros(2, 3, SIZE, SIZE)
    expected, _ = pipe.prepare_mask_latents(mask, masked, 2, 4, 1, SIZE, SIZE, torch.float32, "cpu", None)
    assert torch.equal(pack_pixel_mask(mask, 2), expected)
    assert pipe.transformer.config.in_channels == 16 + 16 + expected.shape[-1]


def test_kontext_context_ids_match_the_pipeline():
    h = w = SIZE // 2
    target = FluxKontextPipeline._prepare_latent_image_ids(1, h // 2, w // 2, "cpu", torch.float32)
    context = target.clone()
    context[:, 0] = 1
    assert torch.equal(latent_ids(h, w, "cpu"), target)
    assert torch.equal(latent_ids(h, w, "cpu", index=1.0), context)
    latents = torch.randn(2, 4, h, w)
    assert pack(latents).shape == (2, (h // 2) * (w // 2), 16)


def test_text_encoder_round_trip_and_errors(tmp_path):
    encoder = WorldTextEncoder(**TINY_TEXT).eval()
    caption = held_out_examples("t2i", 1, 64)[0]["caption"]
    embeds, pooled = encoder.encode_captions([caption, ""])
    assert embeds.shape == (2, encoder.config.max_length, 64) and pooled.shape == (2, 64)
    encoder.save_pretrained(tmp_path)
    loaded = WorldTextEncoder.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded.encode_captions([caption])[0], encoder.encode_captions([caption])[0])
    with pytest.raises(ValueError, match=r"outside the world's vocabulary: \['zebra'\]"):
        encoder.tokenize(["a red zebra"])
    with pytest.raises(ValueError, match="at most"):
        encoder.tokenize(["a " * 60])


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no VAE checkpoint at .*world-vae"):
        load_world_pipeline("t2i", tmp_path)
    with pytest.raises(ValueError, match="task='video'"):
        load_world_pipeline("video", tmp_path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny VAE and t2i model trained for a few steps (the real script path), in one folder."""
    root = tmp_path_factory.mktemp("world")
    common = dict(
        image_size=SIZE,
        num_examples=32,
        batch_size=8,
        device="cpu",
        num_samples=2,
        sample_steps=2,
        log_every=1,
        warmup_steps=1,
        max_minutes=5.0,
    )
    vae_card = train(
        WorldImageConfig(**dict(common, task="vae", vae=TINY_VAE, max_steps=6, lr=3e-3, ema_decay=0.5)),
        root,
        progress=False,
    )
    card = train(
        WorldImageConfig(
            **dict(
                common,
                task="t2i",
                vae_path=str(root),
                transformer=TINY_TRANSFORMER,
                text_encoder=TINY_TEXT,
                max_steps=12,
                lr=3e-3,
                ema_decay=0.5,
            )
        ),
        root,
        progress=False,
    )
    return root, vae_card, card


def test_short_training_lowers_the_loss(trained):
    _, vae_card, card = trained
    assert card["steps"] == 12 and vae_card["steps"] == 6
    assert card["val_loss"] < card["val_loss_start"]
    assert vae_card["val_l1"] < vae_card["val_l1_start"]


def test_trained_checkpoint_loads_and_samples(trained):
    root, _, _ = trained
    for name in ("world-vae", "world-t2i"):
        assert {"README.md", "model_card.json", "samples.png", "train_config.yaml"} <= {
            p.name for p in (root / name).iterdir()
        }
        metadata, body = split_front_matter((root / name / "README.md").read_text())  # the Hub's front matter
        assert metadata == card_metadata(name.removeprefix("world-")) and body.startswith(f"# {name}\n")
    pipe = load_world_pipeline("t2i", root)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.transformer.dtype == torch.float32
    out = pipe(
        height=SIZE,
        width=SIZE,
        num_inference_steps=2,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
        **prompt_kwargs(pipe, ["a large red star at center"]),
    ).images
    assert out.shape == (1, 3, SIZE, SIZE) and torch.isfinite(out).all()
    from diffusers import FluxPipeline  # the export is a pipeline folder: from_pretrained, prompt strings

    exported = FluxPipeline.from_pretrained(root / "world-t2i")
    exported.set_progress_bar_config(disable=True)
    assert (root / "world-t2i" / "model_index.json").is_file() and exported.tokenizer is not None
    same = exported(
        height=SIZE,
        width=SIZE,
        num_inference_steps=2,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
        prompt=["a large red star at center"],
    ).images
    assert torch.equal(same, out)


def test_resume_continues_from_the_saved_step(trained):
    root, _, card = trained
    config = dict(
        image_size=SIZE,
        num_examples=32,
        batch_size=8,
        device="cpu",
        num_samples=1,
        sample_steps=1,
        log_every=1,
        task="t2i",
        vae_path=str(root),
        transformer=TINY_TRANSFORMER,
        text_encoder=TINY_TEXT,
        max_steps=14,
        warmup_steps=1,
        lr=3e-3,
        ema_decay=0.5,
    )  # the run's values
    resumed = train(WorldImageConfig(**config), root, resume=True, progress=False)
    assert resumed["steps"] == 14 and resumed["loss_history"][: len(card["loss_history"])] == card["loss_history"]
    assert resumed["val_loss_start"] == card["val_loss_start"]  # the first start's, not the resumed model's


def test_init_from_continues_a_trained_model(trained, tmp_path):
    root = trained[0]
    card = json.loads((root / "world-t2i" / "model_card.json").read_text())  # the latest export in root
    config = dict(
        image_size=SIZE,
        num_examples=32,
        batch_size=8,
        device="cpu",
        num_samples=1,
        sample_steps=1,
        task="t2i",
        vae_path=str(root),
        init_from=str(root),
        max_steps=2,
        warmup_steps=1,
        transformer=TINY_TRANSFORMER,
        text_encoder=TINY_TEXT,
    )  # as the checkpoint's: accepted
    continued = train(WorldImageConfig(**config), tmp_path, progress=False)
    # starts where the source ended (its weights were shipped in fp16, hence the tolerance)
    assert continued["val_loss_start"] == pytest.approx(card["val_loss"], rel=0.02)
    assert continued["total_steps"] == card["steps"] + 2 and continued["init_from"]["total_steps"] == card["steps"]
    assert "Continued from" in (tmp_path / "world-t2i" / "README.md").read_text()
    with pytest.raises(FileNotFoundError, match="init_from: no t2i checkpoint"):
        train(WorldImageConfig(**{**config, "init_from": str(tmp_path / "missing")}), tmp_path, progress=False)
    with pytest.raises(ValueError, match="in_channels=16; a fill model on this VAE has 48"):
        train(
            WorldImageConfig(**{**config, "task": "fill", "init_from": str(root / "world-t2i")}),
            tmp_path,
            progress=False,
        )
    with pytest.raises(ValueError, match="transformer option num_layers=3 differs from the checkpoint's 1"):
        train(
            WorldImageConfig(**{**config, "transformer": {**TINY_TRANSFORMER, "num_layers": 3}}),
            tmp_path,
            progress=False,
        )
    with pytest.raises(ValueError, match="the VAE trains from scratch"):
        train(WorldImageConfig(**{**config, "task": "vae"}), tmp_path, progress=False)


SHIPPED = Path(__file__).resolve().parents[2] / "assets"


@pytest.mark.parametrize("task", TASKS)
def test_shipped_checkpoints_load_and_sample(task):
    if not (SHIPPED / f"world-{task}" / "transformer").is_dir():
        pytest.skip(f"no shipped world-{task} checkpoint in assets/")
    pipe = load_world_pipeline(task)
    pipe.set_progress_bar_config(disable=True)
    size = trained_image_size(None, task)
    examples = held_out_examples(task, 1, size)
    images = generate(pipe, task, examples, steps=2)
    assert images.shape == examples[0]["image"][None].shape
    card = json.loads((SHIPPED / f"world-{task}" / "model_card.json").read_text())
    assert card["steps"] > 0 and card["val_loss"] < card["val_loss_start"]


def test_shipped_assets_fit_the_size_budget():
    total = sum(p.stat().st_size for p in SHIPPED.glob("world-*/**/*") if p.is_file())
    assert total <= 30 * 2**20, f"assets/world-* take {total / 2**20:.1f} MiB; the budget is 30 MiB"
