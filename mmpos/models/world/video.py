"""The world video model: a small diffusers ``WanTransformer3DModel`` that turns a first frame into a clip.

Image-to-video as Wan 2.2 TI2V does it (diffusers' ``expand_timesteps``): the latent of the first frame is
given clean in place of its noise, its tokens get timestep 0, and the loss covers the other frames. Latents are
the world VAE's (``AutoencoderKL``, 2x spatial, no temporal compression: one latent frame per video frame),
normalised as ``(z - shift_factor) * scaling_factor``. There is no prompt: the text stream is one zero token.

Flow matching as in the world's image models: ``x_s = (1 - s) x_0 + s e``, ``s ~ sigmoid(N(0, 1))``, and the
transformer predicts ``e - x_0`` at ``timestep = 1000 s``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

TRANSFORMER_CONFIG = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=4,
    attention_head_dim=32,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=64,
    ffn_dim=256,
    num_layers=4,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=64,
)


def world_video_transformer(**overrides):
    """A ``WanTransformer3DModel`` of :data:`TRANSFORMER_CONFIG` (``overrides`` replace entries)."""
    from diffusers import WanTransformer3DModel

    unknown = set(overrides) - set(TRANSFORMER_CONFIG)
    if unknown:
        raise ValueError(
            f"unknown transformer option(s) {sorted(unknown)}; expected some of {sorted(TRANSFORMER_CONFIG)}"
        )
    return WanTransformer3DModel(**{**TRANSFORMER_CONFIG, **overrides})


def empty_prompt(transformer, batch_size: int) -> torch.Tensor:
    """``[B, 1, text_dim]`` zeros: the text stream of a model trained without prompts."""
    return torch.zeros(batch_size, 1, transformer.config.text_dim, device=transformer.device, dtype=transformer.dtype)


def token_timesteps(timestep: torch.Tensor, latent_shape, patch_size) -> torch.Tensor:
    """``[B, tokens]``: ``timestep [B]`` on every token of frames 1.., 0 on the first frame's tokens."""
    batch, _, frames, height, width = latent_shape
    per_frame = (height // patch_size[1]) * (width // patch_size[2])
    steps = timestep.reshape(batch, 1, 1).expand(batch, frames, per_frame).clone()
    steps[:, 0] = 0
    return steps.flatten(1)


def with_first_frame(noisy: torch.Tensor, first_latent: torch.Tensor) -> torch.Tensor:
    """``noisy [B, C, F, h, w]`` with frame 0 replaced by the clean ``first_latent [B, C, 1, h, w]``."""
    return torch.cat([first_latent.to(noisy.dtype), noisy[:, :, 1:]], dim=2)


def flow_loss(transformer, latents: torch.Tensor, sigmas: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Velocity MSE on frames 1.. of ``latents [B, C, F, h, w]`` (normalised), frame 0 given clean."""
    s = sigmas.view(-1, 1, 1, 1, 1)
    noisy = with_first_frame((1 - s) * latents + s * noise, latents[:, :, :1])
    timestep = token_timesteps(sigmas * 1000, latents.shape, transformer.config.patch_size)
    prediction = transformer(
        hidden_states=noisy,
        timestep=timestep,
        encoder_hidden_states=empty_prompt(transformer, len(latents)),
        return_dict=False,
    )[0]
    return F.mse_loss(prediction[:, :, 1:].float(), (noise - latents)[:, :, 1:].float())


def latent_normalisation(vae) -> tuple[float, float]:
    """``(shift, scale)`` of ``vae``'s config (``shift_factor`` None means 0, as in diffusers)."""
    return vae.config.shift_factor or 0.0, vae.config.scaling_factor


@torch.no_grad()
def encode_frames(vae, frames: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """``frames [N, F, 3, S, S]`` uint8 -> normalised latents ``[N, C, F, S/2, S/2]`` (posterior mode)."""
    count, length = frames.shape[:2]
    flat = frames.flatten(0, 1)
    latents = torch.cat(
        [
            vae.encode(flat[i : i + batch_size].to(vae.device, vae.dtype) / 127.5 - 1).latent_dist.mode()
            for i in range(0, len(flat), batch_size)
        ]
    )
    shift, scale = latent_normalisation(vae)
    latents = (latents.float() - shift) * scale
    return latents.unflatten(0, (count, length)).transpose(1, 2).contiguous()


@torch.no_grad()
def decode_latents(vae, latents: torch.Tensor) -> torch.Tensor:
    """Normalised ``latents [B, C, F, h, w]`` -> frames ``[B, F, 3, S, S]`` float in [0, 1]."""
    batch, frames = latents.shape[0], latents.shape[2]
    shift, scale = latent_normalisation(vae)
    flat = latents.transpose(1, 2).flatten(0, 1) / scale + shift
    images = vae.decode(flat.to(vae.device, vae.dtype)).sample.float()
    return ((images + 1) / 2).clamp(0, 1).unflatten(0, (batch, frames))
