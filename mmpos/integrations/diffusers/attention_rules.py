"""Attention rules on video models beyond the training length: UltraViCo's decay, FreeLOC's re-encoded time positions.

    from mmpos.integrations.diffusers import set_attention_rule, set_pe
    set_pe(wan, "native")                                   # the stock model (or a spectrum schedule: DyPE, RIFLEx)
    set_attention_rule(wan, {"type": "ultravico", "train_frames": 21, "alpha": 0.9})   # 81 frames at 16 fps
    set_attention_rule(wan, {"type": "freeloc", "train_frames": 21})                    # (one rule at a time)

The rules live in :mod:`mmpos.ops.window_decay` and :mod:`mmpos.ops.frame_reencoding` (the math, written once); here
a pre-forward hook reads each forward's latent grid and the families' processors hand their video self-attention
(with the layer's index) to the rule. FreeLOC moves the time positions of q and k, which arrive rotated: the rule
rotates them further on the time pairs of the encoding's spectrum (resolved at this forward's grid, so a RIFLEx or
DyPE schedule is followed). Inside the training length (``frames <= train_frames``) the processors run the stock
attention, so the model is ``set_pe``'s (or the stock one) bit for bit.

The families say where (``Family.latent_grid``): Wan, Wan VACE and Wan Animate through their mmpos processors; LTX,
whose processors are stock, through rule processors ``set_attention_rule`` installs (``Family.rule_processor``;
UltraViCo only: FreeLOC's time shift reads Wan's rope spectrum). Other families (HunyuanVideo 1.5: joint video and
text attention) are refused by name.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from ..._per_thread import PerThread
from ...coords.grids import video_grid
from ...ops.frame_reencoding import FrameReencoding
from ...ops.rotation import rotate
from ...ops.tables import RotaryTable
from ...ops.window_decay import WindowDecay
from .families import family_for, get_family, list_families
from .installer import ENCODING, ProcessorInstaller
from .processors import PEProcessor

RULES = ("ultravico", "freeloc")


class VideoRule:
    """A rule and this forward's latent grid, called by the processors' video self-attention.

    Args:
        rule: a :class:`WindowDecay` or a :class:`FrameReencoding`.
        shift: ``shift(x, frames, grid)``: ``x [B, L, H, D]`` rotated further in time (FreeLOC).
        layers: the attention layers the rule applies to (``None``: all).
    """

    def __init__(self, rule, shift=None, layers=None):
        self.rule, self.shift = rule, shift
        self.layers = None if layers is None else frozenset(layers)
        self.grid = PerThread(None)

    def __call__(self, query, key, value, mask, parallel_config, layer=None):
        grid = self.grid.get()
        if grid is None or (self.layers is not None and layer not in self.layers):
            return None
        frame_tokens, video_tokens = grid[1] * grid[2], grid[0] * grid[1] * grid[2]
        if not self.rule.active(video_tokens, frame_tokens):
            return None
        name = rule_name(self.rule)
        if parallel_config is not None or key.shape[1] < video_tokens:
            raise ValueError(
                f"{name}: context parallelism with the rule is not supported (the rule needs the whole video "
                "sequence on one device)"
            )
        if isinstance(self.rule, FrameReencoding):
            if mask is not None or key.shape[1] != video_tokens:
                raise ValueError(
                    "freeloc: an attention mask or text tokens in the video self-attention are not supported"
                )
            return self.rule.attend(query, key, value, frame_tokens, lambda x, frames: self.shift(x, frames, grid))
        if mask is not None and mask.dtype != torch.bool:
            raise ValueError(
                f"{name}: an additive attention mask is not supported (a boolean one is), got {mask.dtype}"
            )
        return self.rule.attend(query, key, value, frame_tokens, video_tokens=video_tokens, mask=mask)


def rule_name(rule) -> str:
    return "freeloc" if isinstance(rule, FrameReencoding) else "ultravico"


OPTIONS = {
    "ultravico": {"train_frames", "alpha", "isolate_first_frame", "center_keys"},
    "freeloc": {"train_frames", "near_frames", "far_frames", "near_group", "far_group", "bands", "layers"},
}


def rule_from_config(config: Mapping | WindowDecay | FrameReencoding):
    """``{"type": "ultravico", "train_frames": 21, "alpha": 0.9, ...}``, ``{"type": "freeloc", "train_frames": 21,
    ...}`` (unset windows: :meth:`FrameReencoding.scaled`), or a rule -> ``(rule, layers)``."""
    if isinstance(config, (WindowDecay, FrameReencoding)):
        return config, None
    if not isinstance(config, Mapping) or config.get("type") not in RULES:
        raise ValueError(
            f"rule must be a WindowDecay, a FrameReencoding or a dict with 'type' in {RULES}, got {config!r}"
        )
    kind = config["type"]
    options = {k: v for k, v in config.items() if k != "type"}
    if unknown := sorted(set(options) - OPTIONS[kind]):
        raise ValueError(f"{kind}: unknown options {unknown}; expected some of {sorted(OPTIONS[kind])}")
    if "train_frames" not in options:
        raise ValueError(f"{kind} needs train_frames (latent frames of the training length; Wan 2.1: 21)")
    if kind == "ultravico":
        return WindowDecay(**options), None
    layers = options.pop("layers", None)
    if layers is not None and not (
        isinstance(layers, (list, tuple)) and all(isinstance(i, int) and i >= 0 for i in layers)
    ):
        raise ValueError(f"freeloc: layers must be a list of attention-layer indices, got {layers!r}")
    return FrameReencoding.scaled(**options), layers


def time_shift(transformer: nn.Module, family):
    """``shift(x [B, L, H, D], frames [L], grid) -> x``: ``x`` rotated by ``frames`` more on the time pairs of the
    model's encoding (its spectrum resolved at ``grid``'s coordinates), in the encoding's channel layout."""
    seam = getattr(transformer, family.position_attr)
    encodings = getattr(seam, "encodings", ())
    encoding = encodings[0] if len(encodings) == 1 else None
    if encoding is None or not hasattr(encoding, "spectrum_at") or getattr(seam, "per_layer", False):
        raise ValueError(
            "freeloc needs one axial rotary encoding on the model (set_pe 'native' or 'rope_axial'), got "
            f"{[type(e).__name__ for e in encodings]}"
        )
    time_axis = family.time_axis

    def shift(x: torch.Tensor, frames: torch.Tensor, grid) -> torch.Tensor:
        coords = seam.encoding_coords(video_grid(*grid, device=x.device))
        spectrum = encoding.spectrum_at(coords)
        inv_freq = spectrum.inv_freq.to(x.device, torch.float64)
        on_time = (spectrum.axis_of_pair.to(x.device) == time_axis).to(torch.float64)
        phase = frames.to(torch.float64)[:, None] * (inv_freq * on_time)[None, :]  # [L, P]
        cis = torch.polar(torch.ones_like(phase), phase)
        cis = cis if x.dtype == torch.float64 else cis.to(torch.complex64)
        return rotate(x, RotaryTable(cis), encoding.layout, seq_dim=-3)

    return shift


