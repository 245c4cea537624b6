"""Camera following of the world video model against ground truth (docs/results.md, "Camera-controlled clips").

    python scripts/eval_camera_following.py                       # assets/world-video, 20 test scenes x 3 motions
    python scripts/eval_camera_following.py --scenes 4 --out outputs/camera_following --overwrite

For each held-out clip: the first frame goes to the model with no camera, with each camera adapter told the true
trajectory, and with it told the opposite motion; outputs are scored against the ground-truth render (PSNR) and
the commanded motion recovered with OpenCV (RotErr / TransErr; the render itself gives the floor). Writes
``OUT/results.json`` and ``OUT/examples.png`` (one clip per motion, a row per condition); prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from mmpos._arguments import user_error
from mmpos._atomic import ConcurrentWriteError, claimed_output, written_atomically
from mmpos.eval.video_eval import EVAL_MOTIONS, as_unit_float, eval_clips, evaluate_conditions, summarise
from mmpos.models.world.samples import image_grid
from mmpos.world.images import save_png

ROOT = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval_camera_following",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default=str(ROOT / "assets" / "world-video"), help="WorldVideoPipeline folder")
    p.add_argument(
        "--adapters",
        nargs="+",
        default=["ucpe", "plucker"],
        help="camera adapters: names of MODEL/camera-<name> folders, or folders",
    )
    p.add_argument("--scenes", type=int, default=20, help="held-out scenes (one clip per motion each)")
    p.add_argument("--steps", type=int, default=24, help="sampling steps")
    p.add_argument("--out", default="outputs/camera_following", help="folder for results.json and examples.png")
    p.add_argument("--overwrite", action="store_true", help="replace results already in --out")
    return p


def load(args):
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter
    from mmpos.pipelines import WorldVideoPipeline

    pipe = WorldVideoPipeline.from_pretrained(args.model)
    adapters = {}
    for name in args.adapters:
        folder = Path(name) if Path(name).is_dir() else Path(args.model) / f"camera-{name}"
        if not (folder / "config.json").is_file():
            raise user_error("eval_camera_following", f"no camera adapter at {folder} (expected config.json)")
        adapters[CameraAdapter.load_config(folder)["kind"] if Path(name).is_dir() else name] = (
            CameraAdapter.from_pretrained(folder).eval()
        )
    return pipe, adapters


def table(summary: dict) -> str:
    lines = ["| condition | PSNR (dB) | RotErr (deg) | TransErr (deg) |", "|---|---|---|---|"]
    for name, entry in summary.items():
        cells = [
            f"{entry[m]:.2f} ± {entry[m + '_std']:.2f}" if entry[m] is not None else "n/a"
            for m in ("psnr", "rot_err", "trans_err")
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(outputs: dict, clips, path: Path) -> Path:
    rows = []
    for kind in EVAL_MOTIONS:
        index = next(i for i, c in enumerate(clips) if c.motion.kind == kind)
        for name, frames in outputs.items():
            images = np.clip(np.rint(as_unit_float(frames[index]) * 255), 0, 255).astype(np.uint8)
            rows.append((f"{kind} {clips[index].motion.amount:+g}: {name}"[:40], images))
    return save_png(path, image_grid(rows, zoom=2, label_width=230))


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with claimed_output(args.out):  # another run writing --out now: refused
            return evaluate(parser, args)
    except ConcurrentWriteError as error:
        parser.exit(2, f"{parser.prog}: error: --out {error}\n")


def evaluate(parser, args) -> int:
    out = Path(args.out)
    if (out / "results.json").exists() and not args.overwrite:
        parser.exit(2, f"{parser.prog}: error: {out / 'results.json'} exists; pass --overwrite or another --out\n")
    started = time.process_time()
    pipe, adapters = load(args)
    clips = eval_clips(args.scenes)
    scores, outputs = evaluate_conditions(pipe, adapters, clips, args.steps)
    summary = summarise(scores)
    result = dict(
        scenes=args.scenes,
        clips=len(clips),
        steps=args.steps,
        motions=EVAL_MOTIONS,
        cpu_minutes=round((time.process_time() - started) / 60, 2),
        summary=summary,
    )
    with written_atomically(out / "results.json") as temporary:
        temporary.write_text(json.dumps(result, indent=1))
    figure(outputs, clips, out / "examples.png")
    print(table(summary))
    print(f"wrote {out / 'results.json'} and {out / 'examples.png'} ({result['cpu_minutes']} CPU minutes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
