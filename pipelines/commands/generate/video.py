"""``mmpos generate video``: a camera-controlled video from the parsed command line (the options:
:mod:`mmpos.pipelines.commands.generate`): Wan, or with ``--model FOLDER`` the saved pipeline of any family that takes
camera adapters (its ``model_index.json`` names it: HunyuanVideo 1.5, LTX-2, SkyReels-V2, Cosmos; the call gets the
options its ``__call__`` takes).

    mmpos generate video --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --frames 49 --camera preset:orbit \\
        --adapter path/to/adapter --prompt "a slow orbit around a house" --out outputs/video
    mmpos generate video --model ... --frames 2x --width 1664 --extrapolate riflex dype   # beyond the training size

writes ``video.mp4`` (H.264 where OpenCV has it), ``video.gif``, ``frames.png`` (a labelled grid of frames, upscaled)
and ``rig.png`` (the camera path) into ``--out``; every resize of ``--image`` and resampling of a pose file is
reported in one line, and more frames than trained in a warning. Without
``--model`` it runs the mini-world's trained image-to-video model with its UCPE camera adapter
(:mod:`.world_video`; 32 px, seconds on a CPU), or, without that asset, tiny random Wan components built
offline (``--model tiny``: the frames are noise-like, the plumbing is the real one). It prints the model, device and dtype first, and never replaces existing files
unless ``--overwrite`` is given.
"""

from __future__ import annotations

import math
from pathlib import Path

from .video_files import report_resampling, resized_first_frame, warn_longer_than_trained

TINY = "tiny"
OUTPUT_NAMES = ("video.mp4", "video.gif", "frames.png", "rig.png")
TEMPORAL = ("riflex", "ultravico", "freeloc")  # ultravico, freeloc: attention rules (set_attention_rule)
RULES = ("ultravico", "freeloc")
SPATIAL = ("pi", "ntk", "yarn", "vision_yarn", "dype", "dype_ntk", "dype_yarn")  # mmpos.spectrum.schedule.PRESETS
PATCH_PIXELS = 16  # Wan: 8x VAE, 2x2 patches


def _fail(parser, message: str):
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def _settings(args, parser) -> dict:
    import torch

    from ...images import MAX_SIZE_OVER_TRAINED, over_trained

    tiny = args.model == TINY
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        _fail(parser, "--device cuda: CUDA is not available on this machine")
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    train_frames = _given(args.train_frames, 17 if tiny else 81)
    if train_frames < 1 or (train_frames - 1) % 4:
        _fail(parser, f"--train-frames {train_frames}: expected 4k + 1 frames (5, 9, ..., 81)")
    values = dict(
        frames=_frame_count(args.frames, train_frames, tiny, parser),
        train_frames=train_frames,
        train_size=_train_size(args.train_size or ("64x96" if tiny else "480x832"), parser),
        height=_given(args.height, 64 if tiny else 480),
        width=_given(args.width, 96 if tiny else 832),
        steps=_given(args.steps, 4 if tiny else 50),
    )
    if values["frames"] < 1 or (values["frames"] - 1) % 4:
        _fail(parser, f"--frames {values['frames']}: expected 4k + 1 frames (5, 9, ..., 81)")
    for name, trained in zip(("height", "width", "frames"), (*values["train_size"], values["train_frames"])):
        if name != "frames" and (values[name] < 16 or values[name] % 16):
            _fail(parser, f"--{name} {values[name]}: expected a positive multiple of 16 pixels")
        if values[name] > MAX_SIZE_OVER_TRAINED * trained:  # before anything is allocated
            _fail(parser, f"--{name} {values[name]}: {over_trained(values[name], trained, name, 'the trained')}")
    if values["steps"] < 1:
        _fail(parser, f"--steps {values['steps']}: expected at least 1")
    return dict(values, tiny=tiny, device=device, dtype=dtype)


def _given(value, default):
    """An option's value, or ``default`` when it was not given (``0`` is a value, checked as such)."""
    return default if value is None else value


