"""``mmpos edit {band,transplant,loose}`` and ``mmpos generate``: config-driven runs that save images, the
resolved config, a comparison figure (inputs, edited, strength sweep) and a method diagnostic.

Imports of torch/diffusers happen when a command runs, so registering the commands costs nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

METHODS = ("band", "transplant", "loose")


def add_commands(subparsers) -> None:
    """Register ``edit`` and ``generate`` on an ``argparse`` subparsers object (called from ``mmpos.cli``)."""
    edit = subparsers.add_parser("edit", help="training-free PE edits on Flux: band | transplant | loose",
                                 description="Run a training-free PE edit from a YAML config (configs/edit_*.yaml).")
    methods = edit.add_subparsers(dest="method", required=True, metavar="{band,transplant,loose}")
    band = methods.add_parser("band", help="band modulation (Untwisting RoPE): style-aligned shared attention")
    band.add_argument("--reference-image", help="real reference image (output size), else generated from a prompt")
    band.add_argument("--reference-prompt", help="reference prompt (overrides reference.prompt)")
    band.add_argument("--target", action="append", help="target prompt (repeat; overrides targets)")
    band.add_argument("--image", help="Kontext variant (variant: kontext): the context image")
    transplant = methods.add_parser("transplant", help="PE transplant (PosBridge) object insertion on Fill")
    transplant.add_argument("--background", required=True, help="background image")
    where = transplant.add_mutually_exclusive_group(required=True)
    where.add_argument("--mask", help="target region mask (white = insert here), same size as the background")
    where.add_argument("--box", help="target box left,top,right,bottom in background pixels (PIL order)")
    transplant.add_argument("--reference", action="append", required=True, help="reference view (repeat for more)")
    transplant.add_argument("--reference-mask", action="append", help="object mask per reference (repeat)")
    loose = methods.add_parser("loose", help="LooseRoPE cut-and-paste harmonisation on Kontext")
    loose.add_argument("--image", required=True, help="the collage (object pasted)")
    pasted = loose.add_mutually_exclusive_group(required=True)
    pasted.add_argument("--mask", help="mask of the pasted region")
    pasted.add_argument("--original", help="the image before pasting (the mask is where they differ)")
    loose.add_argument("--saliency", help="saliency map image (grey levels), else loose.saliency's provider")
    for name, sub in (("band", band), ("transplant", transplant), ("loose", loose)):
        sub.add_argument("--prompt", dest="prompt_text", help="prompt (overrides prompt; band: Kontext variant)")
        sub.add_argument("--extrapolate", help="edit above the training size: the RoPE extrapolation of "
                         "`mmpos generate --extrapolate` (dype, ntk, yarn, pi, ..., or row=dype,col=ntk) under the edit")
        sub.add_argument("--train-size", type=int, help="training resolution in pixels for --extrapolate "
                         "(default: 1024, FLUX.1)")
        _common(sub, f"edit_{name}")
        sub.set_defaults(func=run_edit)
    generate = subparsers.add_parser(
        "generate", help="FLUX.1 / Qwen-Image (or the world t2i model) text-to-image, optionally above the training size; "
                         "`generate video`: camera-controlled Wan video",
        description="Generate images with FluxPipeline or QwenImagePipeline (the --model's model_index.json "
                    "decides; configs/generate.yaml; --model world: the shipped world t2i model, "
                    "configs/generate_world.yaml). --extrapolate dype|ntk|yarn|pi|... extrapolates the RoPE beyond "
                    "extrapolate.train_size (auto: 1024 px for FLUX.1, 1328 px for Qwen-Image; DyPE follows the "
                    "denoising step). Camera-controlled Wan videos: `mmpos generate video --help`.")
    generate.add_argument("--prompt", action="append", help="prompt (repeat; overrides prompts)")
    generate.add_argument("--height", type=int, help="output height in pixels (overrides sampler.height)")
    generate.add_argument("--width", type=int, help="output width in pixels (overrides sampler.width)")
    generate.add_argument("--extrapolate", help="none | pi | ntk | yarn | vision_yarn | dype | dype_ntk | dype_yarn, "
                          "or per axis: row=dype,col=ntk (overrides extrapolate.preset)")
    generate.add_argument("--train-size", type=int, help="training resolution in pixels (overrides "
                          "extrapolate.train_size; auto: 1024 FLUX.1, 1328 Qwen-Image)")
    _common(generate, "generate")
    generate.set_defaults(func=run_generate, method="generate")


def _common(parser, config_name: str) -> None:
    parser.add_argument("--config", help=f"YAML config (default: configs/{config_name}.yaml)")
    parser.add_argument("--config-name", default=config_name, help=argparse.SUPPRESS)
    parser.add_argument("--model", help="from_pretrained path or hub id (overrides model)")
    parser.add_argument("--prompt-embeds", help="safetensors/pt file with prompt_embeds [B, L, D] and (Flux) "
                        "pooled_prompt_embeds [B, D] or (Qwen-Image, optional) prompt_embeds_mask [B, L] "
                        "(for models saved without text encoders)")
    parser.add_argument("--device", help="cpu | cuda (overrides device)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="overrides dtype")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key, e.g. --set band.strength=0.5 (repeat)")
    parser.add_argument("--out", default=None, help="output folder (default: outputs/<command>)")
    parser.add_argument("--no-figures", action="store_true", help="skip the comparison and diagnostic figures")


def resolve_config(args) -> dict:
    from .config import apply_overrides, default_config_path, load_config

    config = load_config(args.config or default_config_path(args.config_name))
    for key in ("model", "device", "dtype"):
        if getattr(args, key, None):
            config[key] = getattr(args, key)
    if getattr(args, "prompt_text", None):
        config["prompt"] = args.prompt_text
    config = apply_overrides(config, args.set)
    if config.get("device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("CUDA is not available: running on cpu (set --device to silence this)")
            config["device"] = "cpu"
    return config


EMBED_KEYS = ("prompt_embeds", "pooled_prompt_embeds", "prompt_embeds_mask")


def load_prompt_embeds(path, required=("prompt_embeds", "pooled_prompt_embeds"), optional=()) -> dict:
    """The ``required`` tensors (and those of ``optional`` present) of a safetensors/pt file."""
    import torch

    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(path))
    else:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    missing = set(required) - set(tensors)
    if missing:
        raise ValueError(f"{path} lacks {sorted(missing)}; expected {' and '.join(required)}")
    return {k: tensors[k] for k in (*required, *optional) if k in tensors}


def _prompt_kwargs(args, prompts, pipe) -> dict:
    """``prompt`` strings, or the ``--prompt-embeds`` tensors the pipeline takes: Flux ``prompt_embeds`` and
    ``pooled_prompt_embeds``; Qwen-Image ``prompt_embeds`` and, if saved, ``prompt_embeds_mask`` [B, L]."""
    if args.prompt_embeds:
        accepted = [k for k in EMBED_KEYS if k in _stock_call_parameters(pipe)]
        required = [k for k in accepted if k != "prompt_embeds_mask"]
        embeds = load_prompt_embeds(args.prompt_embeds, required, [k for k in accepted if k not in required])
        dtype = pipe.transformer.dtype
        return {k: v.to(pipe.device, dtype if v.is_floating_point() else v.dtype) for k, v in embeds.items()}
    return {"prompt": prompts}


def _stock_call_parameters(pipe):
    """The parameters of the first ``__call__`` along the pipeline's MRO that names ``prompt_embeds`` (the stock
    diffusers one under an mmpos subclass taking ``*args, **kwargs``)."""
    import inspect

    for cls in type(pipe).__mro__:
        call = cls.__dict__.get("__call__")
        if call is not None and "prompt_embeds" in inspect.signature(call).parameters:
            return inspect.signature(call).parameters
    raise TypeError(f"{type(pipe).__name__}.__call__ takes no prompt_embeds")


def _load_image(path, what: str, token_pixels: int):
    """An image on the pipeline's token grid (resized down to it, saying so)."""
    from .images import load_image, snap_to_grid

    image = load_image(path)
    snapped, message = snap_to_grid(image, token_pixels)
    if message:
        print(f"{what}: {message}")
    return snapped


