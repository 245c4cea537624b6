"""Training objectives of the world's models: VAE reconstruction + KL, and rectified flow for the transformers.

Flow matching as in Flux/SD3: ``x_t = (1 - s) x_0 + s e`` with ``s ~ sigmoid(N(0, 1))`` (logit-normal, drawn by
the trainer), and the transformer predicts the velocity ``e - x_0`` at ``timestep = s`` (what the pipelines pass,
``t / 1000``). Inputs are laid out exactly as FluxPipeline / FluxFillPipeline / FluxKontextPipeline lay them out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...models.world.flux2 import is_flux2
from ...models.world.latents import latent_ids, pack, pack_pixel_mask, to_unit
from .checkpoints import DenoiserWithText
from .flux2_losses import flux2_denoiser_loss
from .training_data import TrainingData


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
    if is_flux2(model.transformer):  # FLUX.2 architecture: its own layout (same objective)
        return flux2_denoiser_loss(model, data, index, sigmas, noise, tokens)
    hidden, ids, target, num_target = flow_matching_inputs(data, index, sigmas, noise)
    embeds, pooled = model.text_encoder(tokens)
    dtype = next(model.transformer.parameters()).dtype
    prediction = model.transformer(
        hidden_states=hidden.to(dtype),
        timestep=sigmas.to(dtype),
        guidance=None,
        pooled_projections=pooled.to(dtype),
        encoder_hidden_states=embeds.to(dtype),
        txt_ids=torch.zeros(tokens.shape[1], 3, device=hidden.device),
        img_ids=ids,
        return_dict=False,
    )[0]
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
