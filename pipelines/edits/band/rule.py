"""RoPE band modulation (Untwisting RoPE, arXiv 2602.05013): rescale the magnitude of reference keys per pair.

The band law (per-pair scale ``s_d`` from the pair's place in its axis' ladder) is the library's
(:mod:`mmpos.spectrum.bands`); it is a per-pair magnitude of the spectrum, so the rules apply it by rotating the
reference keys with the layer's table scaled per pair (:func:`~mmpos.integrations.diffusers.layer_rotation
.scale_pairs`), with the mmpos operator. ``s_hf`` and ``s_lf`` move linearly from their start to their end value
over the denoising steps. Only reference *image* keys are scaled; queries, values, text keys and target keys are
untouched.

Two rules:
- :class:`SharedBandAttention` (text-to-image, StyleAligned-style batch ``[reference, target_1 .. target_n]``):
  the reference attends to itself only (its trajectory is the stock one); each target attends to its own keys
  plus the reference's scaled image keys, never to other targets.
- :class:`ContextBandScaling` (Kontext): the reference is the in-sequence context image; its keys are scaled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from mmpos._validation import check_choice, check_finite_fields
from mmpos.integrations.diffusers.layer_rotation import LayerRotation, scale_pairs, sequence_slice
from mmpos.ops.tables import RotaryTable
from mmpos.spectrum import chunked_spectrum
from mmpos.spectrum.bands import AXIS0_MODES, band_channel_scales, band_scale_per_pair


@dataclass
class BandConfig:
    """Hyperparameters of band modulation (defaults: the "paper-aligned" values of the spec, section 2.4).

    ``strength`` blends every scale toward 1 (``1 + strength * (s - 1)``): 0 means unscaled keys.
    ``window`` is the active part of the run in step progress ``i / (N - 1)``; ``layers`` selects attention layers
    (see :func:`mmpos.pipelines.edits.processor.select_layers`).
    """

    s_hf: tuple = (0.25, 0.75)
    s_lf: tuple = (1.0, 1.4)
    beta: float = 2.0
    strength: float = 1.0
    axis0_mode: str = "low"
    spatial_axes: tuple = (1, 2)
    window: tuple = (0.0, 1.0)
    layers: object = "all"
    adain_qk: bool = False
    share_text: bool = False
    enabled: bool = True

    def __post_init__(self):
        check_finite_fields(self)
        check_choice("axis0_mode", self.axis0_mode, AXIS0_MODES)
        for name in ("s_hf", "s_lf", "window"):
            value = tuple(float(v) for v in getattr(self, name))
            if len(value) != 2:
                raise ValueError(f"{name} must be a (start, end) pair, got {getattr(self, name)!r}")
            setattr(self, name, value)
        if not 0.0 <= self.window[0] <= self.window[1] <= 1.0:
            raise ValueError(f"window={self.window}: expected 0 <= start <= end <= 1 (step progress)")
        if self.strength < 0:
            raise ValueError(f"strength must be >= 0, got {self.strength}")
        if self.share_text:
            raise NotImplementedError("share_text=True (sharing the reference's text keys) is not implemented")

    def endpoints(self, progress: float) -> tuple[float, float]:
        """``(s_hf, s_lf)`` at step progress ``p`` (linear from start to end), before ``strength``."""
        lerp = lambda pair: pair[0] + (pair[1] - pair[0]) * progress  # noqa: E731
        return lerp(self.s_hf), lerp(self.s_lf)

    def channel_scales(self, axes_dims, progress: float) -> torch.Tensor:
        """Per-channel scales ``[head_dim]`` float64 (chunked ``axes_dims``) at step progress, after ``strength``."""
        s_hf, s_lf = self.endpoints(progress)
        scales = band_channel_scales(axes_dims, s_hf, s_lf, self.beta, self.spatial_axes, self.axis0_mode)
        return 1.0 + self.strength * (scales - 1.0)

    def pair_scales(self, axis_of_pair: torch.Tensor, progress: float) -> torch.Tensor:
        """Per-pair scales ``[P]`` float64 of a spectrum (its ``axis_of_pair``) at step progress, after ``strength``."""
        s_hf, s_lf = self.endpoints(progress)
        scales = band_scale_per_pair(axis_of_pair, s_hf, s_lf, self.beta, self.spatial_axes, self.axis0_mode)
        return 1.0 + self.strength * (scales - 1.0)

    def in_window(self, progress: Optional[float]) -> bool:
        p = 0.0 if progress is None else progress
        return self.enabled and self.window[0] <= p <= self.window[1]


def adain(x: torch.Tensor, reference: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Match per (head, channel) token statistics of ``x`` ``[B, S, H, D]`` to ``reference`` ``[1|B, S', H, D]``."""
    mean, std = x.mean(1, keepdim=True), x.std(1, keepdim=True)
    ref_mean, ref_std = reference.mean(1, keepdim=True), reference.std(1, keepdim=True)
    return (x - mean) / (std + eps) * ref_std + ref_mean


