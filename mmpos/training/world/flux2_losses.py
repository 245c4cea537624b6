"""Rectified flow for the FLUX.2-architecture world model (:mod:`mmpos.models.world.flux2`), in
``Flux2Pipeline``'s layout: the same objective, data, sigmas and noise as :func:`.losses.denoiser_loss`, with the
latents patchified and packed as FLUX.2 does and 4-axis ``(t, h, w, l)`` ids."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...models.world.flux2 import flux2_image_ids, flux2_text_ids, flux2_tokens


def flux2_flow_matching_inputs(data, index: torch.Tensor, sigmas: torch.Tensor, noise: torch.Tensor):
    """``(hidden_states [B, N, 4C], img_ids [N, 4], target_velocity [B, N, 4C])`` for t2i examples ``index``."""
    if data.task != "t2i":
        raise ValueError(f"the FLUX.2 world model trains t2i only, got task={data.task!r}")
    x0 = data.latents[index]
    s = sigmas[:, None, None, None]
    return flux2_tokens((1 - s) * x0 + s * noise), flux2_image_ids(x0), flux2_tokens(noise - x0)


def flux2_denoiser_loss(model, data, index, sigmas, noise, tokens) -> torch.Tensor:
    """MSE of the predicted velocity ``noise - x0`` at ``timestep = sigma`` (what the pipeline passes)."""
    hidden, img_ids, target = flux2_flow_matching_inputs(data, index, sigmas, noise)
    embeds = model.text_encoder(tokens)[0]
    dtype = next(model.transformer.parameters()).dtype
    prediction = model.transformer(
        hidden_states=hidden.to(dtype),
        encoder_hidden_states=embeds.to(dtype),
        timestep=sigmas.to(dtype),
        img_ids=img_ids,
        txt_ids=flux2_text_ids(embeds),
        guidance=None,
        return_dict=False,
    )[0]
    return F.mse_loss(prediction.float(), target)
