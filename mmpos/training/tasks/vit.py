"""Fine-tune a timm ViT with an mmpos positional encoding (accelerate: one CPU, one GPU, ``accelerate launch``).

    from mmpos.training import ViTConfig, train_vit
    results = train_vit(ViTConfig.from_file("configs/vit/world_relation.yaml", pe="rope_mixed", out="runs/rm"))

A run folder holds ``config.yaml``, ``log.csv``, ``checkpoint-<step>/`` (the training scaffold's layout: safetensors
and JSON, no pickle, see :mod:`..scaffold.checkpoint`, which also resumes the layouts before it; written to a
temporary folder and renamed into place; the newest two kept), ``model.safetensors`` and ``results.json``. Ctrl-C /
SIGTERM writes a checkpoint at the next update, prints the resume command and exits with code 130
(:mod:`..scaffold.interrupt`). The update's backward pass and NaN stop are the scaffold's (:func:`..scaffold.loop.
backward`); the loop is the ViT's own (timm's optimizers and per-update schedules, gradient accumulation, mixup).
Randomness is a function of (seed, update, process) for dropout/mixup and of (seed, epoch, sample) for
augmentation, so ``resume`` continues with the losses an uninterrupted run would have had.
"""

from __future__ import annotations

import csv
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml
from accelerate import DataLoaderConfiguration
from accelerate.utils import set_seed
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from tqdm.auto import tqdm

from ..._atomic import written_atomically
from ..scaffold.checkpoint import RunState, load_checkpoint, save_checkpoint
from ..scaffold.config import ConfigError, check_resume_config, resolved
from ..scaffold.folders import check_run_folder, latest_checkpoint
from ..scaffold.interrupt import StopOnSignal
from ..scaffold.loop import backward
from ..scaffold.processes import check_shared_out, make_accelerator
from ..task_configs import ViTConfig
from ..vit_data import (
    SeededSamples,
    check_num_classes,
    check_one_batch,
    classes_of,
    make_dataset,
    make_mixup,
    match_classes,
    num_classes_of,
    train_loader,
    train_transform,
)
from ..vit_eval import evaluate_resolutions, plot_results, save_results
from ..vit_model import build_vit, check_image_sizes, count_parameters, plain_model

SEED_STRIDE = 1_000_003


class Progress:
    """Where training stands (checkpointed as JSON in ``trainer_state.json``)."""

    def __init__(self):
        self.step, self.epoch, self.batch, self.micro = 0, 0, 0, 0

    def state_dict(self):
        return dict(vars(self))

    def load_state_dict(self, state):
        vars(self).update(state)


@dataclass
class TrainingState:
    """What a ViT checkpoint holds (the scaffold's :class:`~..scaffold.checkpoint.RunState`, with the trainer's
    progress and accelerate's step as its data): the prepared model (any wrapper) and optimizer, the timm
    scheduler, the progress and the EMA model (or None)."""

    model: torch.nn.Module
    optimizer: object
    scheduler: object
    progress: Progress
    ema: torch.nn.Module | None = None

    def save(self, accelerator, run_dir: Path, config: ViTConfig) -> Path:
        data = {**self.progress.state_dict(), "accelerator_step": accelerator.step}
        model = plain_model(accelerator, self.model)
        run = RunState(model, self.optimizer, self.scheduler, self.ema, self.progress.step, data)
        return save_checkpoint(accelerator, run_dir, run, resolved(config))

    def load(self, accelerator, folder) -> None:
        """Restore from ``folder`` (any layout :func:`~..scaffold.checkpoint.load_checkpoint` reads)."""
        run = RunState(plain_model(accelerator, self.model), self.optimizer, self.scheduler, self.ema)
        load_checkpoint(accelerator, folder, run)
        data = dict(run.data)
        accelerator.step = int(data.pop("accelerator_step"))
        self.progress.load_state_dict(data)


def _make_accelerator(config: ViTConfig, run_dir: Path):
    try:
        import tensorboard  # noqa: F401

        log_with = ["tensorboard"]
    except ImportError:
        log_with = None
    return make_accelerator(
        config.mixed_precision,
        "the ViT trainer",
        gradient_accumulation_steps=config.grad_accum,
        log_with=log_with,
        project_dir=str(run_dir),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )


def prepare_run_folder(run_dir: Path, resume: bool, overwrite: bool, accelerator) -> None:
    """Refuse to write into an existing run without ``resume`` / ``overwrite``; ``overwrite`` empties it. Every
    process must see the folder (:func:`~..scaffold.processes.check_shared_out`)."""
    exists = check_run_folder(run_dir, resume, overwrite)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if exists and overwrite:
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    check_shared_out(accelerator, run_dir)


