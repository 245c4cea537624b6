"""Wan-Animate 2 (``WanAnimate2Transformer3DModel``, diffusers' modular ``wan_animate_2`` blocks): its rope is the
method ``_rope_freqs(offsets, device)``.

The method returns one complex table per stream ``[512, d / 2]`` (``d`` the head size): row ``n`` of axis ``a`` is
``polar(1, (n + offsets[a]) * inv_freq)``, ``inv_freq = 1 / 10000 ** (2i / d_a)`` in float64 (complex128), axes
``(t, row, col)`` of ``d - 4 (d // 6), 2 (d // 6), 2 (d // 6)`` channels concatenated; ``rope_apply`` inside the
KV-cache processors indexes it by the token's grid position. The forward calls it for the reference stream (at the
``refer_offset_*`` config offsets) and, under ``kv_cache_mode="cached"``, for the generation stream at ``(0, 0, 0)``.

The seam stands in for the method (``set_pe`` shadows it on the instance, bypassing ``rope_freqs_cache``; ``restore``
removes the shadow). A schedule's extents are the patch grid of the forward's first latent (``hidden_states[0]``
``[C, F, H, W]`` over ``patch_size``). The modular pipeline passes the scheduler's timesteps (``1000 sigma``).
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family, SpectrumSeam
from .codecs import complex_pairs, forward_arg

ROWS = 512  # the stock table's positions per axis


def _axes_dims(model) -> tuple[int, int, int]:
    d = int(model.config.dim) // int(model.config.num_heads)
    return (d - 4 * (d // 6), 2 * (d // 6), 2 * (d // 6))


def wan_animate2_tables(seam, offsets, device):
    """The stock ``_rope_freqs`` output: complex128 ``[512, d / 2]`` on ``device`` for a stream starting at
    ``offsets`` ``(t, row, col)``."""
    if len(offsets) != 3:
        raise ValueError(f"offsets must give (t, row, col), got {offsets!r}")
    pos = torch.arange(ROWS, dtype=torch.float64)[:, None] + torch.tensor(
        [float(o) for o in offsets], dtype=torch.float64
    )
    grid = seam.target_grid
    spectra = seam.axis_spectra(extents=list(grid)) if grid else seam.axis_spectra()
    return complex_pairs(pos, spectra, seam.axes_dims, seam.theta, freqs_dtype=torch.float64).to(device)


class WanAnimate2Seam(SpectrumSeam):
    """The stand-in for ``_rope_freqs``; a call's table also depends on the noted grid (:func:`_note_target_grid`)."""

    def __init__(self, *args, patch_size):
        super().__init__(*args)
        self.patch_size = tuple(int(p) for p in patch_size)
        self.target_grid = None

    def _call_key(self, args, kwargs):
        key = super()._call_key(args, kwargs)
        return None if key is None else (key, self.target_grid)


def _make_seam(model, stock, encodings, native, coord_axes):
    (encoding,) = encodings
    return WanAnimate2Seam(
        WAN_ANIMATE2, encoding, stock, _axes_dims(model), 10000.0, patch_size=model.config.patch_size
    )


def _note_target_grid(seam, args, kwargs) -> None:
    """Record the patch grid ``(F, H, W)`` of the forward's first latent ``[C, F, H, W]``: this forward's extents."""
    latents = forward_arg(args, kwargs, "hidden_states", 0)
    if not latents:
        seam.target_grid = None
        return
    seam.target_grid = tuple(float(n // p) for n, p in zip(latents[0].shape[-3:], seam.patch_size))


WAN_ANIMATE2 = register_family(
    Family(
        name="wan_animate2",
        classes=("diffusers.models.transformers.transformer_wan_animate_2:WanAnimate2Transformer3DModel",),
        position_attr="_rope_freqs",
        axis_names=("t", "row", "col"),
        native_axes_dims=_axes_dims,
        native_theta=lambda model: 10000.0,  # rope_params' default, fixed in the model
        image_axes=(1, 2),
        time_axis=0,
        tables=wan_animate2_tables,
        check_inputs=_note_target_grid,
        make_seam=_make_seam,
        timestep_per_sigma=1000.0,  # the modular pipeline passes the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 1),
        train_size=832,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="the rope is a method of the model (shadowed on the instance) giving 512-row complex tables per "
        "stream offset; reference and generation streams share the spectrum",
    )
)
