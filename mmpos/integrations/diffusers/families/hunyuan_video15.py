"""HunyuanVideo 1.5 (``HunyuanVideo15Transformer3DModel``; T2V and I2V): ``HunyuanVideo15RotaryPosEmbed`` on the latents.

The model calls ``rope(hidden_states)`` once per forward on the latents ``[B, C, F, H, W]`` (the pipeline's
latents, condition latents and mask concatenated on channels); the module reads only their shape: the patch grid
``(t, row, col)`` of ``(F / patch_size_t, H / patch_size, W / patch_size)`` tokens from 0, float32 ids. It returns
``(cos, sin)`` ``[S, 128]`` float32 (``get_1d_rotary_pos_embed`` with float32 phases, pairs repeated), axes
``rope_axes_dim = (16, 56, 56)``, theta 256. Only the video tokens are rotated: the text, ByT5 and image-embedding
tokens get no rotary position, so a schedule's extents are the patch grid itself (no device sync). The shared
table rebuild is :func:`latent_grid_tables`, used by HunyuanVideo 1.0 too (the same module, another class).

Attention rules (UltraViCo, :mod:`..attention_rules`): ``set_attention_rule`` puts :class:`HunyuanVideo15RuleAttnProcessor`
(the stock ``HunyuanVideo15AttnProcessor2_0``, its joint video + text attention through the rule: video tokens first,
then the text, the padding mask as the stock one builds it) on every ``transformer_blocks.*.attn``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.embeddings import apply_rotary_emb

from ..processors import PEProcessor
from . import register_family
from .base import CameraSite, Family, check_latents
from .codecs import cos_sin_repeated


def latent_patch_grid(seam, hidden_states: torch.Tensor) -> tuple[int, int, int]:
    """``(frames, rows, cols)`` tokens of ``hidden_states [B, C, F, H, W]`` as the stock module counts them
    (floor division by the stock module's ``patch_size_t`` / ``patch_size``, as the patch embedding does)."""
    check_latents(hidden_states, "[B, C, F, H, W]")
    stock = seam.stock[0]
    frames, height, width = hidden_states.shape[2:]
    return frames // stock.patch_size_t, height // stock.patch_size, width // stock.patch_size


def latent_grid_tables(seam, hidden_states: torch.Tensor):
    """The stock HunyuanVideo rope output ``(cos, sin)`` ``[F * H * W, sum(axes_dims)]`` float32 of the latents'
    patch grid; the schedule's extents are the grid sizes (every rotated token is an image token)."""
    return grid_tables(seam, latent_patch_grid(seam, hidden_states), hidden_states.device)


def grid_tables(seam, sizes, device, freqs_dtype: torch.dtype = torch.float32):
    """``(cos, sin)`` ``[prod(sizes), sum(axes_dims)]`` float32 of the grid ``arange(n)`` per axis (float32 ids,
    ``meshgrid`` order, phases in ``freqs_dtype``, pairs repeated); the schedule's extents are the grid sizes."""
    axes = [torch.arange(0, n, device=device, dtype=torch.float32) for n in sizes]
    pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(sizes))
    spectra = seam.axis_spectra(extents=[float(n) for n in sizes])
    return cos_sin_repeated(pos, spectra, seam.axes_dims, seam.theta, freqs_dtype=freqs_dtype)


def stock_rotation(query, key, rotary_emb, layer):
    return apply_rotary_emb(query, rotary_emb, sequence_dim=1), apply_rotary_emb(key, rotary_emb, sequence_dim=1)


class HunyuanVideo15RuleAttnProcessor(PEProcessor):
    """``HunyuanVideo15AttnProcessor2_0`` (diffusers 0.42) with its attention through :meth:`PEProcessor._attend`
    (where an attention rule applies); the stock arithmetic otherwise."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        query, key, value = (f(hidden_states).unflatten(2, (attn.heads, -1)) for f in (attn.to_q, attn.to_k, attn.to_v))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if image_rotary_emb is not None:
            query, key = self.rotation(query, key, image_rotary_emb, self.layer)
        if encoder_hidden_states is not None:
            projections = (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
            added_q, added_k, added_v = (f(encoder_hidden_states).unflatten(2, (attn.heads, -1)) for f in projections)
            if attn.norm_added_q is not None:
                added_q = attn.norm_added_q(added_q)
            if attn.norm_added_k is not None:
                added_k = attn.norm_added_k(added_k)
            query, key, value = (
                torch.cat(pair, dim=1) for pair in ((query, added_q), (key, added_k), (value, added_v))
            )
        batch_size, seq_len, _, _ = query.shape
        attention_mask = F.pad(attention_mask, (seq_len - attention_mask.shape[1], 0), value=True).bool()
        rows = attention_mask.view(batch_size, 1, 1, seq_len).repeat(1, 1, seq_len, 1)
        attention_mask = (rows & rows.transpose(2, 3)).bool()
        hidden_states = self._attend(query, key, value, attention_mask, self._parallel_config, video=True)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is None:
            return hidden_states, None  # the stock processor's return
        text = encoder_hidden_states.shape[1]
        hidden_states, encoder_hidden_states = hidden_states[:, :-text], hidden_states[:, -text:]
        if getattr(attn, "to_out", None) is not None:
            hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if getattr(attn, "to_add_out", None) is not None:
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


def _rule_processor(stock, layer: int) -> HunyuanVideo15RuleAttnProcessor:
    backend, parallel = getattr(stock, "_attention_backend", None), getattr(stock, "_parallel_config", None)
    return HunyuanVideo15RuleAttnProcessor(stock_rotation, layer, backend, parallel)


def _self_attention(model) -> list:
    return [(f"transformer_blocks.{i}.attn", block.attn) for i, block in enumerate(model.transformer_blocks)]


def _latent_grid(model, args, kwargs) -> tuple[int, int, int]:
    hidden_states = kwargs.get("hidden_states", args[0] if args else None)
    config = model.config
    frames, height, width = hidden_states.shape[2:]
    return frames // config.patch_size_t, height // config.patch_size, width // config.patch_size


HUNYUAN_VIDEO15 = register_family(
    Family(
        name="hunyuan_video15",
        classes=("diffusers.models.transformers.transformer_hunyuan_video15:HunyuanVideo15Transformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.rope_axes_dim),
        native_theta=lambda model: float(model.config.rope_theta),
        image_axes=(1, 2),
        time_axis=0,
        tables=latent_grid_tables,
        timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 1),
        pipelines=("HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline"),
        train_size=640,  # the 480p model's target_size (848 x 480 ~ 640 x 640)
        pixels_per_token=16,  # 16x VAE, patch 1
        notes="video tokens only (text unrotated); grid from the latent shape",
        attention_modules=_self_attention,
        latent_grid=_latent_grid,
        rule_processor=_rule_processor,
        camera=CameraSite(output_index=0),  # the joint attention returns (video, text)
    )
)
