"""What each button of ``mmpos app`` runs: an ``mmpos`` command line built from the page's values and run in this
process (:func:`~mmpos.pipelines.commands.app.runs.run_command`), its output files handed back. Gradio-free: the page
(:mod:`mmpos.pipelines.commands.app.page`) and the API tests call these functions the same way."""

from __future__ import annotations

import itertools
import math
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .runs import CommandError, CommandRun, run_command

EXTRAPOLATION_PRESETS = ("dype", "dype_ntk", "dype_yarn", "yarn", "vision_yarn", "ntk", "pi")
EDIT_STRENGTH = {"band": "band.strength", "transplant": "transplant.tau", "loose": "loose.strength"}
CAMERA_ADAPTERS = ("ucpe", "plucker", "none")


@dataclass
class Workspace:
    """Where the app's runs write (one fresh folder per run under ``root``) and which model they use (``model``:
    ``world`` for the embedded mini-world models, or a ``from_pretrained`` folder / hub id)."""

    root: Path
    model: str = "world"
    _counter: itertools.count = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def new_run(self, kind: str) -> Path:
        """A folder name for the next run of ``kind`` that no earlier run used (the command creates it)."""
        with self._lock:
            while True:
                folder = self.root / f"{kind}-{next(self._counter)}"
                if not folder.exists():
                    return folder

    @property
    def world(self) -> bool:
        return self.model == "world"


def _steps_and_seed(steps: int, seed: int) -> list[str]:
    return ["--set", f"sampler.num_inference_steps={_int('steps', steps, 1)}", "--set", f"seed={_int('seed', seed, 0)}"]


def _int(name: str, value, minimum: int) -> int:
    """``value`` as an int of at least ``minimum`` (the page's number fields send floats), else a CommandError."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CommandError(f"{name}: expected an integer, got {value!r}") from None
    if not math.isfinite(number) or number != int(number) or number < minimum:
        raise CommandError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(number)


@dataclass
class GenerateResult:
    extrapolated: Path  # the image at the asked size with the extrapolation preset
    plain: Path  # the same seed and size without extrapolation
    config: Path  # the extrapolated run's config.yaml (the CLI repeats it: mmpos generate --config config.yaml)
    log: str


def generate(space: Workspace, prompt: str, height, width, extrapolate: str, seed, steps) -> GenerateResult:
    """``mmpos generate`` at ``height x width`` with ``--extrapolate PRESET``, then the same seed with ``none``
    (its image copied beside the first run's as ``image_0_no_extrapolation.png``, so the two downloads differ in
    name)."""
    if extrapolate not in EXTRAPOLATION_PRESETS:
        raise CommandError(f"extrapolate: expected one of {', '.join(EXTRAPOLATION_PRESETS)}, got {extrapolate!r}")
    argv = ["generate", "--model", space.model, "--height", str(_int("height", height, 1))]
    argv += ["--width", str(_int("width", width, 1)), *_steps_and_seed(steps, seed)]
    if prompt and prompt.strip():
        argv += ["--prompt", prompt.strip()]
    runs = [
        run_command([*argv, "--extrapolate", preset], space.new_run("generate")) for preset in (extrapolate, "none")
    ]
    plain = runs[0].out / "image_0_no_extrapolation.png"  # downloaded beside image_0.png: its own name
    shutil.copyfile(_needed(runs[1], "image_0.png"), plain)
    return GenerateResult(_needed(runs[0], "image_0.png"), plain, _needed(runs[0], "config.yaml"), runs[0].log)


def _needed(run: CommandRun, name: str) -> Path:
    path = run.file(name)
    if path is None:
        raise CommandError(f"the command wrote no {name} in {run.out}")
    return path


@dataclass
class EditResult:
    edited: list[Path]  # edited_N.png (the model's output over the input picture)
    fullsize: list[Path]  # edited_N_fullsize.png: at the input file's size, where the model's input was resized
    comparison: Path  # the CLI's comparison strip: inputs, edited, strength sweep
    diagnostic: Path | None
    config: Path
    log: str


def edit(space: Workspace, method: str, inputs: list[str], strength, steps, seed, prompt: str = "") -> EditResult:
    """``mmpos edit METHOD INPUTS --set <strength key>=STRENGTH`` (band: ``band.strength``, transplant:
    ``transplant.tau``, loose: ``loose.strength``); ``inputs`` are the method's own options (``--reference-image
    FILE``, ``--box L T R B``, ...)."""
    if method not in EDIT_STRENGTH:
        raise CommandError(f"method: expected one of {', '.join(EDIT_STRENGTH)}, got {method!r}")
    try:
        value = float(strength)
    except (TypeError, ValueError):
        raise CommandError(f"strength: expected a number, got {strength!r}") from None
    argv = ["edit", method, "--model", space.model, *inputs, "--set", f"{EDIT_STRENGTH[method]}={value}"]
    argv += _steps_and_seed(steps, seed)
    if prompt and prompt.strip():
        argv += ["--prompt", prompt.strip()]
    run = run_command(argv, space.new_run(f"edit_{method}"))
    edited = sorted(run.out.glob("edited_*[0-9].png"), key=lambda p: int(p.stem.split("_")[1]))
    fullsize = [path.with_name(f"{path.stem}_fullsize.png") for path in edited]
    fullsize = [path for path in fullsize if path.is_file()]
    return EditResult(
        edited,
        fullsize,
        _needed(run, "comparison.png"),
        run.file("diagnostic.png"),
        _needed(run, "config.yaml"),
        run.log,
    )


def band_inputs(reference_image: str | None, reference_prompt: str, targets: str) -> list[str]:
    """``mmpos edit band``'s inputs: an uploaded reference photo (else the reference prompt), one target per line."""
    argv = []
    if reference_image:
        argv += ["--reference-image", reference_image]
    elif reference_prompt and reference_prompt.strip():
        argv += ["--reference-prompt", reference_prompt.strip()]
    for line in (targets or "").splitlines():
        if line.strip():
            argv += ["--target", line.strip()]
    return argv


