"""Training pieces for the reference DiT: objectives, the matching schedulers, a procedural data set (the EMA
is :class:`mmpos.models.ema.EMA`).

Objectives (``x0`` data, ``eps`` unit Gaussian noise):

* ``"epsilon"`` / ``"v_prediction"``: DDPM forward process (DiT's linear betas 1e-4..0.02, 1000 steps),
  ``x_t = sqrt(a_t) x0 + sqrt(1 - a_t) eps``, the model predicts ``eps`` or ``v``; sample with
  ``DDPMScheduler``/``DDIMScheduler`` of the same config;
* ``"flow"``: rectified flow ``x_s = (1 - s) x0 + s eps``, ``s ~ U(0, 1)``, timestep ``1000 s``, the model
  predicts the velocity ``eps - x0``; sample with ``FlowMatchEulerDiscreteScheduler``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._validation import check_choice, check_positive_int

OBJECTIVES = ("epsilon", "v_prediction", "flow")


def make_noise_scheduler(objective: str, sampler: str | None = None):
    """The diffusers scheduler that trains (``add_noise``) and samples a model with ``objective``.

    ``sampler``: ``"ddpm"`` (default for epsilon/v) or ``"ddim"``; flow always uses flow-matching Euler.
    """
    from diffusers import DDIMScheduler, DDPMScheduler, FlowMatchEulerDiscreteScheduler

    check_choice("objective", objective, OBJECTIVES)
    if objective == "flow":
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)
    check_choice("sampler", sampler or "ddpm", ("ddpm", "ddim"))
    cls = DDIMScheduler if sampler == "ddim" else DDPMScheduler
    return cls(
        num_train_timesteps=1000,
        beta_schedule="linear",
        beta_start=1e-4,
        beta_end=0.02,
        prediction_type=objective,
        clip_sample=False,
    )


def diffusion_loss(
    model,
    x0: torch.Tensor,
    class_labels: torch.Tensor,
    objective: str,
    scheduler=None,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    t: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean squared error of the model's prediction for noised ``x0`` (see the module docstring).

    ``t`` (optional): DDPM step indices ``[B]`` (long) or flow times ``s`` in ``[0, 1]`` ``[B]``; ``noise``
    (optional) fixes the noise; ``scheduler``: a DDPM-style scheduler for epsilon/v (default DiT's).
    """
    check_choice("objective", objective, OBJECTIVES)
    b = x0.shape[0]
    x0 = x0.float()
    noise = torch.randn(x0.shape, generator=generator, device=x0.device) if noise is None else noise.float()
    if objective == "flow":
        s = torch.rand(b, generator=generator, device=x0.device) if t is None else t.float()
        s4 = s.view(b, 1, 1, 1)
        x_t, target, timestep = (1 - s4) * x0 + s4 * noise, noise - x0, s * 1000
    else:
        scheduler = scheduler or make_noise_scheduler(objective)
        steps = scheduler.config.num_train_timesteps
        timestep = torch.randint(0, steps, (b,), generator=generator, device=x0.device) if t is None else t
        x_t = scheduler.add_noise(x0, noise, timestep)
        target = noise if objective == "epsilon" else scheduler.get_velocity(x0, noise, timestep)
    dtype = next(model.parameters()).dtype
    pred = model(x_t.to(dtype), timestep, class_labels).sample
    return F.mse_loss(pred.float(), target)


class ProceduralShapes(torch.utils.data.Dataset):
    """Class-conditional toy images in ``[-1, 1]``: class ``k`` is a soft disc whose colour and
    quadrant depend on ``k``, at a random jitter; deterministic per index (seeded)."""

    def __init__(self, size: int = 32, channels: int = 3, num_classes: int = 10, length: int = 10_000, seed: int = 0):
        for name, value in dict(size=size, channels=channels, num_classes=num_classes, length=length).items():
            check_positive_int(name, value)
        self.size, self.channels, self.num_classes, self.length, self.seed = size, channels, num_classes, length, seed

    def __len__(self):
        return self.length

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        label = index % self.num_classes
        angle = 2 * math.pi * label / self.num_classes
        centre = 0.5 + 0.25 * torch.tensor([math.sin(angle), math.cos(angle)]) + 0.05 * torch.randn(2, generator=g)
        radius = 0.12 + 0.04 * torch.rand(1, generator=g)
        axis = (torch.arange(self.size) + 0.5) / self.size
        rows, cols = torch.meshgrid(axis, axis, indexing="ij")
        dist = ((rows - centre[0]) ** 2 + (cols - centre[1]) ** 2).sqrt()
        disc = torch.sigmoid((radius - dist) * self.size * 2)
        colour = torch.cos(angle + torch.arange(self.channels) * 2 * math.pi / 3)
        image = disc * colour[:, None, None] - (1 - disc) * 0.5
        return image.clamp(-1, 1), label
