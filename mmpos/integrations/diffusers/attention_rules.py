"""Attention rules on a ``set_pe`` model: UltraViCo's decay beyond the training length, on every Wan-rope family.

    from mmpos.integrations.diffusers import set_attention_rule, set_pe
    set_pe(wan, "native")                                   # the stock model (or a spectrum schedule: DyPE, RIFLEx)
    set_attention_rule(wan, {"type": "ultravico", "train_frames": 21, "alpha": 0.9})   # 81 frames at 16 fps

The rule lives in :mod:`mmpos.ops.window_decay` (the math, written once); here a pre-forward hook reads each
forward's frame size (tokens per latent frame) and the families' processors hand their video self-attention to the
rule. Inside the training length (``frames <= train_frames``) the processors run the stock attention, so the model is
``set_pe``'s bit for bit. Families whose processors are mmpos': Wan, Wan VACE, Wan Animate; families with stock
processors (HunyuanVideo 1.5, LTX) are refused by name.
"""

from __future__ import annotations

from typing import Mapping

from torch import nn

from ..._per_thread import PerThread
from ...ops.window_decay import WindowDecay
from .families import family_for
from .installer import ENCODING, ProcessorInstaller
from .processors import PEProcessor

VIDEO_FAMILIES = ("wan", "wan_vace", "wan_animate")
RULES = ("ultravico",)


class VideoRule:
    """A rule and this forward's tokens per latent frame, called by the processors' video self-attention."""

    def __init__(self, decay: WindowDecay):
        self.decay = decay
        self.frame_tokens = PerThread(None)

    def __call__(self, query, key, value, mask, parallel_config):
        frame_tokens = self.frame_tokens.get()
        if frame_tokens is None or not self.decay.active(key.shape[1], frame_tokens):
            return None
        if mask is not None or parallel_config is not None:
            raise ValueError(
                "ultravico: an attention mask or context parallelism with the rule is not supported "
                "(the rule needs the whole video sequence on one device)"
            )
        return self.decay.attend(query, key, value, frame_tokens)


def rule_from_config(config: Mapping | WindowDecay) -> WindowDecay:
    """``{"type": "ultravico", "train_frames": 21, "alpha": 0.9, ...}`` (or a :class:`WindowDecay`) -> the rule."""
    if isinstance(config, WindowDecay):
        return config
    if not isinstance(config, Mapping) or config.get("type") not in RULES:
        raise ValueError(f"rule must be a WindowDecay or a dict with 'type' in {RULES}, got {config!r}")
    options = {k: v for k, v in config.items() if k != "type"}
    known = {"train_frames", "alpha", "isolate_first_frame", "center_keys"}
    if unknown := sorted(set(options) - known):
        raise ValueError(f"ultravico: unknown options {unknown}; expected some of {sorted(known)}")
    if "train_frames" not in options:
        raise ValueError("ultravico needs train_frames (latent frames of the training length; Wan 2.1: 21)")
    return WindowDecay(**options)


def set_attention_rule(transformer: nn.Module, rule) -> nn.Module:
    """Install ``rule`` (see :func:`rule_from_config`) on a model ``set_pe`` prepared; returns the model."""
    family = family_for(transformer)
    if family.name not in VIDEO_FAMILIES:
        raise ValueError(
            f"ultravico: the {family.name} family is not supported (its processors are stock); "
            f"supported: {', '.join(VIDEO_FAMILIES)}"
        )
    processors = encoding_processors(transformer)
    if not processors:
        raise ValueError("set_attention_rule needs set_pe first (set_pe(model, 'native') keeps the stock model)")
    clear_attention_rule(transformer)
    state = VideoRule(rule_from_config(rule))
    for processor in processors:
        processor.attention_rule = state
    patch = tuple(int(p) for p in transformer.config.patch_size)

    def read_frame_size(module, args, kwargs):
        hidden_states = kwargs.get("hidden_states", args[0] if args else None)
        _, _, _, height, width = hidden_states.shape
        state.frame_tokens.set((height // patch[1]) * (width // patch[2]))

    handle = transformer.register_forward_pre_hook(read_frame_size, with_kwargs=True)
    transformer._mmpos_attention_rule = (state, handle, processors)
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
    """Remove :func:`set_attention_rule`'s rule (no-op without one); the processors attend as stock again."""
    installed = getattr(transformer, "_mmpos_attention_rule", None)
    if installed is not None:
        _, handle, processors = installed
        handle.remove()
        for processor in processors:
            processor.attention_rule = None
        del transformer._mmpos_attention_rule
    return transformer
