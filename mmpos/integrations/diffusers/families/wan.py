"""Wan 2.1 / 2.2 (``WanTransformer3DModel``; T2V, I2V, TI2V, VACE-free): ``WanRotaryPosEmbed`` on the latents.

Tier 2: the seam (:class:`WanPositions`: the patch grid ``(t, row, col)`` of the latents) and mmpos
processors (:class:`WanPEAttnProcessor`, self-attention only), so any rotary encoding and the
camera adapters install. Wan 2.2 TI2V passes per-token timesteps (``expand_timesteps``) with the pinned first
frame at 0: the step's sigma is read from the noisy tokens (:meth:`~.base.Family.sigma`).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_wan

from ....coords.grids import grid_rows, video_grid
from ....ops.tables import KeyedCache, RotaryTable, library_owned
from .. import context_parallel
from ..context_parallel import refuse_after_parallelism
from ..positions import PositionSeam, pack_tables
from ..processors import PEProcessor, processors_beneath
from . import register_family
from .base import Family


class WanPositions(PositionSeam):
    """Replaces ``WanTransformer3DModel.rope``: latents ``[B, C, F, H, W]`` -> tables of the patch grid.

    ``native_dtype`` follows the model's casts like the stock module's fp32 buffers do (``_keep_in_fp32_modules``
    keeps it fp32 under ``from_pretrained(torch_dtype=...)``; ``model.to(torch.bfloat16)`` makes it bf16).
    """

    def __init__(self, encodings, native, coord_axes, patch_size, native_dtype=torch.float32):
        super().__init__(encodings, native, coord_axes)
        self.patch_size = tuple(int(p) for p in patch_size)
        self.register_buffer("native_dtype_probe", torch.zeros((), dtype=native_dtype), persistent=False)
        self._grid_cache = KeyedCache(max_entries=4)

    def grid_coords(self, grid: tuple[int, int, int], device, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """``video_grid`` coordinates (``rows``: only rows ``start:stop``), the same tensor while the grid, rows and
        device stay (table cache hits by identity: no value comparison, no device sync per step)."""
        key = (grid, rows, torch.device(device), torch.is_inference_mode_enabled())
        return self._grid_cache.get(key, lambda: library_owned(self.fresh_coords(grid, rows, device)))

    @staticmethod
    def fresh_coords(grid: tuple[int, int, int], rows: tuple[int, int] | None, device=None) -> torch.Tensor:
        """The grid's coordinates, or rows ``start:stop`` of them (built without the others)."""
        return video_grid(*grid, device=device) if rows is None else grid_rows(grid, *rows, device=device)

    def own_rows(self, grid: tuple[int, int, int]) -> tuple[int, int] | None:
        """This rank's rows of the grid under Wan's context-parallel plan (the seam splits its outputs itself),
        ``None`` in one process."""
        hook = context_parallel.own_output_split(self, "rope")
        return None if hook is None else context_parallel.own_rows(hook, grid[0] * grid[1] * grid[2])

    def grid(self, latents: torch.Tensor) -> tuple[int, int, int]:
        if latents.dim() != 5:
            raise ValueError(f"hidden_states has shape {tuple(latents.shape)}; expected [B, C, F, H, W]")
        sizes = tuple(latents.shape[2:])
        if any(n % p for n, p in zip(sizes, self.patch_size)):
            raise ValueError(
                f"hidden_states has (frames, height, width) = {sizes}, not divisible by the patch "
                f"size {self.patch_size}; the stock model would silently drop the remainder"
            )
        return tuple(n // p for n, p in zip(sizes, self.patch_size))

    def forward(self, hidden_states: torch.Tensor):
        self.forwards += 1
        grid = self.grid(hidden_states)
        if not self.encodings:
            return None
        rows = self.own_rows(grid)
        if self.native:  # the stock module computes its tables on the CPU at init: so do we, then cache
            cos, sin = self.native_cos_sin(
                self.fresh_coords(grid, rows), self.native_dtype_probe.dtype, hidden_states.device
            )
            return cos[None, :, None], sin[None, :, None]
        coords = self.grid_coords(grid, hidden_states.device, rows)
        tables = self.tables(coords, self.run_dtype(hidden_states.dtype, hidden_states.device))
        if not all(isinstance(t, RotaryTable) for t in tables):
            return tables  # not packed (a LayerTables tuple): under context parallelism already this rank's rows
        return pack_tables(tables), coords[None, :, None]

    def global_coords(self, args, kwargs) -> torch.Tensor:
        """The whole grid's coordinates (what scheduled encodings measure their extents on), built afresh: under
        context parallelism no rank keeps them."""
        hidden_states = kwargs.get("hidden_states", args[0] if args else None)
        return video_grid(*self.grid(hidden_states), device=hidden_states.device)


def wan_stock_rotation(query, key, rotary_emb, layer):
    return _wan_rotate(query, *rotary_emb), _wan_rotate(key, *rotary_emb)


def _wan_rotate(x, freqs_cos, freqs_sin):
    """``WanAttnProcessor``'s nested ``apply_rotary_emb``, expression for expression."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class WanPEAttnProcessor(PEProcessor):
    """``WanAttnProcessor`` (self-attention, I2V image branch included) with the rotation from mmpos."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        encoder_hidden_states_img = None
        if attn.add_k_proj is not None:
            image_context_length = encoder_hidden_states.shape[1] - 512  # the stock processor's constant
            encoder_hidden_states_img = encoder_hidden_states[:, :image_context_length]
            encoder_hidden_states = encoder_hidden_states[:, image_context_length:]

        query, key, value = transformer_wan._get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))

        if rotary_emb is not None:
            query, key = self.rotation(query, key, rotary_emb, self.layer)

        hidden_states_img = None
        if encoder_hidden_states_img is not None:
            key_img, value_img = transformer_wan._get_added_kv_projections(attn, encoder_hidden_states_img)
            key_img = attn.norm_added_k(key_img).unflatten(2, (attn.heads, -1))
            value_img = value_img.unflatten(2, (attn.heads, -1))
            hidden_states_img = self._attend(query, key_img, value_img, None, None).flatten(2, 3).type_as(query)

        parallel_config = self._parallel_config if encoder_hidden_states is None else None
        hidden_states = self._attend(query, key, value, attention_mask, parallel_config)
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        if hidden_states_img is not None:
            hidden_states = hidden_states + hidden_states_img
        return attn.to_out[1](attn.to_out[0](hidden_states))


