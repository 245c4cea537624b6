"""Writing a trained world model: a diffusers pipeline folder (save_pretrained), model card (JSON + Markdown),
sample grid."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
import yaml

from ..._atomic import folder_written_atomically
from ...models.world.image import build_pipeline
from ...models.world.latents import to_unit
from ...models.world.samples import generate, held_out_examples, image_grid, inputs_row
from ...world.images import save_png
from ..model_cards import card_metadata, front_matter

WEIGHTS_DTYPE = torch.float16  # shipped transformer weights (half the size; loaders upcast to fp32)


@torch.no_grad()
def sample_grid(task: str, model, vae, config: dict) -> np.ndarray:
    examples = held_out_examples(task, config["num_samples"], config["image_size"])
    truth = np.stack([e["image"] for e in examples])
    if task == "vae":
        recon = model.decode(model.encode(to_unit(torch.from_numpy(truth)).to(model.device)).latent_dist.mode())
        recon = ((recon.sample.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()
        return image_grid([("input", truth), ("reconstruction", recon)])
    pipe = build_pipeline(task, vae, model.transformer, model.text_encoder)
    pipe.set_progress_bar_config(disable=True)
    outputs = generate(pipe, task, examples, config["sample_steps"], config["sample_guidance"])
    rows = [row for row in [inputs_row(task, examples)] if row is not None]
    return image_grid(rows + [("generated", outputs), ("ground truth", truth)])


def model_card_markdown(card: dict, folder_name: str) -> str:
    """The folder's ``README.md``: Hugging Face front matter (:func:`~mmpos.training.model_cards.card_metadata`),
    then the card's data, steps, losses and sample grid."""
    losses = card.get("loss_history") or []
    lines = [
        f"# {folder_name}",
        "",
        f"A small `{card['task']}` model of the mmpos mini-world (mmpos.world), trained by "
        "`scripts/train_world.py`; config in `train_config.yaml`.",
        "",
        *load_line(card["task"], folder_name),
        "| field | value |",
        "|---|---|",
    ]
    for key in (
        "task",
        "parameters",
        "steps",
        "train_minutes",
        "total_steps",
        "total_train_minutes",
        "device",
        "mixed_precision",
        "batch_size",
        "final_train_loss",
        "val_loss_start",
        "val_loss",
        "val_l1",
        "latent_shift",
        "latent_scale",
    ):
        if key in card:
            lines.append(f"| {key} | {card[key]} |")
    data = card["data"]
    if "init_from" in card:
        before = card["init_from"]
        lines += [
            "",
            f"Continued from `{before['path']}` ({before['total_steps']} steps, "
            f"{before['total_train_minutes']} min, val_loss {before['val_loss']}); the loss history "
            "below is this run's.",
        ]
    lines += [
        "",
        f"Data: {data['num_examples']} procedurally generated {data['image_size']}x{data['image_size']} "
        f"examples, `{data['generator']}`, seed {data['seed']}.",
        "",
        "Loss (step: loss): " + ", ".join(f"{s}: {v}" for s, v in losses[:: max(len(losses) // 12, 1)]),
        "",
        "![samples](samples.png)",
        "",
        "Sample grid: held-out examples (dataset seed mmpos.models.world.samples.HELD_OUT_SEED) through the real "
        "diffusers pipeline.",
    ]
    return front_matter(card_metadata(card["task"])) + "\n".join(lines) + "\n"


def load_line(task: str, folder_name: str) -> list[str]:
    """The model card's line on loading a pipeline folder (none for the VAE)."""
    from ...models.world.image import PIPELINES

    if task not in PIPELINES:
        return []
    return [
        f'A diffusers pipeline folder: `{PIPELINES[task].__name__}.from_pretrained("{folder_name}")` (or '
        "`DiffusionPipeline`); prompts are strings in the world's words "
        "(`mmpos.world.vocabulary.world_vocabulary()`). `mmpos edit` / `mmpos generate` use it with `--model world`.",
        "",
    ]


def export_model(task: str, model, vae, config: dict, card: dict, out_dir) -> Path:
    """Write ``out_dir/world-<task>/`` (through a temporary folder renamed into place, so a kill keeps the previous
    export whole) and return it."""
    final = Path(out_dir) / f"world-{task}"
    with folder_written_atomically(final) as folder:
        _write_export(task, model, vae, config, card, folder, final.name)
    return final


def _write_export(task: str, model, vae, config: dict, card: dict, folder: Path, name: str) -> None:
    model = model.cpu().float()
    vae = vae.cpu().float() if vae is not None else None
    if task == "vae":
        model.save_pretrained(folder)
    else:
        save_pipeline_folder(task, model.transformer, model.text_encoder, vae, folder)
    save_png(folder / "samples.png", sample_grid(task, model, vae, config))
    (folder / "model_card.json").write_text(json.dumps(card, indent=1))
    (folder / "README.md").write_text(model_card_markdown(card, name))
    (folder / "train_config.yaml").write_text(yaml.safe_dump(config, sort_keys=True))


def save_pipeline_folder(task: str, transformer, text_encoder, vae, folder) -> Path:
    """``folder`` as the diffusers pipeline of ``task`` (``model_index.json``, transformer in
    :data:`WEIGHTS_DTYPE`, VAE, scheduler, text encoder and tokenizer in both Flux text slots): what
    ``FluxPipeline.from_pretrained(folder)`` (Fill, Kontext) loads."""
    transformer = copy.deepcopy(transformer).cpu().to(WEIGHTS_DTYPE)
    build_pipeline(task, vae.cpu().float(), transformer, text_encoder.cpu().float()).save_pretrained(folder)
    return Path(folder)


def upgrade_model_folder(root, task: str) -> Path:
    """Make an older export's ``root/world-<task>/`` (``transformer/`` and ``text_encoder/`` only, VAE in
    ``root/world-vae/``) a full pipeline folder; the weights are unchanged."""
    from ...models.world.image import load_world_pipeline

    folder = Path(root) / f"world-{task}"
    if (folder / "model_index.json").is_file():
        return folder
    pipe = load_world_pipeline(task, root)
    return save_pipeline_folder(task, pipe.transformer, pipe.text_encoder, pipe.vae, folder)
