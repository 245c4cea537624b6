"""``mmpos generate video --model world``: the mini-world's image-to-video model with a camera adapter, on CPU.

The first frame is ``--image`` (resized to the model's 32 px) or, by default, a view of a held-out world scene;
``--camera`` is a motion of :mod:`mmpos.camera.vocabulary` (``orbit``, ``dolly`` and ``pan`` are what the model
was trained on, default ``orbit:35``; ``arc``, ``tilt``, ``roll`` and ``zoom`` run with a one-line note), or a
trajectory file placed at the first camera. ``--adapter`` defaults to
the model's ``camera-ucpe``; ``--adapter none`` runs the base model alone.
"""

from __future__ import annotations

from pathlib import Path

WORLD = "world"
WORLD_DEFAULTS = dict(frames=9, height=32, width=32, steps=24, camera="orbit:35")


def world_model_folder(name: str) -> Path | None:
    """The shipped world video model for ``name == "world"``, a folder holding a WorldVideoPipeline, else None."""
    from ...world.video_demo import video_model_folder

    if name == WORLD:
        return video_model_folder()
    folder = Path(name)
    index = folder / "model_index.json"
    return folder if index.is_file() and '"WorldVideoPipeline"' in index.read_text() else None


def world_settings(args, fail) -> dict:
    import torch

    values = {key: getattr(args, key, None) or default for key, default in WORLD_DEFAULTS.items() if key != "camera"}
    if args.extrapolate or args.train_frames or args.train_size:
        fail(
            "--extrapolate, --train-frames and --train-size are for Wan models; the world video model generates "
            "at its trained length and size (pass --model tiny or a Wan model)"
        )
    try:
        values["frames"] = int(args.frames) if args.frames else WORLD_DEFAULTS["frames"]
    except ValueError:
        fail(f"--frames {args.frames}: the world video model takes a frame count (default 9)")
    for name in ("height", "width"):
        if values[name] < 4 or values[name] % 4:
            fail(f"--{name} {values[name]}: expected a positive multiple of 4 pixels (the world model: 32)")
    if values["frames"] < 2:
        fail(f"--frames {values['frames']}: expected at least 2 (the first frame is the input)")
    if values["steps"] < 1:
        fail(f"--steps {values['steps']}: expected at least 1")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return dict(values, device=device, dtype="float32")


def world_trajectory(spec: str | None, frames: int, fail):
    """A motion of :mod:`mmpos.camera.vocabulary` -> that motion from the demo's start camera (``orbit``, ``dolly``
    and ``pan`` as trained, the others with a one-line note); a file -> that path placed at the start camera."""
    from mmpos.camera import load_trajectory, resample
    from mmpos.camera.vocabulary import is_motion, parse_motion, vocabulary_help
    from mmpos.eval.video_eval import EVAL_MOTIONS
    from mmpos.world.scene3d import place_trajectory
    from mmpos.world.video_data import MOTIONS, Motion, motion_trajectory, start_pose

    from ...world.video_demo import DEMO_START_DEGREES

    spec = spec or WORLD_DEFAULTS["camera"]
    start = start_pose(DEMO_START_DEGREES)
    if is_motion(spec) and not Path(spec).is_file():
        try:
            motion = parse_motion(spec, defaults=EVAL_MOTIONS)
        except ValueError as error:
            fail(f"--camera {spec}: {error}")
        if motion.name in MOTIONS:
            return motion_trajectory(Motion(motion.name, motion.amount), start, frames)
        print(
            f"camera: the world video model was trained on {', '.join(MOTIONS[:-1])} and {MOTIONS[-1]} only; running {motion} anyway "
            "(expect the video to follow it loosely)"
        )
        return untrained_motion_trajectory(motion, start, frames)
    if not Path(spec).is_file():
        fail(
            f"--camera {spec}: the world model takes a camera motion ({vocabulary_help()}) or a RealEstate10K "
            ".txt / mmpos .json trajectory file"
        )
    from .video_files import report_resampling

    try:
        placed = place_trajectory(load_trajectory(spec), start)
    except ValueError as error:  # the file's message names it
        fail(f"--camera {spec}: {error}")
    report_resampling(spec, len(placed), frames)
    return resample(placed, frames)


def untrained_motion_trajectory(motion, start, frames: int):
    """``motion`` (a :class:`~mmpos.camera.vocabulary.CameraMotion`) from ``start``, with the world clips' square
    intrinsics (scaled by the motion's zoom) and, for ``arc``, the orbit radius of the world clips."""
    import math

    import torch

    from mmpos.camera import Trajectory, preset_trajectory
    from mmpos.camera.vocabulary import motion_trajectory
    from mmpos.world.scene3d import place_trajectory
    from mmpos.world.video_data import FOV_DEGREES, RING_HEIGHT, RING_RADIUS

    if motion.name == "arc":
        relative = preset_trajectory(
            "arc", frames, degrees=motion.amount, radius=math.hypot(RING_RADIUS, RING_HEIGHT - 0.4)
        )
    else:
        relative = motion_trajectory(motion, frames)
    placed = place_trajectory(relative, start)
    fx = 0.5 / math.tan(math.radians(FOV_DEGREES) / 2) * relative.intrinsics[:, 0] / relative.intrinsics[0, 0]
    half = torch.full_like(fx, 0.5)
    return Trajectory(placed.c2w, torch.stack([fx, fx, half, half], -1))


