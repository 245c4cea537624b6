"""The world's image models as a training task: the VAE (reconstruction + KL), then the t2i / fill / kontext
transformers (rectified flow). :func:`train` runs one (:class:`WorldTrainer`: models, data, optimiser, EMA,
progress, resume, export) until its step or time budget or SIGTERM; the pieces are :mod:`..world` (examples,
objectives, the trained unit, the export, the config).

On the training scaffold's checkpoints (``train-<task>/checkpoint-<step>/``), backward pass and NaN stop
(:func:`..scaffold.loop.backward`) and on N processes (:mod:`..scaffold.processes`: every process draws the global
batch's indices and noise from the one generator and keeps its slice; one process draws what it always drew). The
VAE's posterior noise is each process's own generator's (on N processes seeded per process), so a VAE run equals
one process at N times the batch in distribution, not to float tolerance."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError

from ..._atomic import recover_folder
from ..._safe_state import UnsafeStateError, load_torch_file, read_json, read_tensors, set_rng_state, write_json
from ...models.ema import EMA
from ...models.world.architectures import build_world_transformer
from ...models.world.image import build_text_encoder, build_vae, vae_scale_factor
from ...models.world.latents import to_unit
from ..scaffold.checkpoint import RunState, load_checkpoint, save_checkpoint, saved_config
from ..scaffold.config import check_resume_config, resolved
from ..scaffold.folders import UnreadableCheckpointError, latest_checkpoint
from ..scaffold.loop import backward
from ..scaffold.processes import (
    any_process,
    average_gradients,
    check_shared,
    generator_state,
    local,
    make_accelerator,
    mean_loss,
    set_generator_state,
)
from ..task_configs import WorldImageConfig
from ..world.checkpoints import (
    DenoiserWithText,
    check_same_config,
    load_trained_denoiser,
    load_trained_vae,
    previous_training,
)
from ..world.export import export_model
from ..world.losses import denoiser_loss, vae_loss, vae_validation_l1, validation_loss
from ..world.training_data import TrainingData


def _lr_lambda(warmup: int):
    return lambda step: min(1.0, (step + 1) / max(warmup, 1))


def _vae_scaling(vae, images_uint8: torch.Tensor) -> tuple[float, float]:
    """``(shift, scale)`` that make the latents zero-mean, unit-variance on this data."""
    with torch.no_grad():
        z = vae.encode(to_unit(images_uint8[:1024].to(vae.device)).to(vae.dtype)).latent_dist.mode().float()
    return z.mean().item(), 1.0 / z.std().item()


class WorldTrainer:
    """One task's model, data, optimiser (prepared by accelerate), EMA and progress."""

    def __init__(self, config: WorldImageConfig, out_dir, progress: bool = True):
        self.config = config
        self.task = task = config.task
        self.out_dir, self.progress = Path(out_dir), progress
        self.run_dir = self.out_dir / f"train-{task}"  # checkpoint-<step>/ (the training scaffold's layout)
        self.state_dir = self.out_dir / f"train_state-{task}"  # the layout before it (read on --resume)
        self.accelerator = make_accelerator(config.mixed_precision, "the world trainers", cpu=config.device == "cpu")
        self.device = self.accelerator.device
        check_shared(self.accelerator, self.out_dir)
        torch.manual_seed(config.seed)
        started = time.time()
        self.vae, model = self._build_models()
        self.data = TrainingData(config, self.device, self.vae, getattr(model, "text_encoder", None))
        self.data_seconds = time.time() - started
        if self.accelerator.num_processes > 1:  # each process its own VAE posterior noise (one process: unchanged)
            torch.manual_seed(config.seed * 1_000_003 + self.accelerator.process_index)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        # not prepared: accelerate's scheduler steps once per process and update; the model is not DDP-wrapped (the
        # losses call its parts): the gradients are averaged over the processes after the backward pass
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config.warmup_steps))
        self.model = self.raw = model.to(self.device)
        self.optimizer = self.accelerator.prepare(optimizer)
        self.ema = EMA(self.raw, config.ema_decay, warmup=True)
        self.step, self.trained_seconds, self.history = 0, 0.0, []
        self.initial_validation = None
        self.generator = None  # the batch and noise draws; seeded at seed + step when a run starts (or restored)

    def _build_models(self):
        config = self.config
        if self.task == "vae":
            if config.init_from is not None:
                raise ValueError(
                    "init_from continues t2i / fill / kontext models; the VAE trains from scratch (the "
                    "transformers' latents depend on it)"
                )
            return None, build_vae(**config.vae)
        vae = load_trained_vae(config.vae_path, self.device)
        if config.init_from is not None:
            model = load_trained_denoiser(
                config.init_from, self.task, self.device, vae.config.latent_channels, vae_scale_factor(vae)
            )
            for part in ("transformer", "text_encoder"):  # the config's architecture must be the checkpoint's
                check_same_config(f"{part} option", getattr(config, part), getattr(model, part).config)
            return vae, model
        transformer = build_world_transformer(
            config.architecture,
            self.task,
            vae.config.latent_channels,
            vae_scale_factor(vae),
            **config.transformer,
        )
        return vae, DenoiserWithText(transformer, build_text_encoder(transformer, **config.text_encoder))

    def validation(self, model) -> float:
        return vae_validation_l1(model, self.data) if self.task == "vae" else validation_loss(model, self.data)

    def loss(self, index: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """This process's loss; ``index``: the global batch (``batch_size`` x processes), whose noise is drawn in
        full on every process (one process at N times the batch draws the same) and sliced
        (:func:`~..scaffold.processes.local`)."""
        config, data, device = self.config, self.data, self.device
        mine = local(self.accelerator, config.batch_size)
        if self.task == "vae":
            return vae_loss(self.raw, to_unit(data.images[index[mine]]), config.kl_weight)[0]
        sigmas = torch.sigmoid(torch.randn(len(index), device=device, generator=generator))
        noise = torch.randn(data.latents[index].shape, device=device, generator=generator)
        tokens = data.tokens_for(index, generator, config.caption_dropout, config.style_dropout)
        return denoiser_loss(self.raw, data, index[mine], sigmas[mine], noise[mine], tokens[mine])

    def run(self, signals: dict) -> None:
        """Optimiser steps until max_steps, the time budget or ``signals["stop"]`` (on any process)."""
        from tqdm.auto import tqdm

        config, accelerator = self.config, self.accelerator
        if self.initial_validation is None:  # a resumed run keeps the first start's value
            self.initial_validation = self.validation(self.raw)
        if self.generator is None:
            self.generator = torch.Generator(device=self.device).manual_seed(config.seed + self.step)
        global_batch = config.batch_size * accelerator.num_processes
        bar = tqdm(
            total=config.max_steps,
            initial=self.step,
            desc=f"train {self.task}",
            disable=not (self.progress and accelerator.is_main_process),
        )
        loop_start = time.time() - self.trained_seconds
        while self.step < config.max_steps and not any_process(
            accelerator, time.time() - loop_start >= config.max_minutes * 60 or signals["stop"]
        ):
            index = torch.randint(0, self.data.num, (global_batch,), device=self.device, generator=self.generator)
            with accelerator.autocast():
                loss = self.loss(index, self.generator)
            backward(accelerator, loss, self.step, self._newest_checkpoint)
            average_gradients(accelerator, self.raw.parameters())
            accelerator.clip_grad_norm_(self.raw.parameters(), 1.0)
            self.optimizer.step()
            if not accelerator.optimizer_step_was_skipped:
                self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.ema.update(self.raw)
            self.step += 1
            self.trained_seconds = time.time() - loop_start
            if self.step % config.log_every == 0 or self.step == 1:
                self._log(mean_loss(accelerator, loss), bar)
            bar.update(1)
            if self.step % config.checkpoint_every == 0:
                self.save_state()
        bar.close()

    def _log(self, value: float, bar) -> None:
        self.history.append([self.step, round(value, 5)])
        bar.set_postfix(loss=f"{value:.4f}")
        if not self.progress and self.accelerator.is_main_process:
            print(f"[{self.task}] step {self.step} loss {value:.5f}", flush=True)

    def _newest_checkpoint(self) -> Path | None:
        kept = latest_checkpoint(self.run_dir)
        earlier = self.state_dir if (self.state_dir / "progress.json").is_file() else None  # the earlier layout
        return kept or earlier

    def _run_state(self) -> RunState:
        return RunState(self.raw, self.optimizer, self.scheduler, self.ema, self.step, {})

    def save_state(self) -> None:
        """``train-<task>/checkpoint-<step>/`` (:mod:`mmpos.training.scaffold.checkpoint`: written by the main
        process, renamed into place once complete; every process's generators): model, optimiser, scheduler, EMA,
        the draws' generator and ``world_progress.json`` (time, loss history, first validation). Collective."""
        state = self._run_state()
        state.data = {
            "generator": None if self.generator is None else generator_state(self.generator),
            "global_batch": self.config.batch_size * self.accelerator.num_processes,
        }
        progress = {
            "step": self.step,
            "trained_seconds": self.trained_seconds,
            "history": self.history,
            "initial_validation": self.initial_validation,
        }
        save_checkpoint(
            self.accelerator,
            self.run_dir,
            state,
            run_keys(self.config),
            keep=2,
            extras=lambda folder: write_json(folder / "world_progress.json", progress),
        )

    def load_state(self) -> None:
        """Resume from the newest ``train-<task>/checkpoint-<step>/``, else from a ``train_state-<task>/`` of the
        earlier layout (read without unpickling anything but tensors; its run re-seeds the draws at seed + step, as
        it did)."""
        folder = latest_checkpoint(self.run_dir)
        if folder is None:
            return self._load_earlier_layout()
        check_resume_config(self.config, saved_config(folder), folder / "config.yaml")  # before any weight is read
        state = self._run_state()
        load_checkpoint(self.accelerator, folder, state)
        if state.data.get("global_batch") not in (None, self.config.batch_size * self.accelerator.num_processes):
            raise ValueError(
                f"--resume: {folder} was written at a global batch of {state.data['global_batch']} "
                "(batch_size x processes); keep it to continue the run's draws"
            )
        saved = _read_part(folder / "world_progress.json", lambda: read_json(folder / "world_progress.json"))
        self._restore_progress(saved)
        if state.data.get("generator") is not None:
            self.generator = torch.Generator(device=self.device)
            set_generator_state(self.generator, state.data["generator"])

    def _restore_progress(self, saved: dict) -> None:
        self.step, self.trained_seconds, self.history = saved["step"], saved["trained_seconds"], saved["history"]
        self.initial_validation = saved.get("initial_validation")

    def _load_earlier_layout(self) -> None:
        state_dir = recover_folder(self.state_dir)
        progress_file = state_dir / "progress.json"
        if not progress_file.is_file():
            raise FileNotFoundError(f"nothing to resume: no {self.run_dir}/checkpoint-<step> and no {progress_file}")
        saved = _read_part(progress_file, lambda: json.loads(progress_file.read_text()))
        weights = _read_part(state_dir / "model.safetensors", lambda: read_tensors(state_dir / "model.safetensors"))
        _read_part(
            state_dir, lambda: self.raw.load_state_dict({k.removeprefix("module."): v for k, v in weights.items()})
        )
        self.optimizer.load_state_dict(_read_part(state_dir, lambda: load_torch_file(state_dir / "optimizer.bin")))
        self.scheduler.load_state_dict(_read_part(state_dir, lambda: load_torch_file(state_dir / "scheduler.bin")))
        rng = state_dir / f"random_states_{self.accelerator.process_index}.pkl"
        if rng.is_file():
            set_rng_state(_read_part(rng, lambda: load_torch_file(rng, allow_numpy=True)))
        ema_file = state_dir / "ema.pt"
        self.ema.load_state_dict(_read_part(ema_file, lambda: _ema_state(load_torch_file(ema_file, self.device))))
        self._restore_progress(saved)

    def finish(self) -> dict:
        """EMA weights -> final model; model card; export under ``out_dir/world-<task>/``."""
        config, task, data = self.config, self.task, self.data
        final = self.ema.copy_to(copy.deepcopy(self.raw)).eval()
        data_task = "scenes" if task in ("vae", "t2i") else task
        card = {
            "task": task,
            "steps": self.step,
            "train_minutes": round(self.trained_seconds / 60, 2),
            "data_seconds": round(self.data_seconds, 1),
            "device": str(self.device),
            "mixed_precision": config.mixed_precision,
            "batch_size": config.batch_size,
            "data": {
                "num_examples": data.num,
                "seed": config.data_seed,
                "image_size": config.image_size,
                "generator": f"mmpos.world.data.build_arrays({data_task!r})",
                **_data_layout(task),
            },
            "loss_history": self.history,
            "final_train_loss": self.history[-1][1] if self.history else None,
            "parameters": sum(p.numel() for p in final.parameters()),
        }
        if config.init_from is not None:
            before = card["init_from"] = previous_training(config.init_from, task)
            card["total_steps"] = self.step + before["total_steps"]
            card["total_train_minutes"] = round(card["train_minutes"] + before["total_train_minutes"], 2)
        start = round(self.initial_validation, 5)
        if task == "vae":
            shift, scale = _vae_scaling(final, data.images)
            final.register_to_config(shift_factor=shift, scaling_factor=scale)
            card.update(
                latent_shift=shift, latent_scale=scale, val_l1_start=start, val_l1=round(self.validation(final), 5)
            )
        else:
            card.update(val_loss_start=start, val_loss=round(self.validation(final), 5))
        if self.accelerator.is_main_process:
            export_model(task, final, self.vae, run_keys(config), card, self.out_dir)
        self.accelerator.wait_for_everyone()
        return card


def run_keys(config: WorldImageConfig) -> dict:
    """The keys that define a run, as plain JSON values (a checkpoint's ``config.yaml``, the export's
    ``train_config.yaml``): the config without where it writes and how it prints."""
    return {k: v for k, v in json.loads(json.dumps(resolved(config))).items() if k not in ("out", "quiet")}


def _data_layout(task: str) -> dict:
    """What the card records of the examples' layout: fill trains on transplant canvases."""
    if task != "fill":
        return {}
    from ...world.canvas import INSERTION_FRACTION, WORLD_TRANSPLANT

    return {"canvas": {"transplant": WORLD_TRANSPLANT, "insertion_fraction": INSERTION_FRACTION}}


def _read_part(path: Path, read):
    """``read()``, with an unreadable (truncated, foreign) file named in the error."""
    try:
        return read()
    except (
        OSError,
        EOFError,
        RuntimeError,
        ValueError,
        KeyError,
        pickle.UnpicklingError,
        SafetensorError,
        UnsafeStateError,
    ) as error:
        raise UnreadableCheckpointError(
            f"{path}: cannot be read as part of a train state ({type(error).__name__}: "
            f"{error}); delete the train state to start over"
        ) from None


def _ema_state(saved: dict) -> dict:
    """An :class:`EMA` state; train states written before the shared EMA hold ``shadow``/``updates``/``decay``."""
    if "shadow" not in saved:
        return saved
    return {
        **{f"model.{key}": value for key, value in saved["shadow"].items()},
        "num_updates": torch.tensor(saved["updates"]),
    }


@contextmanager
def stop_on_sigterm():
    """Yields a dict whose ``"stop"`` turns True on SIGTERM (so ``timeout`` ends training, not the export)."""
    flag = {"stop": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: flag.update(stop=True))
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)


