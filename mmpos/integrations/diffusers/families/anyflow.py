"""AnyFlow (``AnyFlowTransformer3DModel``, ``AnyFlowPipeline``: the bidirectional flow-map Wan model):
``AnyFlowRotaryPosEmbed``, Wan's rope on the patch grid.

The model calls ``rope(layout_cfg=..., device=...)`` once per forward with the latents' patch grid (``total_frames``,
``full_frame_shape``). The stock module builds complex128 tables (complex64 where the device has no float64)
``polar(1, index * inv_freq)`` for positions ``0 .. rope_max_seq_len - 1`` on the CPU (``get_1d_rotary_pos_embed``,
float64 ladder ``1 / theta ** (2i / d)``, theta 10000), axes ``(t, row, col)`` with ``h = w = 2 * (head_dim // 6)``
channels, and returns ``{"query": T, "key": T}``, ``T`` ``[1, 1, F * H * W, head_dim / 2]``. Here the same CPU rows
are computed for the grid (:class:`~.codecs.PrecomputedRows`): native is the stock table bit for bit, grids past
``rope_max_seq_len`` just work. Only video tokens are rotated; the schedule's extents are the patch grid. The pipeline
passes per-frame timesteps ``[B, F]`` on the ``[0, 1000]`` scale (context frames at 0): the step's sigma is the
noisiest frame's. The FAR causal model (``AnyFlowFARTransformer3DModel``, compressed-frame chunks) is not covered.
"""

from __future__ import annotations

import torch

from ....ops.tables import device_has_fp64
from . import register_family
from .base import Family
from .codecs import complex_pairs, precomputed_rows


def _axes_dims(model) -> tuple[int, int, int]:
    head_dim = int(model.config.attention_head_dim)
    h_dim = w_dim = 2 * (head_dim // 6)
    return head_dim - h_dim - w_dim, h_dim, w_dim


def anyflow_tables(seam, layout_cfg, device) -> dict:
    """The stock output ``{"query": T, "key": T}``, ``T`` complex ``[1, 1, F * H * W, head_dim / 2]``."""
    try:
        sizes = (int(layout_cfg["total_frames"]), *(int(n) for n in layout_cfg["full_frame_shape"]))
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"layout_cfg must give 'total_frames' and 'full_frame_shape' (rows, cols), got {layout_cfg!r}"
        ) from None
    device = torch.device(device)
    stock = dict(freqs_dtype=torch.float64 if device_has_fp64(device) else torch.float32)
    axes = [torch.arange(n, device=device) for n in sizes]
    pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
    spectra = seam.axis_spectra(extents=[float(n) for n in sizes])
    rows = precomputed_rows(seam, **stock)
    table = complex_pairs(pos, spectra, seam.axes_dims, seam.theta, rows=rows, **stock)[None, None]
    return {"query": table, "key": table}


ANYFLOW = register_family(
    Family(
        name="anyflow",
        classes=("diffusers.models.transformers.transformer_anyflow:AnyFlowTransformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=_axes_dims,
        native_theta=lambda model: float(model.rope.theta),
        image_axes=(1, 2),
        time_axis=0,
        tables=anyflow_tables,
        timestep_per_sigma=1000.0,  # the pipeline passes the scheduler's timesteps (sigma * 1000) per frame
        timestep_arg=("timestep", 1),
        pipelines=("AnyFlowPipeline",),
        train_size=640,  # 480p (832 x 480 ~ 632 x 632)
        pixels_per_token=16,  # 8x VAE, patch 2
        notes="Wan's rope from CPU-precomputed rows, computed for any grid; per-frame timesteps (context frames at 0)",
    )
)