def _load_mask(path, size):
    from PIL import Image

    from .images import as_mask

    mask = Image.open(path).convert("L")
    if (mask.height, mask.width) != tuple(size):
        print(f"mask {path}: resized {mask.height}x{mask.width} to {size[0]}x{size[1]} (nearest)")
        mask = mask.resize((size[1], size[0]), Image.NEAREST)
    return as_mask(str(path), mask, size)


def _generator(seed):
    import torch

    return torch.Generator("cpu").manual_seed(int(seed))


def run_edit(args) -> int:
    from tqdm.auto import tqdm

    from .config import save_config
    from .images import save_image

    config = resolve_config(args)
    from .extrapolate import extrapolate_setting

    extrapolate_setting(config, args.extrapolate, args.train_size, "mmpos edit", default_train_size=1024)
    out = Path(args.out or f"outputs/edit_{args.method}")
    out.mkdir(parents=True, exist_ok=True)
    runner = {"band": _band, "transplant": _transplant, "loose": _loose}[args.method]
    result = runner(args, config, tqdm)
    written = [save_image(image, out / f"edited_{i}.png") for i, image in enumerate(result["edited"].values())]
    save_config(config, out / "config.yaml")
    if not args.no_figures:
        from .figures import comparison_figure

        written.append(comparison_figure(result["inputs"], result["edited"], result["sweep"], out / "comparison.png",
                                         result["title"]))
        written.append(result["diagnostic"](out / "diagnostic.png"))
    summary = {"method": args.method, "outputs": [str(p) for p in written], "config": str(out / "config.yaml")}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {len(written)} files to {out.resolve()}")
    return 0


