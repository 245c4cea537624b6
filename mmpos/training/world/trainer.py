"""One world model's training run: models, data, optimiser (accelerate), EMA, progress, resume and export."""
from __future__ import annotations

import copy
import json
import pickle
import time
from pathlib import Path

import torch
from safetensors import SafetensorError

from ..._atomic import folder_written_atomically, recover_folder
from ..._validation import check_choice, check_finite_loss
from ...models.ema import EMA
from .checkpoints import (DenoiserWithText, check_same_config, load_trained_denoiser, load_trained_vae,
                          previous_training)
from .export import export_model
from ...models.world.latents import to_unit
from .losses import denoiser_loss, vae_loss, vae_validation_l1, validation_loss
from ...models.world.architectures import build_world_transformer
from ...models.world.image import TASKS, build_text_encoder, build_vae, vae_scale_factor
from .training_data import TrainingData

ALL_TASKS = ("vae",) + TASKS
DEFAULTS = {
    "task": "t2i", "image_size": 64, "num_examples": 20000, "data_seed": 0, "workers": 1,
    "batch_size": 64, "lr": 3e-4, "weight_decay": 0.0, "warmup_steps": 100, "ema_decay": 0.999,
    "max_steps": 100000, "max_minutes": 10.0, "mixed_precision": "no", "seed": 0, "log_every": 50,
    "checkpoint_every": 1000, "caption_dropout": 0.1, "style_dropout": 0.25, "kl_weight": 1e-6,
    "sample_steps": 20, "sample_guidance": 3.0, "num_samples": 8, "vae_path": None, "init_from": None,
    "transformer": {}, "text_encoder": {}, "vae": {}, "architecture": "flux",
}


def _lr_lambda(warmup: int):
    return lambda step: min(1.0, (step + 1) / max(warmup, 1))


def _vae_scaling(vae, images_uint8: torch.Tensor) -> tuple[float, float]:
    """``(shift, scale)`` that make the latents zero-mean, unit-variance on this data."""
    with torch.no_grad():
        z = vae.encode(to_unit(images_uint8[:1024].to(vae.device)).to(vae.dtype)).latent_dist.mode().float()
    return z.mean().item(), 1.0 / z.std().item()


