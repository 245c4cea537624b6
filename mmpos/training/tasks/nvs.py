"""Training and evaluation of :class:`~mmpos.models.world.nvs.NovelViewTransformer` (resumable, seeded).

Regression (MSE) of the target view; AdamW with linear warm-up and cosine decay; a checkpoint (the training
scaffold's ``checkpoint-<step>/``: model, optimiser, generators, and ``nvs_progress.json`` with the config, step,
losses) written every ``checkpoint_every`` steps, so an interrupted run resumes where it stopped with the same
batches (batch order is a function of seed and step), bit for bit.
A run may continue another's weights (``init_from``) with a fresh optimiser and schedule; the totals of steps and
CPU seconds then include the earlier run's (``previous_steps``, ``previous_cpu_seconds``).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..._safe_state import load_torch_file, read_json, read_tensors, write_json
from ...eval.image_quality import psnr, ssim
from ...models.world.nvs import NovelViewTransformer
from ...world.nvs_data import select
from ..scaffold.checkpoint import RunState, load_checkpoint, save_checkpoint
from ..scaffold.config import check_resume_config
from ..scaffold.folders import latest_checkpoint
from ..scaffold.loop import update_averaging_gradients
from ..scaffold.processes import check_shared, local, make_accelerator, step_generator
from ..task_configs import NVSConfig


def learning_rate(config: NVSConfig, step: int) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * 0.5 * (1 + math.cos(math.pi * progress))


def build_model(config: NVSConfig, image_size: int = 32) -> NovelViewTransformer:
    torch.manual_seed(config.seed)
    return NovelViewTransformer(config.encoding, image_size, dim=config.dim, depth=config.depth, heads=config.heads)


def run_folder(checkpoint) -> Path:
    """The scaffold run folder of a run named ``checkpoint`` (``.../rayrope_s0.pt`` -> ``.../rayrope_s0/``)."""
    path = Path(checkpoint)
    return path.with_suffix("") if path.suffix == ".pt" else path


def read_run(checkpoint) -> dict | None:
    """A run's saved state (config, step, losses, cpu_seconds, previous_steps, previous_cpu_seconds, model): its
    newest ``checkpoint-<step>/`` (safetensors + JSON), else a ``.pt`` file of the earlier layout (read with
    ``weights_only=True``); None when neither exists."""
    latest = latest_checkpoint(run_folder(checkpoint))
    if latest is not None:
        saved = read_json(latest / "nvs_progress.json")
        return dict(saved, model=read_tensors(latest / "model.safetensors"), folder=str(latest))
    path = Path(checkpoint)
    return load_torch_file(path) if path.is_file() else None


def _optimizer(model, config: NVSConfig):
    decay = [p for n, p in model.named_parameters() if p.dim() > 1 and "depth" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() > 1 and "depth" not in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": rest, "weight_decay": 0.0}], lr=config.lr
    )


def _start(config: NVSConfig, model, optimizer, accelerator, checkpoint) -> dict:
    """The run's state: resumed from ``checkpoint`` (either layout), else fresh (from ``init_from``'s weights)."""
    state = dict(recipe=asdict(config), step=0, losses=[], cpu_seconds=0.0, previous_steps=0, previous_cpu_seconds=0.0)
    latest = latest_checkpoint(run_folder(checkpoint))
    saved = read_run(checkpoint)
    if saved is None:
        if config.init_from:
            start = read_run(config.init_from)
            if (
                start is None
                or start["recipe"]["encoding"] != config.encoding
                or start["step"] < start["recipe"]["steps"]
            ):
                raise ValueError(f"init_from must be a finished {config.encoding} checkpoint, got {config.init_from}")
            model.load_state_dict(start["model"])
            state["previous_steps"] = start.get("previous_steps", 0) + start["step"]
            state["previous_cpu_seconds"] = start.get("previous_cpu_seconds", 0.0) + start["cpu_seconds"]
        return state
    check_resume_config(config, saved["recipe"], checkpoint)  # a key that defines the run, changed: refused
    if latest is not None:
        load_checkpoint(accelerator, latest, RunState(model, optimizer))
    else:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    return {k: v for k, v in saved.items() if k not in ("model", "optimizer", "folder")}


def train_nvs(config: NVSConfig, data: dict, checkpoint: str, log=print):
    """Train (or resume from ``checkpoint``) on the triples ``data``; returns ``(model, state)`` where ``state``
    holds the config, losses and CPU seconds spent.

    Checkpoints: ``run_folder(checkpoint)/checkpoint-<step>/`` (the training scaffold's layout; a ``.pt`` file of
    the earlier layout resumes too). On N processes (torchrun) ``batch_size`` is per process: every process draws
    the global batch's indices (one process draws what it always drew) and trains on its slice, the gradients are
    averaged, the main process writes. A non-finite loss stops before its update
    (:class:`~mmpos._validation.NonFiniteLossError`), keeping the last checkpoint."""
    accelerator = make_accelerator("no", "the world trainers", cpu=True)
    check_shared(accelerator, run_folder(checkpoint))
    model = build_model(config, data["images"].shape[-1])
    optimizer = _optimizer(model, config)
    state = _start(config, model, optimizer, accelerator, checkpoint)
    count, folder = data["images"].shape[0], run_folder(checkpoint)
    mine, parameters = local(accelerator, config.batch_size), list(model.parameters())
    while state["step"] < config.steps:
        started = time.process_time()
        step = state["step"]
        generator = step_generator(config.seed, state.get("previous_steps", 0) + step)
        index = torch.randint(count, (config.batch_size * accelerator.num_processes,), generator=generator)
        batch = select(data, index[mine])
        loss = (model(batch) - batch["images"][:, 2]).pow(2).mean()
        state["losses"].append(
            update_averaging_gradients(
                accelerator, optimizer, parameters, loss, learning_rate(config, step), step, folder
            )
        )
        state["step"] += 1
        state["cpu_seconds"] += time.process_time() - started
        if state["step"] % config.checkpoint_every == 0 or state["step"] == config.steps:
            _save(accelerator, folder, model, optimizer, state)
            if accelerator.is_main_process:
                log(
                    f"{config.encoding} seed {config.seed} step {state['step']} loss {state['losses'][-1]:.4f} "
                    f"cpu {state['cpu_seconds']:.0f}s"
                )
    return model, state


def _save(accelerator, folder: Path, model, optimizer, state: dict) -> Path:
    run = RunState(model, optimizer, step=state["step"])
    return save_checkpoint(
        accelerator,
        folder,
        run,
        dict(state["recipe"]),
        keep=2,
        extras=lambda part: write_json(part / "nvs_progress.json", state),
    )


def run_command(config: NVSConfig, resume: bool, overwrite: bool) -> int:
    """``mmpos train nvs``: train ``config`` on the train split of ``config.data`` into the run folder
    ``config.out`` (an earlier run there, or a ``<out>.pt`` of the earlier layout, is refused unless ``resume``
    (continue) or ``overwrite``)."""
    import os

    from ..scaffold.folders import refuse_earlier_run, remove_paths

    checkpoint = f"{Path(config.out)}.pt"  # the run's name: run_folder(checkpoint) is config.out
    earlier = [p for p in (checkpoint, config.out) if os.path.exists(p)]
    refuse_earlier_run(f"{earlier[0]} holds an earlier run" if earlier else None, resume, overwrite)
    data = load_torch_file(config.data)["train"]
    Path(config.out).parent.mkdir(parents=True, exist_ok=True)
    if overwrite and int(os.environ.get("RANK", "0")) == 0:
        remove_paths(earlier)
    train_nvs(config, data, checkpoint, log=lambda line: print(line, flush=True))
    return 0


def load_trained(checkpoint: str, image_size: int = 32) -> NovelViewTransformer:
    saved = read_run(checkpoint)
    if saved is None:
        raise FileNotFoundError(f"{checkpoint}: no such checkpoint (nor a run folder {run_folder(checkpoint)})")
    model = build_model(NVSConfig(**saved["recipe"]), image_size)
    model.load_state_dict(saved["model"])
    return model.eval()


@torch.no_grad()
def predict(model: NovelViewTransformer, data: dict, batch_size: int = 32) -> torch.Tensor:
    """``[N, 3, S, S]`` predicted target views."""
    count = data["images"].shape[0]
    return torch.cat([model(select(data, slice(i, i + batch_size))) for i in range(0, count, batch_size)])


def evaluate(model: NovelViewTransformer, data: dict) -> dict:
    """Mean PSNR and SSIM of the predicted target views against the ground-truth renders."""
    prediction, target = predict(model, data).double(), data["images"][:, 2].double()
    return dict(psnr=psnr(prediction, target).mean().item(), ssim=ssim(prediction, target).mean().item())