def world_first_frame(image_path, settings, fail):
    """``[1, 3, H, W]`` in [0, 1]: ``--image`` resized, or the demo scene's first view."""
    import numpy as np
    import torch

    if image_path:
        from ...images import read_photo_pil

        try:
            image = read_photo_pil(image_path, "--image")
        except ValueError as error:
            fail(str(error))
        from .video_files import resized_first_frame

        array = np.asarray(resized_first_frame(image, image_path, settings["width"], settings["height"]))
    else:
        from ...world.video_demo import demo_clips

        array = demo_clips(settings["height"])[0].truth[0]
        print("first frame: a held-out world scene (pass --image for your own)")
    return torch.from_numpy(array.copy()).permute(2, 0, 1)[None].float() / 255


def run_world(args, folder: Path, paths: dict, fail, write) -> int:
    """Generate with the world video model in ``folder`` and ``write(paths, video, trajectory, args, settings)``."""
    import torch

    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter, check_adapter_fits

    from ...video.world import WorldVideoPipeline

    settings = world_settings(args, fail)
    print(f"model: world video model ({folder})\ndevice: {settings['device']}\ndtype: float32", flush=True)
    from mmpos.world.video_data import CLIP_FRAMES

    from .video_files import warn_longer_than_trained

    warn_longer_than_trained(settings["frames"], CLIP_FRAMES, "expect the camera to be followed loosely past them")
    args.camera = args.camera or WORLD_DEFAULTS["camera"]
    trajectory = world_trajectory(args.camera, settings["frames"], fail)
    first = world_first_frame(args.image, settings, fail)
    pipe = WorldVideoPipeline.from_pretrained(folder).to(settings["device"])
    adapter = args.adapter or str(folder / "camera-ucpe")
    if adapter != "none":
        try:
            loaded = CameraAdapter.from_pretrained(adapter)
            check_adapter_fits(pipe.transformer, loaded)  # another model's adapter: named now, not mid-sampling
            pipe.camera_adapter = loaded.eval().to(settings["device"])
        except (OSError, ValueError) as error:
            fail(f"--adapter {adapter}: {str(error).splitlines()[0]}")
        print(f"camera adapter: {pipe.camera_adapter.config.kind} from {adapter}")
    else:
        print("camera adapter: none: the camera is plotted but does not steer the video")
    call = dict(
        num_frames=settings["frames"],
        height=settings["height"],
        width=settings["width"],
        num_inference_steps=settings["steps"],
        generator=torch.Generator().manual_seed(args.seed),
        output_type="pt",
    )
    if pipe.camera_adapter is not None:
        call.update(camera=trajectory, camera_scale=args.camera_scale)
    video = pipe(first, **call).frames[0]
    from ...video.following import describe_following, following

    measured = {args.camera: following(video, trajectory)}
    print(describe_following(args.camera, measured[args.camera]))
    extra = {name: paths["video.mp4"].parent / name for name in ("following.json", "motions.png")}
    if not getattr(args, "compare_motions", False):
        extra.pop("motions.png")
    existing = [str(p) for p in extra.values() if p.exists()]
    if existing and not args.overwrite:
        fail(f"--out: {', '.join(existing)} already exist(s); pass --overwrite or another --out")
    if "motions.png" in extra:  # every trained motion from the same first frame and seed, side by side
        clips = {args.camera: video}
        for motion in MOTIONS_COMPARED:
            if motion.split(":")[0] == args.camera.removeprefix("preset:").split(":")[0]:
                continue  # the clip made above
            path = world_trajectory(motion, settings["frames"], fail)
            steered = dict(call, camera=path) if pipe.camera_adapter is not None else call
            clips[motion] = pipe(first, **steered).frames[0]
            measured[motion] = following(clips[motion], path)
            print(describe_following(motion, measured[motion]))
        motions_figure(clips, measured, extra["motions.png"])
    write_json(measured, extra["following.json"])
    return write({**paths, **extra}, video, trajectory, args, settings)


MOTIONS_COMPARED = ("orbit:35", "dolly:1", "pan:20")  # the trained motions at the evaluation's amounts


def motions_figure(clips: dict, measured: dict, path) -> Path:
    """One row per motion (its frames left to right), titled with its camera-following verdict."""
    from mmpos.viz.figure_files import pyplot, save_figure

    plt = pyplot()
    frames = max(len(video) for video in clips.values())
    fig, axes = plt.subplots(len(clips), frames, figsize=(1.1 * frames, 1.35 * len(clips)), squeeze=False)
    for row, (motion, video) in zip(axes, clips.items()):
        for index, ax in enumerate(row):
            ax.axis("off")
            if index < len(video):
                ax.imshow(video[index].detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy())
        verdict = "follows" if measured[motion]["follows"] else "does NOT follow"
        row[0].set_title(
            f"{motion}: {verdict} (RotErr {measured[motion]['rot_err']}, TransErr {measured[motion]['trans_err']})",
            fontsize=7,
            loc="left",
        )
    fig.suptitle("camera motions on one scene (same first frame and seed)", fontsize=8)
    return save_figure(fig, path, dpi=120)


def write_json(value, path) -> Path:
    import json

    from mmpos._atomic import written_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    with written_atomically(path) as temporary:
        temporary.write_text(json.dumps(value, indent=2))
    return path
