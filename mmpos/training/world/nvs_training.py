"""Training and evaluation of :class:`~mmpos.models.world.nvs.NovelViewTransformer` (resumable, seeded).

Regression (MSE) of the target view; AdamW with linear warm-up and cosine decay; a checkpoint (model,
optimiser, step, losses) written to a temporary name and renamed every ``checkpoint_every`` steps, so an
interrupted run resumes where it stopped with the same batches (batch order is a function of seed and step).
A run may continue another's weights (``init_from``) with a fresh optimiser and schedule; the totals of steps and
CPU seconds then include the earlier run's (``previous_steps``, ``previous_cpu_seconds``).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass

import torch

from ..._atomic import written_atomically
from ..._safe_state import load_torch_file
from ...eval.image_quality import psnr, ssim
from ...world.nvs_data import select
from ...models.world.nvs import NovelViewTransformer


@dataclass
class NVSRecipe:
    encoding: str
    seed: int = 0
    steps: int = 450
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.01
    dim: int = 96
    depth: int = 4
    heads: int = 2
    init_from: str | None = None  # a finished checkpoint whose weights start this run (continued training)


def learning_rate(recipe: NVSRecipe, step: int) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * 0.5 * (1 + math.cos(math.pi * progress))


def build_model(recipe: NVSRecipe, image_size: int = 32) -> NovelViewTransformer:
    torch.manual_seed(recipe.seed)
    return NovelViewTransformer(recipe.encoding, image_size, dim=recipe.dim, depth=recipe.depth, heads=recipe.heads)


def _save(path: str, state: dict) -> None:
    with written_atomically(path) as temporary:
        torch.save(state, temporary)


def train_nvs(recipe: NVSRecipe, data: dict, checkpoint: str, checkpoint_every: int = 100, log=print):
    """Train (or resume from ``checkpoint``) on the triples ``data``; returns ``(model, state)`` where ``state``
    holds the recipe, losses and CPU seconds spent."""
    model = build_model(recipe, data["images"].shape[-1])
    decay = [p for n, p in model.named_parameters() if p.dim() > 1 and "depth" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() > 1 and "depth" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=recipe.lr)
    state = dict(recipe=asdict(recipe), step=0, losses=[], cpu_seconds=0.0, previous_steps=0,
                 previous_cpu_seconds=0.0)
    if recipe.init_from and not os.path.exists(checkpoint):
        start = load_torch_file(recipe.init_from)
        if start["recipe"]["encoding"] != recipe.encoding or start["step"] < start["recipe"]["steps"]:
            raise ValueError(f"init_from must be a finished {recipe.encoding} checkpoint, got {recipe.init_from}")
        model.load_state_dict(start["model"])
        state["previous_steps"] = start.get("previous_steps", 0) + start["step"]
        state["previous_cpu_seconds"] = start.get("previous_cpu_seconds", 0.0) + start["cpu_seconds"]
    if os.path.exists(checkpoint):
        saved = load_torch_file(checkpoint)
        if asdict(NVSRecipe(**saved["recipe"])) != state["recipe"]:
            raise ValueError(f"{checkpoint} was written by another recipe: {saved['recipe']}")
        model.load_state_dict(saved.pop("model"))
        optimizer.load_state_dict(saved.pop("optimizer"))
        state = saved
    count = data["images"].shape[0]
    while state["step"] < recipe.steps:
        started = time.process_time()
        step = state["step"]
        generator = torch.Generator().manual_seed(recipe.seed * 1_000_003 + state.get("previous_steps", 0) + step)
        batch = select(data, torch.randint(count, (recipe.batch_size,), generator=generator))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(recipe, step)
        loss = (model(batch) - batch["images"][:, 2]).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        state["losses"].append(loss.item())
        state["step"] += 1
        state["cpu_seconds"] += time.process_time() - started
        if state["step"] % checkpoint_every == 0 or state["step"] == recipe.steps:
            _save(checkpoint, dict(state, model=model.state_dict(), optimizer=optimizer.state_dict()))
            log(f"{recipe.encoding} seed {recipe.seed} step {state['step']} loss {loss.item():.4f} "
                f"cpu {state['cpu_seconds']:.0f}s")
    return model, state


def load_trained(checkpoint: str, image_size: int = 32) -> NovelViewTransformer:
    saved = load_torch_file(checkpoint)
    model = build_model(NVSRecipe(**saved["recipe"]), image_size)
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