def transplant_inputs(
    background: str | None, reference: str | None, box, reference_mask: str | None = None
) -> list[str]:
    """``mmpos edit transplant``'s inputs: background, reference object (and its mask), ``box`` ``(L, T, R, B)`` in
    the background's pixels."""
    if not background:
        raise CommandError("mmpos edit transplant: error: --background: upload a background image")
    if not reference:
        raise CommandError("mmpos edit transplant: error: --reference: upload the reference object's image")
    argv = [
        "--background",
        background,
        "--reference",
        reference,
        "--box",
        *(str(_int(n, v, 0)) for n, v in zip("LTRB", box)),
    ]
    return argv + (["--reference-mask", reference_mask] if reference_mask else [])


def loose_inputs(collage: str | None, original: str | None, mask: str | None = None) -> list[str]:
    """``mmpos edit loose``'s inputs: the collage (object pasted) and the picture before pasting (or a paste mask)."""
    if not collage:
        raise CommandError("mmpos edit loose: error: --image: upload the collage (the object pasted on the scene)")
    argv = ["--image", collage]
    if original:
        argv += ["--original", original]
    if mask:
        argv += ["--mask", mask]
    return argv


def camera_spec(space: Workspace, mode: str, preset: str, actions: str) -> str:
    """The ``--camera`` value: a motion of the vocabulary (``orbit:35``), or the actions saved as an mmpos
    trajectory ``.json`` in a fresh run folder (keyframes, resampled to the clip by the command)."""
    if mode == "preset":
        return (preset or "").strip() or "orbit:35"
    from mmpos.camera import save_trajectory
    from mmpos.world.video_data import FOV_DEGREES

    from .camera_path import action_trajectory, parse_actions

    try:
        trajectory = action_trajectory(parse_actions(actions or ""), FOV_DEGREES)
    except ValueError as error:
        raise CommandError(f"mmpos generate video: error: --camera: {error}") from None
    folder = space.new_run("camera_path")
    folder.mkdir(parents=True)
    return str(save_trajectory(trajectory, folder / "trajectory.json"))


def plot_rig(space: Workspace, spec: str, frames) -> Path:
    """The rig plot of the path ``mmpos generate video --model world --camera SPEC`` would follow (the same
    function places it at the world clip's first camera), before anything is generated."""
    from ..generate.video_files import write_rig_plot
    from ..generate.world_video import world_trajectory

    count = _int("frames", frames, 2)

    def fail(message):
        raise CommandError(f"mmpos generate video: error: {message}")

    trajectory = world_trajectory(spec, count, fail)
    folder = space.new_run("rig")
    folder.mkdir(parents=True)
    return write_rig_plot(
        trajectory, folder / "rig.png", f"{spec if len(spec) < 40 else Path(spec).name}: {count} frames"
    )


@dataclass
class VideoResult:
    video: Path  # video.mp4 (H.264 where OpenCV has the encoder)
    frames: Path
    rig: Path
    following: dict  # camera_errors of the generated frames against the commanded path (degrees)
    log: str