def _frame_count(text, train_frames: int, tiny: bool, parser) -> int:
    """``--frames``: ``N`` frames, or ``Fx``: ``F`` times the trained duration, ``4 round(F (train - 1) / 4) + 1``."""
    if text is None:
        return 17 if tiny else 81
    try:
        if text.lower().endswith("x"):
            factor = float(text[:-1])
            if not (factor > 0 and math.isfinite(factor)):
                raise ValueError
            return 4 * max(round(factor * (train_frames - 1) / 4), 1) + 1
        return int(text)
    except ValueError:
        _fail(parser, f"--frames {text}: expected a frame count (4k + 1) or a multiple of --train-frames (2x)")


def _train_size(text: str, parser) -> tuple:
    try:
        size = tuple(int(v) for v in text.lower().split("x"))
        if len(size) != 2 or min(size) < PATCH_PIXELS:
            raise ValueError
    except ValueError:
        _fail(parser, f"--train-size {text}: expected HEIGHTxWIDTH in pixels, e.g. 480x832")
    return size


def _outputs(args, parser) -> dict:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        _fail(parser, f"--out {out}: a file; expected a folder (video.mp4, frames.png and rig.png are written into it)")
    paths = {name: out / name for name in OUTPUT_NAMES}
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not args.overwrite:
        _fail(parser, f"--out {out}: {', '.join(existing)} already exist(s); pass --overwrite or another --out")
    return paths


def _trajectory(args, parser, frames: int):
    from mmpos.camera.specs import resolve_trajectory

    try:
        trajectory = resolve_trajectory(args.camera or "preset:orbit", frames)
    except (FileNotFoundError, ValueError) as error:
        _fail(parser, f"--camera {args.camera}: {error}")
    report_resampling(args.camera, len(trajectory), frames)
    return trajectory


def _pipeline_class(args, parser):
    """The camera-controlled class for ``--model``: Wan's (tiny, a hub id, a Wan folder), else the class a local
    folder's ``model_index.json`` names, of a family that takes camera adapters
    (:func:`~mmpos.pipelines.video.camera.camera_control`)."""
    from ... import CameraControlWanImageToVideoPipeline, CameraControlWanPipeline

    wan = CameraControlWanImageToVideoPipeline if args.image else CameraControlWanPipeline
    index = Path(args.model) / "model_index.json"
    if args.model == TINY or not index.is_file():
        return wan
    from ...edits.detect import read_json_file
    from ...video.camera import camera_control

    try:
        class_name = str(read_json_file(index, "a mapping of component names").get("_class_name"))
    except (OSError, ValueError) as error:
        _fail(parser, f"--model {args.model}: {str(error).splitlines()[0]}")
    if class_name in ("WanPipeline", "WanImageToVideoPipeline"):
        return wan
    import diffusers

    from mmpos.integrations.diffusers.camera_adapter import camera_families

    try:
        return camera_control(getattr(diffusers, class_name))
    except (AttributeError, ValueError, TypeError):
        _fail(
            parser,
            f"--model {args.model}: a {class_name} pipeline; `mmpos generate video` runs the pipelines of the "
            f"families that take camera adapters ({', '.join(camera_families())})",
        )


def _pipeline(args, parser, settings, cls):
    import torch

    from mmpos.models.world.image import dtype_keyword

    dtype = getattr(torch, settings["dtype"])
    if settings["tiny"]:
        from mmpos.models.tiny_wan import tiny_wan_components

        pipe = cls(**tiny_wan_components(image_to_video=bool(args.image))).to(settings["device"])
        return pipe if dtype == torch.float32 else pipe.to(dtype=dtype)
    from ...loading import missing_components

    try:  # a folder saved without text encoders: those passed as None (--prompt-embeds)
        pipe = cls.from_pretrained(args.model, **{dtype_keyword(cls): dtype}, **missing_components(args.model, cls))
    except (OSError, ValueError) as error:  # diffusers: neither a pipeline folder nor a reachable Hub id
        _fail(parser, f"--model {args.model}: {str(error).splitlines()[0]}")
    return pipe.to(settings["device"])


def riflex_k(transformer, repeat_latent_frames: int) -> int:
    """RIFLEx's intrinsic frequency on ``transformer``'s time axis (:func:`~mmpos.spectrum.extrapolation.
    riflex_intrinsic_k`): the (1-based) time-axis pair whose period is closest to RIFLEx's ``N``, the latent frame
    where the stock video first repeats; pass the trained latent length where it has not been observed."""
    from mmpos.integrations.diffusers.families import family_for
    from mmpos.spectrum.extrapolation import riflex_intrinsic_k

    spec = family_for(transformer)
    time_dim, theta = spec.native_axes_dims(transformer)[0], spec.native_theta(transformer)
    return riflex_intrinsic_k(time_dim, theta, repeat_latent_frames)


