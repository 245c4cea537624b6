"""LooseRoPE: cut-and-paste harmonisation on Kontext, the pasted tokens' positions loosened by saliency.

``mmpos edit loose``: a collage and its paste mask (or the image before pasting). On the world Kontext model:
:func:`~mmpos.world.edit_pairs.harmonise_pair` examples, the schedule rescaled to the step count
(:func:`loose_for_steps`).
"""

from __future__ import annotations

from . import register_edit
from .base import EditMethod, run_edit

PIPELINES = {  # pipeline key (class name or diffusers family) -> pipeline; a new family is one line
    "FluxKontextPipeline": "mmpos.pipelines.loose_pipeline:LooseRoPEKontextPipeline",
    "Flux2KleinPipeline": "mmpos.pipelines.loose_family_pipeline:LooseRoPEKleinPipeline",
    "QwenImageEditPipeline": "mmpos.pipelines.loose_family_pipeline:LooseRoPEQwenEditPipeline",
    "QwenImageEditPlusPipeline": "mmpos.pipelines.loose_family_pipeline:LooseRoPEQwenEditPlusPipeline",
}
SCHEDULE_STEPS = 28  # LooseConfig's step indices are for the authors' 28-step Kontext schedule
DEMO_SEED = 424_242  # harmonise pairs never seen in training (those come from instruction_pair seeds)


def add_options(parser) -> None:
    parser.add_argument("--image", required=True, help="the collage (object pasted)")
    pasted = parser.add_mutually_exclusive_group(required=True)
    pasted.add_argument("--mask", help="mask of the pasted region (this or --original is required)")
    pasted.add_argument(
        "--original", help="the image before pasting: the mask is where they differ (this or --mask is required)"
    )
    parser.add_argument(
        "--saliency", help="saliency map image, grey levels (default: the config's loose.saliency provider)"
    )


def collect(result, call) -> dict:
    return {"outputs": result.images}


def loose_for_steps(steps: int, **options) -> dict:
    """LooseConfig options with its step indices (``cutoffs``, ``step_range``) rescaled from the 28-step
    schedule they were tuned for to ``steps`` (rounded: below about 10 steps phases merge)."""
    from mmpos.pipelines.loose import LooseConfig

    defaults = LooseConfig()
    rescale = lambda values: tuple(int(round(v * steps / SCHEDULE_STEPS)) for v in values)  # noqa: E731
    return {"cutoffs": rescale(defaults.cutoffs), "step_range": rescale(defaults.step_range), **options}


def world_calls(pipe, pairs, steps: int, guidance=None) -> list:
    """One call per :func:`~mmpos.world.edit_pairs.harmonise_pair`: its collage, paste mask known."""
    from mmpos.models.world.image import conditioning

    calls = []
    for pair in pairs:
        size = pair.collage.shape[0]
        calls.append(
            dict(
                image=pair.collage,
                crop_mask=pair.paste_mask,
                num_inference_steps=steps,
                height=size,
                width=size,
                max_area=size * size,
                _auto_resize=False,
                **conditioning(pipe, [pair.instruction], guidance),
            )
        )
    return calls


def run_loose(pipe, pairs, steps: int = 20, loose=None, guidance: float | None = None, seed: int = 0):
    """Harmonise each pair's collage (paste mask known) with LooseRoPE (``loose``: LooseConfig or dict); uint8
    outputs, pair ``i`` sampled with ``seed + i``."""
    return run_edit(LOOSE, pipe, world_calls(pipe, pairs, steps, guidance), loose, seed, progress="LooseRoPE")