def set_attention_rule(transformer: nn.Module, rule) -> nn.Module:
    """Install ``rule`` (see :func:`rule_from_config`) on a video model; returns the model. Wan families: on the
    processors ``set_pe`` installed (call it first); families with stock processors (LTX): on rule processors
    installed here (the stock arithmetic, bit for bit within the training length), with or without ``set_pe``."""
    rule, layers = rule_from_config(rule)
    family = family_for(transformer)
    name = rule_name(rule)
    if family.latent_grid is None or (name == "freeloc" and family.rule_processor is not None):
        supported = [f for f in list_families() if get_family(f).latent_grid is not None]
        if name == "freeloc":
            supported = [f for f in supported if get_family(f).rule_processor is None]
        raise ValueError(f"{name}: the {family.name} family is not supported; supported: {', '.join(supported)}")
    clear_attention_rule(transformer)
    installed = False
    if family.rule_processor is not None and not ProcessorInstaller.of(transformer).filled(ENCODING):
        installer = ProcessorInstaller.of(transformer)
        installer.fill(ENCODING, {i: family.rule_processor(slot.original, i) for i, slot in enumerate(installer.slots)})
        installed = True
    processors = encoding_processors(transformer)
    if not processors:
        raise ValueError("set_attention_rule needs set_pe first (set_pe(model, 'native') keeps the stock model)")
    shift = time_shift(transformer, family) if name == "freeloc" else None
    state = VideoRule(rule, shift, layers)
    for processor in processors:
        processor.attention_rule = state

    def read_grid(module, args, kwargs):
        state.grid.set(family.latent_grid(module, args, kwargs))

    handle = transformer.register_forward_pre_hook(read_grid, with_kwargs=True)
    transformer._mmpos_attention_rule = (state, handle, processors, installed)
    return transformer


def encoding_processors(transformer: nn.Module) -> list:
    """The mmpos processors of the encoding level (under a camera adapter or an edit too)."""
    installer = ProcessorInstaller.find(transformer)
    if installer is not None:
        found = [slot.levels.get(ENCODING) for slot in installer.slots]
    else:
        found = list(transformer.attn_processors.values())
    return [p for p in found if isinstance(p, PEProcessor)]


def clear_attention_rule(transformer: nn.Module) -> nn.Module:
    """Remove :func:`set_attention_rule`'s rule (no-op without one); the processors attend as stock again (the rule
    processors it installed give the stock ones back)."""
    installed = getattr(transformer, "_mmpos_attention_rule", None)
    if installed is not None:
        _, handle, processors, own = installed
        handle.remove()
        for processor in processors:
            processor.attention_rule = None
        if own:
            ProcessorInstaller.of(transformer).clear(transformer, ENCODING)
        del transformer._mmpos_attention_rule
    return transformer
