"""Assemble the trained stages of the world video model into one diffusers folder with a model card.

    <out>/model_index.json, transformer/, vae/, scheduler/    (WorldVideoPipeline.save_pretrained)
    <out>/camera-<kind>/                                       (CameraAdapter.save_pretrained, one per adapter)
    <out>/README.md, model_card.json, samples.png              (card: data, steps, CPU minutes, losses)

The folder is written under a temporary name and renamed into place; an ``out`` holding files is replaced only
when ``overwrite`` is set.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from mmpos._atomic import check_new_output, output_folder_written
from mmpos._safe_state import load_torch_file
from mmpos.training.model_cards import card_metadata, front_matter
from mmpos.world.video_data import AMOUNTS, CLIP_FRAMES, CLIP_SIZE, MOTIONS

SCHEDULER_SHIFT = 1.0


def stage_summary(run: Path, window: int = 100) -> dict:
    """What a finished stage's newest checkpoint (or ``state.pt`` of the earlier layout) records: recipe, steps,
    CPU minutes, loss curve (means of ``window`` steps) and final loss (mean of the last ``window``)."""
    from mmpos.training.tasks.world_video import read_stage_state

    state = read_stage_state(run)
    if state is None:
        state = load_torch_file(Path(run) / "state.pt")  # names the missing file
    if not state["finished"]:
        raise ValueError(f"{run} is not finished (step {state['step']} of {state['recipe']['steps']})")
    losses = state["losses"]
    curve = {i + window: round(float(np.mean(losses[i : i + window])), 5) for i in range(0, len(losses), window * 5)}
    summary = dict(
        recipe=state["recipe"],
        steps=state["step"],
        cpu_minutes=round(state["cpu_seconds"] / 60, 1),
        final_loss=round(float(np.mean(losses[-window:])), 5),
        loss_curve=curve,
    )
    start = state["recipe"].get("init_from")
    if start:  # continued training: the totals include the earlier run's
        earlier = stage_summary(Path(start), window)
        steps = summary["steps"] + earlier.get("total_steps", earlier["steps"])
        minutes = summary["cpu_minutes"] + earlier.get("total_cpu_minutes", earlier["cpu_minutes"])
        summary.update(continued_from=earlier, total_steps=steps, total_cpu_minutes=round(minutes, 1))
    return summary


def model_card(stages: dict, parameters: dict) -> dict:
    return dict(
        model="WorldVideoPipeline: WanTransformer3DModel (image-to-video, first frame given clean at timestep 0) "
        "+ world AutoencoderKL fine-tuned on clip frames + FlowMatchEulerDiscreteScheduler",
        data=dict(
            generator="mmpos.world.video_data.make_clips('train', scenes)",
            frames=CLIP_FRAMES,
            size=CLIP_SIZE,
            motions=list(MOTIONS),
            amounts=AMOUNTS,
            train_scenes=stages["base"]["recipe"]["train_scenes"],
            clips=stages["base"]["recipe"]["train_scenes"] * stages["base"]["recipe"]["clips_per_scene"],
            test="held-out scenes (test seeds from 1,000,000)",
        ),
        device="cpu (one thread)",
        stages=stages,
        parameters=parameters,
        scheduler_shift=SCHEDULER_SHIFT,
    )


def card_markdown(card: dict) -> str:
    """The folder's ``README.md``: Hugging Face front matter, then the stages, losses and samples."""
    lines = [
        "# world-video",
        "",
        "A small image-to-video model of the mmpos mini-world (3D scenes, camera-moving "
        "clips) and camera adapters trained on it, all on a CPU. Load with "
        "`WorldVideoPipeline.from_pretrained(folder)` and `load_camera_adapter(pipe, folder / 'camera-ucpe')` "
        "(`mmpos.pipelines`).",
        "",
        f"Model: {card['model']}.",
        "",
        f"Data: {card['data']['clips']} clips of {card['data']['train_scenes']} textured training scenes, "
        f"{card['data']['frames']} frames of {card['data']['size']} px, motions {', '.join(MOTIONS)} with random "
        f"signed amounts ({card['data']['amounts']}); {card['data']['test']}.",
        "",
        "| stage | parameters | steps | batch | CPU minutes | final loss |",
        "|---|---|---|---|---|---|",
    ]
    for name, stage in card["stages"].items():
        steps, minutes = stage.get("total_steps", stage["steps"]), stage.get("total_cpu_minutes", stage["cpu_minutes"])
        continued = " (continued)" if "continued_from" in stage else ""
        lines.append(
            f"| {name}{continued} | {card['parameters'].get(name, '-')} | {steps} | "
            f"{stage['recipe']['batch_size']} | {minutes} | {stage['final_loss']} |"
        )
    lines += ["", "Loss curves (step: mean loss of the preceding 100 steps):", ""]
    lines += [
        f"- {name}: " + ", ".join(f"{k}: {v}" for k, v in stage["loss_curve"].items())
        for name, stage in card["stages"].items()
    ]
    lines += [
        "",
        "![samples](samples.png)",
        "",
        "Samples: held-out scene, first frame + trajectory; rows per motion: ground truth, no camera, each adapter.",
        "",
        'Reproduce: `bash scripts/train_world_video.sh` (README, "Camera-controlled clips").',
    ]
    return front_matter(card_metadata("video")) + "\n".join(lines) + "\n"


