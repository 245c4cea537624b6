"""Latents in the diffusers pipelines' layout: images to VAE latents, 2x2 packing, Flux ids, Fill's mask.

Exactly as FluxPipeline / FluxFillPipeline / FluxKontextPipeline lay out their inputs.
"""

from __future__ import annotations

import torch
from diffusers import FluxPipeline

from ...coords.grids import flux_ids


def to_unit(images_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 ``[B, S, S, 3]`` -> float ``[B, 3, S, S]`` in [-1, 1]."""
    return images_uint8.permute(0, 3, 1, 2).float() / 127.5 - 1.0


@torch.no_grad()
def encode_latents(vae, images_uint8: torch.Tensor, masks=None, mode: bool = True, chunk: int = 512):
    """Normalised latents ``(z - shift) * scale`` of uint8 images ``[N, S, S, 3]``, chunked (posterior mean
    when ``mode``). With ``masks`` (bool ``[N, S, S]``) masked pixels are set to 0, as FluxFillPipeline does."""
    out = []
    for start in range(0, len(images_uint8), chunk):
        batch = to_unit(images_uint8[start : start + chunk].to(vae.device))
        if masks is not None:
            batch = batch * (~masks[start : start + chunk, None].to(vae.device))
        batch = batch.to(vae.dtype)
        posterior = vae.encode(batch).latent_dist
        z = posterior.mode() if mode else posterior.sample()
        out.append((z.float() - vae.config.shift_factor) * vae.config.scaling_factor)
    return torch.cat(out)


def pack(latents: torch.Tensor) -> torch.Tensor:
    """``[B, C, h, w]`` -> ``[B, h/2 * w/2, 4C]`` (FluxPipeline._pack_latents)."""
    b, c, h, w = latents.shape
    return FluxPipeline._pack_latents(latents, b, c, h, w)


def latent_ids(h: int, w: int, device, index: float = 0.0) -> torch.Tensor:
    """``[h/2 * w/2, 3]`` ids (index, row, col) of packed tokens; Kontext gives the context index 1."""
    return flux_ids(h // 2, w // 2, index=index, device=device)


def pack_pixel_mask(mask: torch.Tensor, scale_factor: int) -> torch.Tensor:
    """Pixel mask ``[B, 1, H, W]`` -> ``[B, tokens, 4 scale^2]`` as FluxFillPipeline.prepare_mask_latents."""
    b, _, height, width = mask.shape
    h, w = height // scale_factor, width // scale_factor
    folded = mask[:, 0].view(b, h, scale_factor, w, scale_factor).permute(0, 2, 4, 1, 3)
    return pack(folded.reshape(b, scale_factor * scale_factor, h, w))
