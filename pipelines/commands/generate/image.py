"""``mmpos generate``: FLUX.1, Qwen-Image or the world t2i model, text to image, optionally above the training size
(``--extrapolate``, :mod:`mmpos.pipelines.extrapolate`); saves the images and the resolved config (with the installed schedule)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mmpos._arguments import user_error

from ...edits.method import seeded_generator
from ...extrapolate import (
    extrapolate_setting,
    install_extrapolation,
    install_noise_shift,
    parse_extrapolate,
    parse_rules,
)
from ...images import save_image
from ...inputs import prompt_kwargs, sampler_options
from .._config import check_prompt_source, check_sampler_size, default_side, resolve_config, save_config
from .._options import output_folder, report_written


def run_generate(args) -> int:
    config = generate_config(args)
    model = _model(config)
    try:
        check_prompt_source(args, model)
    except ValueError as error:
        raise user_error("mmpos generate", error) from None
    out = output_folder(args, Path("outputs/generate"))
    pipe, call = _generate_pipeline(args, config, model)
    try:  # before anything is allocated: the size on the model's token grid and in the device's memory
        check_sampler_size(pipe, config["sampler"], len(args.prompt or config["prompts"]), _train_size(config, model))
    except ValueError as error:
        raise user_error("mmpos generate", error) from None
    setting = config.get("extrapolate", {})
    presets, rules = (f(str(setting.get("preset", "none"))) for f in (parse_extrapolate, parse_rules))
    try:  # a rule on a family it does not reach
        installed = install_extrapolation(pipe, presets, _train_size(config, model), setting.get("options"), rules)
    except ValueError as error:
        raise user_error("mmpos generate", error) from None
    if installed["schedules"] is not None:
        sampler, default = sampler_options(config), default_side(pipe)
        size = (sampler.get("height") or default, sampler.get("width") or default)
        installed["noise_shift"] = install_noise_shift(
            pipe, presets, setting["shift"], installed["trained_grid"], *size
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
    config.setdefault("extrapolate", {}).setdefault("shift", "authors")
    if getattr(args, "dype_shift", None):
        config["extrapolate"]["shift"] = args.dype_shift
    extrapolate_setting(config, args.extrapolate, args.train_size, "mmpos generate")
    return config


TRAIN_SIZES = {"FluxPipeline": 1024, "QwenImagePipeline": 1328}  # FLUX.1; Qwen-Image's 1:1 size (model card)


def _model(config):
    """The config's ``model`` resolved once (:class:`~mmpos.pipelines.loading.ModelRef`)."""
    from ...loading import model_ref

    return model_ref("generate", config["model"])


def _generate_pipeline(args, config, model):
    """The pipeline and its prompt arguments: the FluxPipeline or QwenImagePipeline that ``model``'s
    ``model_index.json`` names (``model: world``: the shipped world t2i model, prompted with its guidance)."""
    from ...inputs import load_cli_pipeline, report_prompts, world_model_notice
    from ...loading import generate_kind

    prompts = args.prompt or config["prompts"]
    try:
        kind = generate_kind(model.path)
    except ValueError as err:
        print(f"mmpos generate: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if model.is_world:
        from ...world.sources import HUB_FLUX

        print(world_model_notice("mmpos generate", HUB_FLUX["t2i"], model.side))
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
    sampler = sampler_options(config, pipe)  # the keys its __call__ takes (Qwen-Image 2.1: no guidance_scale)
    distilled = getattr(pipe.transformer.config, "guidance_embeds", True)
    if type(pipe).__name__ == "QwenImagePipeline" and not distilled and "guidance_scale" in sampler:
        print(
            f"sampler.guidance_scale={sampler.pop('guidance_scale')} dropped: this Qwen-Image transformer has no "
            "guidance embedding (use --set sampler.true_cfg_scale=... with sampler.negative_prompt)"
        )
    return sampler


def _train_size(config, model):
    size = config.get("extrapolate", {}).get("train_size", "auto")
    if size != "auto":
        return size
    if model.is_world:
        return model.side
    name = config.get("pipeline", "FluxPipeline")
    if name in TRAIN_SIZES:
        return TRAIN_SIZES[name]
    from mmpos.integrations.diffusers.families import family_for_pipeline

    return family_for_pipeline(name).train_size  # the family's 1:1 training size
