"""Z-Image (Turbo, Base, Omni; ``ZImageTransformer2DModel``): three axes ``(index, row, col)``, theta 256.

Its ``rope_embedder`` is a plain object (``RopeEmbedder``, not a module), called once per token kind and forward:
on the image ids, on the caption ids and (Omni) on the SigLIP ids, each ``[S, 3]`` int32. It precomputes on the CPU
complex64 tables ``polar(1, float32(p * ladder))`` (float64 ladder and phases) for ``p < axes_lens`` and indexes
them by the ids: the "wall at 2048 px" (row / col ids past ``axes_lens``, 512 tokens by default, fail). The seam
computes the same rows from the positions instead (:class:`~.codecs.PrecomputedRows`), so larger grids just work.
Captions are ``(1 + j, 0, 0)`` and images ``(caption length + 1, row, col)``; padding tokens are ``(0, 0, 0)``. A
schedule reads its scale from each call's rows and columns: captions (extent 1) keep the training spectrum.
The pipelines pass ``t = 1 - sigma`` (time running backwards). Under a ``convention="comfyui"`` schedule the native
seam gives the image tokens ComfyUI-DyPE's fractional rows and columns (:func:`comfyui_positions`).

Tier 2: ``"native"`` (and its spectrum options) rebuilds the stock tables above and keeps the stock
``ZSingleStreamAttnProcessor``; any other rotary encoding runs through :class:`ZImagePEAttnProcessor`. The model
splits each call's tables per sample, pads them (``pad_sequence``, zeros) and concatenates the image and caption
halves along the sequence: :class:`ZImagePositions` returns packed real tables ``[S, G, 2P]``, sequence first, so
those operations give each layer ``[B, L, G, 2P]``, the tables of its padded joint sequence.
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence

from ....ops.tables import RotaryTable
from ....spectrum.schedule import ExtrapolationSchedule
from ..positions import PositionSeam, pack_tables
from ..processors import PEProcessor
from . import register_family
from .base import Family, extents_of, ids_values_key
from .codecs import complex_pairs, precomputed_rows

_STOCK = dict(freqs_dtype=torch.float64, phase_dtype=torch.float32)  # RopeEmbedder.precompute_freqs_cis


def z_image_tables(seam, ids: torch.Tensor) -> torch.Tensor:
    """``RopeEmbedder(ids)``: ``ids [S, 3]`` integer -> complex64 ``[S, sum(axes_dims) / 2]`` on ``ids``' device."""
    if ids.dim() != 2 or ids.shape[-1] != len(seam.axes_dims):
        raise ValueError(f"ids have shape {tuple(ids.shape)}; expected [S, {len(seam.axes_dims)}] (index, row, col)")
    if seam.scheduled and torch.compiler.is_compiling():  # the spectrum the hooks published (z_image_extents)
        positions = _comfyui_positions(seam, ids, seam.encodings[0].compiled_sigma)
        positions = ids if positions is None else positions
        return seam.published_tables(
            ids[:, 1:3], lambda spectra: complex_pairs(positions, spectra, seam.axes_dims, seam.theta, **_STOCK)
        )
    spectra = _spectra(seam, ids)
    positions = _comfyui_positions(seam, ids)
    if positions is not None:  # fractional rows and columns: computed here, not looked up by integer id
        return complex_pairs(positions, spectra, seam.axes_dims, seam.theta, **_STOCK)
    return complex_pairs(ids, spectra, seam.axes_dims, seam.theta, rows=precomputed_rows(seam, **_STOCK), **_STOCK)


