"""``mmpos edit loose``: its options and its run on the command line's inputs."""

from __future__ import annotations

from .. import get_edit
from ..method import run_edit


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


def cli_run(args, config, model, load, tqdm) -> dict:
    """``mmpos edit loose``: the collage and its paste mask (or the original), a run and a strength sweep."""
    from ...inputs import load_placed_image, load_placed_mask, prompt_kwargs, report_prompts, sampler_options
    from ...loading import input_side
    from .figures import loose_diagnostic
    from .rule import LooseConfig

    pipe = load()
    collage, placement = load_placed_image(args.image, "image", pipe.token_pixels, input_side(config, model))
    if args.mask:
        pasted = {"crop_mask": load_placed_mask(args.mask, placement, "the --image")}
    else:  # placed like the collage, so that the two differ only where the object was pasted
        from ...images import load_image

        pasted = {"original": placement.place_image(load_image(args.original, "--original"))}
    report_prompts(args, [("", config.get("prompt"), "--prompt", args.prompt_text is not None)])
    call = dict(
        image=collage,
        **pasted,
        **prompt_kwargs(args, config.get("prompt"), pipe, config.get("guidance")),
        **sampler_options(config, pipe),
    )
    if args.saliency:
        from ...images import load_image

        call["saliency"] = placement.place_map(load_image(args.saliency, "--saliency")[0].mean(0)).clamp(0, 1)
    loose = dict(config["loose"])

    def run(strength):
        return run_edit(
            get_edit("loose"),
            pipe,
            [call],
            {**loose, "strength": strength},
            config["seed"],
            output_type="pt",
            uint8=False,
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
