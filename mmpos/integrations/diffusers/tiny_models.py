"""Tiny random Flux and Wan transformers (diffusers' own test configs) and inputs, for tests and device checks.

The configs are ``get_init_dict()`` of diffusers' ``tests/models/transformers/test_models_transformer_flux.py``
and ``..._wan.py``; nothing is downloaded.
"""
from __future__ import annotations

import torch

FLUX_CONFIG = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
WAN_CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                  text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                  qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def tiny_flux(dtype=torch.float32, device="cpu", seed: int = 0, **overrides):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    return _placed(FluxTransformer2DModel(**{**FLUX_CONFIG, **overrides}), dtype, device)


def tiny_wan(dtype=torch.float32, device="cpu", seed: int = 0, **overrides):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return _placed(WanTransformer3DModel(**{**WAN_CONFIG, **overrides}), dtype, device)


def _placed(model, dtype, device):
    model = model.to(device).eval()
    return model if dtype == torch.float32 else model.to(dtype)  # diffusers warns on every dtype cast


def tiny_flux_inputs(dtype=torch.float32, device="cpu", height=4, width=4, text=8, batch=1, seed: int = 1) -> dict:
    """Inputs of :func:`tiny_flux`: ``height x width`` image tokens after ``text`` text tokens (fp32 ids)."""
    from ...coords.grids import flux_ids

    gen = torch.Generator().manual_seed(seed)
    ids = flux_ids(height, width, text_length=text, device=device)
    tensors = dict(hidden_states=torch.randn(batch, height * width, FLUX_CONFIG["in_channels"], generator=gen),
                   encoder_hidden_states=torch.randn(batch, text, FLUX_CONFIG["joint_attention_dim"], generator=gen),
                   pooled_projections=torch.randn(batch, FLUX_CONFIG["pooled_projection_dim"], generator=gen))
    inputs = {k: v.to(device, dtype) for k, v in tensors.items()}
    return dict(inputs, timestep=torch.tensor([0.5] * batch, device=device), img_ids=ids[text:], txt_ids=ids[:text])


def tiny_wan_inputs(dtype=torch.float32, device="cpu", frames=2, height=8, width=6, text=12, seed: int = 1) -> dict:
    """Inputs of :func:`tiny_wan`: latents ``[1, 4, frames, height, width]`` (patch (1, 2, 2))."""
    gen = torch.Generator().manual_seed(seed)
    tensors = dict(hidden_states=torch.randn(1, WAN_CONFIG["in_channels"], frames, height, width, generator=gen),
                   encoder_hidden_states=torch.randn(1, text, WAN_CONFIG["text_dim"], generator=gen))
    return dict({k: v.to(device, dtype) for k, v in tensors.items()}, timestep=torch.tensor([500], device=device))