def _criterion(config: ViTConfig, mixup):
    if mixup is not None:
        return SoftTargetCrossEntropy()
    if config.smoothing:
        return LabelSmoothingCrossEntropy(config.smoothing)
    return torch.nn.CrossEntropyLoss()


def _optimizer_and_scheduler(config: ViTConfig, model):
    extra = {"momentum": config.momentum} if config.opt in ("sgd", "momentum", "nesterov") else {}
    optimizer = create_optimizer_v2(
        model,
        opt=config.opt,
        lr=config.lr,
        weight_decay=config.weight_decay,
        layer_decay=config.layer_decay,
        **extra,
    )
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched=config.sched,
        num_epochs=config.steps,
        warmup_epochs=config.warmup_steps,
        warmup_lr=config.warmup_lr,
        min_lr=config.min_lr,
        step_on_epochs=False,
        updates_per_epoch=1,
    )
    return optimizer, scheduler


class CsvLog:
    """``log.csv`` on the main process; appended to on resume, after dropping the rows past the checkpoint the
    run resumes from (``resumed_step``: they were logged by the interrupted run and are logged again).
    ``seconds_before``: the training seconds of the last row kept, from which a resumed run's ``seconds`` go on."""

    FIELDS = ("step", "epoch", "loss", "lr", "grad_norm", "images_per_s", "seconds")

    def __init__(self, path: Path, enabled: bool, resumed_step: int = 0):
        self.path, self.enabled, self.seconds_before = path, enabled, 0.0
        if enabled and not path.exists():
            with open(path, "w", newline="") as f:
                csv.writer(f).writerow(self.FIELDS)
        elif enabled:
            self._drop_rows_after(resumed_step)
            self.seconds_before = self._last_seconds()

    def _last_seconds(self) -> float:
        with open(self.path, newline="") as f:
            rows = list(csv.DictReader(f))
        try:
            return float(rows[-1]["seconds"]) if rows else 0.0
        except (KeyError, TypeError, ValueError):  # a log without the column: start the count again
            return 0.0

    def _drop_rows_after(self, step: int) -> None:
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        kept = rows[:1] + [row for row in rows[1:] if row and row[0].isdigit() and int(row[0]) <= step]
        if len(kept) == len(rows):
            return
        with written_atomically(self.path) as temporary:
            with open(temporary, "w", newline="") as f:
                csv.writer(f).writerows(kept)

    def write(self, row: dict) -> None:
        if self.enabled:
            with open(self.path, "a", newline="") as f:
                csv.writer(f).writerow([row.get(k, "") for k in self.FIELDS])


def train_vit(
    config: ViTConfig,
    resume: bool = False,
    overwrite: bool = False,
    eval_only: bool = False,
    checkpoint=None,
    results_name: str | None = "results.json",
) -> dict:
    """Train ``config`` into its run folder ``config.out`` (or with ``eval_only`` just evaluate ``checkpoint``) and
    return the results.

    The results go to ``config.out/results_name`` with a PNG beside it (``eval_results.json`` by default with
    ``eval_only``; ``results_name=None``: nothing written)."""
    if eval_only and results_name == "results.json":
        results_name = "eval_results.json"
    check_names(config)
    run_dir = Path(config.out)
    if not eval_only:
        check_run_folder(run_dir, resume, overwrite)
    if resume and not eval_only:
        check_same_run(config, run_dir / "config.yaml")  # the run keeps the config it was started with
    accelerator = _make_accelerator(config, run_dir)
    set_seed(config.seed)
    probe = build_vit(replace(config, pretrained=False), 1000)
    check_image_sizes(config, probe, config.eval_resolutions())
    train_set = make_dataset(config, config.train_split, train_transform(config, probe), is_training=True)
    num_classes = config.num_classes or num_classes_of(train_set)
    check_num_classes(config, train_set)
    train_classes = classes_of(train_set)
    if not eval_only:
        check_one_batch(config, train_set, accelerator.num_processes)
        match_classes(make_dataset(config, config.val_split), train_classes, config.val_split)  # refused now
        prepare_run_folder(run_dir, resume, overwrite, accelerator)
        if accelerator.is_main_process and not resume:  # a resumed run keeps its config.yaml
            (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved(config), sort_keys=True))
    set_seed(config.seed)
    model = build_vit(replace(config, pretrained=False) if eval_only else config, num_classes)  # weights: checkpoint
    optimizer, scheduler = _optimizer_and_scheduler(config, model)
    if config.compile:
        model = torch.compile(model)
    seeded = SeededSamples(train_set, config.seed)
    model, optimizer, loader = accelerator.prepare(model, optimizer, train_loader(seeded, config))
    ema = ModelEmaV3(plain_model(accelerator, model), decay=config.ema_decay) if config.ema_decay else None
    progress = Progress()
    state = TrainingState(model, optimizer, scheduler, progress, ema)  # checkpointed without pickle
    start = checkpoint or (latest_checkpoint(run_dir) if resume else None)
    if start is not None:
        state.load(accelerator, start)
        accelerator.print(f"resumed from {start} at update {progress.step}")
    if not eval_only:
        if accelerator.trackers == [] and accelerator.log_with:
            accelerator.init_trackers("vit", config={k: str(v) for k, v in resolved(config).items()})
        _train_loop(config, run_dir, accelerator, state, loader, seeded, num_classes)
    evaluated = ema.module if ema is not None else model
    rows = evaluate_resolutions(
        config,
        evaluated,
        accelerator,
        config.eval_resolutions(),
        config.eval_aspects,
        config.eval_extrapolation,
        num_classes,
        train_classes=train_classes,
    )
    results = {
        "model": config.model,
        "pe": config.pe,
        "steps": progress.step,
        "parameters": count_parameters(plain_model(accelerator, model)),
        "eval": rows,
    }
    if accelerator.is_main_process and results_name:
        save_results(results, run_dir / results_name)
        plot_results({config.pe or config.model: rows}, run_dir / results_name.replace(".json", ".png"))
    accelerator.wait_for_everyone()  # every process past its last collective and rank 0's writes before any destroys
    accelerator.end_training()
    return results