def train(
    config: WorldImageConfig, out_dir, resume: bool = False, progress: bool = True, overwrite: bool = False
) -> dict:
    """Train ``config.task``; write the model (EMA weights), model card and samples under ``out_dir``.

    Runs on N processes (torchrun / ``accelerate launch``): ``batch_size`` is per process; every process draws the
    global batch and trains on its slice, only the main process writes (checkpoints ``out_dir/train-<task>/
    checkpoint-<step>/``, the export). ``resume`` continues the newest checkpoint (or an earlier layout's
    ``train_state-<task>/``); ``overwrite`` deletes the earlier run's checkpoints first.

    Stops at ``max_steps``, after ``max_minutes`` of training or on SIGTERM; a NaN or inf loss raises
    :class:`~mmpos._validation.NonFiniteLossError`, keeping the last checkpoint. An ``out_dir`` that is a file or
    cannot be written is refused before training. Returns the model card, whose
    ``val_loss_start`` is the validation loss of the starting weights (random, or ``init_from``'s on this run's
    validation data: then equal to the previous card's ``val_loss`` when the data are the same), measured before the
    first step and kept by ``resume``; ``val_loss`` is the final EMA weights'. Validation uses fixed examples, sigmas
    and noise (:func:`~mmpos.training.world.losses.validation_loss`), so values of different runs compare.
    """
    check_writable_folder(out_dir)
    trainer = WorldTrainer(config, out_dir, progress)
    if overwrite and not resume:  # the earlier run's checkpoints go; its export is replaced once the new one is whole
        trainer.accelerator.wait_for_everyone()
        if trainer.accelerator.is_main_process:
            for folder in (trainer.run_dir, trainer.state_dir):
                shutil.rmtree(folder, ignore_errors=True)
        trainer.accelerator.wait_for_everyone()
    if resume:
        trainer.load_state()
    with stop_on_sigterm() as signals:
        trainer.run(signals)
    trainer.save_state()
    return trainer.finish()


