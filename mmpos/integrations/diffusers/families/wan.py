"""The families of Wan's rope (``WanRotaryPosEmbed`` and its copies) on the latents' patch grid ``(t, row, col)``.

One module, one generalisation: :func:`register_wan_family` registers a class whose ``rope`` is Wan's.

* Tier 2 (the seam :class:`WanPositions` and the processors :class:`WanPEAttnProcessor` on every self-attention
  layer, ``blocks.*.attn1`` and VACE's ``vace_blocks.*.attn1``; any rotary encoding installs, and on ``wan`` the
  camera adapters): ``wan`` (Wan 2.1 / 2.2 T2V, I2V, TI2V, V2V, Lucy Edit), ``wan_vace`` (imports Wan's rope),
  ``wan_animate`` (a copy), ``chronoedit`` (a copy whose two-frame input, the image and its edit, sits at times ``0`` and
  ``temporal_skip_len - 1``).
* Tier 1 (the stock processors stay; the tables rebuilt from positions as for SkyReels-V2, whose rope is also
  Wan's): ``sana_video`` (SANA-Video's linear attention rotates with the stock ``(cos, sin)``).

Wan 2.2 TI2V passes per-token timesteps (``expand_timesteps``) with the pinned first frame at 0: the step's sigma is
read from the noisy tokens (:meth:`~.base.Family.sigma`).
"""

from __future__ import annotations

import importlib
from functools import partial
from typing import Callable, Optional

import torch
from diffusers.models.transformers import transformer_wan

from ....coords.grids import grid_rows, video_grid
from ....ops.tables import KeyedCache, RotaryTable, library_owned
from .. import context_parallel
from ..context_parallel import refuse_after_parallelism
from ..positions import PositionSeam, pack_tables
from ..processors import PEProcessor, processors_beneath
from . import register_family
from .base import CameraSite, CastFollowingSeam, Family
from .skyreels_v2 import skyreels_tables


