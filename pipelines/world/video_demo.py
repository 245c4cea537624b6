"""The camera-controlled clips section of ``mmpos demo``: one held-out scene, three commanded motions (orbit,
dolly, pan), the world video model without a camera and with each camera adapter, beside the ground-truth render;
the rigs, a GIF per motion and the measured PSNR / RotErr / TransErr of every row."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mmpos.eval.video_eval import EvalClip, as_unit_float, generate, score
from mmpos.models.world.image import DEFAULT_ASSETS
from mmpos.world.video_data import Motion, motion_trajectory, render_clip, start_pose

from ..report import Section

VIDEO_MODEL = "world-video"
DEMO_SCENE_SEED = 1_000_007  # a test-split scene (see mmpos.world.nvs_data.scene_seeds)
DEMO_MOTIONS = (Motion("orbit", 35.0), Motion("dolly", 1.0), Motion("pan", 20.0))
DEMO_START_DEGREES = 200.0


def video_model_folder(root=None) -> Path | None:
    """``<assets>/world-video`` when it holds a trained pipeline, else None."""
    folder = Path(root if root is not None else DEFAULT_ASSETS) / VIDEO_MODEL
    return folder if (folder / "model_index.json").is_file() else None


def demo_clips(size: int = 32) -> list[EvalClip]:
    from mmpos.world.scene3d import sample_scene3d

    scene = sample_scene3d(DEMO_SCENE_SEED, 4, textured=True)
    start = start_pose(DEMO_START_DEGREES)
    clips = []
    for motion in DEMO_MOTIONS:
        trajectory = motion_trajectory(motion, start)
        clips.append(
            EvalClip(
                DEMO_SCENE_SEED, motion, trajectory, render_clip(scene, trajectory, size).permute(0, 2, 3, 1).numpy()
            )
        )
    return clips


def _uint8(frames) -> np.ndarray:
    return np.clip(np.rint(as_unit_float(frames) * 255), 0, 255).astype(np.uint8)


def write_gif(rows: list[np.ndarray], path: Path, zoom: int = 4, fps: int = 4) -> Path:
    """Clips ``[F, S, S, 3]`` side by side, one GIF (written atomically)."""
    from PIL import Image

    from mmpos._atomic import written_atomically

    strip = np.concatenate([np.pad(r, ((0, 0), (0, 0), (0, 2), (0, 0)), constant_values=255) for r in rows], axis=2)
    frames = [Image.fromarray(f).resize((f.shape[1] * zoom, f.shape[0] * zoom), Image.NEAREST) for f in strip]
    with written_atomically(path) as temporary:
        frames[0].save(temporary, format="GIF", save_all=True, append_images=frames[1:], duration=1000 // fps, loop=0)
    return path


def write_rigs(clips: list[EvalClip], path: Path) -> Path:
    from mmpos.viz.cameras import plot_rig
    from mmpos.viz.figure_files import pyplot, save_figure

    fig = pyplot().figure(figsize=(5 * len(clips), 4.5))
    for i, clip in enumerate(clips):
        plot_rig(
            fig.add_subplot(1, len(clips), i + 1, projection="3d"),
            clip.trajectory,
            title=f"{clip.motion.kind} {clip.motion.amount:+g}",
        )
    return save_figure(fig, path)


def load_video_model(folder: Path):
    """``(pipe, {kind: adapter})``: the pipeline and the camera adapters shipped in ``folder``."""
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter

    from .. import WorldVideoPipeline

    pipe = WorldVideoPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    adapters = {
        kind: CameraAdapter.from_pretrained(folder / f"camera-{kind}").eval()
        for kind in ("ucpe", "plucker")
        if (folder / f"camera-{kind}" / "config.json").is_file()
    }
    return pipe, adapters


def demo_outputs(pipe, adapters: dict, steps: int = 24) -> list[tuple[EvalClip, dict]]:
    """Per demo clip: ``{row name: frames}`` (ground truth, no camera, each adapter)."""
    results = []
    for index, clip in enumerate(demo_clips()):
        outputs = {"ground truth": clip.truth}
        pipe.camera_adapter = None
        outputs["no camera"] = generate(pipe, clip, None, steps, index)
        for kind, adapter in adapters.items():
            pipe.camera_adapter = adapter
            outputs[f"{kind} adapter"] = generate(pipe, clip, clip.trajectory, steps, index)
        pipe.camera_adapter = None
        results.append((clip, {name: _uint8(frames) for name, frames in outputs.items()}))
    return results


def labelled_rows(results) -> list[tuple[str, np.ndarray]]:
    return [
        (f"{clip.motion.kind} {clip.motion.amount:+g}: {name}", frames)
        for clip, outputs in results
        for name, frames in outputs.items()
    ]


def camera_clips_section(out_dir: Path, root=None, steps: int = 24):
    """The section (a :class:`~mmpos.pipelines.report.Section`), or None without a trained video model."""
    folder = video_model_folder(root)
    if folder is None:
        print("no world video model in assets/; skipping the camera-controlled clips section")
        return None
    results = demo_outputs(*load_video_model(folder), steps=steps)
    lines, written = [], [write_rigs([clip for clip, _ in results], Path(out_dir) / "world_camera_rigs.png")]
    for clip, outputs in results:
        for name, frames in outputs.items():
            s = score(frames, clip)
            psnr = "-" if name == "ground truth" else f"{s['psnr']:.1f} dB"
            lines.append(
                f"{clip.motion.kind} {clip.motion.amount:+g}, {name}: PSNR {psnr}, RotErr "
                f"{s['rot_err']:.1f}, TransErr {s['trans_err']:.1f}"
            )
        written.append(write_gif(list(outputs.values()), Path(out_dir) / f"world_camera_{clip.motion.kind}.gif"))
    note = (
        "First frame + commanded trajectory -> 9 frames (32 px) from the world video model (WanTransformer3DModel "
        "in WorldVideoPipeline), without a camera and with each camera adapter, beside the ground-truth render. "
        "RotErr / TransErr (degrees): the motion recovered from the frames with OpenCV against the commanded "
        "one (the ground-truth row is the measurement's floor; TransErr is undefined for a pan). GIFs, left to "
        f"right: {' | '.join(results[0][1])}. " + "; ".join(lines) + "."
    )
    return Section(
        "Camera-controlled clips: the world video model without / with camera adapters",
        labelled_rows(results),
        [],
        written,
        note,
    )