def extrapolation_policies(
    methods, transformer, frames: int, train_frames: int, train_size, repeat_frames: int | None = None
) -> list:
    """``set_pe``'s per-axis ``(t, row, col)`` extrapolation: RIFLEx on time (a static policy for ``frames``, only
    when longer than trained: at or below the trained length the time axis stays stock; its ``k`` from
    ``repeat_frames``, the video frame where the stock model repeats, else from ``train_frames``); the spatial
    preset (:data:`mmpos.spectrum.schedule.PRESETS`) on rows and columns as schedules from the trained patch grid
    (``train_size / 16``): they act on axes longer than trained only, DyPE's follow the step's sigma."""
    from mmpos.integrations.diffusers import model_extrapolation

    spatial = [m for m in methods if m not in TEMPORAL]
    if len(spatial) > 1:
        raise ValueError(f"--extrapolate: choose one of {', '.join(SPATIAL)} for the spatial axes, got {spatial}")
    time = None
    latent, trained = (frames - 1) // 4 + 1, (train_frames - 1) // 4 + 1
    if "riflex" in methods and latent > trained:
        repeat = trained if repeat_frames is None else (repeat_frames - 1) // 4 + 1
        time = {"type": "riflex", "k": riflex_k(transformer, repeat), "target_length": latent}
    grid = tuple(pixels / PATCH_PIXELS for pixels in train_size)
    return model_extrapolation(transformer, spatial[0] if spatial else "none", grid, time=time)


def _extrapolate(args, parser, pipe, settings) -> str:
    from mmpos.integrations.diffusers import set_pe

    try:
        policies = extrapolation_policies(
            args.extrapolate,
            pipe.transformer,
            settings["frames"],
            settings["train_frames"],
            settings["train_size"],
            args.riflex_repeat,
        )
    except ValueError as error:
        _fail(parser, str(error))
    set_pe(pipe.transformer, "native", extrapolation=policies)
    shown = [p.describe() if hasattr(p, "describe") else p for p in policies]
    line = "extrapolation (t, rows, cols): " + ", ".join(str(p) for p in shown)
    rules = [m for m in args.extrapolate if m in RULES]
    if len(rules) > 1:
        _fail(parser, f"--extrapolate: choose one attention rule of {', '.join(RULES)}, got {', '.join(rules)}")
    if rules:
        line += "\n" + _attention_rule(rules[0], args, parser, pipe, settings)
    return line


def _attention_rule(name: str, args, parser, pipe, settings) -> str:
    """UltraViCo's decay or FreeLOC's re-encoded time positions on the self-attention past the trained latent length
    (stock attention up to it)."""
    from mmpos.integrations.diffusers import set_attention_rule

    trained = (settings["train_frames"] - 1) // 4 + 1
    rule = {"type": name, "train_frames": trained}
    if name == "ultravico":
        rule["alpha"] = args.ultravico_alpha
    try:
        set_attention_rule(pipe.transformer, rule)
    except ValueError as error:
        _fail(parser, f"--extrapolate {name}: {error}")
    return f"attention rule: {rule} (applies past {trained} latent frames)"


