"""``mmpos edit {band,transplant,loose}`` and ``mmpos generate``: config-driven runs that save images, the
resolved config, a comparison figure (inputs, edited, strength sweep) and a method diagnostic.

Imports of torch/diffusers happen when a command runs, so registering the commands costs nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mmpos._atomic import written_atomically
from mmpos._validation import positive_int_arg

METHODS = ("band", "transplant", "loose")


def add_commands(subparsers) -> None:
    """Register ``edit`` and ``generate`` on an ``argparse`` subparsers object (called from ``mmpos.cli``)."""
    edit = subparsers.add_parser("edit", help="training-free PE edits on Flux: band | transplant | loose",
                                 description="Run a training-free PE edit from a YAML config (configs/edit_*.yaml).")
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
    generate.add_argument("--prompt", action="append", help="prompt, repeat for more (default: the config's "
                          "prompts)")
    generate.add_argument("--height", type=positive_int_arg, help="output height in pixels (default: the config's "
                          "sampler.height: 1024 FLUX.1, 32 world)")
    generate.add_argument("--width", type=positive_int_arg, help="output width in pixels (default: the config's sampler.width)")
    generate.add_argument("--extrapolate", help="none | pi | ntk | yarn | vision_yarn | dype | dype_ntk | dype_yarn, "
                          "or per axis: row=dype,col=ntk (default: the config's extrapolate.preset, none)")
    generate.add_argument("--train-size", type=positive_int_arg, help="training resolution in pixels (default: the config's "
                          "extrapolate.train_size; auto: 1024 FLUX.1, 1328 Qwen-Image, 32 world)")
    _common(generate, "generate")
    generate.set_defaults(func=run_generate, method="generate")


def _common(parser, config_name: str) -> None:
    parser.add_argument("--config", help=f"YAML config (default: configs/{config_name}.yaml with CUDA, "
                        f"configs/{config_name}_world.yaml without CUDA or with --model world)")
    parser.add_argument("--config-name", default=config_name, help=argparse.SUPPRESS)
    parser.add_argument("--model", help="from_pretrained folder or hub id, or 'world' for the shipped world model "
                        "(default: the config's model: FLUX.1 with CUDA, the world model without)")
    parser.add_argument("--prompt-embeds", help="safetensors/pt file with prompt_embeds [B, L, D] and (Flux) "
                        "pooled_prompt_embeds [B, D] or (Qwen-Image, optional) prompt_embeds_mask [B, L] "
                        "(for models saved without text encoders; default: encode the prompts)")
    parser.add_argument("--device", help="cpu | cuda (default: the config's device: cuda for FLUX.1, falling back "
                        "to cpu; cpu for the world models)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="model dtype (default: the "
                        "config's dtype: bfloat16 for FLUX.1, float32 for the world models)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key, e.g. --set band.strength=0.5, repeat (default: none)")
    parser.add_argument("--out", default=None, help="output folder (default: outputs/<command>, or the next free "
                        "outputs/<command>-N); a named folder that holds files is refused unless --overwrite")
    parser.add_argument("--overwrite", action="store_true", help="write into a named --out that already holds "
                        "files (default: refuse)")
    parser.add_argument("--no-figures", action="store_true", help="skip the comparison and diagnostic figures "
                        "(default: write them)")


def run_edit(args) -> int:
    from tqdm.auto import tqdm

    from .config import save_config
    from .images import save_image

    from .run_inputs import output_folder, resolve_config

    config = resolve_config(args)
    from .extrapolate import extrapolate_setting

    extrapolate_setting(config, args.extrapolate, args.train_size, "mmpos edit", default_train_size=1024)
    out = output_folder(args, Path(f"outputs/edit_{args.method}"))
    from .edit_methods import run_band, run_loose, run_transplant

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
        from .figures import comparison_figure

        written.append(comparison_figure(result["inputs"], result["edited"], result["sweep"], out / "comparison.png",
                                         result["title"]))
        written.append(result["diagnostic"](out / "diagnostic.png"))
    summary = {"method": args.method, "outputs": [str(p) for p in written if p.suffix == ".png"],
               "config": str(out / "config.yaml")}
    with written_atomically(out / "summary.json") as temporary:
        temporary.write_text(json.dumps(summary, indent=2))
    report_written(written + [out / "summary.json"], out)
    return 0


def report_written(paths, out: Path) -> None:
    """Print every file a command wrote (names inside ``out``)."""
    print(f"wrote {len(paths)} files to {out.resolve()}:", *(Path(p).name for p in paths), sep="\n  ")


def run_generate(args) -> int:
    from .generate import run_generate as run

    return run(args)


def split_comma_box(argv: list[str]) -> list[str]:
    """``--box 8,8,40,40`` (the old syntax) -> ``--box 8 8 40 40``, with a deprecation note."""
    out = []
    for arg in argv:
        value = arg[len("--box="):] if arg.startswith("--box=") else arg if out[-1:] == ["--box"] else None
        if value is not None and "," in value:
            print(f"note: --box {value} is deprecated; write --box {value.replace(',', ' ')}", file=sys.stderr)
            out += (["--box"] if arg.startswith("--box=") else []) + [v.strip() for v in value.split(",")]
        else:
            out.append(arg)
    return out


def main(argv=None) -> int:
    """Standalone entry (``scripts/edit.py``, ``scripts/generate.py``)."""
    from mmpos.cli import show_defaults

    parser = argparse.ArgumentParser(prog="mmpos")
    add_commands(parser.add_subparsers(dest="command", required=True))
    show_defaults(parser)
    args = parser.parse_args(split_comma_box(sys.argv[1:] if argv is None else list(argv)))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
