"""``mmpos edit {band,transplant,loose}``: config-driven training-free PE edits that save images, the resolved
config, a comparison figure (inputs, edited, strength sweep) and a method diagnostic. torch and diffusers are
imported when the command runs."""
from __future__ import annotations

import sys
from pathlib import Path

from mmpos._arguments import positive_int_arg

from ._options import add_run_options

METHODS = ("band", "transplant", "loose")


def register(subparsers) -> None:
    """Register ``edit`` and its methods on the root parser's subparsers."""
    edit = subparsers.add_parser("edit", help="training-free PE edits on Flux: band | transplant | loose",
                                 description="Run a training-free PE edit from a YAML config (configs/edit_*.yaml).")
    edit.set_defaults(func=run)
    methods = edit.add_subparsers(dest="method", required=True, metavar="{band,transplant,loose}")
    band = methods.add_parser("band", help="band modulation (Untwisting RoPE): style-aligned shared attention")
    band.add_argument("--reference-image", help="real reference image (output size) (default: the config's "
                      "reference.image, else generated from the reference prompt)")
    band.add_argument("--reference-prompt", help="reference prompt (default: the config's reference.prompt)")
    band.add_argument("--target", action="append", help="target prompt, repeat for more (default: the config's "
                      "targets)")
    band.add_argument("--image", help="Kontext variant (variant: kontext): the context image (default: the "
                      "config's image)")
    transplant = methods.add_parser("transplant", help="PE transplant (PosBridge) object insertion on Fill")
    transplant.add_argument("--background", required=True, help="background image")
    where = transplant.add_mutually_exclusive_group(required=True)
    where.add_argument("--mask", help="target region mask (white = insert here), same size as the background "
                       "(this or --box is required)")
    where.add_argument("--box", type=int, nargs=4, metavar=("L", "T", "R", "B"),
                       help="target box: left top right bottom in pixels of the --background file (exclusive "
                       "ends; rescaled with the background when it is resized; this or --mask is required)")
    transplant.add_argument("--reference", action="append", required=True, help="reference view (repeat for more)")
    transplant.add_argument("--reference-mask", action="append", help="object mask per reference, repeat "
                            "(default: the whole reference is the object)")
    loose = methods.add_parser("loose", help="LooseRoPE cut-and-paste harmonisation on Kontext")
    loose.add_argument("--image", required=True, help="the collage (object pasted)")
    pasted = loose.add_mutually_exclusive_group(required=True)
    pasted.add_argument("--mask", help="mask of the pasted region (this or --original is required)")
    pasted.add_argument("--original", help="the image before pasting: the mask is where they differ "
                        "(this or --mask is required)")
    loose.add_argument("--saliency", help="saliency map image, grey levels (default: the config's "
                       "loose.saliency provider)")
    for name, sub in (("band", band), ("transplant", transplant), ("loose", loose)):
        sub.add_argument("--prompt", dest="prompt_text", help="prompt, band: of the Kontext variant (default: the "
                         "config's prompt)")
        sub.add_argument("--extrapolate", help="edit above the training size: the RoPE extrapolation of "
                         "`mmpos generate --extrapolate` (dype, ntk, yarn, pi, ..., or row=dype,col=ntk) under the "
                         "edit (default: the config's extrapolate.preset, none)")
        sub.add_argument("--train-size", type=positive_int_arg, help="training resolution in pixels for --extrapolate "
                         "(default: the config's extrapolate.train_size, else 1024 for FLUX.1; 32 world)")
        add_run_options(sub, f"edit_{name}")


def run(args) -> int:
    """Run ``mmpos edit METHOD``: resolve the config, run the method, save images, config, figures and summary."""
    import json

    from tqdm.auto import tqdm

    from mmpos._atomic import written_atomically

    from ..config import save_config
    from ..images import save_image
    from ..run_inputs import output_folder, report_written

    config = edit_config(args)  # config errors (one line, exit 2) before diffusers is imported
    out = output_folder(args, Path(f"outputs/edit_{args.method}"))
    from ..edit_methods import run_band, run_loose, run_transplant

    runner = {"band": run_band, "transplant": run_transplant, "loose": run_loose}[args.method]
    try:
        result = runner(args, config, tqdm)
    except (OSError, ValueError) as error:  # unreadable inputs, a box outside the image, words unknown to a model
        print(f"mmpos edit {args.method}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    out.mkdir(parents=True, exist_ok=True)  # after the work: a failed run leaves no folder behind
    written = [save_image(image, out / f"edited_{i}.png") for i, image in enumerate(result["edited"].values())]
    written.append(save_config(config, out / "config.yaml"))
    if not args.no_figures:
        from ..figures import comparison_figure

        written.append(comparison_figure(result["inputs"], result["edited"], result["sweep"], out / "comparison.png",
                                         result["title"]))
        written.append(result["diagnostic"](out / "diagnostic.png"))
    summary = {"method": args.method, "outputs": [str(p) for p in written if p.suffix == ".png"],
               "config": str(out / "config.yaml")}
    with written_atomically(out / "summary.json") as temporary:
        temporary.write_text(json.dumps(summary, indent=2))
    report_written(written + [out / "summary.json"], out)
    return 0


def edit_config(args) -> dict:
    """The config a ``mmpos edit METHOD`` run uses (saved as its ``config.yaml``): the YAML config, ``--set``, then
    each option naming a key (``--prompt`` prompt, ``--target`` targets, ``--extrapolate`` extrapolate.preset, ...)
    over its own key only (:data:`mmpos.pipelines.run_inputs.FLAG_KEYS`)."""
    from ..extrapolate import extrapolate_setting
    from ..run_inputs import resolve_config

    config = resolve_config(args)
    extrapolate_setting(config, args.extrapolate, args.train_size, "mmpos edit", default_train_size=1024)
    return config
