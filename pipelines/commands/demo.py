"""``mmpos demo``: a figure per registered encoding, camera figures, and the mini-world generation and PE-editing
report (``world/report.html``)."""

from __future__ import annotations

import sys
from pathlib import Path

from mmpos._arguments import bounded_int_arg, positive_int_arg


def register(subparsers) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="encoding figures, and the mini-world generation and PE-editing report",
        description="Write a figure per registered encoding (its spectrum and its "
        "content-free attention logit against 2D offset) and camera figures; then, with the "
        "shipped world models (or --model), generate from captions and run PE transplant, "
        "LooseRoPE and band modulation against their baselines into world/report.html.",
    )
    demo.add_argument(
        "--out",
        help="output folder; one that holds files is refused unless --overwrite (default: "
        "outputs/demo, or the next free outputs/demo-2, ...)",
    )
    demo.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an --out that holds files, replacing the figures of the same names",
    )
    demo.add_argument("--size", type=positive_int_arg, default=31, help="side of the 2D grid of offsets (default: 31)")
    demo.add_argument(
        "--steps", type=positive_int_arg, default=20, help="denoising steps of the world models (default: 20)"
    )
    demo.add_argument("--checkpoint", help="folder with world-vae/ and world-<task>/ (default: shipped assets)")
    demo.add_argument("--no-world", action="store_true", help="only the encoding figures")
    demo.add_argument(
        "--model",
        action="append",
        metavar="TASK=PATH",
        help="run the world sections on pretrained pipelines instead: t2i=, fill=, kontext= a "
        "from_pretrained path or hub id (repeat), or 'flux' for FLUX.1 dev / Fill / Kontext "
        "(default: the shipped world models)",
    )
    demo.add_argument("--device", choices=("cpu", "cuda"), help="device of the world sections (default: cpu)")
    demo.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="model dtype (default: float32)")
    demo.add_argument(
        "--image-size",
        type=bounded_int_arg(1, 4096),
        help="scene side in pixels, at most 4096 (default: the world models' trained size; 512 with --model)",
    )
    demo.add_argument("--count", type=positive_int_arg, default=6, help="examples per world section (default: 6)")
    demo.set_defaults(func=run)


def run(args) -> int:
    from mmpos.demo import run_demo

    from ._options import output_folder

    out = output_folder(args, Path("outputs/demo"))  # never the user's files unless --overwrite (else exit 2)
    try:
        source = model_source(args)
        written = run_demo(
            out,
            args.size,
            world=not args.no_world,
            steps=args.steps,
            checkpoint=args.checkpoint,
            source=source,
            count=args.count,
        )
    except (FileNotFoundError, ValueError) as error:
        print(f"mmpos demo: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None  # a user error: exit code 2, as argparse's
    print(f"wrote {len(written)} figures to {out.resolve()}:")
    for path in written:
        print(f"  {path}")
    return 0


def model_source(args):
    """The world demo's models: ``--model`` pretrained pipelines, else the world checkpoints (None: default)."""
    if not args.model and args.device is None and args.dtype is None and args.image_size is None:
        return None
    from mmpos.pipelines.world.sources import ModelSource, parse_model_args

    device = args.device or "cpu"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: CUDA is not available on this machine")
    models = parse_model_args(args.model)
    token = 16 if models else 4  # pixels per token: FLUX.1 (VAE 8 x 2x2 packing), world models (2 x 2x2)
    if args.image_size is not None and (args.image_size < 2 * token or args.image_size % token):
        raise ValueError(
            f"--image-size {args.image_size}: expected a multiple of {token} pixels (one token), at least {2 * token}"
        )
    return ModelSource(args.checkpoint, models, device, args.dtype or "float32", args.image_size)
