"""Band modulation (Untwisting RoPE): style-aligned generation with band-scaled shared attention.

``mmpos edit band``: FLUX.1 (``[reference, targets...]`` in one batch) and Kontext (``variant: kontext``: the
context image is the reference). On the world t2i model: :func:`~mmpos.world.edit_pairs.style_set` examples.
"""

from __future__ import annotations

from . import register_edit
from .base import EditMethod, Variant, run_edit

PIPELINES = {  # pipeline key (class name or diffusers family) -> pipeline; a new family is one line
    "FluxPipeline": "mmpos.pipelines.band_pipeline:BandModulationFluxPipeline",
    "FluxKontextPipeline": "mmpos.pipelines.band_pipeline:BandModulationKontextPipeline",
    "Flux2Pipeline": "mmpos.pipelines.band_families:BandModulationFlux2Pipeline",
    "Flux2KleinPipeline": "mmpos.pipelines.band_families:BandModulationFlux2KleinPipeline",
    "QwenImagePipeline": "mmpos.pipelines.band_families:BandModulationQwenImagePipeline",
    "QwenImage21Pipeline": "mmpos.pipelines.band_families:BandModulationQwenImage21Pipeline",
    "ZImagePipeline": "mmpos.pipelines.band_families:BandModulationZImagePipeline",
}
VARIANTS = {"flux": Variant("FluxPipeline", "t2i"), "kontext": Variant("FluxKontextPipeline", "kontext")}
STRENGTHS = (0.0, 0.5, 1.0)  # the demo's rows; 0: shared attention with the bands unscaled
DEMO_SEED = 444_444  # the demo's style sets


def add_options(parser) -> None:
    parser.add_argument(
        "--reference-image",
        help="real reference image (output size) (default: the config's "
        "reference.image, else generated from the reference prompt)",
    )
    parser.add_argument("--reference-prompt", help="reference prompt (default: the config's reference.prompt)")
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


def collect(result, call) -> dict:
    """A Kontext call (``image=`` the context) edits each output; a shared-reference batch is
    ``[reference, target_1, ...]``."""
    if "image" in call:
        return {"outputs": result.images}
    return {"references": result.images[:1], "outputs": result.images[1:]}


def world_calls(pipe, style_sets, steps: int, guidance=None, reference_mode: str = "noise", probe=None) -> list:
    """One call per :func:`~mmpos.world.edit_pairs.style_set`: its reference image shared with its targets
    (content prompts)."""
    from mmpos.models.world.image import conditioning

    calls = []
    for style in style_sets:
        size = style.reference.image.shape[0]
        captions = [style.reference.spec.caption()] + list(style.prompts)
        calls.append(
            dict(
                reference_image=style.reference.image,
                reference_mode=reference_mode,
                num_inference_steps=steps,
                height=size,
                width=size,
                probe=probe,
                **conditioning(pipe, captions, guidance),
            )
        )
    return calls


def run_band(
    pipe,
    style_sets,
    steps: int = 20,
    band=None,
    guidance: float | None = None,
    seed: int = 0,
    reference_mode: str = "noise",
    probe=None,
):
    """For each style set, generate its targets sharing attention with its reference image (``band``: BandConfig
    or dict); outputs (uint8) are the targets of every set, in order; set ``i`` samples with ``seed + i``."""
    return run_edit(
        BAND,
        pipe,
        world_calls(pipe, style_sets, steps, guidance, reference_mode, probe),
        band,
        seed,
        progress="band modulation",
    )


