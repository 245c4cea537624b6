"""The ``mmpos`` command: ``demo``, ``list``, ``bench``, ``viz``, ``edit``, ``generate``, ``train``/``eval`` and the commands that
modules register with ``add_*`` hooks below (``mmpos --help`` lists them)."""
from __future__ import annotations

import argparse
import inspect
import subprocess
import sys
from pathlib import Path

from ._validation import OneLineErrorParser, positive_int_arg


def _demo(args) -> int:
    from .demo import run_demo

    try:
        source = _model_source(args)
        written = run_demo(args.out, args.size, world=not args.no_world, steps=args.steps, checkpoint=args.checkpoint,
                           source=source, count=args.count)
    except (FileNotFoundError, ValueError) as error:
        print(f"mmpos demo: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None  # a user error: exit code 2, as argparse's
    print(f"wrote {len(written)} figures to {Path(args.out).resolve()}:")
    for path in written:
        print(f"  {path}")
    return 0


def _model_source(args):
    """The world demo's models: ``--model`` pretrained pipelines, else the world checkpoints (None: default)."""
    if not args.model and args.device is None and args.dtype is None and args.image_size is None:
        return None
    from .world.sources import ModelSource, parse_model_args

    device = args.device or "cpu"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: CUDA is not available on this machine")
    models = parse_model_args(args.model)
    token = 16 if models else 4  # pixels per token: FLUX.1 (VAE 8 x 2x2 packing), world models (2 x 2x2)
    if args.image_size is not None and (args.image_size < 2 * token or args.image_size % token):
        raise ValueError(f"--image-size {args.image_size}: expected a multiple of {token} pixels (one token), "
                         f"at least {2 * token}")
    return ModelSource(args.checkpoint, models, device, args.dtype or "float32", args.image_size)


def _list(args) -> int:
    from .encodings import list_pes, pe_class, pe_description, pe_options

    width = max(map(len, list_pes()))
    for name in list_pes():
        print(f"{name:{width}s}  [{pe_class(name).kind}] {pe_description(name)}")
        if args.verbose:
            for option, default in pe_options(name).items():
                shown = "(required)" if default is inspect.Parameter.empty else f"= {default!r}"
                print(f"    {option} {shown}")
    return 0


BENCH_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_rotary.py"


def _bench(args) -> int:
    """Run ``benchmarks/bench_rotary.py`` of the source checkout (benchmarks are scripts, not package code)."""
    if not BENCH_SCRIPT.is_file():
        print(f"mmpos bench: {BENCH_SCRIPT} not found; the benchmarks live in the source checkout "
              "(install mmpos with `pip install -e .` from a clone)", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(BENCH_SCRIPT), *args.bench_args])


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="mmpos", description="Positional encodings for vision and multimodal "
                                     "transformers and diffusion models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="encoding figures, and the mini-world generation and PE-editing report",
                          description="Write a figure per registered encoding (its spectrum and its content-free "
                          "attention logit against 2D offset) and camera figures; then, with the shipped world "
                          "models (or --model), generate from captions and run PE transplant, LooseRoPE and band "
                          "modulation against their baselines into world/report.html.")
    demo.add_argument("--out", default="outputs/demo", help="output folder (default: outputs/demo)")
    demo.add_argument("--size", type=positive_int_arg, default=31, help="side of the 2D grid of offsets (default: 31)")
    demo.add_argument("--steps", type=positive_int_arg, default=20,
                      help="denoising steps of the world models (default: 20)")
    demo.add_argument("--checkpoint", help="folder with world-vae/ and world-<task>/ (default: shipped assets)")
    demo.add_argument("--no-world", action="store_true", help="only the encoding figures")
    demo.add_argument("--model", action="append", metavar="TASK=PATH",
                      help="run the world sections on pretrained pipelines instead: t2i=, fill=, kontext= a "
                      "from_pretrained path or hub id (repeat), or 'flux' for FLUX.1 dev / Fill / Kontext "
                      "(default: the shipped world models)")
    demo.add_argument("--device", choices=("cpu", "cuda"), help="device of the world sections (default: cpu)")
    demo.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="model dtype (default: float32)")
    demo.add_argument("--image-size", type=positive_int_arg, help="scene side in pixels (default: the world "
                      "models' trained size; 512 with --model)")
    demo.add_argument("--count", type=positive_int_arg, default=6, help="examples per world section (default: 6)")
    demo.set_defaults(func=_demo)

    lister = sub.add_parser("list", help="list registered encodings", description="List registered encodings.")
    lister.add_argument("-v", "--verbose", action="store_true",
                        help="also list each encoding's options (default: names and one-line descriptions only)")
    lister.set_defaults(func=_list)

    bench = sub.add_parser("bench", help="rotary apply benchmark against peers (see `mmpos bench -- --help`)",
                           description="Run benchmarks/bench_rotary.py; arguments after `--` go to it "
                           "(e.g. `mmpos bench -- --shapes flux --dtypes bf16`; its defaults: `mmpos bench -- --help`). "
                           "The rotary-embedding-torch peer is optional (pip install 'mmpos[bench]'): without it its "
                           "rows are skipped.")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the benchmark (default: none, "
                       "the benchmark's own defaults)")
    bench.set_defaults(func=_bench)

    from .pipelines.cli import add_commands as add_edit_commands
    from .training.vit_cli import add_training_commands
    from .viz.cli import add_viz_parser
    from .world.cli import add_world_command

    add_viz_parser(sub)
    add_edit_commands(sub)
    add_world_command(sub)
    add_training_commands(sub)
    show_defaults(parser)
    return parser


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with ``(default: X)`` after each option whose help does not state its default already (options
    without a default to show, None, False or empty, are left as written)."""

    def _get_help_string(self, action):
        text = action.help or ""
        hidden = any(action.default is value for value in (None, False, argparse.SUPPRESS)) or action.default == []
        if "default" in text or hidden or not action.option_strings:
            return text
        return super()._get_help_string(action)


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every subcommand parser under it :class:`DefaultsHelpFormatter`."""
    parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                show_defaults(subparser)


def main(argv=None) -> int:
    from .pipelines.cli import split_comma_box

    argv = split_comma_box(sys.argv[1:] if argv is None else list(argv))
    if argv[:2] == ["generate", "video"]:  # its own parser: `mmpos generate` alone stays FLUX text-to-image
        from .pipelines.video_cli import run

        return run(argv[2:])
    args = build_parser().parse_args(argv)
    if getattr(args, "bench_args", None) and args.bench_args[0] == "--":
        args.bench_args = args.bench_args[1:]
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
