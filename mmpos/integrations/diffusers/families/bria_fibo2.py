"""Bria FIBO 2 (``BriaFibo2Transformer2DModel``, ``BriaFibo2Pipeline``): ``RopeEmbedder`` (Z-Image's) on ``ids [S, 3]``.

The model calls ``rope_embedder(ids)`` twice per forward: on the image tokens (the output image on plane
``p = max_num_gist_tokens + 1``, ids ``(p, row, col)``, then each context image on the next planes) and on the gist
tokens (the Perceiver's text summary, ids ``(1 + g, 0, 0)``). The stock embedder is a plain object that precomputes,
on the CPU, complex64 tables ``polar(1, float32(index * inv_freq))`` (float64 ladder and phases) up to ``axes_lens``
and indexes them; here the same CPU rows are computed for the positions used (:class:`~.codecs.PrecomputedRows`),
so native is the stock table bit for bit and positions past ``axes_lens`` just work. Axes ``(plane, row, col)``,
``axes_dims`` (32, 48, 48), theta 256. Image and context tokens (plane ``>= p``) get the spectrum resolved at the
output image's rows and columns; the gist tokens keep the training spectrum. The pipeline passes
``timestep = sigma`` (1 is noise); the model multiplies by ``t_scale``.
"""

from __future__ import annotations

import torch

from . import register_family
from .base import Family, SpectrumSeam, ids_values_key
from .codecs import complex_pairs, masked_extents, precomputed_rows

_STOCK = dict(freqs_dtype=torch.float64, phase_dtype=torch.float32)  # RopeEmbedder.precompute_freqs_cis


def _make_seam(model, stock, encodings, native, coord_axes):
    (encoding,) = encodings
    seam = SpectrumSeam(BRIA_FIBO2, encoding, stock, BRIA_FIBO2.native_axes_dims(model), float(stock.theta))
    seam.image_plane = int(model.config.max_num_gist_tokens) + 1  # the output image's plane; context images after
    return seam


def fibo2_tables(seam, ids: torch.Tensor) -> torch.Tensor:
    """The stock output: complex64 ``[S, sum(axes_dims) / 2]`` of integer ``ids [S, 3]``."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[-1] != len(seam.axes_dims):
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids has shape {shape}; expected [S, {len(seam.axes_dims)}] integer positions")
    rows = precomputed_rows(seam, **_STOCK)
    is_image = ids[:, 0] >= seam.image_plane
    text = seam.training_spectra()
    image = seam.axis_spectra(extents=lambda: masked_extents(ids.float(), ids[:, 0] == seam.image_plane))
    table = complex_pairs(ids, text, seam.axes_dims, seam.theta, rows=rows, **_STOCK)
    if image is not text and not all(a.is_stock and b.is_stock for a, b in zip(text, image)):
        image_table = complex_pairs(ids, image, seam.axes_dims, seam.theta, rows=rows, **_STOCK)
        table = torch.where(is_image[:, None], image_table, table)
    return table


BRIA_FIBO2 = register_family(
    Family(
        name="bria_fibo2",
        classes=("diffusers.models.transformers.transformer_bria_fibo2:BriaFibo2Transformer2DModel",),
        position_attr="rope_embedder",
        axis_names=("plane", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.axes_dims),
        native_theta=lambda model: float(model.config.rope_theta),
        image_axes=(1, 2),
        tables=fibo2_tables,
        tables_key=ids_values_key,
        make_seam=_make_seam,
        timestep_per_sigma=1.0,  # BriaFibo2Pipeline passes sigma (1 is noise); the model multiplies by t_scale
        timestep_arg=("timestep", 1),
        pipelines=("BriaFibo2Pipeline",),
        train_size=1024,
        pixels_per_token=16,
        notes="Z-Image's CPU-precomputed rows, computed for any position; gist tokens on the training spectrum; "
        "context images on the output's spectrum",
    )
)