def comfyui_positions(
    ids: torch.Tensor, base: float, sigma, exponent: float = 2.0, start_sigma: float = 1.0
) -> torch.Tensor:
    """ComfyUI-DyPE's (v2.3.0) Z-Image positions of image ids ``[S, 3]`` (index, row, col) as float64 ``[S, 3]``.

    Re-implemented from its ``dype_patchify_and_embed`` and ``PosEmbedZImage._resize_rope_grid``: rows and columns at
    the stride ``c = 2 base / max(rows, cols)`` (``base``: the training grid's longest side in tokens; the port's
    latent pixels per token, 2, times the training size over the requested one), then moved back towards the integer
    grid by ``blend = 1 - min(sigma / start_sigma, 1) ** exponent`` (``sigma``: a float or a 0-d tensor, clamped to
    ``[0, 1]``; ``None``: DyPE off, no blend): ``p = c i + ((c i - p0) / c + p0 - c i) blend``, ``p0`` the least
    position of the tokens not at row 0 and column 0 (0 but in one row or column). As the port: an axis at one
    position, ``c`` within ``1e-3`` of 1 or ``blend <= 0.001`` keep the strided positions. Tensor operations only
    (``torch.compile`` traces it with the published sigma)."""
    pos = ids.to(torch.float64)
    image = pos[:, 1:3]
    stride = 2.0 * base / ((image.amax(dim=0) - image.amin(dim=0)).amax() + 1) if image.shape[0] else pos.new_ones(())
    strided = image * stride
    if sigma is None:
        return torch.cat([pos[:, :1], strided], dim=1)
    t = torch.as_tensor(sigma, dtype=torch.float64, device=pos.device).clamp(0.0, 1.0)
    blend = 1.0 - torch.where(t > start_sigma, torch.ones_like(t), t / start_sigma) ** exponent
    mask = (image != 0).any(dim=1, keepdim=True)  # the port's image tokens: not at row 0 and column 0
    low = torch.where(mask, strided, torch.inf).amin(dim=0)
    high = torch.where(mask, strided, -torch.inf).amax(dim=0)
    moves = (high > low) & (blend > 0.001) & ((stride - 1.0).abs() > 1e-3 + 1e-5)
    full = (strided - low) / stride + low
    return torch.cat([pos[:, :1], torch.where(moves, strided + (full - strided) * blend, strided)], dim=1)


def _comfyui_entries(seam) -> list:
    """The seam's schedule entries of ``convention="comfyui"``."""
    schedule = seam.encodings[0].schedule
    entries = getattr(schedule, "entries", ())
    return [e for e in entries if isinstance(e, ExtrapolationSchedule) and e.convention == "comfyui"]


def _comfyui_positions(seam, ids: torch.Tensor, sigma=None):
    """The call's positions under a ``convention="comfyui"`` schedule (:func:`comfyui_positions`: captions' rows and
    columns are 0, they stay), else ``None`` (every other convention and encoding: the ids as they are). ``sigma``:
    the step's (a compiled graph passes the published tensor)."""
    entries = _comfyui_entries(seam)
    if not entries:
        return None
    dynamic = any(e.dynamic for e in entries)
    step_sigma = seam.encodings[0].step.sigma if sigma is None else sigma
    if dynamic and step_sigma is None:
        raise ValueError("Z-Image under convention='comfyui' needs the step's sigma: set encoding.step.sigma")
    base = max(e.original_length for e in entries)
    return comfyui_positions(ids, base, step_sigma if dynamic else None, entries[0].lambda_t, entries[0].start_sigma)


def _spectra(seam, ids: torch.Tensor):
    """Captions (rows and cols all 0) keep the training spectrum; images and SigLIP tokens get the schedule at
    their extent. Without a schedule, no extent is read (no device sync; ``torch.compile`` traces through)."""
    if seam.encodings[0].schedule is None:
        return seam.axis_spectra()
    extents = extents_of(ids) if ids.shape[0] else [0.0] * ids.shape[-1]
    rows, cols = (extents[axis] for axis in Z_IMAGE.image_axes)
    return seam.training_spectra() if max(rows, cols) <= 1 else seam.axis_spectra(extents=extents)


def z_image_inputs(args, kwargs) -> tuple:
    """``(x, cap_feats, patch_size, f_patch_size)`` of a ``ZImageTransformer2DModel.forward`` call, by keyword or
    at their places in its signature (the patch sizes default to 2 and 1)."""

    def arg(name, index, default=None):
        return kwargs.get(name, args[index] if len(args) > index else default)

    return arg("x", 0), arg("cap_feats", 2), arg("patch_size", 7, 2), arg("f_patch_size", 8, 1)


