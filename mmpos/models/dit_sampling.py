"""Sample a class-conditional DiT with any diffusers scheduler (DDPM, DDIM, DPM-Solver, flow matching).

The model predicts what the scheduler expects (its ``prediction_type``: epsilon or v-prediction for
DDPM/DDIM, velocity ``noise - x0`` for ``FlowMatchEulerDiscreteScheduler``): train with the matching
objective (:func:`mmpos.models.dit_training.diffusion_loss`).
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from .._validation import check_positive_int


@torch.no_grad()
def sample_dit(
    model,
    scheduler,
    class_labels,
    num_inference_steps: int = 50,
    guidance_scale: float = 1.0,
    height: int | None = None,
    width: int | None = None,
    generator: torch.Generator | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Generate ``[B, C, height, width]`` samples (latents or pixels, as the model was trained) for
    ``class_labels`` ``[B]``; ``guidance_scale > 1`` runs classifier-free guidance with the null class."""
    check_positive_int("num_inference_steps", num_inference_steps)
    device, dtype = model.device, model.dtype
    labels = torch.as_tensor(class_labels, device=device, dtype=torch.long).reshape(-1)
    height = height or model.config.sample_size
    width = width or model.config.sample_size
    shape = (labels.shape[0], model.config.in_channels, height, width)
    latents = torch.randn(shape, generator=generator, device=generator.device if generator else device)
    latents = latents.to(device) * getattr(scheduler, "init_noise_sigma", 1.0)
    scheduler.set_timesteps(num_inference_steps, device=device)
    guided = guidance_scale > 1.0
    if guided:
        labels = torch.cat([labels, torch.full_like(labels, model.config.num_classes)])
    for t in tqdm(scheduler.timesteps, disable=not progress, desc="sampling"):
        x = scheduler.scale_model_input(latents, t) if hasattr(scheduler, "scale_model_input") else latents
        x = torch.cat([x, x]) if guided else x
        out = model(x.to(dtype), t.to(device).expand(x.shape[0]), labels).sample.float()
        if guided:
            cond, uncond = out.chunk(2)
            out = uncond + guidance_scale * (cond - uncond)
        latents = scheduler.step(out, t, latents, generator=generator).prev_sample
    return latents
