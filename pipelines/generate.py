"""``mmpos generate``: FLUX.1, Qwen-Image or the world t2i model, text to image, optionally above the training size
(``--extrapolate``, :mod:`.extrapolate`); saves the images and the resolved config (with the installed schedule)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mmpos._arguments import user_error

from .config import save_config
from .edits.base import seeded_generator
from .extrapolate import extrapolate_setting, install_extrapolation, parse_extrapolate
from .images import check_sampler_size, save_image
from .run_inputs import output_folder, prompt_kwargs, report_written, resolve_config, sampler_options


def run_generate(args) -> int:
    config = generate_config(args)
    out = output_folder(args, Path("outputs/generate"))
    pipe, call = _generate_pipeline(args, config)
    try:  # before anything is allocated: the size on the model's token grid and in the device's memory
        check_sampler_size(pipe, config["sampler"], len(args.prompt or config["prompts"]), _train_size(config))
    except ValueError as error:
        raise user_error("mmpos generate", error) from None
    setting = config.get("extrapolate", {})
    installed = install_extrapolation(
        pipe, parse_extrapolate(str(setting.get("preset", "none"))), _train_size(config), setting.get("options")
    )
    config["extrapolate"]["installed"] = installed
    print(f"extrapolation: {json.dumps(installed)}")
    images = pipe(
        **call, generator=seeded_generator(config["seed"]), output_type="pt", **_call_sampler(pipe, config)
    ).images
    written = [save_image(image, out / f"image_{i}.png") for i, image in enumerate(images)]
    written.append(save_config(config, out / "config.yaml"))
    report_written(written, out)
    return 0


def generate_config(args) -> dict:
    """The config a ``mmpos generate`` run uses (saved as its ``config.yaml`` with the installed schedule): the YAML
    config, ``--set``, then each option naming a key (``--height`` sampler.height, ``--extrapolate``
    extrapolate.preset, ...) over its own key only."""
    config = resolve_config(args)
    extrapolate_setting(config, args.extrapolate, args.train_size, "mmpos generate")
    return config


TRAIN_SIZES = {"FluxPipeline": 1024, "QwenImagePipeline": 1328}  # FLUX.1; Qwen-Image's 1:1 size (model card)


def _generate_pipeline(args, config):
    """The pipeline and its prompt arguments: the FluxPipeline or QwenImagePipeline that ``model``'s
    ``model_index.json`` names (``model: world``: the shipped world t2i model, prompted with its guidance)."""
    from .loading import generate_kind, is_world_model, model_path, world_image_size
    from .run_inputs import load_cli_pipeline, report_prompts, world_model_notice

    prompts = args.prompt or config["prompts"]
    try:
        kind = generate_kind(model_path("generate", config["model"]))
    except ValueError as err:
        print(f"mmpos generate: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if is_world_model(config["model"]):
        from .sources import HUB_FLUX

        side = world_image_size(model_path("generate", config["model"]))
        print(world_model_notice("mmpos generate", HUB_FLUX["t2i"], side))
    pipe = load_cli_pipeline("generate", kind, config)
    config["pipeline"] = type(pipe).__name__
    report_prompts(args, [("", prompts, "--prompt", bool(args.prompt))])
    try:  # a world model: words outside its vocabulary
        return pipe, prompt_kwargs(args, prompts, pipe, config.get("guidance"))
    except ValueError as err:
        print(f"mmpos generate: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def _call_sampler(pipe, config) -> dict:
    """``sampler`` as the pipeline takes it: Qwen-Image without guidance embeddings has no distilled guidance
    (its guidance is ``true_cfg_scale`` with a negative prompt), so ``guidance_scale`` is dropped, saying so."""
    sampler = sampler_options(config)
    distilled = getattr(pipe.transformer.config, "guidance_embeds", True)
    if type(pipe).__name__ == "QwenImagePipeline" and not distilled and "guidance_scale" in sampler:
        print(
            f"sampler.guidance_scale={sampler.pop('guidance_scale')} dropped: this Qwen-Image transformer has no "
            "guidance embedding (use --set sampler.true_cfg_scale=... with sampler.negative_prompt)"
        )
    return sampler


def _train_size(config):
    size = config.get("extrapolate", {}).get("train_size", "auto")
    if size != "auto":
        return size
    from .loading import is_world_model, model_path, world_image_size

    if is_world_model(config["model"]):
        return world_image_size(model_path("generate", config["model"]))
    name = config.get("pipeline", "FluxPipeline")
    if name in TRAIN_SIZES:
        return TRAIN_SIZES[name]
    from mmpos.integrations.diffusers.families import family_for_pipeline

    return family_for_pipeline(name).train_size  # the family's 1:1 training size