def check_writable_folder(out_dir) -> Path:
    """``out_dir``, made if missing; a file or a folder that cannot be written raises, naming it."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file; expected a folder")
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK | os.X_OK):
        raise PermissionError(f"--out {out} is not writable")
    return out


def check_earlier_run(out_dir, task: str, resume: bool, overwrite: bool) -> None:
    """A fresh run over an earlier run of ``task`` in ``out_dir`` (its train state or export) is refused unless
    ``resume`` (continue it) or ``overwrite`` (replace it, each part once the new one is complete)."""
    if resume and overwrite:
        raise ValueError("--resume continues the earlier run and --overwrite replaces it: pass one")
    out = Path(out_dir)
    earlier = [p for p in (out / f"train-{task}", out / f"train_state-{task}", out / f"world-{task}") if p.exists()]
    if earlier and not (resume or overwrite):
        raise FileExistsError(
            f"--out {out} holds an earlier {task} run ({', '.join(p.name for p in earlier)}); "
            "pass --resume to continue it or --overwrite to replace it"
        )


def run_command(config: WorldImageConfig, resume: bool, overwrite: bool) -> int:
    """``mmpos train world_image``: :func:`train` into ``config.out`` (an earlier run of the task there is refused
    unless ``resume`` or ``overwrite``); the main process prints the card's summary as one JSON line."""
    check_writable_folder(config.out)
    check_earlier_run(config.out, config.task, resume, overwrite)
    card = train(config, config.out, resume=resume, progress=not config.quiet, overwrite=overwrite)
    if int(os.environ.get("RANK", "0")) == 0:  # on N processes the main one reports
        keys = ("task", "steps", "train_minutes", "final_train_loss", "val_loss_start", "val_loss", "val_l1_start")
        print(json.dumps({k: card.get(k) for k in (*keys, "val_l1", "parameters")}))
    return 0