class _BandRule:
    def __init__(self, config: BandConfig, axes_dims: Sequence[int]):
        self.config = config
        self.axes_dims = tuple(axes_dims)
        self.stock_axis_of_pair = chunked_spectrum(self.axes_dims).axis_of_pair

    def stock_pair_scales(self, context) -> torch.Tensor:
        """Per-pair scales ``[P]`` float64 of the stock (chunked ``axes_dims``) spectrum at the context's step."""
        return self._per_forward(
            context, ("stock",), None, lambda: self.config.pair_scales(self.stock_axis_of_pair, _progress(context))
        )

    def pair_scales(self, context, rotation: LayerRotation) -> torch.Tensor:
        """Per-pair scales ``[P]`` float64 of the layer's spectrum (the ``set_pe`` encoding's, else the stock
        chunked one) at the context's step."""
        if rotation.axis_of_pair is None:
            return self.stock_pair_scales(context)
        return self._per_forward(
            context, ("pairs",), rotation, lambda: self.config.pair_scales(rotation.axis_of_pair, _progress(context))
        )

    def band_table(self, context, rotation: LayerRotation, tokens: slice, sample: int = 0):
        """The layer's table at ``tokens`` (of batch element ``sample`` where the table is per sample: Z-Image)
        with the band law in each pair's magnitude (built once per forward for the layers that share a table)."""
        return self._per_forward(
            context,
            ("table", tokens.start, tokens.stop, sample),
            rotation,
            lambda: scale_pairs(sample_rows(rotation.table, tokens, sample), self.pair_scales(context, rotation)),
        )

    def _per_forward(self, context, key: tuple, rotation, build):
        """``build()`` once per forward (the pre-forward hook clears ``context.cache``) and per ``rotation`` (held
        in the cache with the value, so that its id is not reused)."""
        key = ("band", id(self), id(rotation)) + key
        cached = context.cache.get(key)
        if cached is None or cached[0] is not rotation:
            cached = context.cache[key] = (rotation, build())
        return cached[1]


def sample_rows(table: RotaryTable, tokens: slice, sample: int = 0) -> RotaryTable:
    """The rows ``tokens`` of ``table``; of batch element ``sample`` only for a per-sample table ``[B, G, S, P]``."""
    rows = sequence_slice(table, tokens)
    if rows.cis.dim() == 4 and rows.cis.shape[0] > 1:
        rows = RotaryTable(rows.cis[sample : sample + 1])
    return rows


def _progress(context) -> float:
    return 0.0 if context.progress is None else context.progress