def cli_run(args, config, load, tqdm) -> dict:
    """``mmpos edit band``: the config's (or the options') prompts and images, a run and a strength sweep."""
    from ..figures import band_attention_maps, band_diagnostic
    from ..run_inputs import load_placed_image, prompt_kwargs, report_prompts, sampler_options
    from .loading import input_side

    pipe = load()
    variant = "kontext" if config.get("variant") == "kontext" else "flux"
    band, figure, sampler = dict(config["band"]), config.get("figure", {}), sampler_options(config, pipe)
    layers, axes, image_axes = attention_layout(pipe.transformer)
    probe_layer = min(int(figure.get("diagnostic_layer", 0)), layers - 1)
    side, guidance, placement = input_side(config, BAND), config.get("guidance"), None
    if variant == "flux":  # the targets are new images: the reference's placement is not theirs
        reference_prompt, targets = (
            args.reference_prompt or config["reference"]["prompt"],
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
        reference = args.reference_image or config["reference"].get("image")
        if reference:
            call.update(
                reference_image=load_placed_image(reference, "reference image", pipe.token_pixels, side)[0],
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

    def run(strength, probe=None):
        return run_edit(
            BAND,
            pipe,
            [dict(call, probe=probe)],
            {**band, "strength": strength},
            config["seed"],
            output_type="pt",
            uint8=False,
        )

    result = run(band["strength"], probe=(probe_layer, float(figure.get("diagnostic_step", 0.5))))
    probe = pipe.probe
    sweep = {f"strength={s}": run(s).outputs[-1] for s in tqdm(figure.get("sweep", []), desc="strength sweep")}
    if variant == "flux":
        inputs, target = {"reference": result.references[0]}, 1
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
        title=f"band modulation ({variant}): s_hf {band['s_hf']}, s_lf {band['s_lf']}, beta {band['beta']}",
    )


def attention_layout(transformer) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """``(attention layers, native rotary channels per axis, image row / column axes)`` of ``transformer``, from
    its diffusers family (:mod:`mmpos.integrations.diffusers.families`): what the probe and its figure need."""
    from mmpos.integrations.diffusers.families import family_for

    family = family_for(transformer)
    layers = len(family.attention_modules(transformer))
    return layers, tuple(family.native_axes_dims(transformer)), tuple(family.image_axes)


def demo_section(source, steps: int, count: int, out_dir):
    """Style-aligned sets: no sharing, then band modulation at :data:`STRENGTHS`, beside the ground truth."""
    import numpy as np

    from mmpos.eval.edit_scores import SCORE_NOTES, style_row
    from mmpos.pipelines.world.demo import Section
    from mmpos.world.edit_pairs import style_set
    from mmpos.world.images import to_chw

    from ..figures import band_attention_maps, band_diagnostic

    size = source.size("t2i")
    sets = [style_set(DEMO_SEED + i, 2, size) for i in range(max(count // 2, 1))]
    pipe, guidance = source.pipeline("band"), source.guidance("t2i")
    references = [s.reference for s in sets for _ in s.targets]
    rows = [
        ("reference", np.stack([r.image for r in references])),
        ("no sharing", run_band(pipe, sets, steps, {"enabled": False}, guidance).outputs),
    ]
    for strength in STRENGTHS:
        probe = (0, 0.5) if strength == STRENGTHS[-1] else None
        rows.append(
            (
                f"band strength {strength}",
                run_band(pipe, sets, steps, {"strength": strength}, guidance, probe=probe).outputs,
            )
        )
    rows.append(("ground truth", np.stack([t.image for s in sets for t in s.targets])))
    table = [style_row(label, images, references) for label, images in rows[1:]]
    grid = (size // pipe.token_pixels,) * 2
    token = grid[0] // 2 * grid[1] + grid[1] // 2
    maps = band_attention_maps(pipe.probe.query, pipe.probe.key, pipe.transformer.config.axes_dims_rope, grid, token)
    figure = band_diagnostic(maps, grid, token, out_dir / "world_band_attention.png", to_chw(sets[-1].reference.image))
    strengths = ", ".join(str(s) for s in STRENGTHS)
    return Section(
        f"Style-aligned sets: band modulation at strengths {strengths} (BandModulationFluxPipeline)",
        rows,
        [p for s in sets for p in s.prompts],
        [figure],
        "Targets get their content prompt only; the style comes from the shared reference image (no "
        "sharing: no attention to it; strength 0: shared attention with the bands unscaled). The "
        "figure: attention of the centre query of the last set's first target over its reference "
        f"(layer 0, strength {STRENGTHS[-1]}, half-way through sampling), per frequency band.",
        table,
        SCORE_NOTES["style"],
    )


BAND = register_edit(
    EditMethod(
        name="band",
        help="band modulation (Untwisting RoPE): style-aligned shared attention",
        config_class="mmpos.pipelines.band:BandConfig",
        pipelines=PIPELINES,
        world_task="t2i",
        add_options=add_options,
        flag_keys=FLAG_KEYS,
        collect=collect,
        cli_run=cli_run,
        demo_section=demo_section,
        variants=VARIANTS,
        demo_order=3,
    )
)