class WanPositions(PositionSeam):
    """Replaces ``WanTransformer3DModel.rope``: latents ``[B, C, F, H, W]`` -> tables of the patch grid.

    ``native_dtype`` follows the model's casts like the stock module's fp32 buffers do (``_keep_in_fp32_modules``
    keeps it fp32 under ``from_pretrained(torch_dtype=...)``; ``model.to(torch.bfloat16)`` makes it bf16).
    ``frame_step(frames) -> float``: the time between consecutive latent frames (ChronoEdit's two-frame input:
    ``temporal_skip_len - 1``); default 1.
    """

    def __init__(self, encodings, native, coord_axes, patch_size, native_dtype=torch.float32, frame_step=None):
        super().__init__(encodings, native, coord_axes)
        self.patch_size = tuple(int(p) for p in patch_size)
        self.frame_step: Optional[Callable[[int], float]] = frame_step
        self.register_buffer("native_dtype_probe", torch.zeros((), dtype=native_dtype), persistent=False)
        self._grid_cache = KeyedCache(max_entries=4)

    def grid_coords(self, grid: tuple[int, int, int], device, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """``video_grid`` coordinates (``rows``: only rows ``start:stop``), the same tensor while the grid, rows and
        device stay (table cache hits by identity: no value comparison, no device sync per step); built afresh while
        ``torch.compile`` traces (the graph holds no cache lookup or mode query)."""
        if torch.compiler.is_compiling():
            return library_owned(self.fresh_coords(grid, rows, device))
        key = (grid, rows, torch.device(device), torch.is_inference_mode_enabled())
        return self._grid_cache.get(key, lambda: library_owned(self.fresh_coords(grid, rows, device)))

    def fresh_coords(self, grid: tuple[int, int, int], rows: tuple[int, int] | None, device=None) -> torch.Tensor:
        """The grid's coordinates, or rows ``start:stop`` of them (built without the others)."""
        coords = video_grid(*grid, device=device) if rows is None else grid_rows(grid, *rows, device=device)
        step = 1.0 if self.frame_step is None else float(self.frame_step(grid[0]))
        if step != 1.0:
            coords[:, 0] *= step
        return coords

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
        self.count_forward()
        grid = self.grid(hidden_states)
        if not self.encodings:
            return None
        rows = self.own_rows(grid)
        if self.native:  # the stock module computes its tables on the CPU at init: so do we, then cache
            dtype, device = self.native_dtype_probe.dtype, hidden_states.device
            return self.memo((grid, rows, dtype, device), lambda: self._native_tables(grid, rows, dtype, device))
        coords = self.grid_coords(grid, hidden_states.device, rows)
        tables = self.tables(coords, self.run_dtype(hidden_states.dtype, hidden_states.device))
        if not all(isinstance(t, RotaryTable) for t in tables):
            return tables  # not packed (a LayerTables tuple): under context parallelism already this rank's rows
        return pack_tables(tables), coords[None, :, None]

    def _native_tables(self, grid, rows, dtype, device):
        """The stock ``(cos, sin)`` ``[1, L, 1, D]`` of the grid (this rank's ``rows``) in ``dtype`` on ``device``."""
        cos, sin = self.native_cos_sin(self.fresh_coords(grid, rows), dtype, device)
        return cos[None, :, None], sin[None, :, None]

    def global_coords(self, args, kwargs) -> torch.Tensor:
        """The whole grid's coordinates (what scheduled encodings measure their extents on), built afresh: under
        context parallelism no rank keeps them."""
        hidden_states = kwargs.get("hidden_states", args[0] if args else None)
        return self.fresh_coords(self.grid(hidden_states), None, hidden_states.device)


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
        video = encoder_hidden_states is None
        hidden_states = self._attend(query, key, value, attention_mask, parallel_config, video=video)
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        if hidden_states_img is not None:
            hidden_states = hidden_states + hidden_states_img
        return attn.to_out[1](attn.to_out[0](hidden_states))


def wan_self_attention(model) -> list:
    """Every self-attention layer (the ones the rope reaches): ``blocks.*.attn1``, then VACE's ``vace_blocks.*.attn1``."""
    return [
        (f"{group}.{i}.attn1", block.attn1)
        for group in ("blocks", "vace_blocks")
        for i, block in enumerate(getattr(model, group, ()))
    ]


def wan_axes_dims(model) -> tuple[int, int, int]:
    """Wan's channels per axis ``(t, row, col)``: ``h = w = 2 * (head_dim // 6)``, the rest on time."""
    head_dim = int(model.config.attention_head_dim)
    h_dim = w_dim = 2 * (head_dim // 6)
    return (head_dim - h_dim - w_dim, h_dim, w_dim)


def _stock_processor(module: str):
    """The module's ``WanAttnProcessor`` (Wan Animate and ChronoEdit carry copies; VACE uses Wan's)."""
    return importlib.import_module(f"diffusers.models.transformers.{module}").WanAttnProcessor


def _seam(frame_step, model, stock, encodings, native, coord_axes):
    probe = getattr(stock, "freqs_cos", None)
    native_dtype = probe.dtype if probe is not None else torch.float32
    step = None if frame_step is None else partial(frame_step, stock)
    return WanPositions(encodings, native, coord_axes, model.config.patch_size, native_dtype, step)


def _processors(beneath, rotation, native):
    return processors_beneath(beneath, wan_stock_rotation if native else rotation, lambda _: WanPEAttnProcessor)


def wan_latent_grid(model, args, kwargs) -> tuple[int, int, int]:
    """The patch grid of the forward's latents ``hidden_states [B, C, F, H, W]``."""
    hidden_states = kwargs.get("hidden_states", args[0] if args else None)
    return tuple(n // int(p) for n, p in zip(hidden_states.shape[2:], model.config.patch_size))


def _global_coords(seam, args, kwargs):
    return seam.global_coords(args, kwargs)


check_no_sharded_seam = refuse_after_parallelism("rope")  # Wan's plan hooks the position module itself


def register_wan_family(
    name: str,
    module: str,
    class_name: str,
    pipelines: tuple[str, ...],
    notes: str,
    tier: int = 2,
    context_parallel: bool = False,
    frame_step: Optional[Callable] = None,
    check_model: Optional[Callable] = None,
    timestep_index: int = 1,
    train_size: int = 832,
    attention_rules: bool = False,
    camera: bool = False,
) -> Family:
    """Register the family of ``diffusers.models.transformers.{module}:{class_name}``, whose ``rope`` is Wan's.

    Tier 2: :class:`WanPositions` and :class:`WanPEAttnProcessor` over :func:`wan_self_attention` (``frame_step(stock
    rope, frames)``: the seam's time step between latent frames); tier 1: SkyReels-V2's tables (the stock format
    ``(cos, sin) [1, F * H * W, 1, head_dim]`` from positions). The pipelines pass ``timestep = 1000 sigma``.
    ``attention_rules``: UltraViCo and FreeLOC (:mod:`..attention_rules`) through the tier-2 processors.
    ``check_model`` defaults, for a family verified under diffusers' context parallelism (``context_parallel``:
    Wan's plan, which hooks ``rope``), to refusing ``set_pe`` on a model already parallel; an unverified family is
    refused there by name (:mod:`..parallelism`). ``camera``: camera adapters act on :func:`wan_self_attention`.
    """
    if check_model is None and context_parallel:
        check_model = check_no_sharded_seam
    tier2 = dict(
        attention_modules=wan_self_attention,
        stock_processor=partial(_stock_processor, module),
        make_processors=_processors,
        make_seam=partial(_seam, frame_step),
        global_coords=_global_coords,
    )
    family = Family(
        name=name,
        classes=(f"diffusers.models.transformers.{module}:{class_name}",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=wan_axes_dims,
        native_theta=lambda model: 10000.0,  # the rope's default; the models never pass another
        image_axes=(1, 2),
        time_axis=0,
        timestep_per_sigma=1000.0,  # the pipelines pass the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", timestep_index),
        tier=tier,
        check_model=check_model,
        context_parallel=context_parallel,
        pipelines=pipelines,
        train_size=train_size,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes=notes,
        latent_grid=wan_latent_grid if attention_rules or camera else None,
        camera=CameraSite() if camera else None,
        **(tier2 if tier == 2 else dict(tables=skyreels_tables, make_seam=partial(_tier1_seam, name))),
    )
    return register_family(family)


def _tier1_seam(name, model, stock, encodings, native, coord_axes):
    from . import get_family

    (encoding,) = encodings
    return CastFollowingSeam(get_family(name), encoding, stock, wan_axes_dims(model), 10000.0, probe="freqs_cos")


def chronoedit_frame_step(rope, frames: int) -> float:
    """ChronoEdit's rope puts a two-frame input at times ``0`` and ``min(temporal_skip_len, max_seq_len) - 1``."""
    return float(min(rope.temporal_skip_len, rope.max_seq_len) - 1) if frames == 2 else 1.0


def check_chronoedit(model) -> None:
    """ChronoEdit's rope builds its axes with ``2 * (head_dim // 6)`` channels and splits them with ``head_dim // 3``:
    they agree unless ``head_dim % 6 >= 3`` (then the stock tables mix axes; refused)."""
    head_dim = int(model.config.attention_head_dim)
    if head_dim // 3 != 2 * (head_dim // 6):
        raise ValueError(
            f"ChronoEdit with attention_head_dim={head_dim}: its rope builds {2 * (head_dim // 6)} channels per image "
            f"axis but splits {head_dim // 3}, mixing axes; set_pe supports head dims with head_dim % 6 < 3 (128)"
        )
    check_no_sharded_seam(model)


WAN = register_wan_family(
    "wan",
    "transformer_wan",
    "WanTransformer3DModel",
    ("WanPipeline", "WanImageToVideoPipeline", "WanVideoToVideoPipeline", "LucyEditPipeline"),
    "any rotary encoding, camera adapters; TI2V per-token timesteps: sigma from the noisy tokens",
    context_parallel=True,  # tests/integrations/test_context_parallel.py
    attention_rules=True,
    camera=True,
)
WAN_VACE = register_wan_family(
    "wan_vace",
    "transformer_wan_vace",
    "WanVACETransformer3DModel",
    ("WanVACEPipeline",),
    "any rotary encoding; the VACE blocks' self-attention too (control tokens on the latents' grid)",
    attention_rules=True,
)
WAN_ANIMATE = register_wan_family(
    "wan_animate",
    "transformer_wan_animate",
    "WanAnimateTransformer3DModel",
    ("WanAnimatePipeline",),
    "any rotary encoding; the reference frame is latent frame 0 (face adapter blocks: no positions)",
    attention_rules=True,
)
CHRONOEDIT = register_wan_family(
    "chronoedit",
    "transformer_chronoedit",
    "ChronoEditTransformer3DModel",
    ("ChronoEditPipeline",),
    "any rotary encoding; a two-frame input (image, edit) at times 0 and temporal_skip_len - 1",
    frame_step=chronoedit_frame_step,
    check_model=check_chronoedit,
    context_parallel=True,  # its plan is Wan's: tests/integrations/test_context_parallel.py
)
SANA_VIDEO = register_wan_family(
    "sana_video",
    "transformer_sana_video",
    "SanaVideoTransformer3DModel",
    ("SanaVideoPipeline", "SanaImageToVideoPipeline"),
    "Wan's rope in linear attention: the stock processors read the rebuilt tables",
    tier=1,
    timestep_index=2,
    train_size=720,  # 480p / 720p
)
