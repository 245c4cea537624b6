"""JoyImage Edit (``JoyImageEditTransformer3DModel``, ``JoyImageEditPipeline``) and Edit Plus
(``JoyImageEditPlusTransformer3DModel``): their ropes are methods of the model.

Edit calls ``get_rotary_pos_embed(vis_rope_size, txt_rope_size)`` once per forward; Edit Plus calls
``_get_rotary_pos_embed_for_range(start, stop)`` once per component of each sample (the edited image at ``t = 0``,
each reference after it on the time axis; the same arithmetic over ``arange(start, stop)`` per axis): every call of
a forward gets the spectrum resolved at the edited image's grid (``shape_list``'s first component).

The seam stands in for the method (``set_pe`` shadows it on the instance; ``restore`` removes the shadow). The
visual tokens (the edited image and the reference images stacked on the time axis: ``tt x th x tw`` patches) get
``(t, row, col)`` positions from 0 (float32), each axis ``1 / theta ** (2i / d)`` in float32, float32 phases on the
CPU, ``(cos, sin)`` ``[S, sum(rope_dim_list)]`` pairs repeated; axes ``rope_dim_list = (16, 56, 56)``, theta 256.
With ``rope_type="mrope"`` the text tokens get ``max + 1 + j`` on every axis (the training spectrum); with the
default ``"rope"`` they are unrotated (``None``). A schedule's extents are the visual grid. The pipeline passes the
scheduler's timesteps (``1000 sigma``).
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family
from .codecs import cos_sin_repeated, forward_arg


def joyimage_tables(seam, vis_rope_size, txt_rope_size=None):
    """The stock output ``((cos, sin) [S_vis, D], (cos, sin) [S_txt, D] or None)`` float32 on the CPU."""
    sizes = [1] * (3 - len(vis_rope_size)) + [int(n) for n in vis_rope_size]
    if len(sizes) != 3:
        raise ValueError(f"vis_rope_size must give at most 3 sizes (t, rows, cols), got {vis_rope_size!r}")
    axes = [torch.linspace(0, n, n + 1, dtype=torch.float32)[:n] for n in sizes]
    pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
    spectra = seam.axis_spectra(extents=[float(n) for n in sizes])
    vis = cos_sin_repeated(pos, spectra, seam.axes_dims, seam.theta, freqs_dtype=torch.float32)
    if txt_rope_size is None:
        return vis, None
    text = (torch.arange(int(txt_rope_size)) + max(sizes)).float()[:, None].expand(-1, 3)
    txt = cos_sin_repeated(text, seam.training_spectra(), seam.axes_dims, seam.theta, freqs_dtype=torch.float32)
    return vis, txt


JOYIMAGE = register_family(
    Family(
        name="joyimage",
        classes=("diffusers.models.transformers.transformer_joyimage:JoyImageEditTransformer3DModel",),
        position_attr="get_rotary_pos_embed",
        axis_names=("t", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.rope_dim_list),
        native_theta=lambda model: float(model.theta),
        image_axes=(1, 2),
        time_axis=0,
        tables=joyimage_tables,
        timestep_per_sigma=1000.0,  # the pipeline passes the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 1),
        pipelines=("JoyImageEditPipeline",),
        train_size=1024,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="the rope is a method of the model (shadowed on the instance); reference images on the time axis; "
        "mrope text on the training spectrum",
    )
)


def _note_target_grid(seam, args, kwargs) -> None:
    """Record the edited image's patch grid (the first component of the first sample's ``shape_list``): the
    extents of the spectrum every component's rope of this forward gets."""
    shape_list = forward_arg(args, kwargs, "shape_list", 4)
    seam.target_grid = tuple(float(n) for n in shape_list[0][0]) if shape_list else None


def joyimage_plus_tables(seam, start, stop):
    """The stock output ``(cos, sin)`` ``[prod(stop - start), sum(rope_dim_list)]`` float32 on the CPU of the grid
    ``arange(start[a], stop[a])`` per axis ``(t, row, col)``."""
    if len(start) != 3 or len(stop) != 3:
        raise ValueError(f"start and stop must give (t, row, col), got {start!r} and {stop!r}")
    axes = [torch.arange(a, b, dtype=torch.float32) for a, b in zip(start, stop)]
    pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
    grid = getattr(seam, "target_grid", None) or [float(b - a) for a, b in zip(start, stop)]
    spectra = seam.axis_spectra(extents=list(grid))
    return cos_sin_repeated(pos, spectra, seam.axes_dims, seam.theta, freqs_dtype=torch.float32)


JOYIMAGE_EDIT_PLUS = register_family(
    Family(
        name="joyimage_edit_plus",
        classes=("diffusers.models.transformers.transformer_joyimage_edit_plus:JoyImageEditPlusTransformer3DModel",),
        position_attr="_get_rotary_pos_embed_for_range",
        axis_names=("t", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.rope_dim_list),
        native_theta=lambda model: float(model.config.theta),
        image_axes=(1, 2),
        time_axis=0,
        tables=joyimage_plus_tables,
        check_inputs=_note_target_grid,
        timestep_per_sigma=1000.0,  # the pipeline passes the scheduler's timesteps (sigma * 1000)
        timestep_arg=("timestep", 1),
        pipelines=("JoyImageEditPlusPipeline",),
        train_size=1024,
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="the rope is a method (shadowed on the instance), called per component (target, references at later "
        "t): one spectrum per forward, from the target's grid",
    )
)
