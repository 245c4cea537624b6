"""Past the training length on the world video model: stock attention against UltraViCo and FreeLOC, measured per frame.

The world video model (``assets/world-video``: a small Wan, 9 latent frames of 32 px, one latent per frame) follows
an orbit through its UCPE camera adapter; the commanded path is extended at the training speed (35 degrees per 9
frames) to 2x, 3x and 4x the training length (at 1x the rule is off: the stock model), and the world renders the ground truth along it. Per frame:
PSNR against the render (quality), the frame-to-frame change over the render's (below 1: frozen dynamics) and
the PSNR between frames one training length apart over the render's (repetition with the training period).

    OMP_NUM_THREADS=1 python scripts/eval_video_length.py --scenes 8 --out outputs/video_length
    OMP_NUM_THREADS=1 python scripts/eval_video_length.py --scenes 3 --conditions stock freeloc --out outputs/freeloc
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

TRAIN_FRAMES = 9
DEGREES_PER_CLIP = 35.0
CONDITIONS = {
    "stock": None,
    "ultravico 0.9": {"type": "ultravico", "train_frames": TRAIN_FRAMES, "alpha": 0.9},
    "ultravico 0.6": {"type": "ultravico", "train_frames": TRAIN_FRAMES, "alpha": 0.6},
    "freeloc": {"type": "freeloc", "train_frames": TRAIN_FRAMES},  # windows scaled from the authors' Wan setting
}


def psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per frame, ``a, b [F, S, S, 3]`` in [0, 1]."""
    mse = ((a - b) ** 2).reshape(len(a), -1).mean(1)
    return 10 * np.log10(1.0 / np.maximum(mse, 1e-10))


def frame_stats(frames: np.ndarray, truth: np.ndarray) -> dict:
    """Means over the frames past the training length."""
    past = slice(TRAIN_FRAMES, None)
    change = np.abs(np.diff(frames, axis=0)).mean((1, 2, 3))
    truth_change = np.abs(np.diff(truth, axis=0)).mean((1, 2, 3))
    out = dict(
        psnr_curve=psnr(frames, truth).tolist(),
        psnr_past=float(psnr(frames, truth)[past].mean()),
        motion_ratio=float(change[TRAIN_FRAMES - 1 :].mean() / truth_change[TRAIN_FRAMES - 1 :].mean()),
    )
    if len(frames) > TRAIN_FRAMES:
        lag = psnr(frames[TRAIN_FRAMES:], frames[:-TRAIN_FRAMES]) - psnr(truth[TRAIN_FRAMES:], truth[:-TRAIN_FRAMES])
        out["period_psnr_excess"] = float(lag.mean())
    return out


def write_results(out: Path, results: dict) -> None:
    from mmpos._atomic import written_atomically

    out.mkdir(parents=True, exist_ok=True)
    with written_atomically(out / "results.json") as temporary:
        Path(temporary).write_text(json.dumps(results))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=8)
    parser.add_argument("--scales", type=int, nargs="+", default=[2, 3, 4], choices=range(2, 9))
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--model", default="assets/world-video")
    parser.add_argument(
        "--conditions",
        nargs="+",
        choices=list(dict.fromkeys(name.split()[0] for name in CONDITIONS)),
        default=["stock", "ultravico"],
        help="attention conditions to run (ultravico: alpha 0.9 and 0.6) (default: stock ultravico)",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out)
    if (out / "results.json").exists():
        parser.error(f"--out {out}: results.json exists (choose another folder)")

    from mmpos.integrations.diffusers import clear_attention_rule, set_attention_rule, set_pe
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter
    from mmpos.pipelines import WorldVideoPipeline, load_camera_adapter
    from mmpos.world.scene3d import sample_scene3d
    from mmpos.world.video_data import Motion, motion_trajectory, render_clip, start_pose

    torch.set_num_threads(1)
    folder = Path(args.model)
    pipe = WorldVideoPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    set_pe(pipe.transformer, "native")
    load_camera_adapter(pipe, folder / "camera-ucpe")
    assert isinstance(pipe.camera_adapter, CameraAdapter)
    results: dict = {}
    for i in range(args.scenes):  # scenes outside: an interrupted run has every length for the scenes it did
        scene = sample_scene3d(1_000_000 + i, 4, textured=True)
        for scale in args.scales:
            frames_n = (TRAIN_FRAMES - 1) * scale + 1
            motion = Motion("orbit", DEGREES_PER_CLIP * scale)
            trajectory = motion_trajectory(motion, start_pose(200.0 + 17.0 * i), frames_n)
            truth = render_clip(scene, trajectory, 32).permute(0, 2, 3, 1).numpy().astype(np.float64) / 255
            first = torch.from_numpy(truth[0]).permute(2, 0, 1)[None].float()
            for name, rule in CONDITIONS.items():
                if name.split()[0] not in args.conditions:
                    continue
                clear_attention_rule(pipe.transformer)
                if rule is not None:
                    set_attention_rule(pipe.transformer, rule)
                generator = torch.Generator().manual_seed(i)
                call = dict(num_frames=frames_n, height=32, width=32, num_inference_steps=args.steps)
                frames = pipe(first, **call, generator=generator, camera=trajectory).frames[0]
                stats = frame_stats(np.asarray(frames, dtype=np.float64), truth)
                results.setdefault(f"{scale}x", {}).setdefault(name, []).append(stats)
            write_results(out, results)  # after every scene: an interrupted run keeps what it measured
            print(f"{scale}x scene {i} done", flush=True)
    keys = ("psnr_past", "motion_ratio", "period_psnr_excess")
    print("| length | condition | PSNR past 9 frames (dB) | motion / truth | period-9 PSNR excess (dB) |")
    print("|---|---|---|---|---|")
    for scale, table in results.items():
        for name, rows in table.items():
            cells = []
            for key in keys:
                values = [r[key] for r in rows if key in r]
                cells.append(f"{np.mean(values):.2f} ± {np.std(values):.2f}" if values else "-")
            print(f"| {scale} | {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