def camera_video(
    space: Workspace, spec: str, frames, steps, seed, adapter: str = "ucpe", camera_scale=1.0
) -> VideoResult:
    """``mmpos generate video --model MODEL --camera SPEC --adapter ...`` (``adapter``: see :func:`_adapter_folder`)
    and the camera-following numbers of its frames
    (:func:`mmpos.eval.camera_following.camera_errors`: RotErr / TransErr of the motion recovered from the video
    against the commanded one)."""
    from ..generate.video import run_video, write_outputs

    kept = {}

    def write(paths, video, trajectory, args, settings):
        kept.update(video=video, trajectory=trajectory)
        return write_outputs(paths, video, trajectory, args, settings)

    argv = ["generate", "video", "--model", space.model, "--camera", spec, "--frames", str(_int("frames", frames, 2))]
    argv += [
        "--steps",
        str(_int("steps", steps, 1)),
        "--seed",
        str(_int("seed", seed, 0)),
        "--camera-scale",
        str(float(camera_scale)),
    ]
    folder = _adapter_folder(space, adapter)
    argv += [] if folder is None else ["--adapter", folder]
    run = run_command(argv, space.new_run("video"), call=lambda args: run_video(args, args.video_parser, write=write))
    return VideoResult(
        _needed(run, "video.mp4"), _needed(run, "frames.png"), _needed(run, "rig.png"), following_numbers(kept), run.log
    )


def _adapter_folder(space: Workspace, adapter: str) -> str | None:
    """``--adapter``'s value: on the world model one of :data:`CAMERA_ADAPTERS` (its shipped adapters), on a
    user's model a ``CameraAdapter.save_pretrained`` folder, or None (empty or ``none``: the model alone)."""
    if space.world:
        if adapter not in CAMERA_ADAPTERS:
            raise CommandError(f"adapter: expected one of {', '.join(CAMERA_ADAPTERS)}, got {adapter!r}")
        from ...world.video_demo import video_model_folder

        return "none" if adapter == "none" else str(Path(video_model_folder()) / f"camera-{adapter}")
    adapter = (adapter or "").strip()
    return adapter if adapter not in ("", "none") else None


def following_numbers(kept: dict) -> dict:
    """RotErr / TransErr per frame and their means (degrees; NaN where too few corners were tracked)."""
    if "video" not in kept:
        return {}
    from mmpos.camera import resample
    from mmpos.eval.camera_following import camera_errors

    from ..generate.video_files import video_to_uint8

    frames = video_to_uint8(kept["video"])
    errors = camera_errors(frames, resample(kept["trajectory"], len(frames)))
    return {
        "rot_err_mean": _number(errors["rot_err_mean"]),
        "trans_err_mean": _number(errors["trans_err_mean"]),
        "tracks": errors["tracks"],
        "frame": list(range(1, len(frames))),
        "rot_err": [_number(v) for v in errors["rot_err"]],
        "trans_err": [_number(v) for v in errors["trans_err"]],
    }


def _number(value) -> float | None:
    value = float(value)
    return round(value, 3) if math.isfinite(value) else None


def encoding_figure(space: Workspace, name: str, head_dim, options: str = "", size=31) -> Path:
    """The spectrum and content-free logit-vs-offset figure of encoding ``name`` (``mmpos demo``'s figure,
    :func:`mmpos.viz.spectrum.encoding_figure`) with ``head_dim`` and the JSON ``options`` of ``create_pe``;
    camera encodings: their pattern across two views (:func:`mmpos.viz.cameras.camera_encoding_figure`)."""
    import json

    from mmpos.demo import DEMO_OPTIONS, DEMO_OVERRIDES, FIGURE_NOTES
    from mmpos.encodings import create_pe, list_pes, pe_class, pe_options

    if name not in list_pes():
        raise CommandError(f"encoding: expected one of {', '.join(list_pes())}, got {name!r}")
    try:
        extra = json.loads(options) if options and options.strip() else {}
    except json.JSONDecodeError as error:
        raise CommandError(
            f"options: expected a JSON object of create_pe options, got {options!r} ({error.msg})"
        ) from None
    if not isinstance(extra, dict):
        raise CommandError(f"options: expected a JSON object of create_pe options, got {options!r}")
    folder = space.new_run("encoding")
    folder.mkdir(parents=True)
    if pe_class(name).capabilities.needs_cameras:
        from mmpos.viz.cameras import camera_encoding_figure

        return camera_encoding_figure(name, folder / f"{name}.png")
    valid = pe_options(name)
    settings = {**DEMO_OPTIONS, **DEMO_OVERRIDES.get(name, {}), "head_dim": _int("head_dim", head_dim, 2)}
    settings = {key: value for key, value in settings.items() if key in valid}
    unknown = sorted(set(extra) - set(valid))
    if unknown:
        raise CommandError(f"options: {name} takes no option(s) {unknown}; it takes {sorted(valid)}")
    try:
        pe = create_pe(name, **{**settings, **extra})
    except (TypeError, ValueError) as error:
        raise CommandError(f"options: {error}") from None
    from mmpos.viz.spectrum import encoding_figure as figure

    return figure(pe, name, folder / f"{name}.png", _int("size", size, 3), FIGURE_NOTES.get(name, ""))
