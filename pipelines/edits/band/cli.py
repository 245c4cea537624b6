"""``mmpos edit band``: its options and its run on the command line's inputs."""

from __future__ import annotations

from .. import get_edit
from ..method import run_edit


def add_options(parser) -> None:
    parser.add_argument(
        "--reference-image",
        help="real reference image (output size) (default: the config's "
        "reference.image, else generated from the reference prompt)",
    )
    parser.add_argument(
        "--reference-prompt",
        help="reference prompt (default: the config's reference.prompt; with a reference image, empty: the "
        "config's prompt describes a generated reference, not your photo)",
    )
    parser.add_argument(
        "--target", action="append", help="target prompt, repeat for more (default: the config's targets)"
    )
    parser.add_argument(
        "--image", help="Kontext variant (variant: kontext): the context image (default: the config's image)"
    )


FLAG_KEYS = {
    "target": "targets",
    "reference_prompt": "reference.prompt",
    "reference_image": "reference.image",
    "image": "image",
}


def cli_run(args, config, model, load, tqdm) -> dict:
    """``mmpos edit band``: the config's (or the options') prompts and images, a run and a strength sweep."""
    from ...inputs import load_placed_image, prompt_kwargs, report_prompts, sampler_options
    from ...loading import input_side
    from .figures import band_attention_maps, band_diagnostic

    pipe = load()
    variant = "kontext" if config.get("variant") == "kontext" else "flux"
    band, figure, sampler = dict(config["band"]), config.get("figure", {}), sampler_options(config, pipe)
    layers, axes, image_axes = attention_layout(pipe.transformer)
    probe_layer = min(int(figure.get("diagnostic_layer", 0)), layers - 1)
    side, guidance, placement = input_side(config, model), config.get("guidance"), None
    photo = None  # the reference image the user gave, as the pipeline gets it
    if variant == "flux":  # the targets are new images: the reference's placement is not theirs
        reference = args.reference_image or config["reference"].get("image")
        reference_prompt, targets = (
            reference_prompt_for(args, config, reference),
            args.target or config["targets"],
        )
        report_prompts(
            args,
            [
                ("reference", reference_prompt, "--reference-prompt", args.reference_prompt is not None),
                ("targets", targets, "--target", args.target is not None),
            ],
        )
        call = dict(**prompt_kwargs(args, [reference_prompt, *targets], pipe, guidance), **sampler)
        if reference:
            photo = load_placed_image(reference, "reference image", pipe.token_pixels, side, outputs_follow=False)[0]
            call.update(
                reference_image=photo,
                reference_seed=config["reference"].get("seed", 0),
                reference_mode=config["reference"].get("mode", "noise"),
            )
    else:
        image_path = args.image or config.get("image")
        if not image_path:
            raise ValueError("the Kontext variant needs --image (the context/reference image)")
        context_image, placement = load_placed_image(image_path, "image", pipe.token_pixels, side)
        height, width = context_image.shape[-2:]  # the output takes the context image's size
        sampler.update(height=height, width=width, max_area=height * width, _auto_resize=False)
        report_prompts(args, [("", config.get("prompt"), "--prompt", args.prompt_text is not None)])
        call = dict(image=context_image, **prompt_kwargs(args, config.get("prompt"), pipe, guidance), **sampler)

    def run(strength, probe=None, enabled=True):
        return run_edit(
            get_edit("band"),
            pipe,
            [dict(call, probe=probe)],
            {**band, "strength": strength, "enabled": enabled and band.get("enabled", True)},
            config["seed"],
            output_type="pt",
            uint8=False,
        )

    result = run(band["strength"], probe=(probe_layer, float(figure.get("diagnostic_step", 0.5))))
    probe = pipe.probe
    sweep = {f"strength={s}": run(s).outputs[-1] for s in tqdm(figure.get("sweep", []), desc="strength sweep")}
    summary = {}
    if variant == "flux":
        inputs, target = {"reference": result.references[0]}, 1
        if photo is not None:  # the photo itself, then what the reference branch made of it
            inputs = {"reference photo": photo[0], "reference branch (reconstruction)": result.references[0]}
            summary["reference_effect"] = reference_effect(result.outputs, run_edit_off(run, band))
            print(describe_reference_effect(summary["reference_effect"]))
        edited = {f"target {i}": image for i, image in enumerate(result.outputs, 1)}
    else:
        inputs, edited, target = {"context": call["image"][0]}, {"edited": result.outputs[0]}, 0
    tokens = pipe.token_pixels
    first = result.outputs[0]
    grid = (call.get("height", first.shape[-2]) // tokens, call.get("width", first.shape[-1]) // tokens)
    token = (grid[0] // 2) * grid[1] + grid[1] // 2

    def diagnostic(path):
        maps = band_attention_maps(probe.query, probe.key, axes, grid, token, target, image_axes)
        return band_diagnostic(maps, grid, token, path, next(iter(inputs.values())))

    return dict(
        inputs=inputs,
        edited=edited,
        sweep=sweep,
        diagnostic=diagnostic if probe is not None and probe.query is not None else None,  # off: nothing recorded
        placement=placement,
        summary=summary,
        title=f"band modulation ({variant}): s_hf {band['s_hf']}, s_lf {band['s_lf']}, beta {band['beta']}",
    )


def reference_prompt_for(args, config: dict, photo) -> str:
    """The reference branch's prompt: ``--reference-prompt``; else, with a reference photo, empty (the config's
    ``reference.prompt`` describes the reference it would generate, not the user's photo: conditioning the photo
    on it pulls the reference branch away from the photo), saying so; else the config's."""
    if args.reference_prompt is not None:
        return args.reference_prompt
    if photo:
        print(
            "reference prompt: empty (a reference image is given; the config's reference.prompt describes a "
            "generated reference, not this image; --reference-prompt describes it)"
        )
        return ""
    return config["reference"]["prompt"]


def run_edit_off(run, band: dict) -> list:
    """The targets with no shared attention (``band.enabled: false``): what they are without the reference."""
    return run(band["strength"], enabled=False).outputs


def reference_effect(with_reference: list, without: list) -> dict:
    """How much the reference moved each target: mean absolute pixel change (0-255 scale) between the targets
    with band-modulated shared attention and the same targets (same seed) without any shared attention."""
    changes = [round(float((a.float() - b.float()).abs().mean()) * 255, 2) for a, b in zip(with_reference, without)]
    return {
        "mean_abs_change_255": changes,
        "against": "the same targets and seed without shared attention (band.enabled: false)",
    }


def describe_reference_effect(effect: dict) -> str:
    changes = ", ".join(f"{c:.1f}" for c in effect["mean_abs_change_255"])
    return f"the reference image moved the targets by {changes} /255 (mean absolute change against no sharing)"


def attention_layout(transformer) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """``(attention layers, native rotary channels per axis, image row / column axes)`` of ``transformer``, from
    its diffusers family (:mod:`mmpos.integrations.diffusers.families`): what the probe and its figure need."""
    from mmpos.integrations.diffusers.families import family_for

    family = family_for(transformer)
    layers = len(family.attention_modules(transformer))
    return layers, tuple(family.native_axes_dims(transformer)), tuple(family.image_axes)
