"""Positional-encoding benchmark on the mini-world (the embedded default of the ViT workflow).

Every encoding is trained with the same recipe and budget (``configs/vit/world_relation.yaml``) for each
seed through ``scripts/train_vit.py``, evaluated at 1x, 1.5x and 2x the training resolution with and without
extrapolation, and summarised as mean ± std over seeds:

    OMP_NUM_THREADS=1 python scripts/vit_benchmark.py run --out runs/vit_bench --jobs 2
    python scripts/vit_benchmark.py summarize --out runs/vit_bench --assets assets/vit_bench

``summarize`` writes the plot into ``--assets`` and the tables (``results.md``, ``results.json``) into
``--results`` (default ``assets/results/vit_bench``).

``run`` writes the data set if missing (``mmpos world dataset --task relation``), skips runs that have a
``results.json`` (so it can be restarted) and records each run's CPU seconds (user + system) in
``cpu_seconds.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PES = ("nope", "ape_learned", "ape_sincos", "rope_axial", "rope_mixed", "comrope_ld", "harope")
COLUMNS = ((1.0, "none"), (1.5, "none"), (2.0, "none"), (1.5, "pi"), (2.0, "pi"), (1.5, "ntk"), (2.0, "ntk"))


def ensure_data(data_dir: Path, train_count: int, val_count: int) -> None:
    from mmpos.world.positional import write_positional_folder

    for split, count, seed in (("train", train_count, 0), ("val", val_count, 1)):
        if not (data_dir / split).exists():
            write_positional_folder(data_dir / split, count, seed=seed, task="relation", image_size=64)


def run_command(args, pe: str, seed: int, run_dir: Path) -> list[str]:
    command = [
        "nice",
        "-n",
        str(args.nice),
        sys.executable,
        str(ROOT / "scripts" / "train_vit.py"),
        "--config",
        str(args.config),
        "--pe",
        pe,
        "--seed",
        str(seed),
        "--data-dir",
        str(args.data_dir),
        "--output-dir",
        str(run_dir),
    ]
    if (run_dir / "checkpoints").exists():
        command.append("--overwrite")  # an unfinished run starts over (the budget is whole runs)
    return command + [item for text in args.set for item in ("--set", text)]


def run_all(args) -> None:
    ensure_data(args.data_dir, args.train_count, args.val_count)
    todo = [
        (pe, seed)
        for seed in args.seeds
        for pe in args.pes
        if not (args.out / f"{pe}_s{seed}" / "results.json").exists()
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    running: dict[int, tuple[str, Path, object]] = {}
    while todo or running:
        while todo and len(running) < args.jobs:
            pe, seed = todo.pop(0)
            run_dir = args.out / f"{pe}_s{seed}"
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log = open(args.out / f"{pe}_s{seed}.log", "w")
            process = subprocess.Popen(
                run_command(args, pe, seed, run_dir), env=env, stdout=log, stderr=subprocess.STDOUT
            )
            running[process.pid] = (f"{pe} seed {seed}", run_dir, log)
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        name, run_dir, log = running.pop(pid)
        log.close()
        cpu = usage.ru_utime + usage.ru_stime
        if os.waitstatus_to_exitcode(status) == 0:
            (run_dir / "cpu_seconds.json").write_text(json.dumps({"cpu_seconds": cpu}))
        print(f"{name}: exit {os.waitstatus_to_exitcode(status)}, {cpu:.0f} CPU s", flush=True)


def _mean_std(values):
    if not values:
        return None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def collect(out: Path, pes, seeds) -> dict:
    """``{pe: {"scale/extrapolation": [top1 per seed]}, ...}`` and CPU seconds, from the run folders."""
    table, cpu = {}, []
    for pe in pes:
        cells = {}
        for seed in seeds:
            run = out / f"{pe}_s{seed}"
            if not (run / "results.json").exists():
                continue
            for row in json.loads((run / "results.json").read_text())["eval"]:
                if row["aspect"] == 1.0 and row["top1"] is not None:
                    cells.setdefault(f"{row['scale']:g}/{row['extrapolation']}", []).append(row["top1"])
            if (run / "cpu_seconds.json").exists():
                cpu.append(json.loads((run / "cpu_seconds.json").read_text())["cpu_seconds"])
        table[pe] = cells
    return {"top1": table, "cpu_seconds": cpu}


def markdown(collected: dict) -> str:
    header = "| encoding | " + " | ".join(f"{s:g}x" + ("" if k == "none" else f" {k}") for s, k in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 1)]
    for pe, cells in collected["top1"].items():
        texts = []
        for scale, kind in COLUMNS:
            stats = _mean_std(cells.get(f"{scale:g}/{kind}", []))
            texts.append("n/a" if stats is None else f"{stats[0]:.1f} ± {stats[1]:.1f}")
        seeds = len(cells.get("1/none", []))
        lines.append(f"| {pe} (n={seeds}) | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def plot(collected: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    colours = {pe: plt.get_cmap("tab10")(i) for i, pe in enumerate(collected["top1"])}
    for ax, kind in zip(axes, ("none", "pi")):
        for pe, cells in collected["top1"].items():
            points = [(s, _mean_std(cells.get(f"{s:g}/{'none' if s == 1 else kind}", []))) for s in (1.0, 1.5, 2.0)]
            points = [(s, m) for s, m in points if m is not None]
            if len(points) > 1:
                ax.errorbar(
                    [s for s, _ in points],
                    [m[0] for _, m in points],
                    yerr=[m[1] for _, m in points],
                    marker="o",
                    capsize=3,
                    label=pe,
                    color=colours[pe],
                )
        ax.set_title("no extrapolation" if kind == "none" else "position interpolation (pi)")
        ax.set_xlabel("evaluation resolution / training resolution")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("top-1 (%), mean ± std over seeds")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summarize(args) -> None:
    collected = collect(args.out, args.pes, args.seeds)
    table = markdown(collected)
    cpu = collected["cpu_seconds"]
    footer = f"\n\n{len(cpu)} runs, {sum(cpu) / 60:.1f} CPU minutes in total ({sum(cpu) / max(len(cpu), 1):.0f} s each)"
    print(table + footer)
    args.assets.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "results.md").write_text(table + footer + "\n")
    (args.results / "results.json").write_text(json.dumps(collected, indent=1))
    plot(collected, args.assets / "accuracy_vs_resolution.png")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("run", "summarize"))
    parser.add_argument("--out", type=Path, default=Path("runs/vit_bench"))
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "vit" / "world_relation.yaml")
    parser.add_argument("--data-dir", type=Path, default=Path("data/world_relation"))
    parser.add_argument("--train-count", type=int, default=4000)
    parser.add_argument("--val-count", type=int, default=1000)
    parser.add_argument("--pes", nargs="+", default=list(PES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument("--set", action="append", default=[], help="config override for every run")
    parser.add_argument("--assets", type=Path, default=ROOT / "assets" / "vit_bench", help="folder of the plot")
    parser.add_argument(
        "--results",
        type=Path,
        default=ROOT / "assets" / "results" / "vit_bench",
        help="folder of results.md and results.json",
    )
    args = parser.parse_args(argv)
    run_all(args) if args.action == "run" else summarize(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