def adapter_card_markdown(card: dict, kind: str) -> str:
    """``camera-<kind>/README.md``: front matter, what the adapter is, how to load it, its stage's numbers."""
    stage = card["stages"][kind]
    steps, minutes = stage.get("total_steps", stage["steps"]), stage.get("total_cpu_minutes", stage["cpu_minutes"])
    lines = [
        f"# camera-{kind}",
        "",
        f"A `{kind}` camera adapter (`mmpos.integrations.diffusers.CameraAdapter`) for the world video model in the "
        "folder above, trained with its transformer frozen. Load it with `CameraAdapter.from_pretrained(folder)`, "
        "or onto the pipeline: `load_camera_adapter(WorldVideoPipeline.from_pretrained(parent), folder)` "
        "(`mmpos.pipelines`).",
        "",
        f"Parameters {card['parameters'].get(kind, '-')}, {steps} steps of batch {stage['recipe']['batch_size']}, "
        f"{minutes} CPU minutes, final loss {stage['final_loss']}; data, loss curve and samples: `../README.md`.",
    ]
    return front_matter(card_metadata(f"camera-{kind}")) + "\n".join(lines) + "\n"


def export_world_video(runs: Path, out: Path, adapters=("ucpe", "plucker"), overwrite: bool = False) -> Path:
    """``runs/{vae,base,<adapter>}`` (finished stage folders) -> the model folder ``out``."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, WanTransformer3DModel

    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter

    from .. import WorldVideoPipeline

    runs, out = Path(runs), Path(out)
    check_new_output(out, overwrite)
    names = ("vae", "base", *adapters)
    stages = {name: stage_summary(runs / name) for name in names}
    pipe = WorldVideoPipeline(
        WanTransformer3DModel.from_pretrained(runs / "base" / "transformer"),
        AutoencoderKL.from_pretrained(runs / "vae" / "vae"),
        FlowMatchEulerDiscreteScheduler(shift=SCHEDULER_SHIFT),
    )
    loaded = {kind: CameraAdapter.from_pretrained(runs / kind / "camera_adapter") for kind in adapters}
    parameters = {
        "vae": _count(pipe.vae),
        "base": _count(pipe.transformer),
        **{kind: _count(adapter) for kind, adapter in loaded.items()},
    }
    card = model_card(stages, parameters)

    with output_folder_written(out, overwrite) as folder:  # a second writer at once: ConcurrentWriteError
        pipe.save_pretrained(folder)
        for kind in adapters:
            shutil.copytree(runs / kind / "camera_adapter", folder / f"camera-{kind}")
            (folder / f"camera-{kind}" / "README.md").write_text(adapter_card_markdown(card, kind))
        (folder / "model_card.json").write_text(json.dumps(card, indent=1))
        (folder / "README.md").write_text(card_markdown(card))
        _write_samples(folder)
    return out


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _write_samples(folder: Path) -> None:
    from mmpos.models.world.samples import image_grid
    from mmpos.world.images import save_png

    from .video_demo import demo_outputs, labelled_rows, load_video_model

    rows = labelled_rows(demo_outputs(*load_video_model(folder)))
    save_png(folder / "samples.png", image_grid(rows, label_width=200))
