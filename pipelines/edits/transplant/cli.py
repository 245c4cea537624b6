"""``mmpos edit transplant``: its options and its run on the command line's inputs."""

from __future__ import annotations

from .. import get_edit
from ..method import run_edit


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


def cli_run(args, config, model, load, tqdm) -> dict:
    """``mmpos edit transplant``: the background, the region, the references; a run and a tau sweep."""
    from mmpos.integrations.diffusers.families import family_for

    from ...images import load_image
    from ...inputs import (
        load_mask,
        load_placed_image,
        load_placed_mask,
        prompt_kwargs,
        report_prompts,
        rescale_box,
        sampler_options,
    )
    from ...loading import input_side
    from .figures import transplant_diagnostic

    if args.box:  # a box outside the background fails before the model loads
        rescale_box(args.box, image_height_width(args.background), image_height_width(args.background))
    pipe = load()
    background, placement = load_placed_image(
        args.background, "background", pipe.token_pixels, input_side(config, model)
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
            get_edit("transplant"),
            pipe,
            [call],
            {**transplant, "tau": tau},
            config["seed"],
            output_type="pt",
            uint8=False,
        )

    result = run(transplant["tau"])
    requested = requested_region(where, background.shape[-2:])
    repainted = repainted_region(result.last.canvas)
    summary = {"repainted": repainted_area(requested, repainted, transplant, pipe.token_pixels)}
    print(describe_repainted(summary["repainted"]))
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
        summary=summary,
        overlays={"background": [(requested, "cyan", "requested"), (repainted, "red", "repainted")]},
        title=f"PE transplant ({transplant['layout']}, tau={transplant['tau']})",
    )


def requested_region(where: dict, size):
    """The region the user asked for, ``[H, W]`` bool on the model input: the placed mask, or the placed box."""
    import torch

    if "mask_image" in where:
        return where["mask_image"].bool()
    left, top, right, bottom = where["target_box"]
    region = torch.zeros(tuple(size), dtype=torch.bool)
    region[top:bottom, left:right] = True
    return region


def repainted_region(canvas):
    """The pixels of the background the model repaints, ``[H, W]`` bool: the canvas's inpaint mask (the requested
    region dilated by ``transplant.mask_dilate_tokens`` tokens) on the background."""
    rows, cols = canvas.layout.background.slices
    return canvas.inpaint_mask[rows, cols].cpu()


def repainted_area(requested, repainted, transplant: dict, token_pixels: int) -> dict:
    """Pixel counts of the requested and repainted regions (model input pixels), their ratio, the margin."""
    asked, painted = int(requested.sum()), int(repainted.sum())
    margin = int(transplant.get("mask_dilate_tokens", 1))
    return {
        "requested_pixels": asked,
        "repainted_pixels": painted,
        "ratio": round(painted / max(asked, 1), 2),
        "outside_request_pixels": int((repainted & ~requested).sum()),
        "margin_tokens": margin,
        "margin_pixels": margin * token_pixels,
    }


def describe_repainted(area: dict) -> str:
    return (
        f"repainted {area['repainted_pixels']} px of the model input for the {area['requested_pixels']} px "
        f"requested ({area['ratio']}x: a margin of transplant.mask_dilate_tokens={area['margin_tokens']} token, "
        f"{area['margin_pixels']} px, around it; 0 repaints the region only, rounded out to whole tokens)"
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
    from ...images import photo_size

    return photo_size(path, "--background")
