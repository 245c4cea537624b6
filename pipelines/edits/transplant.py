"""PE transplant (PosBridge): object insertion on Fill, the reference tiles' tokens carrying the target box's
positions while sigma >= tau.

``mmpos edit transplant``: a background, a mask or box, reference views. On the world Fill model:
:func:`~mmpos.world.edit_pairs.transplant_pair` examples, on the world's canvas layout
(:data:`~mmpos.world.canvas.WORLD_TRANSPLANT`).
"""

from __future__ import annotations

from . import register_edit
from .base import EditMethod, run_edit

PIPELINES = {  # pipeline key (class name or diffusers family) -> pipeline; a new family is one line
    "FluxFillPipeline": "mmpos.pipelines.transplant_pipeline:PosBridgeFillPipeline",
    "Flux2KleinInpaintPipeline": "mmpos.pipelines.family_transplant_pipeline:PosBridgeKleinInpaintPipeline",
    "QwenImageInpaintPipeline": "mmpos.pipelines.family_transplant_pipeline:PosBridgeQwenInpaintPipeline",
    # the released Klein and Qwen-Image folders name their text-to-image pipeline; the inpainting pipeline takes the
    # same components (FLUX.1 Fill, by contrast, has its own weights)
    "Flux2KleinPipeline": "mmpos.pipelines.family_transplant_pipeline:PosBridgeKleinInpaintPipeline",
    "QwenImagePipeline": "mmpos.pipelines.family_transplant_pipeline:PosBridgeQwenInpaintPipeline",
}
WORLD_LAYOUT = "world"  # run_transplant's default: the world Fill model's canvas layout
DEMO_SEED = 434_343  # insertion pairs never seen in training (those come from fill_canvas_example seeds)


def add_options(parser) -> None:
    parser.add_argument("--background", required=True, help="background image")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--mask",
        help="target region mask (white = insert here), same size as the background (this or --box is required)",
    )
    where.add_argument(
        "--box",
        type=int,
        nargs=4,
        metavar=("L", "T", "R", "B"),
        help="target box: left top right bottom in pixels of the --background file (exclusive "
        "ends; mapped with the background when it is resized or padded; this or --mask is required)",
    )
    parser.add_argument("--reference", action="append", required=True, help="reference view (repeat for more)")
    parser.add_argument(
        "--reference-mask",
        action="append",
        help="object mask per reference, repeat (default: the whole reference is the object)",
    )


def collect(result, call) -> dict:
    """The composited output, and the scene part of the canvas output before compositing (``raw``)."""
    rows, cols = result.canvas.layout.background.slices
    return {"outputs": result.images, "raw": result.canvas_images[..., rows, cols]}


def world_calls(pipe, pairs, steps: int, guidance=None) -> list:
    """One call per :func:`~mmpos.world.edit_pairs.transplant_pair`: its reference object at its box."""
    from mmpos.models.world.image import conditioning

    return [
        dict(
            image=pair.background.image,
            target_box=pair.box,
            references=[pair.reference.image],
            reference_masks=[pair.reference.masks[0]],
            num_inference_steps=steps,
            **conditioning(pipe, [pair.caption], guidance),
        )
        for pair in pairs
    ]


def run_transplant(pipe, pairs, steps: int = 20, transplant=WORLD_LAYOUT, guidance: float | None = None, seed: int = 0):
    """Insert each pair's reference object at its box (uint8 outputs, and ``raw``: the scene part of each canvas
    output before compositing). ``transplant``: TransplantConfig or dict; the default is the world Fill model's canvas
    layout :data:`~mmpos.world.canvas.WORLD_TRANSPLANT` (a dict given replaces it: write
    ``{**WORLD_TRANSPLANT, "tau": 0.5}`` to keep it; ``{}`` is the paper's corner layout for FLUX.1-Fill)."""
    if isinstance(transplant, str) and transplant == WORLD_LAYOUT:
        from mmpos.world.canvas import WORLD_TRANSPLANT

        transplant = WORLD_TRANSPLANT
    return run_edit(
        TRANSPLANT,
        pipe,
        world_calls(pipe, pairs, steps, guidance),
        transplant,
        seed,
        output_type="pt",
        progress="PE transplant",
    )