def check_names(config: ViTConfig) -> None:
    """The names of ``config`` that timm and mmpos know (the model, the optimizer, the encoding and its options),
    or a :class:`ConfigError` naming the key, before the run folder is made."""
    from mmpos import list_pes

    if config.pe is not None and config.pe not in list_pes():
        raise ConfigError(f"pe: expected one of mmpos.list_pes() {list_pes()}, got {config.pe!r}")
    check_pe_options(config)
    check_model_name(config.model)
    check_optimizer_name(config.opt)


CONVERT_OPTIONS = ("share_pe", "grid_mode", "grid_scale", "grid_indexing")  # mmpos.integrations.timm.convert's own


def check_pe_options(config: ViTConfig) -> None:
    """Every key of ``pe_options`` is an option of the encoding (``pe``; ``ape: resample``: ape_learned) or of the
    timm conversion; a ConfigError names the unknown key and the valid ones (else a TypeError deep in the build)."""
    from mmpos.encodings import pe_options

    pe = "ape_learned" if config.ape == "resample" and config.pe is None else config.pe
    if pe is None or not config.pe_options or config.model.startswith("open_clip:"):
        return
    supplied = ("head_dim", "num_heads", "num_prefix_tokens", "num_axes", "embed_dim", "grid_size")  # by the model
    valid = sorted(set(pe_options(pe)) - set(supplied) | set(CONVERT_OPTIONS))
    unknown = sorted(set(config.pe_options) - set(valid))
    if unknown:
        raise ConfigError(f"pe_options: unknown key(s) {unknown} for pe={pe!r}; valid keys: {valid}")


def check_model_name(name: str) -> None:
    """A timm model name or ``SOURCE:NAME`` (``hf-hub:``, ``local-dir:``, ``open_clip:``; resolved when built)."""
    import timm

    if ":" not in name and not timm.is_model(name):
        raise ConfigError(
            f"model: expected a timm model name (timm.list_models()), 'hf-hub:REPO' or 'open_clip:NAME', got {name!r}"
        )


def check_optimizer_name(name: str) -> None:
    from timm.optim import list_optimizers

    known = list_optimizers()
    if name.lower() not in known and name.lower().split("_")[-1] not in known:
        raise ConfigError(
            f"opt: expected a timm optimizer name (timm.optim.list_optimizers(): {', '.join(known[:12])}, ...), "
            f"got {name!r}"
        )


def check_same_run(config: ViTConfig, saved_path: Path) -> None:
    """A resumed run keeps the config it was started with (``saved_path``: its ``config.yaml``): a changed key that
    may not change (:func:`~..scaffold.config.check_resume_config`) is a :class:`ConfigError`."""
    if saved_path.is_file():
        check_resume_config(config, resolved(ViTConfig.from_file(saved_path, out=config.out)), saved_path)


