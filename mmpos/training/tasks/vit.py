"""Fine-tune a timm ViT with an mmpos positional encoding (accelerate: one CPU, one GPU, ``accelerate launch``).

    from mmpos.training import load_config, train_vit
    results = train_vit(load_config("configs/vit/world_relation.yaml"), "runs/rope_mixed", )

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
from dataclasses import dataclass
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
from ..scaffold.folders import check_run_folder, latest_checkpoint
from ..scaffold.interrupt import StopOnSignal
from ..scaffold.loop import backward
from ..scaffold.processes import check_shared_out, make_accelerator
from ..vit_config import check_config, check_resume_config, eval_sizes
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

    def save(self, accelerator, run_dir: Path, config: dict) -> Path:
        data = {**self.progress.state_dict(), "accelerator_step": accelerator.step}
        model = plain_model(accelerator, self.model)
        run = RunState(model, self.optimizer, self.scheduler, self.ema, self.progress.step, data)
        return save_checkpoint(accelerator, run_dir, run, config)

    def load(self, accelerator, folder) -> None:
        """Restore from ``folder`` (any layout :func:`~..scaffold.checkpoint.load_checkpoint` reads)."""
        run = RunState(plain_model(accelerator, self.model), self.optimizer, self.scheduler, self.ema)
        load_checkpoint(accelerator, folder, run)
        data = dict(run.data)
        accelerator.step = int(data.pop("accelerator_step"))
        self.progress.load_state_dict(data)


def _make_accelerator(config: dict, run_dir: Path):
    try:
        import tensorboard  # noqa: F401

        log_with = ["tensorboard"]
    except ImportError:
        log_with = None
    return make_accelerator(
        config["mixed_precision"],
        "the ViT trainer",
        gradient_accumulation_steps=config["grad_accum"],
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


def _criterion(config: dict, mixup):
    if mixup is not None:
        return SoftTargetCrossEntropy()
    if config["smoothing"]:
        return LabelSmoothingCrossEntropy(config["smoothing"])
    return torch.nn.CrossEntropyLoss()


def _optimizer_and_scheduler(config: dict, model):
    extra = {"momentum": config["momentum"]} if config["opt"] in ("sgd", "momentum", "nesterov") else {}
    optimizer = create_optimizer_v2(
        model,
        opt=config["opt"],
        lr=config["lr"],
        weight_decay=config["weight_decay"],
        layer_decay=config["layer_decay"],
        **extra,
    )
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched=config["sched"],
        num_epochs=config["steps"],
        warmup_epochs=config["warmup_steps"],
        warmup_lr=config["warmup_lr"],
        min_lr=config["min_lr"],
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
    config: dict,
    output_dir,
    resume: bool = False,
    overwrite: bool = False,
    eval_only: bool = False,
    checkpoint=None,
    results_name: str | None = "results.json",
) -> dict:
    """Train (or with ``eval_only`` just evaluate ``checkpoint``) and return the results.

    The results go to ``output_dir/results_name`` with a PNG beside it (``eval_results.json`` by default with
    ``eval_only``; ``results_name=None``: nothing written)."""
    if eval_only and results_name == "results.json":
        results_name = "eval_results.json"
    check_config(config)
    run_dir = Path(output_dir)
    if not eval_only:
        check_run_folder(run_dir, resume, overwrite)
    if resume and not eval_only:
        check_resume_config(config, run_dir / "config.yaml")  # the run keeps the config it was started with
    accelerator = _make_accelerator(config, run_dir)
    set_seed(config["seed"])
    probe = build_vit({**config, "pretrained": False}, 1000)
    check_image_sizes(config, probe, eval_sizes(config))
    train_set = make_dataset(config, config["train_split"], train_transform(config, probe), is_training=True)
    num_classes = config["num_classes"] or num_classes_of(train_set)
    check_num_classes(config, train_set)
    train_classes = classes_of(train_set)
    if not eval_only:
        check_one_batch(config, train_set, accelerator.num_processes)
        match_classes(make_dataset(config, config["val_split"]), train_classes, config["val_split"])  # refused now
        prepare_run_folder(run_dir, resume, overwrite, accelerator)
        if accelerator.is_main_process and not resume:  # a resumed run keeps its config.yaml
            (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=True))
    set_seed(config["seed"])
    model = build_vit({**config, "pretrained": False} if eval_only else config, num_classes)  # weights: checkpoint
    optimizer, scheduler = _optimizer_and_scheduler(config, model)
    if config["compile"]:
        model = torch.compile(model)
    seeded = SeededSamples(train_set, config["seed"])
    model, optimizer, loader = accelerator.prepare(model, optimizer, train_loader(seeded, config))
    ema = ModelEmaV3(plain_model(accelerator, model), decay=config["ema_decay"]) if config["ema_decay"] else None
    progress = Progress()
    state = TrainingState(model, optimizer, scheduler, progress, ema)  # checkpointed without pickle
    start = checkpoint or (latest_checkpoint(run_dir) if resume else None)
    if start is not None:
        state.load(accelerator, start)
        accelerator.print(f"resumed from {start} at update {progress.step}")
    if not eval_only:
        if accelerator.trackers == [] and accelerator.log_with:
            accelerator.init_trackers("vit", config={k: str(v) for k, v in config.items()})
        _train_loop(config, run_dir, accelerator, state, loader, seeded, num_classes)
    evaluated = ema.module if ema is not None else model
    rows = evaluate_resolutions(
        config,
        evaluated,
        accelerator,
        eval_sizes(config),
        config["eval_aspects"],
        config["eval_extrapolation"],
        num_classes,
        train_classes=train_classes,
    )
    results = {
        "model": config["model"],
        "pe": config["pe"],
        "steps": progress.step,
        "parameters": count_parameters(plain_model(accelerator, model)),
        "eval": rows,
    }
    if accelerator.is_main_process and results_name:
        save_results(results, run_dir / results_name)
        plot_results({config["pe"] or config["model"]: rows}, run_dir / results_name.replace(".json", ".png"))
    accelerator.end_training()
    return results


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
        total=config["steps"],
        initial=progress.step,
        disable=not accelerator.is_main_process,
        desc="train",
        dynamic_ncols=True,
    )
    started, images_seen = time.time(), 0
    with bar, StopOnSignal() as stop:  # the bar closed before an error prints; SIGINT / SIGTERM: checkpoint, exit 130
        while progress.step < config["steps"]:
            loader.set_epoch(progress.epoch)
            seeded.set_epoch(progress.epoch)
            epoch_loader = accelerator.skip_first_batches(loader, progress.batch) if progress.batch else loader
            for images, targets in epoch_loader:
                model.train()
                set_seed(config["seed"] * SEED_STRIDE + progress.micro, device_specific=True)
                if mixup is not None:
                    images, targets = mixup(images, targets)
                with accelerator.accumulate(model):
                    with accelerator.autocast():
                        loss = criterion(model(images), targets)
                    backward(accelerator, loss, progress.step, lambda: latest_checkpoint(run_dir))
                    grad_norm = None
                    if accelerator.sync_gradients and config["clip_grad"]:
                        grad_norm = accelerator.clip_grad_norm_(model.parameters(), config["clip_grad"])
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
                if progress.step % config["log_every"] == 0 or progress.step == config["steps"]:
                    _log(accelerator, log, bar, progress, loss, optimizer, grad_norm, images_seen, started)
                saved = None
                if progress.step % config["checkpoint_every"] == 0 or progress.step == config["steps"]:
                    saved = state.save(accelerator, run_dir, config)
                if progress.step >= config["steps"]:
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
