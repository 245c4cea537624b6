"""Training the world's models: the VAE (reconstruction + KL) and Flux transformers (rectified flow).

Flow matching as in Flux/SD3: ``x_t = (1 - s) x_0 + s e`` with ``s ~ sigmoid(N(0, 1))`` (logit-normal), and
the transformer predicts the velocity ``e - x_0`` at ``timestep = s`` (what the pipelines pass, ``t / 1000``).
Inputs are laid out exactly as FluxPipeline / FluxFillPipeline / FluxKontextPipeline lay them out.
"""
from __future__ import annotations

import copy
import json
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import FluxPipeline
from torch import nn

from .._validation import check_choice
from .data import build_arrays
from .models import (
    TASKS,
    build_text_encoder,
    build_transformer,
    build_vae,
    transformer_channels,
    vae_scale_factor,
)

ALL_TASKS = ("vae",) + TASKS
DEFAULTS = {
    "task": "t2i", "image_size": 64, "num_examples": 20000, "data_seed": 0, "workers": 1,
    "batch_size": 64, "lr": 3e-4, "weight_decay": 0.0, "warmup_steps": 100, "ema_decay": 0.999,
    "max_steps": 100000, "max_minutes": 10.0, "mixed_precision": "no", "seed": 0, "log_every": 50,
    "checkpoint_every": 1000, "caption_dropout": 0.1, "style_dropout": 0.25, "kl_weight": 1e-6,
    "sample_steps": 20, "sample_guidance": 3.0, "num_samples": 8, "vae_path": None, "init_from": None,
    "transformer": {}, "text_encoder": {}, "vae": {},
}


class EMA:
    """Exponential moving average of a module's parameters, with the usual warm-up of the decay."""

    def __init__(self, module: nn.Module, decay: float):
        self.decay = decay
        self.shadow = {k: v.detach().clone().float() for k, v in module.state_dict().items()}
        self.updates = 0

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        current = module.state_dict()
        floats = [k for k, v in current.items() if v.dtype.is_floating_point]
        torch._foreach_lerp_([self.shadow[k] for k in floats], [current[k].float() for k in floats], 1 - decay)
        for key in current.keys() - set(floats):
            self.shadow[key].copy_(current[key])

    def copy_to(self, module: nn.Module) -> nn.Module:
        module.load_state_dict({k: v.to(module.state_dict()[k].dtype) for k, v in self.shadow.items()})
        return module

    def state_dict(self) -> dict:
        return {"shadow": self.shadow, "updates": self.updates, "decay": self.decay}

    def load_state_dict(self, state: dict) -> None:
        self.shadow, self.updates, self.decay = state["shadow"], state["updates"], state["decay"]


class DenoiserWithText(nn.Module):
    """The trained unit: a Flux transformer and its text encoder (optimised jointly)."""

    def __init__(self, transformer, text_encoder):
        super().__init__()
        self.transformer, self.text_encoder = transformer, text_encoder


# --------------------------------------------------------------------------------------------- packing

def pack(latents: torch.Tensor) -> torch.Tensor:
    """``[B, C, h, w]`` -> ``[B, h/2 * w/2, 4C]`` (FluxPipeline._pack_latents)."""
    b, c, h, w = latents.shape
    return FluxPipeline._pack_latents(latents, b, c, h, w)


def latent_ids(h: int, w: int, device, index: float = 0.0) -> torch.Tensor:
    """``[h/2 * w/2, 3]`` ids (index, row, col) of packed tokens; Kontext gives the context index 1."""
    ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, device, torch.float32)
    ids[:, 0] = index
    return ids


def pack_pixel_mask(mask: torch.Tensor, scale_factor: int) -> torch.Tensor:
    """Pixel mask ``[B, 1, H, W]`` -> ``[B, tokens, 4 scale^2]`` as FluxFillPipeline.prepare_mask_latents."""
    b, _, height, width = mask.shape
    h, w = height // scale_factor, width // scale_factor
    folded = mask[:, 0].view(b, h, scale_factor, w, scale_factor).permute(0, 2, 4, 1, 3)
    return pack(folded.reshape(b, scale_factor * scale_factor, h, w))