def _processor():
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    return WanAttnProcessor


def _self_attention(model):
    return [(f"blocks.{i}.attn1", block.attn1) for i, block in enumerate(model.blocks)]


def _axes_dims(model):
    rope = model.rope
    return (int(rope.t_dim), int(rope.h_dim), int(rope.w_dim))


def _seam(model, stock, encodings, native, coord_axes):
    probe = getattr(stock, "freqs_cos", None)
    native_dtype = probe.dtype if probe is not None else torch.float32
    return WanPositions(encodings, native, coord_axes, model.config.patch_size, native_dtype)


def _processors(beneath, rotation, native):
    return processors_beneath(beneath, wan_stock_rotation if native else rotation, lambda _: WanPEAttnProcessor)


def _global_coords(seam, args, kwargs):
    return seam.global_coords(args, kwargs)


check_no_sharded_seam = refuse_after_parallelism("rope")  # Wan's plan hooks the position module itself


WAN = register_family(
    Family(
        name="wan",
        classes=("diffusers.models.transformers.transformer_wan:WanTransformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=_axes_dims,
        native_theta=lambda model: 10000.0,  # WanRotaryPosEmbed's default; the model never passes another
        image_axes=(1, 2),
        time_axis=0,
        timestep_per_sigma=1000.0,  # WanPipeline passes the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 1),
        tier=2,
        attention_modules=_self_attention,
        stock_processor=_processor,
        make_processors=_processors,
        make_seam=_seam,
        check_model=check_no_sharded_seam,
        global_coords=_global_coords,
        context_parallel=True,  # tests/integrations/test_context_parallel.py
        pipelines=("WanPipeline", "WanImageToVideoPipeline"),
        train_size=832,
        pixels_per_token=16,
        notes="any rotary encoding, camera adapters; TI2V per-token timesteps: sigma from the noisy tokens",
    )
)
