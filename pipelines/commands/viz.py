"""``mmpos viz ...``: figures of the inputs encodings see (``mmpos viz cameras TRAJECTORY``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mmpos._arguments import bounded_float_arg, finite_float_arg, positive_int_arg
from mmpos._camera_motions import is_motion, vocabulary_help


def _trajectory(args):
    from mmpos.camera.specs import resolve_trajectory

    try:
        return resolve_trajectory(args.trajectory, args.frames)
    except ValueError as error:  # the file's own message names it; a preset's names its parameter
        message = str(error)
        raise ValueError(
            message if message.startswith(args.trajectory) else f"TRAJECTORY {args.trajectory}: {message}"
        ) from None


def run_cameras(args) -> int:
    from mmpos._atomic import check_new_output
    from mmpos.viz.cameras import camera_figures

    motion = is_motion(args.trajectory) and not Path(args.trajectory).exists()
    stem = args.trajectory.removeprefix("preset:").replace(":", "_") if motion else Path(args.trajectory).stem
    try:  # the figures it would replace: refused before any work unless --overwrite
        for name in (f"{stem}_rig.png", f"{stem}_rays.png"):
            check_new_output(Path(args.out) / name, args.overwrite)
        if args.model == "pinhole" and (args.fov is not None or args.xi != 0):
            raise ValueError(
                "--fov / --xi shape the ray maps of --model unified; the pinhole's are the trajectory's own "
                "intrinsics (pass --model unified, or leave them out)"
            )
        trajectory = _trajectory(args)
        if not -len(trajectory) <= args.frame < len(trajectory):
            raise ValueError(f"--frame {args.frame}: outside the trajectory's {len(trajectory)} frames")
        written = camera_figures(
            trajectory,
            args.out,
            stem,
            args.frame,
            tuple(args.image_size),
            tuple(args.grid),
            args.model,
            args.fov,
            args.xi,
            replace=args.overwrite,
        )
    except (OSError, ValueError) as error:  # a file kept (not replaced), a bad trajectory or option: one line, exit 2
        args.viz_parser.error(str(error))
    for path in written:
        print(path)
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Register ``viz`` and its subcommands on the top-level ``mmpos`` parser."""
    viz = subparsers.add_parser(
        "viz", help="figures of inputs to encodings (cameras)", description="Figures of the inputs encodings see."
    )
    viz.set_defaults(func=run)
    kinds = viz.add_subparsers(dest="viz_command", required=True, metavar="{cameras}")
    cameras = kinds.add_parser(
        "cameras",
        help="camera rig and ray maps of a trajectory",
        description="Draw the camera rig of TRAJECTORY (frusta along the path, coloured by time) to "
        "OUT/STEM_rig.png and, for one frame, the world ray directions, latitude and image up-vectors to "
        "OUT/STEM_rays.png.",
    )
    cameras.add_argument(
        "trajectory",
        help="RealEstate10K pose .txt, mmpos .json, or a camera motion "
        "preset:NAME[:AMOUNT] (the prefix is optional): "
        f"{vocabulary_help()}",
    )
    cameras.add_argument("--frame", type=int, default=0, help="frame of the ray maps (negative counts from the end)")
    cameras.add_argument("--out", default="outputs/viz", help="output folder (default: outputs/viz)")
    cameras.add_argument("--overwrite", action="store_true", help="replace STEM_rig.png / STEM_rays.png in --out")
    cameras.set_defaults(viz_parser=cameras)
    cameras.add_argument("--frames", type=positive_int_arg, default=49, help="frames of a preset (default: 49)")
    cameras.add_argument(
        "--image-size",
        type=positive_int_arg,
        nargs=2,
        default=(180, 320),
        metavar=("H", "W"),
        help="image size in pixels for the ray maps (default: 180 320)",
    )
    cameras.add_argument(
        "--grid",
        type=positive_int_arg,
        nargs=2,
        default=(18, 32),
        metavar=("ROWS", "COLS"),
        help="patch grid of the ray maps (default: 18 32)",
    )
    cameras.add_argument(
        "--model",
        choices=("pinhole", "unified"),
        default="pinhole",
        help="camera model of the ray maps: the trajectory's pinhole or a unified camera",
    )
    cameras.add_argument(
        "--fov",
        type=bounded_float_arg(0, 360),
        default=None,
        help="horizontal FoV in degrees for --model unified: below 180, or up to 360 with a fisheye --xi "
        "(cos(fov / 2) + xi > 0) (default: the trajectory's)",
    )
    cameras.add_argument("--xi", type=finite_float_arg, default=0.0, help="xi for --model unified (0 = pinhole)")
    return viz


def run(args) -> int:
    """Run the chosen ``mmpos viz`` subcommand."""
    return {"cameras": run_cameras}[args.viz_command](args)