def run_command(config: ViTConfig, resume: bool, overwrite: bool) -> int:
    """``mmpos train vit``: train ``config`` into ``config.out`` and print the evaluation table (rank 0)."""
    from accelerate import PartialState

    results = train_vit(config, resume=resume, overwrite=overwrite)
    if PartialState().is_main_process:  # under torchrun every rank has the results: rank 0 prints them
        print_table(results["eval"])
    return 0


def print_table(rows) -> None:
    """The evaluation rows as lines: ``HxW extrapolation: top-1 (top-5)``."""
    for row in rows:
        top1 = "n/a" if row["top1"] is None else f"{row['top1']:.2f}"
        top5 = (
            "" if row.get("classes", 6) <= 5 else "  top-5 " + ("n/a" if row["top5"] is None else f"{row['top5']:.2f}")
        )
        print(f"  {row['height']}x{row['width']} {row['extrapolation']:>5}: top-1 {top1}{top5}")


def _train_loop(config, run_dir, accelerator, state, loader, seeded, num_classes):
    model, optimizer, scheduler, progress, ema = (
        state.model,
        state.optimizer,
        state.scheduler,
        state.progress,
        state.ema,
    )
    mixup = make_mixup(config, num_classes)
    criterion = _criterion(config, mixup)
    log = CsvLog(run_dir / "log.csv", accelerator.is_main_process, resumed_step=progress.step)
    bar = tqdm(
        total=config.steps,
        initial=progress.step,
        disable=not accelerator.is_main_process,
        desc="train",
        dynamic_ncols=True,
    )
    started, images_seen = time.time(), 0
    with bar, StopOnSignal() as stop:  # the bar closed before an error prints; SIGINT / SIGTERM: checkpoint, exit 130
        while progress.step < config.steps:
            loader.set_epoch(progress.epoch)
            seeded.set_epoch(progress.epoch)
            epoch_loader = accelerator.skip_first_batches(loader, progress.batch) if progress.batch else loader
            for images, targets in epoch_loader:
                model.train()
                set_seed(config.seed * SEED_STRIDE + progress.micro, device_specific=True)
                if mixup is not None:
                    images, targets = mixup(images, targets)
                with accelerator.accumulate(model):
                    with accelerator.autocast():
                        loss = criterion(model(images), targets)
                    backward(accelerator, loss, progress.step, lambda: latest_checkpoint(run_dir))
                    grad_norm = None
                    if accelerator.sync_gradients and config.clip_grad:
                        grad_norm = accelerator.clip_grad_norm_(model.parameters(), config.clip_grad)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                progress.batch += 1
                progress.micro += 1
                images_seen += len(images) * accelerator.num_processes
                if not accelerator.sync_gradients:
                    continue
                progress.step += 1
                scheduler.step_update(progress.step)
                if ema is not None:
                    ema.update(plain_model(accelerator, model), step=progress.step)
                bar.update(1)
                if progress.step % config.log_every == 0 or progress.step == config.steps:
                    _log(accelerator, log, bar, progress, loss, optimizer, grad_norm, images_seen, started)
                saved = None
                if progress.step % config.checkpoint_every == 0 or progress.step == config.steps:
                    saved = state.save(accelerator, run_dir, config)
                if progress.step >= config.steps:
                    break
                if stop.requested(accelerator):
                    bar.close()
                    stop.exit(accelerator, saved or state.save(accelerator, run_dir, config))
            else:
                progress.epoch += 1
                progress.batch = 0
    bar.close()
    accelerator.wait_for_everyone()
    accelerator.save_model(ema.module if ema is not None else plain_model(accelerator, model), str(run_dir))


def _log(accelerator, log, bar, progress, loss, optimizer, grad_norm, images_seen, started):
    loss_value = accelerator.reduce(loss.detach().float(), reduction="mean").item()
    elapsed = time.time() - started
    row = {
        "step": progress.step,
        "epoch": progress.epoch,
        "loss": f"{loss_value:.6f}",
        "lr": f"{optimizer.param_groups[0]['lr']:.3e}",
        "grad_norm": "" if grad_norm is None else f"{float(grad_norm):.4f}",
        "images_per_s": f"{images_seen / max(elapsed, 1e-9):.1f}",
        "seconds": f"{log.seconds_before + elapsed:.1f}",  # training time, continued across --resume
    }
    log.write(row)
    bar.set_postfix(loss=f"{loss_value:.4f}", lr=row["lr"])
    if accelerator.log_with:
        accelerator.log({"loss": loss_value, "lr": optimizer.param_groups[0]["lr"]}, step=progress.step)