# ------------------------------------------------------------------------------------------------ data

def to_unit(images_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 ``[B, S, S, 3]`` -> float ``[B, 3, S, S]`` in [-1, 1]."""
    return images_uint8.permute(0, 3, 1, 2).float() / 127.5 - 1.0


@torch.no_grad()
def encode_latents(vae, images_uint8: torch.Tensor, masks=None, mode: bool = True, chunk: int = 512):
    """Normalised latents ``(z - shift) * scale`` of uint8 images ``[N, S, S, 3]``, chunked (posterior mean
    when ``mode``). With ``masks`` (bool ``[N, S, S]``) masked pixels are set to 0, as FluxFillPipeline does."""
    out = []
    for start in range(0, len(images_uint8), chunk):
        batch = to_unit(images_uint8[start:start + chunk].to(vae.device))
        if masks is not None:
            batch = batch * (~masks[start:start + chunk, None].to(vae.device))
        batch = batch.to(vae.dtype)
        posterior = vae.encode(batch).latent_dist
        z = posterior.mode() if mode else posterior.sample()
        out.append((z.float() - vae.config.shift_factor) * vae.config.scaling_factor)
    return torch.cat(out)


class TrainingData:
    """The task's examples on the training device, with per-step batch assembly."""

    def __init__(self, config: dict, device, vae=None, text_encoder=None):
        task = config["task"]
        data_task = {"vae": "scenes", "t2i": "scenes", "fill": "fill", "kontext": "kontext"}[task]
        arrays = build_arrays(data_task, config["num_examples"], config["data_seed"], config["image_size"],
                              config["workers"])
        self.task, self.device, self.num = task, device, len(arrays["image"])
        self.images = torch.from_numpy(arrays["image"]).to(device)
        if task == "vae":
            return
        self.tokens = text_encoder.tokenize(arrays["caption"]).to(device)
        content = arrays.get("content_caption")
        self.content_tokens = text_encoder.tokenize(content).to(device) if content else self.tokens
        self.empty_tokens = text_encoder.tokenize([""]).to(device)
        self.latents = encode_latents(vae, self.images)
        self.scale_factor = vae_scale_factor(vae)
        if task == "fill":
            self.masks = torch.from_numpy(arrays["mask"]).to(device)
            self.masked_latents = encode_latents(vae, self.images, self.masks)
        if task == "kontext":
            self.context_latents = encode_latents(vae, torch.from_numpy(arrays["context"]).to(device))

    def tokens_for(self, index: torch.Tensor, generator, caption_dropout: float, style_dropout: float):
        tokens = self.tokens[index]
        u = torch.rand(len(index), 1, device=self.device, generator=generator)
        tokens = torch.where(u < style_dropout, self.content_tokens[index], tokens)
        return torch.where(u > 1 - caption_dropout, self.empty_tokens, tokens)


# ----------------------------------------------------------------------------------------------- losses

def vae_loss(vae, images: torch.Tensor, kl_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, l1)``: L1 + MSE reconstruction of the posterior sample plus a small KL term."""
    posterior = vae.encode(images).latent_dist
    recon = vae.decode(posterior.sample()).sample
    l1 = (recon.float() - images).abs().mean()
    loss = l1 + F.mse_loss(recon.float(), images) + kl_weight * posterior.kl().mean() / images[0].numel()
    return loss, l1.detach()


def flow_matching_inputs(data: TrainingData, index: torch.Tensor, sigmas: torch.Tensor, noise: torch.Tensor):
    """``(hidden_states, img_ids, target_velocity, num_target_tokens)`` in the pipelines' layout."""
    x0 = data.latents[index]
    h, w = x0.shape[-2:]
    noisy = pack((1 - sigmas[:, None, None, None]) * x0 + sigmas[:, None, None, None] * noise)
    target = pack(noise - x0)
    ids = latent_ids(h, w, x0.device)
    if data.task == "fill":
        mask = data.masks[index][:, None].float()
        noisy = torch.cat([noisy, pack(data.masked_latents[index]), pack_pixel_mask(mask, data.scale_factor)], 2)
    if data.task == "kontext":
        noisy = torch.cat([noisy, pack(data.context_latents[index])], 1)
        ids = torch.cat([ids, latent_ids(h, w, x0.device, index=1.0)])
    return noisy, ids, target, target.shape[1]


def denoiser_loss(model: DenoiserWithText, data: TrainingData, index, sigmas, noise, tokens) -> torch.Tensor:
    hidden, ids, target, num_target = flow_matching_inputs(data, index, sigmas, noise)
    embeds, pooled = model.text_encoder(tokens)
    dtype = next(model.transformer.parameters()).dtype
    prediction = model.transformer(hidden_states=hidden.to(dtype), timestep=sigmas.to(dtype), guidance=None,
                                   pooled_projections=pooled.to(dtype), encoder_hidden_states=embeds.to(dtype),
                                   txt_ids=torch.zeros(tokens.shape[1], 3, device=hidden.device), img_ids=ids,
                                   return_dict=False)[0]
    return F.mse_loss(prediction[:, :num_target].float(), target)


@torch.no_grad()
def validation_loss(model: DenoiserWithText, data: TrainingData, count: int = 64, seed: int = 1234) -> float:
    """Flow-matching loss on the first ``count`` examples at fixed sigmas and noise (comparable across runs)."""
    g = torch.Generator(device=data.device).manual_seed(seed)
    index = torch.arange(min(count, data.num), device=data.device)
    sigmas = torch.linspace(0.05, 0.95, len(index), device=data.device)
    noise = torch.randn(data.latents[index].shape, device=data.device, generator=g)
    return denoiser_loss(model, data, index, sigmas, noise, data.tokens[index]).item()


@torch.no_grad()
def vae_validation_l1(vae, data: TrainingData, count: int = 256) -> float:
    """Mean absolute reconstruction error (posterior sample) of the first ``count`` images, in [-1, 1] units."""
    torch.manual_seed(0)
    return vae_loss(vae, to_unit(data.images[:count]), 0.0)[1].item()


# ------------------------------------------------------------------------------------------------- loop

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


def _lr_lambda(warmup: int):
    return lambda step: min(1.0, (step + 1) / max(warmup, 1))


def _vae_scaling(vae, images_uint8: torch.Tensor) -> tuple[float, float]:
    """``(shift, scale)`` that make the latents zero-mean, unit-variance on this data."""
    with torch.no_grad():
        z = vae.encode(to_unit(images_uint8[:1024].to(vae.device)).to(vae.dtype)).latent_dist.mode().float()
    return z.mean().item(), 1.0 / z.std().item()


def train(config: dict, out_dir, resume: bool = False, progress: bool = True) -> dict:
    """Train ``config['task']``; write the model (EMA weights), model card and samples under ``out_dir``.

    Stops at ``max_steps``, after ``max_minutes`` of training or on SIGTERM. Returns the model card.
    """
    trainer = WorldTrainer(config, out_dir, progress)
    if resume:
        trainer.load_state()
    with stop_on_sigterm() as signals:
        trainer.run(signals)
    trainer.save_state()
    return trainer.finish()


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
        self.ema = EMA(self.raw, config["ema_decay"])
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
                _check_same_config(f"{part} option", config[part], getattr(model, part).config)
            return vae, model
        transformer = build_transformer(self.task, vae.config.latent_channels, vae_scale_factor(vae),
                                        **config["transformer"])
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

    def save_state(self) -> None:
        """Accelerate state (model, optimiser, scheduler, RNG), EMA and progress, for ``load_state``."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.accelerator.save_state(str(self.state_dir))
        torch.save(self.ema.state_dict(), self.state_dir / "ema.pt")
        progress = {"step": self.step, "trained_seconds": self.trained_seconds, "history": self.history,
                    "initial_validation": self.initial_validation}
        (self.state_dir / "progress.json").write_text(json.dumps(progress))

    def load_state(self) -> None:
        if not (self.state_dir / "progress.json").is_file():
            raise FileNotFoundError(f"nothing to resume: no {self.state_dir / 'progress.json'}")
        self.accelerator.load_state(str(self.state_dir))
        self.ema.load_state_dict(torch.load(self.state_dir / "ema.pt", map_location=self.device))
        saved = json.loads((self.state_dir / "progress.json").read_text())
        self.step, self.trained_seconds, self.history = saved["step"], saved["trained_seconds"], saved["history"]
        self.initial_validation = saved.get("initial_validation")

    def finish(self) -> dict:
        """EMA weights -> final model; model card; export under ``out_dir/world-<task>/``."""
        from .export import export_model

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
    from .canvas import INSERTION_FRACTION, WORLD_TRANSPLANT

    return {"canvas": {"transplant": WORLD_TRANSPLANT, "insertion_fraction": INSERTION_FRACTION}}


def load_trained_vae(path, device):
    from diffusers import AutoencoderKL

    if path is None:
        raise ValueError("vae_path is required for transformer tasks; train the VAE first (task: vae)")
    folder = Path(path)
    folder = folder / "world-vae" if (folder / "world-vae").is_dir() else folder
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no VAE checkpoint at {folder} (expected config.json); train one with "
                                "scripts/train_world.py --task vae")
    vae = AutoencoderKL.from_pretrained(folder, torch_dtype=torch.float32).to(device)
    return vae.eval().requires_grad_(False)


def _task_folder(path, task: str) -> Path:
    """``path/world-<task>`` when it exists, else ``path`` itself."""
    folder = Path(path)
    return folder / f"world-{task}" if (folder / f"world-{task}").is_dir() else folder


def load_trained_denoiser(path, task: str, device, vae_latent_channels: int = 4,
                          vae_factor: int = 2) -> DenoiserWithText:
    """A trained world model (``path`` holds ``world-<task>/`` or is it), in fp32, to continue training; its
    input channels must be those of ``task`` on the VAE (``vae_latent_channels``, ``vae_factor``)."""
    from diffusers import FluxTransformer2DModel

    from .text import WorldTextEncoder

    folder = _task_folder(path, task)
    if not (folder / "transformer" / "config.json").is_file():
        raise FileNotFoundError(f"init_from: no {task} checkpoint at {folder} (expected transformer/config.json)")
    transformer = FluxTransformer2DModel.from_pretrained(folder / "transformer", torch_dtype=torch.float32)
    expected = transformer_channels(task, vae_latent_channels, vae_factor)[0]
    if transformer.config.in_channels != expected:
        raise ValueError(f"init_from: {folder} holds a transformer with in_channels={transformer.config.in_channels}; "
                         f"a {task} model on this VAE has {expected} (is it another task's checkpoint?)")
    text_encoder = WorldTextEncoder.from_pretrained(folder / "text_encoder", torch_dtype=torch.float32)
    return DenoiserWithText(transformer, text_encoder).to(device).train()


def _check_same_config(what: str, wanted: dict, loaded) -> None:
    for key, value in wanted.items():
        have = loaded.get(key)
        if (list(have) if isinstance(have, (tuple, list)) else have) != (
                list(value) if isinstance(value, (tuple, list)) else value):
            raise ValueError(f"init_from: {what} {key}={value!r} differs from the checkpoint's {have!r}")


def previous_training(path, task: str) -> dict:
    """What the ``init_from`` checkpoint's own model card says of its training (steps, minutes, val loss)."""
    card_path = _task_folder(path, task) / "model_card.json"
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    return {"path": str(path), "val_loss": card.get("val_loss"),
            "total_steps": card.get("total_steps", card.get("steps", 0)),
            "total_train_minutes": card.get("total_train_minutes", card.get("train_minutes", 0.0))}