def cli_run(args, config, load, tqdm) -> dict:
    """``mmpos edit loose``: the collage and its paste mask (or the original), a run and a strength sweep."""
    from ..figures import loose_diagnostic
    from ..loose import LooseConfig
    from ..run_inputs import load_placed_image, load_placed_mask, prompt_kwargs, report_prompts, sampler_options
    from .loading import input_side

    pipe = load()
    collage, placement = load_placed_image(args.image, "image", pipe.token_pixels, input_side(config, LOOSE))
    if args.mask:
        pasted = {"crop_mask": load_placed_mask(args.mask, placement, "the --image")}
    else:  # placed like the collage, so that the two differ only where the object was pasted
        from ..images import load_image

        pasted = {"original": placement.place_image(load_image(args.original, "--original"))}
    report_prompts(args, [("", config.get("prompt"), "--prompt", args.prompt_text is not None)])
    call = dict(
        image=collage,
        **pasted,
        **prompt_kwargs(args, config.get("prompt"), pipe, config.get("guidance")),
        **sampler_options(config, pipe),
    )
    if args.saliency:
        from ..images import load_image

        call["saliency"] = placement.place_map(load_image(args.saliency, "--saliency")[0].mean(0)).clamp(0, 1)
    loose = dict(config["loose"])

    def run(strength):
        return run_edit(
            LOOSE, pipe, [call], {**loose, "strength": strength}, config["seed"], output_type="pt", uint8=False
        )

    result = run(loose["strength"])
    sweep = {
        f"strength={s}": run(s).outputs[0]
        for s in tqdm(config.get("figure", {}).get("sweep", []), desc="strength sweep")
    }
    maps = result.last.maps
    return dict(
        inputs={"collage": collage[0]},
        edited={"harmonised": result.outputs[0]},
        sweep=sweep,
        diagnostic=lambda path: loose_diagnostic(maps, LooseConfig(**loose), path, collage[0]),
        placement=placement,
        title=f"LooseRoPE ({loose['num_bins']} bins, boost {loose['saliency_boost']})",
    )


def demo_section(source, steps: int, count: int, out_dir):
    """Paste harmonisation: plain Kontext (strength 0) vs LooseRoPE, beside the ground truth."""
    import numpy as np

    from mmpos.eval.edit_scores import SCORE_NOTES, harmonise_row
    from mmpos.pipelines.world.demo import Section, error_map, mask_image
    from mmpos.world.edit_pairs import harmonise_pair
    from mmpos.world.images import to_chw

    from ..figures import loose_diagnostic
    from ..loose import LooseConfig

    pairs = [harmonise_pair(DEMO_SEED + i, source.size("kontext")) for i in range(count)]
    pipe, guidance = source.pipeline("loose"), source.guidance("kontext")
    plain = run_loose(pipe, pairs, steps, loose_for_steps(steps, strength=0.0), guidance)
    config = loose_for_steps(steps)
    edited = run_loose(pipe, pairs, steps, config, guidance)
    truth = np.stack([p.target.image for p in pairs])
    rows = [
        ("pasted", np.stack([p.collage for p in pairs])),
        ("plain Kontext", plain.outputs),
        ("LooseRoPE", edited.outputs),
        ("ground truth", truth),
        ("paste mask", mask_image(np.stack([p.paste_mask for p in pairs]))),
        ("|error| LooseRoPE", error_map(edited.outputs, truth)),
    ]
    figure = loose_diagnostic(
        edited.last.maps, LooseConfig(**config), out_dir / "world_loose_maps.png", to_chw(pairs[-1].collage)
    )
    table = [
        harmonise_row("unedited collage", np.stack([p.collage for p in pairs]), pairs),
        harmonise_row("plain Kontext", plain.outputs, pairs),
        harmonise_row("LooseRoPE", edited.outputs, pairs),
        harmonise_row("ground truth", truth, pairs),
    ]
    return Section(
        "Paste harmonisation: plain Kontext vs LooseRoPE (LooseRoPEKontextPipeline)",
        rows,
        [pairs[0].instruction],
        [figure],
        "Plain Kontext is the same pipeline at strength 0. The figure shows the last example's token "
        "saliency, bins and per-token factors.",
        table,
        SCORE_NOTES["harmonise"],
    )


LOOSE = register_edit(
    EditMethod(
        name="loose",
        help="LooseRoPE cut-and-paste harmonisation on Kontext",
        config_class="mmpos.pipelines.loose:LooseConfig",
        pipelines=PIPELINES,
        world_task="kontext",
        add_options=add_options,
        flag_keys={},
        collect=collect,
        cli_run=cli_run,
        demo_section=demo_section,
        demo_order=2,
        prompt_help="the edit model's harmonisation instruction (default: the config's prompt, the authors' instruction)",
    )
)
