"""Cosmos and Anima (``CosmosTransformer3DModel``: Cosmos 1.0, Cosmos-Predict2 / 2.5, Cosmos-Transfer2.5, Anima):
``CosmosRotaryPosEmbed``.

The model calls ``rope(hidden_states, fps=fps)`` once per forward on the latents ``[B, C, T, H, W]``; the module reads
their shape: the patch grid ``(T / p_t, H / p_h, W / p_w)`` from 0. Channels per head: ``d_h = d_w = head_dim // 6 *
2``, ``d_t`` the rest; each axis has its own NTK-scaled base ``10000 * rope_scale[a] ** (d_a / (d_a - 2))`` (Cosmos
``(2, 1, 1)``, Anima ``(1, 4, 4)``): the family's native spectrum is that per-axis theta. Float32 ladders
``1 / theta_a ** (arange(0, d_a, 2) / d_a)``, phases ``outer(position, ladder)``, ``(cos, sin)`` ``[S, head_dim]`` of
``cat([t, h, w] * 2)`` (half layout). With ``fps`` given, the time positions are ``frame / fps * base_fps``
(``base_fps = 24``).

diffusers#14768: the pipelines pass ``fps`` (Cosmos-Predict2 Video2World: 16 by default, so the temporal phases turn
1.5x faster), while the reference code puts this modulation behind ``enable_fps_modulation``, off in the released
Cosmos-Predict2 checkpoints. ``set_pe(model, "native")`` reproduces the stock module, modulation included
(``fps_modulation="stock"``); ``fps_modulation="off"`` gives the reference convention (time positions are frame
indices whatever ``fps`` is passed).

The stock module slices a position table of ``max(max_size) / patch`` entries (a larger grid fails there); the seam
computes the positions, so larger grids run. Schedules read the patch grid in tokens; Cosmos 1.0's learnable absolute
embedding (``extra_pos_embed_type="learnable"``) stays stock. ``timestep`` is read as sigma: Cosmos-Predict2
(``sigma / (sigma + 1)`` of its EDM sigma), 2.5 and Anima (flow sigmas); Cosmos 1.0's EDM timesteps are not in
``[0, 1]`` (a DyPE schedule then runs at full strength).
"""

from __future__ import annotations

import torch

from ....spectrum.allocation import chunked_spectrum
from ..positions import identity_key
from . import register_family
from .base import CameraSite, Family, SpectrumSeam, latent_video_grid
from .codecs import axis_frequencies, ladder

FPS_MODULATION = ("stock", "off")


def _stock(model):
    rope = model.rope
    return rope.stock[0] if isinstance(rope, SpectrumSeam) else rope


def _axes_dims(model):
    rope = _stock(model)
    return (int(rope.dim_t), int(rope.dim_h), int(rope.dim_w))


def _thetas(model):
    rope = _stock(model)
    return tuple(10000.0 * factor for factor in (rope.t_ntk_factor, rope.h_ntk_factor, rope.w_ntk_factor))


class CosmosSeam(SpectrumSeam):
    """A :class:`SpectrumSeam` with one base per axis (the stock NTK-scaled thetas); ``fps_modulation`` is set by
    ``set_pe``."""

    fps_modulation = "stock"

    def __init__(self, family, encoding, stock, axes_dims, thetas):
        super().__init__(family, encoding, stock, axes_dims, thetas[0])
        self.thetas = tuple(float(t) for t in thetas)
        self._plain = chunked_spectrum(self.axes_dims, self.thetas)


def cosmos_tables(seam: CosmosSeam, hidden_states: torch.Tensor, fps=None):
    """The stock ``(cos, sin)`` ``[T H W, head_dim]`` float32 of the latents' patch grid (module docstring)."""
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 5:
        shape = tuple(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else type(hidden_states)
        raise ValueError(f"hidden_states has shape {shape}; expected latents [B, C, T, H, W]")
    rope = seam.stock[0]
    device = hidden_states.device
    sizes = [n // p for n, p in zip(hidden_states.shape[2:], rope.patch_size)]
    spectra = seam.axis_spectra(extents=[float(n) for n in sizes])
    positions = [torch.arange(n, device=device, dtype=torch.float32) for n in sizes]
    if fps is not None and seam.fps_modulation == "stock":
        positions[0] = positions[0] / fps * rope.base_fps
    emb = []
    for axis, (dim, theta, spectrum, pos) in enumerate(zip(seam.axes_dims, seam.thetas, spectra, positions)):
        phases = torch.outer(pos, axis_frequencies(spectrum, dim, theta, torch.float32, device, ladder))
        shape = [1, 1, 1, -1]
        shape[axis] = sizes[axis]
        emb.append(phases.view(*shape).expand(*sizes, -1))
    freqs = torch.cat(emb * 2, dim=-1).flatten(0, 2).float()
    cos, sin = torch.cos(freqs), torch.sin(freqs)
    magnitudes = [s.magnitude for s in spectra]
    if any(m != 1.0 for m in magnitudes):
        scale = torch.cat([torch.full((d // 2,), m, device=device) for d, m in zip(seam.axes_dims, magnitudes)] * 2)
        cos, sin = cos * scale, sin * scale
    return cos, sin


def cosmos_tables_key(seam, hidden_states, fps=None):
    """What :func:`cosmos_tables` reads of the stock call: the latents' shape and device (not their values) and ``fps``
    (by identity); a new latents tensor per step (the model concatenates the padding mask) reuses the tables."""
    if not isinstance(hidden_states, torch.Tensor):
        return identity_key(hidden_states), identity_key(fps)
    return tuple(hidden_states.shape), hidden_states.device, identity_key(fps)


def _make_seam(model, stock, encodings, native, coord_axes):
    (encoding,) = encodings
    return CosmosSeam(COSMOS, encoding, stock, _axes_dims(model), _thetas(model))


COSMOS = register_family(
    Family(
        name="cosmos",
        classes=("diffusers.models.transformers.transformer_cosmos:CosmosTransformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=_axes_dims,
        native_theta=_thetas,
        image_axes=(1, 2),
        time_axis=0,
        tables=cosmos_tables,
        tables_key=cosmos_tables_key,
        make_seam=_make_seam,
        seam_options={"fps_modulation": FPS_MODULATION},
        timestep_per_sigma=1.0,  # Cosmos-Predict2 / 2.5 and Anima pass a timestep in [0, 1]
        timestep_arg=("timestep", 1),
        pipelines=(
            "CosmosTextToWorldPipeline",
            "CosmosVideoToWorldPipeline",
            "Cosmos2TextToImagePipeline",
            "Cosmos2VideoToWorldPipeline",
            "Cosmos2_5_PredictBasePipeline",
            "Cosmos2_5_TransferPipeline",
            "AnimaModularPipeline",
        ),
        train_size=1024,
        pixels_per_token=16,  # VAE 8 x patch 2
        notes="per-axis NTK rope_scale built in; fps_modulation='stock' (diffusers) or 'off' (the checkpoints)",
        attention_modules=lambda model: [
            (f"transformer_blocks.{i}.attn1", b.attn1) for i, b in enumerate(model.transformer_blocks)
        ],
        latent_grid=latent_video_grid,
        camera=CameraSite(),
    )
)