def run_video(args, parser, write=None) -> int:
    """Run ``mmpos generate video`` from its parsed ``args``; ``parser`` (its own) reports user errors. ``write(paths,
    video [F, 3, H, W], trajectory, args, settings)`` saves the result (default: the files of :data:`OUTPUT_NAMES`;
    ``mmpos app`` passes one that also keeps the frames to measure the camera following)."""
    from .world_video import WORLD, run_world, world_model_folder

    if args.model is None:
        args.model = WORLD if world_model_folder(WORLD) is not None else TINY
    world = world_model_folder(args.model)
    if args.model == WORLD and world is None:
        _fail(parser, "--model world: no world video model in assets/world-video (see scripts/train_world_video.sh)")
    if world is not None:
        return run_world(
            args, world, _outputs(args, parser), lambda message: _fail(parser, message), write or write_outputs
        )
    settings = _settings(args, parser)
    paths = _outputs(args, parser)
    shown = "tiny offline Wan components (random weights, no download)" if settings["tiny"] else args.model
    print(f"model: {shown}\ndevice: {settings['device']}\ndtype: {settings['dtype']}", flush=True)
    if not args.extrapolate:
        warn_longer_than_trained(
            settings["frames"],
            settings["train_frames"],
            "expect repeats or drift past them (--extrapolate riflex adapts the time axis)",
        )
    trajectory = _trajectory(args, parser, settings["frames"])
    image = _first_frame(args, parser, settings)
    import torch

    from ... import load_camera_adapter

    pipe = _pipeline(args, parser, settings, _pipeline_class(args, parser))
    if args.adapter:
        try:
            adapter = load_camera_adapter(pipe, args.adapter)
        except (OSError, ValueError) as error:  # not a saved adapter folder / Hub id, or a bad config in it
            _fail(parser, f"--adapter {args.adapter}: {str(error).splitlines()[0]}")
        print(f"camera adapter: {adapter.config.kind} from {args.adapter}")
    else:
        print("camera adapter: none (pass --adapter): the camera is plotted but does not steer the video")
    if args.extrapolate:
        print(_extrapolate(args, parser, pipe, settings))
    call = dict(
        prompt=args.prompt,
        negative_prompt=args.negative_prompt,
        height=settings["height"],
        width=settings["width"],
        num_frames=settings["frames"],
        num_inference_steps=settings["steps"],
        guidance_scale=args.guidance,
        generator=torch.Generator().manual_seed(args.seed),
        output_type="pt",
    )
    if settings["tiny"] and image is None:
        call["max_sequence_length"] = 16  # the stock I2V processor needs the full 512 text tokens
    if image is not None:
        call["image"] = image
    accepted = pipe.stock_signature().parameters
    call = {name: value for name, value in call.items() if name in accepted}
    if args.prompt_embeds:
        call = {k: v for k, v in call.items() if k not in ("prompt", "negative_prompt")}
        call.update(_prompt_embeds(args, parser, accepted, settings["device"]))
    camera = trajectory if pipe.camera_adapter is not None else None
    video = pipe(**call, camera=camera, camera_scale=args.camera_scale).frames[0]
    return (write or write_outputs)(paths, video, trajectory, args, settings)


def _prompt_embeds(args, parser, accepted, device) -> dict:
    """``--prompt-embeds``: the file's tensors, each named as a prompt tensor argument of the pipeline's call
    (``prompt_embeds``, ``prompt_embeds_mask``, ``negative_prompt_attention_mask``, ...); anything else is refused by
    name."""
    from ...inputs import read_embeds_file

    try:
        tensors = read_embeds_file(args.prompt_embeds)
    except ValueError as error:
        _fail(parser, str(error))
    names = sorted(name for name in accepted if name.startswith(("prompt_", "negative_prompt_")) or "embeds" in name)
    unknown = sorted(set(tensors) - set(names))
    if unknown or not tensors:
        _fail(
            parser, f"--prompt-embeds {args.prompt_embeds}: holds {unknown or 'nothing'}; this pipeline takes {names}"
        )
    return {name: tensor.to(device) for name, tensor in tensors.items()}


def _first_frame(args, parser, settings):
    if not args.image:
        return None
    from ...images import read_photo_pil

    try:
        image = read_photo_pil(args.image, "--image")
    except ValueError as error:
        _fail(parser, str(error))
    return resized_first_frame(image, args.image, settings["width"], settings["height"])


def write_outputs(paths, video, trajectory, args, settings) -> int:
    from mmpos.camera import resample

    from .video_files import frame_grid, write_gif, write_mp4, write_png, write_rig_plot

    paths["video.mp4"].parent.mkdir(parents=True, exist_ok=True)
    write_mp4(video, paths["video.mp4"], args.fps)
    write_gif(video, paths["video.gif"], args.fps)
    write_png(frame_grid(video), paths["frames.png"])
    write_rig_plot(resample(trajectory, len(video)), paths["rig.png"], f"{args.camera}: {len(video)} frames")
    for path in paths.values():
        print(f"wrote {path}")
    return 0