def _load_edit_pipeline(kind: str, config):
    """The editing pipeline, with ``config["extrapolate"]``'s schedule installed under the edit (``set_pe``)."""
    from .extrapolate import install_extrapolation, parse_extrapolate
    from .loading import load_pipeline

    pipe = load_pipeline(kind, config["model"], config["dtype"], config["device"])
    setting = config["extrapolate"]
    installed = install_extrapolation(pipe, parse_extrapolate(str(setting["preset"])), setting["train_size"],
                                      setting.get("options"))
    if installed["schedules"] is not None:
        setting["installed"] = installed
        print(f"extrapolation: {json.dumps(installed)}")
    return pipe


def _sampler(config) -> dict:
    return dict(config.get("sampler", {}))


def _band(args, config, tqdm) -> dict:
    from .figures import band_attention_maps, band_diagnostic

    variant = config.get("variant", "flux")
    kind = "band" if variant == "flux" else "band_kontext"
    pipe = _load_edit_pipeline(kind, config)
    band = dict(config["band"])
    figure = config.get("figure", {})
    sampler = _sampler(config)
    probe_layer = min(int(figure.get("diagnostic_layer", 0)), len(pipe.transformer.transformer_blocks)
                      + len(pipe.transformer.single_transformer_blocks) - 1)
    if variant == "flux":
        targets = args.target or config["targets"]
        prompts = [args.reference_prompt or config["reference"]["prompt"], *targets]
        call = dict(**_prompt_kwargs(args, prompts, pipe), **sampler)
        reference = args.reference_image or config["reference"].get("image")
        if reference:
            call.update(reference_image=_load_image(reference, "reference image", pipe.token_pixels),
                        reference_seed=config["reference"].get("seed", 0),
                        reference_mode=config["reference"].get("mode", "noise"))
    else:
        image_path = args.image or config.get("image")
        if not image_path:
            raise ValueError("the Kontext variant needs --image (the context/reference image)")
        context_image = _load_image(image_path, "image", pipe.token_pixels)
        height, width = context_image.shape[-2:]  # the output takes the context image's size
        sampler.update(height=height, width=width, max_area=height * width, _auto_resize=False)
        call = dict(image=context_image, **_prompt_kwargs(args, config.get("prompt"), pipe), **sampler)

    def run(strength, probe=None):
        return pipe(band={**band, "strength": strength}, generator=_generator(config["seed"]), output_type="pt",
                    probe=probe, **call).images

    images = run(band["strength"], probe=(probe_layer, float(figure.get("diagnostic_step", 0.5))))
    probe = pipe.probe
    sweep = {f"strength={s}": run(s)[-1] for s in tqdm(figure.get("sweep", []), desc="strength sweep")}
    if variant == "flux":
        inputs = {"reference": images[0]}
        edited = {f"target {i}": image for i, image in enumerate(images[1:], 1)}
        target = 1
    else:
        inputs, edited, target = {"context": call["image"][0]}, {"edited": images[0]}, 0
    tokens = pipe.token_pixels
    grid = (call.get("height", images.shape[-2]) // tokens, call.get("width", images.shape[-1]) // tokens)
    token = (grid[0] // 2) * grid[1] + grid[1] // 2
    axes = pipe.transformer.config.axes_dims_rope

    def diagnostic(path):
        maps = band_attention_maps(probe.query, probe.key, axes, grid, token, target)
        return band_diagnostic(maps, grid, token, path, next(iter(inputs.values())))

    return dict(inputs=inputs, edited=edited, sweep=sweep, diagnostic=diagnostic,
                title=f"band modulation ({variant}): s_hf {band['s_hf']}, s_lf {band['s_lf']}, beta {band['beta']}")


def _transplant(args, config, tqdm) -> dict:
    from .figures import transplant_diagnostic
    from .images import load_image

    pipe = _load_edit_pipeline("transplant", config)
    background = _load_image(args.background, "background", pipe.token_pixels)
    size = tuple(background.shape[-2:])
    references = [load_image(p) for p in args.reference]  # any size: each is fitted into its tile
    reference_masks = None
    if args.reference_mask:
        reference_masks = [_load_mask(p, r.shape[-2:]) for p, r in zip(args.reference_mask, references)]
    where = {"mask_image": _load_mask(args.mask, size)} if args.mask else \
        {"target_box": [int(v) for v in args.box.split(",")]}
    call = dict(image=background, references=references, reference_masks=reference_masks, **where,
                **_prompt_kwargs(args, config.get("prompt"), pipe), **_sampler(config))
    transplant = dict(config["transplant"])

    def run(tau):
        return pipe(transplant={**transplant, "tau": tau}, generator=_generator(config["seed"]), output_type="pt",
                    **call)

    result = run(transplant["tau"])
    sweep = {f"tau={t}": run(t).images[0] for t in tqdm(config.get("figure", {}).get("sweep", []), desc="tau sweep")}
    inputs = {"background": background[0], **{f"reference {i}": r[0] for i, r in enumerate(references)}}
    return dict(inputs=inputs, edited={"inserted": result.images[0]}, sweep=sweep,
                diagnostic=lambda path: transplant_diagnostic(result.canvas, result.ids, result.native_ids, path),
                title=f"PE transplant ({transplant['layout']}, tau={transplant['tau']})")


def _loose(args, config, tqdm) -> dict:
    from .figures import loose_diagnostic
    from .loose import LooseConfig

    pipe = _load_edit_pipeline("loose", config)
    collage = _load_image(args.image, "image", pipe.token_pixels)
    size = tuple(collage.shape[-2:])
    pasted = {"crop_mask": _load_mask(args.mask, size)} if args.mask else \
        {"original": _load_image(args.original, "original", pipe.token_pixels)}
    call = dict(image=collage, **pasted, **_prompt_kwargs(args, config.get("prompt"), pipe), **_sampler(config))
    if args.saliency:
        from .images import area_resize, load_image

        call["saliency"] = area_resize(load_image(args.saliency)[0].mean(0), size).clamp(0, 1)
    loose = dict(config["loose"])

    def run(strength):
        return pipe(loose={**loose, "strength": strength}, generator=_generator(config["seed"]), output_type="pt",
                    **call)

    result = run(loose["strength"])
    sweep = {f"strength={s}": run(s).images[0] for s in tqdm(config.get("figure", {}).get("sweep", []),
                                                               desc="strength sweep")}
    return dict(inputs={"collage": collage[0]}, edited={"harmonised": result.images[0]}, sweep=sweep,
                diagnostic=lambda path: loose_diagnostic(result.maps, LooseConfig(**loose), path, collage[0]),
                title=f"LooseRoPE ({loose['num_bins']} bins, boost {loose['saliency_boost']})")


def run_generate(args) -> int:
    from .generate import run_generate as run

    return run(args)


def main(argv=None) -> int:
    """Standalone entry (``scripts/edit.py``, ``scripts/generate.py``)."""
    parser = argparse.ArgumentParser(prog="mmpos")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