def latent_tokens(latent: torch.Tensor, patch: int, frame_patch: int) -> int:
    """Image tokens of one latent ``[C, F, H, W]`` cut into ``frame_patch x patch x patch`` patches."""
    return (latent.shape[-3] // frame_patch) * (latent.shape[-2] // patch) * (latent.shape[-1] // patch)


def z_image_extents(args, kwargs):
    """The image call's extent per axis in a forward of the basic mode, as :func:`z_image_tables` measures its ids
    (``x``: latents ``[C, F, H, W]``, ``cap_feats``: ``[L, C]``): rows and columns of ``patch_size`` patches, and the
    index axis from the padded caption length to the last frame (from 0 where the image tokens are padded), over the
    batch; ``None`` for other inputs (Omni's nested lists)."""
    from diffusers.models.transformers.transformer_z_image import SEQ_MULTI_OF

    latents, captions, patch, frame_patch = z_image_inputs(args, kwargs)
    if not all(isinstance(v, (list, tuple)) and v for v in (latents, captions)) or len(latents) != len(captions):
        return None
    if not all(isinstance(x, torch.Tensor) and x.dim() == 4 for x in latents):
        return None
    first, last, rows, cols = [], [], [], []
    for x, caption in zip(latents, captions):
        caption_length = len(caption) + (-len(caption)) % SEQ_MULTI_OF
        frames, height, width = x.shape[1] // frame_patch, x.shape[2] // patch, x.shape[3] // patch
        first.append(0 if (frames * height * width) % SEQ_MULTI_OF else caption_length + 1)
        last.append(caption_length + frames)
        rows.append(height)
        cols.append(width)
    return [float(max(last) - min(first) + 1), float(max(rows)), float(max(cols))]


# ---- tier 2: any rotary encoding through mmpos processors ---------------------------------------------------------
class ZImagePositions(PositionSeam):
    """Replaces ``rope_embedder`` for an mmpos encoding: each call (image, caption, SigLIP ids ``[S, 3]``) returns
    the packed tables ``[S, G, 2P]`` (:func:`~..positions.pack_tables`; ``G``: the encodings' groups), or ``[S, 0]``
    for ``"nope"``. A table is per token, so the model's split, padding and concatenation along dim 0 carry it."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.count_forward()
        if ids.dim() != 2 or ids.shape[-1] != 3:
            raise ValueError(f"ids have shape {tuple(ids.shape)}; expected [S, 3] (index, row, col)")
        coords = ids.float()
        if not self.encodings:
            return coords.new_zeros(coords.shape[0], 0)
        tables = self.tables(coords, self.run_dtype(torch.float32, coords.device))
        if not all(isinstance(t, RotaryTable) for t in tables):
            raise TypeError(
                "Z-Image pads and concatenates the tables along the sequence: the encoding must give "
                f"rotary tables (got {[type(t).__name__ for t in tables]})"
            )
        return pack_tables(tables)[0]


def _attention(model):
    """``(name, Attention)`` of every ``ZImageTransformerBlock`` (refiners, then the main layers, in module order)."""
    from diffusers.models.transformers.transformer_z_image import ZImageTransformerBlock

    return [
        (f"{name}.attention", m.attention) for name, m in model.named_modules() if isinstance(m, ZImageTransformerBlock)
    ]


def _stock_processor():
    from diffusers.models.transformers.transformer_z_image import ZSingleStreamAttnProcessor

    return ZSingleStreamAttnProcessor


def _seam(model, stock, encodings, native, coord_axes):
    for encoding in encodings:
        entries = getattr(getattr(encoding, "schedule", None), "entries", ())
        if any(isinstance(e, ExtrapolationSchedule) and e.convention == "comfyui" for e in entries):
            raise ValueError(
                "Z-Image: convention='comfyui' (ComfyUI-DyPE's Z-Image positions) is on the native seam only: "
                "use pe='native' (DyPEConfig's default)"
            )
    return ZImagePositions(encodings, native, coord_axes)


class ZImagePEAttnProcessor(PEProcessor):
    """``ZSingleStreamAttnProcessor`` (self-attention on ``[B, S, H, D]``, optional qk RMS norm) with the rotation
    from mmpos: ``freqs_cis`` is the padded packed tables ``[B, S, G, 2P]`` (``[B, S, 0]``: no encoding)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, freqs_cis=None):
        query = attn.to_q(hidden_states).unflatten(-1, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(-1, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(-1, (attn.heads, -1))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        rotary_emb = (freqs_cis, None) if freqs_cis is not None and freqs_cis.shape[-1] else None
        dtype = query.dtype
        if attention_mask is not None and attention_mask.ndim == 2:  # [B, S] -> [B, 1, 1, S]
            attention_mask = attention_mask[:, None, None, :]
        hidden_states = self._rotate_attend(query, key, value, rotary_emb, attention_mask, self._parallel_config)
        output = attn.to_out[0](hidden_states.flatten(2, 3).to(dtype))
        return attn.to_out[1](output) if len(attn.to_out) > 1 else output


def z_image_bundle_tables(model, args, kwargs, bundle):
    """SPA's tables (:attr:`Family.bundle_tables`) for the basic mode: the seam on the forward's image ids with the
    rows and columns of each of ``bundle``'s grids (all images' together; padding ids ``(0, 0, 0)`` stay), split,
    padded and joined with the captions' tables as the model does: the noise refiner's ``[B, S_img, G, 2P]``, the
    main layers' ``[B, S_img + S_cap, G, 2P]`` (image first); the context refiner (captions only) is stock."""
    latents, captions, patch, frame_patch = z_image_inputs(args, kwargs)
    if not (isinstance(latents, (list, tuple)) and latents and isinstance(latents[0], torch.Tensor)):
        raise ValueError("spa on Z-Image supports its basic mode (x: a list of latents [C, F, H, W]), not Omni's")
    embedded = model.patchify_and_embed(list(latents), list(captions), patch, frame_patch)
    image_ids, caption_ids = embedded[3], embedded[4]
    seam = model.rope_embedder
    caption_tables = seam(torch.cat(caption_ids)).split([len(c) for c in caption_ids])
    caption_tables = [t[: len(c)] for t, c in zip(caption_tables, embedded[1])]  # ids past the padded caption: cut
    image_lengths = [len(i) for i in image_ids]
    whole = torch.cat(image_ids)
    kinds = {layer: name.split(".")[0] for layer, (name, _) in enumerate(_attention(model))}
    refiner, joint = [], []
    for grid in bundle(whole[:, 1:3].float()):
        ids = torch.cat([whole[:, :1], grid.to(whole.dtype)], dim=1)
        images = [t[: len(x)] for t, x in zip(seam(ids).split(image_lengths), embedded[0])]
        refiner.append((pad_sequence(images, batch_first=True), None))
        joined = [torch.cat([i, c]) for i, c in zip(images, caption_tables)]
        joint.append((pad_sequence(joined, batch_first=True), None))
    by_kind = {"noise_refiner": refiner, "layers": joint}
    return lambda layer: by_kind.get(kinds[layer])


def _processors(beneath, rotation, native):
    return {
        layer: ZImagePEAttnProcessor(
            rotation, layer, getattr(stock, "_attention_backend", None), getattr(stock, "_parallel_config", None)
        )
        for layer, (_, stock) in enumerate(beneath)
    }


class _ZImageFamily(Family):
    """Z-Image's config names its heads ``n_heads`` and its width ``dim`` (no ``attention_head_dim``)."""

    def head_dim(self, model) -> int:
        return int(model.config.dim) // int(model.config.n_heads)

    def num_heads(self, model) -> int:
        return int(model.config.n_heads)


Z_IMAGE = register_family(
    _ZImageFamily(
        name="z_image",
        classes=("diffusers.models.transformers.transformer_z_image:ZImageTransformer2DModel",),
        position_attr="rope_embedder",
        axis_names=("index", "row", "col"),
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.axes_dims),
        native_theta=lambda model: float(model.config.rope_theta),
        image_axes=(1, 2),
        tables=z_image_tables,  # native: the stock processors stay
        tables_key=ids_values_key,
        tier=2,  # any other rotary encoding: mmpos processors
        attention_modules=_attention,
        stock_processor=_stock_processor,
        make_processors=_processors,
        make_seam=_seam,
        timestep_per_sigma=-1.0,  # ZImagePipeline passes t = (1000 - timestep) / 1000 = 1 - sigma
        timestep_at_zero_sigma=1.0,
        timestep_arg=("t", 1),
        image_extents=z_image_extents,
        bundle_tables=z_image_bundle_tables,
        pipelines=(
            "ZImagePipeline",
            "ZImageImg2ImgPipeline",
            "ZImageInpaintPipeline",
            "ZImageControlNetPipeline",
            "ZImageControlNetInpaintPipeline",
            "ZImageOmniPipeline",
        ),
        train_size=1024,
        pixels_per_token=16,
        notes="any rotary encoding (native: stock processors); positions past axes_lens (the 2048 px wall) computed, not indexed; t = 1 - sigma",
    )
)