def cli_run(args, config, load, tqdm) -> dict:
    """``mmpos edit transplant``: the background, the region, the references; a run and a tau sweep."""
    from mmpos.integrations.diffusers.families import family_for

    from ..figures import transplant_diagnostic
    from ..images import load_image
    from ..run_inputs import (
        load_mask,
        load_placed_image,
        load_placed_mask,
        prompt_kwargs,
        report_prompts,
        rescale_box,
        sampler_options,
    )
    from .loading import input_side

    if args.box:  # a box outside the background fails before the model loads
        rescale_box(args.box, image_height_width(args.background), image_height_width(args.background))
    pipe = load()
    background, placement = load_placed_image(
        args.background, "background", pipe.token_pixels, input_side(config, TRANSPLANT)
    )
    references = [load_image(p, "--reference") for p in args.reference]  # any size: each is fitted into its tile
    reference_masks = None
    if args.reference_mask:
        reference_masks = [load_mask(p, r.shape[-2:]) for p, r in zip(args.reference_mask, references)]
    where = (
        {"mask_image": load_placed_mask(args.mask, placement, "the background")}
        if args.mask
        else {"target_box": target_box(args.box, placement)}
    )
    report_prompts(args, [("", config.get("prompt"), "--prompt", args.prompt_text is not None)])
    call = dict(
        image=background,
        references=references,
        reference_masks=reference_masks,
        **where,
        **prompt_kwargs(args, config.get("prompt"), pipe, config.get("guidance")),
        **sampler_options(config, pipe),
    )
    transplant = dict(config["transplant"])

    def run(tau):
        return run_edit(
            TRANSPLANT, pipe, [call], {**transplant, "tau": tau}, config["seed"], output_type="pt", uint8=False
        )

    result = run(transplant["tau"])
    sweep = {f"tau={t}": run(t).outputs[0] for t in tqdm(config.get("figure", {}).get("sweep", []), desc="tau sweep")}
    inputs = {"background": background[0], **{f"reference {i}": r[0] for i, r in enumerate(references)}}
    last = result.last
    image_axes = family_for(pipe.transformer).image_axes  # the ids are in the family's coordinates
    return dict(
        inputs=inputs,
        edited={"inserted": result.outputs[0]},
        sweep=sweep,
        diagnostic=lambda path: transplant_diagnostic(last.canvas, last.ids, last.native_ids, path, image_axes),
        placement=placement,
        title=f"PE transplant ({transplant['layout']}, tau={transplant['tau']})",
    )


def target_box(box, placement) -> list[int]:
    """``--box`` (L T R B pixels of the background file) on the background as the pipeline gets it (``placement``:
    resized, and for a world model padded to its square)."""
    placed = list(placement.place_box(box))
    if placement.changed:
        (h0, w0), (h1, w1) = placement.source, placement.canvas
        print(
            f"--box {' '.join(map(str, box))} of the {h0}x{w0} background is "
            f"{' '.join(map(str, placed))} of the {h1}x{w1} model input"
        )
    return placed


def image_height_width(path) -> tuple[int, int]:
    from ..images import photo_size

    return photo_size(path, "--background")


def demo_section(source, steps: int, count: int, out_dir):
    """Object insertion: plain Fill (transplant disabled, same canvas) vs PE transplant, beside the ground truth."""
    import numpy as np

    from mmpos.eval.edit_scores import SCORE_NOTES, transplant_row
    from mmpos.pipelines.world.demo import Section, error_map, with_box
    from mmpos.world.canvas import WORLD_TRANSPLANT, insertion_canvas, scene_part
    from mmpos.world.edit_pairs import transplant_pair

    from ..figures import transplant_diagnostic

    pairs = [transplant_pair(DEMO_SEED + i, source.size("fill")) for i in range(count)]
    pipe, guidance = source.pipeline("transplant"), source.guidance("fill")
    options = WORLD_TRANSPLANT if source.is_world("fill") else {}  # pretrained Fill: the paper's layout
    plain = run_transplant(pipe, pairs, steps, {**options, "enabled": False}, guidance)
    edited = run_transplant(pipe, pairs, steps, options, guidance)
    truth = np.stack([p.target.image for p in pairs])
    rows = [
        ("background, target box", np.stack([with_box(p.background.image, p.box) for p in pairs])),
        ("reference", np.stack([p.reference.image for p in pairs])),
        ("plain Fill", plain.outputs),
        ("PE transplant", edited.outputs),
        ("ground truth", truth),
        ("|error| transplant", error_map(edited.outputs, truth)),
    ]
    last = edited.last
    figure = transplant_diagnostic(last.canvas, last.ids, last.native_ids, out_dir / "world_transplant_ids.png")
    regions = [scene_part(insertion_canvas(p).mask) for p in pairs]  # the repainted (dilated) box
    table = [
        transplant_row("plain Fill", plain.outputs, pairs, regions, plain.raw),
        transplant_row("PE transplant", edited.outputs, pairs, regions, edited.raw),
        transplant_row("ground truth", truth, pairs, regions),
    ]
    return Section(
        "Object insertion: plain Fill vs PE transplant (PosBridgeFillPipeline)",
        rows,
        [p.caption for p in pairs],
        [figure],
        "Both rows run the same pipeline on the same canvas (reference tile left of the scene); plain "
        "Fill is transplant.enabled=False. The red outline is the target box. The figure shows the last "
        "example's canvas and the ids its tokens carry while sigma >= tau.",
        table,
        SCORE_NOTES["transplant"],
    )


TRANSPLANT = register_edit(
    EditMethod(
        name="transplant",
        help="PE transplant (PosBridge) object insertion on Fill",
        config_class="mmpos.pipelines.transplant:TransplantConfig",
        pipelines=PIPELINES,
        world_task="fill",
        add_options=add_options,
        flag_keys={},
        collect=collect,
        cli_run=cli_run,
        demo_section=demo_section,
        demo_order=1,
        prompt_help="the inpainting prompt: the edited scene, object included (default: the config's prompt)",
    )
)