class WorldTrainer:
    """One task's model, data, optimiser (prepared by accelerate), EMA and progress."""

    def __init__(self, config: dict, out_dir, progress: bool = True):
        from accelerate import Accelerator

        self.config = config = {**DEFAULTS, **config}
        self.task = task = config["task"]
        check_choice("task", task, ALL_TASKS)
        self.out_dir, self.progress = Path(out_dir), progress
        self.state_dir = self.out_dir / f"train_state-{task}"
        self.accelerator = Accelerator(mixed_precision=config["mixed_precision"], cpu=config.get("device") == "cpu")
        self.device = self.accelerator.device
        torch.manual_seed(config["seed"])
        started = time.time()
        self.vae, model = self._build_models()
        self.data = TrainingData(config, self.device, self.vae, getattr(model, "text_encoder", None))
        self.data_seconds = time.time() - started
        optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config["warmup_steps"]))
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(model, optimizer, scheduler)
        self.raw = self.accelerator.unwrap_model(self.model)
        self.ema = EMA(self.raw, config["ema_decay"], warmup=True)
        self.step, self.trained_seconds, self.history = 0, 0.0, []
        self.initial_validation = None

    def _build_models(self):
        config = self.config
        if self.task == "vae":
            if config["init_from"] is not None:
                raise ValueError("init_from continues t2i / fill / kontext models; the VAE trains from scratch (the "
                                 "transformers' latents depend on it)")
            return None, build_vae(**config["vae"])
        vae = load_trained_vae(config["vae_path"], self.device)
        if config["init_from"] is not None:
            model = load_trained_denoiser(config["init_from"], self.task, self.device, vae.config.latent_channels,
                                          vae_scale_factor(vae))
            for part in ("transformer", "text_encoder"):  # the config's architecture must be the checkpoint's
                check_same_config(f"{part} option", config[part], getattr(model, part).config)
            return vae, model
        transformer = build_world_transformer(config["architecture"], self.task, vae.config.latent_channels,
                                              vae_scale_factor(vae), **config["transformer"])
        return vae, DenoiserWithText(transformer, build_text_encoder(transformer, **config["text_encoder"]))

    def validation(self, model) -> float:
        return vae_validation_l1(model, self.data) if self.task == "vae" else validation_loss(model, self.data)

    def loss(self, index: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        config, data, device = self.config, self.data, self.device
        if self.task == "vae":
            return vae_loss(self.model, to_unit(data.images[index]), config["kl_weight"])[0]
        sigmas = torch.sigmoid(torch.randn(len(index), device=device, generator=generator))
        noise = torch.randn(data.latents[index].shape, device=device, generator=generator)
        tokens = data.tokens_for(index, generator, config["caption_dropout"], config["style_dropout"])
        model = self.raw if self.accelerator.num_processes == 1 else self.model
        return denoiser_loss(model, data, index, sigmas, noise, tokens)

    def run(self, signals: dict) -> None:
        """Optimiser steps until max_steps, the time budget or ``signals["stop"]``."""
        from tqdm.auto import tqdm

        config, accelerator = self.config, self.accelerator
        if self.initial_validation is None:  # a resumed run keeps the first start's value
            self.initial_validation = self.validation(self.raw)
        generator = torch.Generator(device=self.device).manual_seed(config["seed"] + self.step)
        bar = tqdm(total=config["max_steps"], initial=self.step, desc=f"train {self.task}",
                   disable=not self.progress)
        loop_start = time.time() - self.trained_seconds
        while (self.step < config["max_steps"] and time.time() - loop_start < config["max_minutes"] * 60
               and not signals["stop"]):
            index = torch.randint(0, self.data.num, (config["batch_size"],), device=self.device, generator=generator)
            with accelerator.autocast():
                loss = self.loss(index, generator)
            check_finite_loss(accelerator.gather(loss.detach()[None]), self.step + 1, self._kept)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.ema.update(self.raw)
            self.step += 1
            self.trained_seconds = time.time() - loop_start
            if self.step % config["log_every"] == 0 or self.step == 1:
                self._log(loss.item(), bar)
            bar.update(1)
            if self.step % config["checkpoint_every"] == 0:
                self.save_state()
        bar.close()

    def _log(self, value: float, bar) -> None:
        self.history.append([self.step, round(value, 5)])
        bar.set_postfix(loss=f"{value:.4f}")
        if not self.progress:
            print(f"[{self.task}] step {self.step} loss {value:.5f}", flush=True)

    def _kept(self) -> str:
        if (self.state_dir / "progress.json").is_file():
            return f"The last checkpoint is kept in {self.state_dir} (--resume continues from it)."
        return "No checkpoint was written yet."

    def save_state(self) -> None:
        """Accelerate state (model, optimiser, scheduler, RNG), EMA and progress, for ``load_state``: written to a
        temporary folder renamed into place, so a kill keeps the previous state whole (never parts of two steps)."""
        progress = {"step": self.step, "trained_seconds": self.trained_seconds, "history": self.history,
                    "initial_validation": self.initial_validation}
        with folder_written_atomically(self.state_dir) as folder:
            self.accelerator.save_state(str(folder))
            torch.save(self.ema.state_dict(), folder / "ema.pt")
            (folder / "progress.json").write_text(json.dumps(progress))

    def load_state(self) -> None:
        state_dir = recover_folder(self.state_dir)
        progress_file = state_dir / "progress.json"
        if not progress_file.is_file():
            raise FileNotFoundError(f"nothing to resume: no {progress_file}")
        saved = _read_part(progress_file, lambda: json.loads(progress_file.read_text()))
        _read_part(state_dir, lambda: self.accelerator.load_state(str(state_dir)))
        ema_file = state_dir / "ema.pt"
        self.ema.load_state_dict(_read_part(ema_file, lambda: _ema_state(torch.load(ema_file, weights_only=True,
                                                                                    map_location=self.device))))
        self.step, self.trained_seconds, self.history = saved["step"], saved["trained_seconds"], saved["history"]
        self.initial_validation = saved.get("initial_validation")

    def finish(self) -> dict:
        """EMA weights -> final model; model card; export under ``out_dir/world-<task>/``."""
        config, task, data = self.config, self.task, self.data
        final = self.ema.copy_to(copy.deepcopy(self.raw)).eval()
        data_task = "scenes" if task in ("vae", "t2i") else task
        card = {"task": task, "steps": self.step, "train_minutes": round(self.trained_seconds / 60, 2),
                "data_seconds": round(self.data_seconds, 1), "device": str(self.device),
                "mixed_precision": config["mixed_precision"], "batch_size": config["batch_size"],
                "data": {"num_examples": data.num, "seed": config["data_seed"], "image_size": config["image_size"],
                         "generator": f"mmpos.world.data.build_arrays({data_task!r})", **_data_layout(task)},
                "loss_history": self.history, "final_train_loss": self.history[-1][1] if self.history else None,
                "parameters": sum(p.numel() for p in final.parameters())}
        if config["init_from"] is not None:
            before = card["init_from"] = previous_training(config["init_from"], task)
            card["total_steps"] = self.step + before["total_steps"]
            card["total_train_minutes"] = round(card["train_minutes"] + before["total_train_minutes"], 2)
        start = round(self.initial_validation, 5)
        if task == "vae":
            shift, scale = _vae_scaling(final, data.images)
            final.register_to_config(shift_factor=shift, scaling_factor=scale)
            card.update(latent_shift=shift, latent_scale=scale, val_l1_start=start,
                        val_l1=round(self.validation(final), 5))
        else:
            card.update(val_loss_start=start, val_loss=round(self.validation(final), 5))
        export_model(task, final, self.vae, config, card, self.out_dir)
        return card


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
    except (OSError, EOFError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError, SafetensorError) as error:
        raise ValueError(f"{path}: cannot be read as part of a train state ({type(error).__name__}: {error}); "
                         "delete the train state to start over") from None


def _ema_state(saved: dict) -> dict:
    """An :class:`EMA` state; train states written before the shared EMA hold ``shadow``/``updates``/``decay``."""
    if "shadow" not in saved:
        return saved
    return {**{f"model.{key}": value for key, value in saved["shadow"].items()},
            "num_updates": torch.tensor(saved["updates"])}
