"""``mmpos world ...``: generate world datasets, single scenes and edit pairs, and sample the trained models.

``--out`` is a folder in every subcommand (as in ``mmpos edit`` / ``generate``): created if missing, the command's
files written into it; a value that names an image file is refused before any work.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mmpos._arguments import bounded_float_arg, bounded_int_arg, finite_float_arg, positive_int_arg
from mmpos._atomic import check_new_output
from mmpos._camera_motions import vocabulary_help
from mmpos.world.scene import COLOURS, PATTERNS, SHAPES, SIZES

EDIT_KINDS = ("transplant", "harmonise", "style")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")
MAX_OBJECTS = 64  # world clip: more than the ground around the origin holds apart; rendering cost grows with each
MAX_SCALE = 100.0  # world clip --scale: a trajectory's translations times this; beyond it the scene is out of view
MAX_SIZE = 2048  # image side of every world command (the world models train at 32-64 px)


def _dataset(args) -> list[Path]:
    from mmpos.world.data import write_image_folder
    from mmpos.world.positional import POSITIONAL_TASKS, write_positional_folder

    if args.task in POSITIONAL_TASKS:
        return write_positional_folder(
            args.out, args.count, args.seed, args.task, args.size, progress=True, overwrite=args.overwrite
        )
    return write_image_folder(
        args.out, args.count, args.seed, args.task, args.size, progress=True, overwrite=args.overwrite
    )


def _render(args) -> list[Path]:
    from mmpos.world.images import save_png
    from mmpos.world.render import render_scene
    from mmpos.world.scene import ObjectSpec, SceneSpec, SceneStyle

    style = SceneStyle(args.background, args.background_pattern, args.pattern)
    spec = SceneSpec(args.size, style, (ObjectSpec(args.shape, args.colour, tuple(args.box), args.object_size),))
    rendered = render_scene(spec)
    _refuse_overwrite(args)
    out = Path(args.out)
    written = [save_png(out / "scene.png", rendered.image), out / "scene.json"]
    written[1].write_text(
        json.dumps({"caption": spec.caption(), "spec": spec.to_dict(), "boxes": rendered.boxes()}, indent=1)
    )
    return written


def _edits(args) -> list[Path]:
    from mmpos.world import edit_pairs
    from mmpos.world.images import save_png

    out, written = Path(args.out), []
    _refuse_overwrite(args)
    for seed in range(args.seed, args.seed + args.count):
        folder = out / f"{args.kind}-{seed:05d}"
        if args.kind == "transplant":
            pair = edit_pairs.transplant_pair(seed, args.size, box=tuple(args.box) if args.box else None)
            images = {
                "background": pair.background.image,
                "reference": pair.reference.image,
                "target": pair.target.image,
                "mask": pair.mask.astype(np.uint8) * 255,
            }
            truth = {"box": pair.box, "caption": pair.caption, "target_spec": pair.target.spec.to_dict()}
        elif args.kind == "harmonise":
            pair = edit_pairs.harmonise_pair(seed, args.size)
            images = {
                "collage": pair.collage,
                "target": pair.target.image,
                "scene": pair.scene.image,
                "paste_mask": pair.paste_mask.astype(np.uint8) * 255,
                "object_mask": pair.object_mask.astype(np.uint8) * 255,
            }
            truth = {
                "instruction": pair.instruction,
                "target_spec": pair.target.spec.to_dict(),
                "source_spec": pair.source.spec.to_dict(),
            }
        else:
            styles = edit_pairs.style_set(seed, 4, args.size)
            images = {"reference": styles.reference.image}
            images.update({f"target_{i}": t.image for i, t in enumerate(styles.targets)})
            truth = {
                "reference_spec": styles.reference.spec.to_dict(),
                "prompts": styles.prompts,
                "target_specs": [t.spec.to_dict() for t in styles.targets],
            }
        written += [save_png(folder / f"{name}.png", image) for name, image in images.items()]
        (folder / "ground_truth.json").write_text(json.dumps(truth, indent=1))
        written.append(folder / "ground_truth.json")
    return written


def _clip(args) -> list[Path]:
    from mmpos.camera import save_trajectory
    from mmpos.world.images import save_png
    from mmpos.world.scene3d import orbit_trajectory, place_trajectory, render_trajectory, sample_scene3d

    if args.trajectory:
        if args.degrees is not None or args.fov is not None:
            raise ValueError(
                "--degrees and --fov shape the default orbit; a --trajectory brings its own poses and "
                "intrinsics (use --scale to size its motion)"
            )
        trajectory = place_trajectory(_load_trajectory(args.trajectory, args.frames), scale=args.scale)
    else:
        trajectory = orbit_trajectory(
            args.frames,
            degrees=90.0 if args.degrees is None else args.degrees,
            fov_degrees=60.0 if args.fov is None else args.fov,
        )
    frames = render_trajectory(sample_scene3d(args.seed, args.objects, args.textured), trajectory, args.size)
    _refuse_overwrite(args)
    out = Path(args.out)
    _remove_stale_frames(out, len(frames))
    written = [save_png(out / f"frame_{i:03d}.png", f.image) for i, f in enumerate(frames)]
    np.savez_compressed(
        out / "ground_truth.npz",
        depth=np.stack([f.depth for f in frames]),
        ids=np.stack([f.ids for f in frames]),
        intrinsics=np.stack([f.intrinsics for f in frames]),
        poses=np.stack([f.pose for f in frames]),
    )
    return written + [out / "ground_truth.npz", save_trajectory(trajectory, out / "trajectory.json")]


def _remove_stale_frames(out: Path, count: int) -> None:
    """``--overwrite`` of a longer clip: its ``frame_NNN.png`` past the new ``count`` go (a clip folder is frames
    plus one pose per frame; stale frames would pair with no pose)."""
    import re

    if out.is_dir():
        for path in out.glob("frame_*.png"):
            match = re.fullmatch(r"frame_(\d{3,})\.png", path.name)
            if match and int(match.group(1)) >= count:
                path.unlink()


def _load_trajectory(value: str, frames: int):
    """A trajectory file (RealEstate10K .txt or mmpos JSON) or a camera motion ``NAME[:AMOUNT]``, ``frames``
    frames."""
    from mmpos.camera import load_trajectory, resample
    from mmpos.camera.vocabulary import is_motion, motion_trajectory, parse_motion

    if Path(value).is_file():
        return resample(load_trajectory(value), frames)
    if is_motion(value):
        return motion_trajectory(parse_motion(value), frames)  # ValueError: names the vocabulary
    raise ValueError(f"--trajectory {value!r}: not a file, and not a preset camera motion ({vocabulary_help()})")


def _sample(args) -> list[Path]:
    import torch

    from mmpos.models.world.image import conditioning, load_world_pipeline, trained_image_size
    from mmpos.models.world.samples import image_grid
    from mmpos.world.images import save_png, to_uint8

    check_caption_words(args.caption, args.checkpoint)  # a user error before the model loads
    _refuse_overwrite(args)
    pipe = load_world_pipeline("t2i", args.checkpoint)
    pipe.set_progress_bar_config(desc="world sample", leave=False)
    size = args.size or trained_image_size(args.checkpoint, "t2i")
    images = to_uint8(
        pipe(
            height=size,
            width=size,
            num_inference_steps=args.steps,
            output_type="np",
            generator=torch.Generator().manual_seed(args.seed),
            **conditioning(pipe, args.caption, args.guidance),
        ).images
    )
    out, replace = Path(args.out), args.overwrite  # not replacing: a file written there meanwhile is kept too
    written = [save_png(out / f"image_{i}.png", image, replace) for i, image in enumerate(images)]
    return written + [save_png(out / "samples.png", image_grid([("generated", images)]), replace)]


def check_caption_words(captions, checkpoint) -> None:
    """Raise ValueError naming the words of ``captions`` that the t2i model's saved text encoder does not know
    (its ``config.json``'s vocabulary, null: the world's; read before the model loads; nothing to check without
    a saved config)."""
    from mmpos.models.world.image import DEFAULT_ASSETS
    from mmpos.world.vocabulary import check_known_words, world_vocabulary

    config = (
        Path(checkpoint if checkpoint is not None else DEFAULT_ASSETS) / "world-t2i" / "text_encoder" / "config.json"
    )
    if config.is_file():
        check_known_words(captions, json.loads(config.read_text()).get("vocabulary") or world_vocabulary())


def _check_out_folder(args) -> None:
    """Fail before the work when ``--out`` names a file: every world subcommand writes into a folder."""
    out = Path(args.out)
    if out.suffix.lower() in IMAGE_SUFFIXES or out.is_file():
        raise ValueError(
            f"--out {out}: expected a folder (mmpos world {args.world_command} writes its files into "
            f"it, e.g. {out.with_suffix('') / args.world_outputs})"
        )


def _refuse_overwrite(args) -> None:
    """Before a command writes: what it would replace at ``--out`` exists and ``--overwrite`` was not given."""
    out = Path(args.out)
    named = {
        "render": lambda: [out / "scene.png", out / "scene.json"],
        "edits": lambda: [out / f"{args.kind}-{seed:05d}" for seed in range(args.seed, args.seed + args.count)],
        "clip": lambda: (
            [out / f"frame_{i:03d}.png" for i in range(args.frames)]
            + [out / "ground_truth.npz", out / "trajectory.json"]
        ),
        "sample": lambda: [out / f"image_{i}.png" for i in range(len(args.caption))] + [out / "samples.png"],
    }
    for path in named[args.world_command]():
        check_new_output(path, args.overwrite)


def run(args) -> int:
    """Run the chosen ``mmpos world`` subcommand; user errors are one line (exit 2)."""
    try:
        _check_out_folder(args)
        written = args.world_func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        args.world_parser.error(str(error))
    shown = written if len(written) <= 4 else written[:2] + [f"... ({len(written) - 2} more)"]
    print(f"wrote {len(written)} file(s):", *shown, sep="\n  ")
    return 0


def register(subparsers) -> None:
    """Register ``mmpos world`` and its subcommands on the root parser's subparsers."""
    world = subparsers.add_parser(
        "world",
        help="procedural mini-world: datasets, scenes, edit pairs, samples",
        description="Generate the mini-world's data (deterministic per seed, ground truth "
        "kept beside every image) and sample its trained models.",
    )
    world.set_defaults(func=run)
    sub = world.add_subparsers(dest="world_command", required=True)

    def command(name, func, help_text, outputs, size_help="image side in pixels", size_default=64):
        parser = sub.add_parser(
            name, help=help_text, description=f"{help_text}. --out is a folder; this command writes {outputs} into it."
        )
        parser.set_defaults(world_func=func, world_parser=parser, world_outputs=outputs.split()[0])
        parser.add_argument(
            "--size", type=bounded_int_arg(1, MAX_SIZE), default=size_default, help=f"{size_help}, at most {MAX_SIZE}"
        )
        parser.add_argument("--overwrite", action="store_true", help="replace what --out names if it exists")
        return parser

    dataset = command(
        "dataset",
        _dataset,
        "write an ImageFolder-style dataset with metadata.jsonl",
        "metadata.jsonl and <class>/<index>.png",
    )
    dataset.add_argument("--out", required=True, help="output folder")
    dataset.add_argument("--count", type=positive_int_arg, default=100, help="number of images")
    dataset.add_argument("--seed", type=int, default=0, help="dataset seed (examples are deterministic per seed)")
    dataset.add_argument(
        "--task",
        choices=("scenes", "fill", "kontext", "relation", "quadrant"),
        default="scenes",
        help="relation/quadrant: positional classification (mmpos.world.positional)",
    )

    render = command(
        "render", _render, "render one object on a background (PNG + JSON ground truth)", "scene.png and scene.json"
    )
    render.add_argument("--out", required=True, help="output folder")
    render.add_argument("--shape", choices=SHAPES, required=True, help="the object's shape")
    render.add_argument("--colour", choices=tuple(COLOURS), required=True, help="the object's colour")
    render.add_argument(
        "--box",
        type=int,
        nargs=4,
        metavar=("L", "T", "R", "B"),
        required=True,
        help="the object's box: left top right bottom in pixels (exclusive ends)",
    )
    render.add_argument("--pattern", choices=PATTERNS, default="flat", help="the object's pattern")
    render.add_argument("--background", choices=tuple(COLOURS), default="white", help="background colour")
    render.add_argument("--background-pattern", choices=PATTERNS, default="flat", help="background pattern")
    render.add_argument("--object-size", choices=tuple(SIZES), default="large", help="the caption's size word")

    edit = command(
        "edits",
        _edits,
        "write edit pairs with ground truth (transplant, harmonise, style)",
        "<kind>-<seed>/ folders of images and ground_truth.json",
    )
    edit.add_argument("--kind", choices=EDIT_KINDS, required=True, help="which edit")
    edit.add_argument("--out", required=True, help="output folder")
    edit.add_argument("--count", type=positive_int_arg, default=4, help="number of pairs")
    edit.add_argument("--seed", type=int, default=0, help="seed of the first pair (then seed + 1, ...)")
    edit.add_argument(
        "--box",
        type=int,
        nargs=4,
        metavar=("L", "T", "R", "B"),
        help="transplant target box: left top right bottom in pixels (default: a random box per pair)",
    )

    clip = command(
        "clip",
        _clip,
        "render a 3D scene along a camera path: frames, ground_truth.npz (depth, ids "
        "[N, S, S]; intrinsics [N, 3, 3]; poses [N, 4, 4]) and trajectory.json",
        "frame_<i>.png, ground_truth.npz and trajectory.json",
    )
    clip.add_argument("--out", required=True, help="output folder")
    clip.add_argument("--seed", type=int, default=0, help="scene seed")
    clip.add_argument(
        "--objects", type=bounded_int_arg(0, MAX_OBJECTS), default=3, help=f"objects in the scene, 0 to {MAX_OBJECTS}"
    )
    clip.add_argument("--frames", type=positive_int_arg, default=8, help="number of frames")
    clip.add_argument(
        "--degrees", type=bounded_float_arg(-720, 720, "both"), help="arc of the default orbit in degrees (default: 90)"
    )
    clip.add_argument(
        "--fov",
        type=bounded_float_arg(0, 180),
        help="horizontal field of view of the default orbit in degrees, in (0, 180) (default: 60)",
    )
    clip.add_argument(
        "--trajectory",
        help="camera path instead of the orbit: a RealEstate10K .txt or mmpos JSON "
        f"file (resampled to --frames) or a camera motion NAME[:AMOUNT] ({vocabulary_help()}); "
        "moved so that its first camera is the orbit's first (default: the orbit)",
    )
    clip.add_argument(
        "--scale",
        type=bounded_float_arg(0, MAX_SCALE, "high"),
        default=1.0,
        help=f"multiplies the --trajectory's translations, in (0, {MAX_SCALE:g}]",
    )
    clip.add_argument(
        "--textured",
        action="store_true",
        help="checker ground, striped sky and textured objects (same geometry; default: flat shading)",
    )

    sample = command(
        "sample",
        _sample,
        "sample the trained text-to-image world model",
        "image_<i>.png per caption and samples.png (a grid)",
        "image side in pixels (default: the side the model was trained at)",
        None,
    )
    sample.add_argument("--caption", nargs="+", required=True, help="one or more captions in the world's words")
    sample.add_argument("--checkpoint", help="folder with world-vae/ and world-t2i/ (default: the shipped assets)")
    sample.add_argument("--out", default="outputs/world_sample", help="output folder")
    sample.add_argument("--steps", type=positive_int_arg, default=20, help="denoising steps")
    sample.add_argument(
        "--guidance", type=finite_float_arg, default=3.0, help="true CFG scale against the empty caption"
    )
    sample.add_argument("--seed", type=int, default=0, help="sampling seed")