class SharedBandAttention(_BandRule):
    """Shared attention with band-modulated reference keys; batch element 0 is the reference.

    With ``context.group_size = n`` (a pipeline that batches its CFG branches: Z-Image), the batch is groups of
    ``n`` elements ``[reference, target, ...]``, each shared within itself.
    """

    def is_active(self, context) -> bool:
        return self.config.in_window(context.progress)

    def adain(self, query, key, context):
        """``adain_qk``: the targets' image q and k matched to the reference's (before RoPE)."""
        return self.adain_segments(query, key, context.segments)

    def adain_segments(self, query, key, segments):
        """``adain_qk`` on q, k ``[B, S, H, D]`` with the sequence's ``segments``: the targets' image tokens."""
        if not self.config.adain_qk:
            return query, key
        return _adain_targets(query, segments.image), _adain_targets(key, segments.image)

    def attend_call(self, call, context):
        """The rule on one layer call (:class:`~mmpos.pipelines.edits.families.LayerCall`, any family)."""
        batch = call.query.shape[0]
        size = getattr(context, "group_size", None) or batch
        if batch % size or size < 2:
            raise ValueError(
                "shared band attention needs a batch of [reference, target, ...]; got batch size "
                f"{batch}" + (f" in groups of {size}" if size != batch else "")
            )
        groups = batch // size
        outs = [self._group(call, context, slice(g * size, (g + 1) * size)) for g in range(groups)]
        out = outs[0] if groups == 1 else torch.cat(outs, dim=0)
        return call.finish(out, call.query.dtype)

    def _group(self, call, context, group: slice) -> torch.Tensor:
        image, rotation, mask = call.segments.image, call.rotation, call.key_mask
        query, key, value = call.query[group], call.key[group], call.value[group]
        query, key = self.adain_segments(query, key, call.segments)
        ref_key = rotation(key[:1, image], self.band_table(context, rotation, image, group.start))
        query, key = _rotate_rows(rotation, query, group), _rotate_rows(rotation, key, group)
        targets = query.shape[0] - 1
        shared_key = torch.cat([key[1:], ref_key.expand(targets, -1, -1, -1)], dim=1)
        shared_value = torch.cat([value[1:], value[:1, image].expand(targets, -1, -1, -1)], dim=1)
        mask = None if mask is None else mask[group]
        shared_mask = (
            None if mask is None else torch.cat([mask[1:], mask.new_ones(targets, image.stop - image.start)], dim=1)
        )
        reference_out = call.attend(query[:1], key[:1], value[:1], None if mask is None else mask[:1])
        target_out = call.attend(query[1:], shared_key, shared_value, shared_mask)
        return torch.cat([reference_out, target_out], dim=0)


def _rotate_rows(rotation: LayerRotation, x: torch.Tensor, group: slice) -> torch.Tensor:
    """``x`` (the batch elements ``group``) rotated by the layer's table (its rows ``group`` if per sample)."""
    cis = rotation.table.cis
    if cis.dim() == 4 and cis.shape[0] > 1:
        return rotation(x, RotaryTable(cis[group]))
    return rotation(x)


def _adain_targets(x: torch.Tensor, image: slice) -> torch.Tensor:
    """AdaIN of the targets' image tokens toward the reference's (element 0), before RoPE."""
    targets = adain(x[1:, image], x[:1, image])
    return torch.cat([x[:1], torch.cat([x[1:, : image.start], targets, x[1:, image.stop :]], dim=1)], dim=0)


class ContextBandScaling(_BandRule):
    """Kontext variant: scale the keys of the in-sequence context image (the reference)."""

    def is_active(self, context) -> bool:
        if not self.config.in_window(context.progress) or context.segments is None:
            return False
        if context.segments.context_len == 0:
            return False
        return self.config.adain_qk or not bool((self.stock_pair_scales(context) == 1).all())

    def adain(self, query, key, context):
        """``adain_qk``: the target image's q and k matched to the context image's (before RoPE)."""
        return self.adain_segments(query, key, context.segments)

    def adain_segments(self, query, key, seg):
        """``adain_qk`` on q, k ``[B, S, H, D]`` with the sequence's segments ``seg``: the target image's tokens."""
        if not self.config.adain_qk:
            return query, key
        return _adain_target_to_context(query, seg), _adain_target_to_context(key, seg)

    def key_table(self, context, rotation: LayerRotation, segments=None) -> RotaryTable:
        """The keys' table: the layer's, band-scaled on the context image's rows (once per forward)."""
        seg = context.segments if segments is None else segments

        def build():
            cis = rotation.table.cis.clone()
            cis[..., seg.context, :] = self.band_table(context, rotation, seg.context).cis
            return RotaryTable(cis)

        return self._per_forward(context, ("keys", seg.context.start, seg.context.stop), rotation, build)

    def attend_call(self, call, context):
        """The rule on one layer call (:class:`~mmpos.pipelines.edits.families.LayerCall`, any family)."""
        rotation = call.rotation
        query, key = self.adain_segments(call.query, call.key, call.segments)
        query, key = rotation(query), rotation(key, self.key_table(context, rotation, call.segments))
        out = call.attend(query, key, call.value, call.key_mask)
        return call.finish(out, query.dtype)


def _adain_target_to_context(x: torch.Tensor, seg) -> torch.Tensor:
    target = adain(x[:, seg.target], x[:, seg.context])
    return torch.cat([x[:, : seg.target.start], target, x[:, seg.target.stop :]], dim=1)
