"""Train the world video model's stages on camera-moving clips of the 3D mini-world (CPU-sized defaults).

    python scripts/train_world_video.py --stage vae  --out runs/video/vae  --max-minutes 10
    python scripts/train_world_video.py --stage base --out runs/video/base --vae runs/video/vae/vae
    python scripts/train_world_video.py --stage ucpe --out runs/video/ucpe --vae runs/video/vae/vae \\
        --base runs/video/base/transformer

Stages, data and checkpoints: :mod:`mmpos.training.tasks.world_video`. ``--resume`` continues a run folder's
newest ``checkpoint-<step>/`` (or a ``state.pt`` of the earlier layout), ``--overwrite`` replaces the run; without
either a folder that has one is refused. ``--max-minutes`` stops (with a checkpoint) after that wall time; rerun
with ``--resume`` to go on. The rendered clips are cached in ``OUT/clips-train.pt``. On N processes
(``torchrun --nproc_per_node N``) ``--batch-size`` is per process and only the main process writes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from mmpos._atomic import written_atomically
from mmpos._safe_state import UnsafeStateError, load_torch_file
from mmpos.training.scaffold.folders import RunExistsError, refuse_earlier_run, remove_paths
from mmpos.training.tasks.world_video import STAGES, VideoRecipe, train_stage
from mmpos.world.video_data import make_clips

DEFAULT_VAE = Path(__file__).resolve().parents[1] / "assets" / "world-vae"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train_world_video",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--stage", required=True, choices=STAGES)
    p.add_argument("--out", required=True, help="run folder (state.pt, clips cache, exported model)")
    p.add_argument("--vae", default=str(DEFAULT_VAE), help="AutoencoderKL folder (the vae stage starts from it)")
    p.add_argument("--base", help="trained transformer folder (camera stages)")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--scenes", type=int, default=600, help="training scenes (4 clips each)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=200, help="steps")
    p.add_argument("--max-minutes", type=float, default=float("inf"), help="wall-clock budget of this call")
    p.add_argument("--size", type=int, default=32, help="clip frame size in pixels (square)")
    p.add_argument("--frames", type=int, default=9, help="frames per clip")
    p.add_argument("--device", default="cpu", help="where the models train (cuda on a GPU)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue OUT's newest checkpoint-<step>/ (or state.pt); a folder without one starts the run",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the run in OUT (its checkpoints and export)")
    p.add_argument(
        "--init-from",
        help="a finished run folder of the same stage: start from its weights with a fresh "
        "optimiser and schedule (continued training)",
    )
    return p


def cached_clips(out: Path, scenes: int, frames: int, size: int) -> dict:
    """The training clips, rendered once per run folder (``OUT/clips-train.pt``)."""
    path = out / "clips-train.pt"
    if path.exists():
        data = load_torch_file(path)
        if tuple(data["frames"].shape[:2]) == (scenes * 4, frames) and data["frames"].shape[-1] == size:
            return data
    main = int(os.environ.get("RANK", "0")) == 0  # every process renders the same clips; the main one caches them
    data = make_clips("train", scenes, frames=frames, size=size, progress=main)
    if main:
        with written_atomically(path) as temporary:
            torch.save(data, temporary)
    return data


def earlier_run(out: Path) -> list[Path]:
    """What a run left in ``out``: checkpoints (also partial ones) and a ``state.pt`` of the earlier layout."""
    if not out.is_dir():
        return []
    names = ("checkpoint-", ".checkpoint-")
    return sorted(p for p in out.iterdir() if p.name == "state.pt" or p.name.startswith(names))


def main(argv=None) -> int:
    from diffusers import AutoencoderKL, WanTransformer3DModel

    parser = build_parser()
    args = parser.parse_args(argv)
    out = Path(args.out)
    earlier = earlier_run(out)
    try:
        refuse_earlier_run(
            f"--out {out} holds an earlier run ({earlier[0].name})" if earlier else None, args.resume, args.overwrite
        )
    except RunExistsError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if args.stage not in ("vae", "base") and not args.base:
        parser.exit(
            2,
            f"{parser.prog}: error: --stage {args.stage} trains a camera adapter: pass --base "
            "(the transformer folder of a finished base run)\n",
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        recipe = VideoRecipe(
            args.stage,
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            train_scenes=args.scenes,
            checkpoint_every=args.checkpoint_every,
            init_from=args.init_from,
        )
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    out.mkdir(parents=True, exist_ok=True)
    if args.overwrite and int(os.environ.get("RANK", "0")) == 0:
        remove_paths(earlier)
    try:
        data = cached_clips(out, args.scenes, args.frames, args.size)
        vae = AutoencoderKL.from_pretrained(args.vae)
        base = WanTransformer3DModel.from_pretrained(args.base) if args.base else None
        state = train_stage(
            recipe,
            data,
            out,
            vae,
            base,
            max_minutes=args.max_minutes,
            device=args.device,
            log=lambda line: print(line, flush=True),
        )
    except (UnsafeStateError, ValueError) as error:  # a cache or state that is not plain tensors; another recipe
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    except FloatingPointError as error:  # the NaN stop
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    done = "finished" if state["finished"] else "stopped (rerun with --resume)"
    print(f"{args.stage}: {done} at step {state['step']}, {state['cpu_seconds'] / 60:.1f} CPU minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
