"""Attention rules on a ``set_pe`` model: UltraViCo's decay beyond the training length (Wan) and UltraImage's
entropy-driven sharpening beyond the training size (FLUX.1, FLUX.2, Chroma, Z-Image).

    from mmpos.integrations.diffusers import set_attention_rule, set_pe
    set_pe(wan, "native")                                   # the stock model (or a spectrum schedule: DyPE, RIFLEx)
    set_attention_rule(wan, {"type": "ultravico", "train_frames": 21, "alpha": 0.9})   # 81 frames at 16 fps
    set_pe(flux, "native")
    set_attention_rule(flux, {"type": "ultraimage", "train_grid": (64, 64)})           # 1024 px trained

The rules live in :mod:`mmpos.ops.window_decay` and :mod:`mmpos.ops.entropy_scaling` (the math, written once); here
a pre-forward hook reads each forward's size (tokens per latent frame, image tokens, the step's sigma) and the
families' processors hand their self-attention to the rule. Inside the training length or size the processors run
the stock attention, so the model is ``set_pe``'s bit for bit. A family whose processors are stock (Qwen-Image,
HunyuanVideo 1.5, LTX) is refused by name.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from ..._per_thread import PerThread
from ...coords.bundles import bundle_variants
from ...ops.entropy_scaling import EntropyScaling
from ...ops.head_scopes import HeadScopes
from ...ops.window_decay import WindowDecay
from .families import family_for
from .installer import ENCODING, ProcessorInstaller
from .processors import PEProcessor

VIDEO_FAMILIES = ("wan", "wan_vace", "wan_animate")
IMAGE_FAMILIES = ("flux", "chroma", "flux2", "z_image")
TEXT_FIRST_FAMILIES = ("flux", "chroma", "flux2")  # joint sequences with the text before the image tokens
FLUX_ID_FAMILIES = ("flux", "chroma")  # FLUX.1's processors and (index, row, col) ids
RULES = {"ultravico": VIDEO_FAMILIES, "ultraimage": IMAGE_FAMILIES, "hap": TEXT_FIRST_FAMILIES, "spa": FLUX_ID_FAMILIES}


class VideoRule:
    """A rule and this forward's tokens per latent frame, called by the processors' video self-attention."""

    def __init__(self, decay: WindowDecay):
        self.decay = decay
        self.frame_tokens = PerThread(None)

    def before_forward(self, transformer, family, args, kwargs) -> None:
        hidden_states = kwargs.get("hidden_states", args[0] if args else None)
        _, _, _, height, width = hidden_states.shape
        patch = tuple(int(p) for p in transformer.config.patch_size)
        self.frame_tokens.set((height // patch[1]) * (width // patch[2]))

    def __call__(self, query, key, value, mask, parallel_config, layer, attend):
        frame_tokens = self.frame_tokens.get()
        if frame_tokens is None or not self.decay.active(key.shape[1], frame_tokens):
            return None
        if mask is not None or parallel_config is not None:
            raise ValueError(
                "ultravico: an attention mask or context parallelism with the rule is not supported "
                "(the rule needs the whole video sequence on one device)"
            )
        return self.decay.attend(query, key, value, frame_tokens)


class ImageRule:
    """UltraImage past ``train_tokens`` image tokens: each layer's per-head factor, measured at the first forward
    of a generation (the noisiest step) and kept for its later steps.

    A generation starts when the forward's sigma is above the previous forward's (or the image size changes);
    forwards without a timestep keep the factors until the size changes. A batch of another size than the one
    measured (a separate unconditional pass) takes the factors again from its own first forward.
    """

    def __init__(self, scaling: EntropyScaling, train_tokens: int):
        self.scaling, self.train_tokens = scaling, train_tokens
        self.state = PerThread(None)  # (image tokens, sigma, {layer: factor [B, H]})

    def before_forward(self, transformer, family, args, kwargs) -> None:
        tokens, sigma = image_tokens(family.name, args, kwargs), family.sigma(args, kwargs)
        previous = self.state.get()
        if previous is None or previous[0] != tokens or (sigma is not None and (previous[1] or -1.0) < sigma):
            self.state.set((tokens, sigma, {}))
        else:
            self.state.set((tokens, sigma if sigma is not None else previous[1], previous[2]))

    def factors(self) -> dict:
        """Each layer's factors ``[B, H]`` of the generation in flight (empty before its first forward)."""
        state = self.state.get()
        return {} if state is None else dict(state[2])

    def __call__(self, query, key, value, mask, parallel_config, layer, attend):
        state = self.state.get()
        if state is None or state[0] is None or state[0] <= self.train_tokens:
            return None
        if parallel_config is not None:
            raise ValueError("ultraimage: context parallelism with the rule is not supported (it measures whole rows)")
        factors = state[2]
        factor = factors.get(layer)
        if factor is None or factor.shape[0] != query.shape[0]:
            factor = factors[layer] = self.scaling.factor(self.scaling.entropy(query, key, key_mask(mask, key)))
        return attend(self.scaling.scale_query(query, factor), key, value, mask, parallel_config)


class PrunedRule:
    """HRDiT's HAP past ``train_tokens`` image tokens: each layer's heads attend within their scopes
    (:class:`~mmpos.ops.head_scopes.HeadScopes`; the text length is this forward's ``encoder_hidden_states``')."""

    def __init__(self, alphas, betas, anchor_stride: int, train_tokens: int):
        self.alphas, self.betas, self.anchor_stride, self.train_tokens = alphas, betas, anchor_stride, train_tokens
        self.state = PerThread(None)  # (image tokens, text tokens)

    def before_forward(self, transformer, family, args, kwargs) -> None:
        text = kwargs.get("encoder_hidden_states")
        self.state.set((image_tokens(family.name, args, kwargs), None if text is None else int(text.shape[1])))

    def scopes(self, layer: int, text_tokens: int) -> HeadScopes:
        if layer >= len(self.alphas):
            raise ValueError(f"hap: the scope plan holds {len(self.alphas)} layers, the model has more")
        return HeadScopes(
            tuple(self.alphas[layer]), tuple(self.betas[layer]), text_tokens, anchor_stride=self.anchor_stride
        )

    def __call__(self, query, key, value, mask, parallel_config, layer, attend):
        state = self.state.get()
        if state is None or state[0] is None or state[0] <= self.train_tokens or state[1] is None:
            return None
        if mask is not None or parallel_config is not None:
            raise ValueError("hap: an attention mask or context parallelism with the rule is not supported")
        return self.scopes(layer, state[1]).attend(query, key, value)


class BundleRule:
    """HRDiT's SPA past ``train_tokens`` image tokens, on a generation's first ``steps`` forwards: the processors
    average their attention over the rotary tables of :func:`~mmpos.coords.bundles.bundle_variants` (the model's
    own position module on ``[txt_ids; bundled img_ids]``)."""

    def __init__(self, group_num: int, steps: int, train_tokens: int):
        self.group_num, self.steps, self.train_tokens = group_num, steps, train_tokens
        self.state = PerThread(None)  # (image tokens, sigma, forwards of this generation, tables or None)

    def before_forward(self, transformer, family, args, kwargs) -> None:
        tokens, sigma = image_tokens(family.name, args, kwargs), family.sigma(args, kwargs)
        previous = self.state.get()
        fresh = previous is None or previous[0] != tokens or (sigma is not None and (previous[1] or -1.0) < sigma)
        count = 0 if fresh else previous[2] + (sigma is None or sigma != previous[1])
        tables = None
        if tokens is not None and tokens > self.train_tokens and count < self.steps:
            text, image = kwargs["txt_ids"], kwargs["img_ids"]
            position = getattr(transformer, family.position_attr)
            grids = bundle_variants(image[:, 1:].round(), self.group_num)
            tables = [position(torch.cat([text, torch.cat([image[:, :1], g], dim=1)])) for g in grids]
        self.state.set((tokens, sigma, count, tables))

    def tables(self):
        state = self.state.get()
        return None if state is None else state[3]

    def __call__(self, query, key, value, mask, parallel_config, layer, attend):
        return None  # SPA acts where the processor rotates (PEProcessor._rotate_attend)


def image_tokens(family: str, args, kwargs) -> int | None:
    """The forward's image tokens: packed ``hidden_states [B, S, C]`` (FLUX.1, FLUX.2, Chroma: ``S``, reference
    images included) or Z-Image's latents (a list of ``[C, F, H, W]``, patches ``f_patch_size x patch_size^2``)."""
    if family == "z_image":
        latents = kwargs.get("x", args[0] if args else None)
        patch, frames = int(kwargs.get("patch_size", 2)), int(kwargs.get("f_patch_size", 1))
        items = latents if isinstance(latents, (list, tuple)) else [latents]
        return max((x.shape[-3] // frames) * (x.shape[-2] // patch) * (x.shape[-1] // patch) for x in items)
    hidden_states = kwargs.get("hidden_states", args[0] if args else None)
    return int(hidden_states.shape[1]) if isinstance(hidden_states, torch.Tensor) else None


def key_mask(mask, key) -> torch.Tensor | None:
    """A boolean key mask ``[B, 1, 1, L]`` / ``[B, L]`` (Z-Image's padded captions) as ``[B, L]``; other masks:
    ValueError."""
    if mask is None:
        return None
    if mask.dtype == torch.bool and mask.shape[-1] == key.shape[1] and mask.numel() == mask.shape[0] * key.shape[1]:
        return mask.reshape(mask.shape[0], key.shape[1])
    raise ValueError(f"ultraimage: only a boolean key mask is supported, got {mask.dtype} {tuple(mask.shape)}")


def rule_from_config(config: Mapping | WindowDecay) -> VideoRule | ImageRule | PrunedRule:
    """``{"type": "ultravico", "train_frames": 21, ...}``, ``{"type": "ultraimage", "train_grid": (64, 64), ...}``,
    ``{"type": "hap", "train_grid": (64, 64), "scope_plan": {"alphas": ..., "betas": ...}, "anchor_stride": 32}``
    (or a :class:`WindowDecay`) -> the rule's state for :func:`set_attention_rule`."""
    if isinstance(config, WindowDecay):
        return VideoRule(config)
    if not isinstance(config, Mapping) or config.get("type") not in RULES:
        raise ValueError(f"rule must be a WindowDecay or a dict with 'type' in {tuple(RULES)}, got {config!r}")
    kind = config["type"]
    options = {k: v for k, v in config.items() if k != "type"}
    if kind == "spa":
        _check_options(
            kind, options, {"train_grid", "group_num", "steps"}, "train_grid", "(rows, cols); FLUX.1: (64, 64)"
        )
        rows, cols = _train_grid(kind, options["train_grid"])
        group_num, steps = options.get("group_num", 80), options.get("steps", 3)
        if not (isinstance(group_num, int) and group_num >= 2 and isinstance(steps, int) and steps >= 0):
            raise ValueError(f"spa: group_num must be an int >= 2 and steps an int >= 0, got {group_num!r}, {steps!r}")
        return BundleRule(group_num, steps, int(rows * cols))
    if kind == "hap":
        _check_options(kind, options, {"train_grid", "scope_plan", "anchor_stride"}, "scope_plan", "alphas, betas")
        plan = options["scope_plan"]
        if not (isinstance(plan, Mapping) and {"alphas", "betas"} <= set(plan)):
            raise ValueError("hap: scope_plan must be {'alphas': [[per head] per layer], 'betas': [[...]]}")
        if "train_grid" not in options:
            raise ValueError("hap needs train_grid ((rows, cols) tokens of the training size; FLUX.1: (64, 64))")
        rows, cols = _train_grid(kind, options["train_grid"])
        return PrunedRule(plan["alphas"], plan["betas"], int(options.get("anchor_stride", 0)), rows * cols)
    if kind == "ultravico":
        known = {"train_frames", "alpha", "isolate_first_frame", "center_keys"}
        _check_options(kind, options, known, "train_frames", "latent frames of the training length; Wan 2.1: 21")
        return VideoRule(WindowDecay(**options))
    known = {"train_grid", "lambda_min", "lambda_max", "h_min", "h_max", "gamma", "block"}
    _check_options(kind, options, known, "train_grid", "(rows, cols) tokens of the training size; FLUX.1: (64, 64)")
    rows, cols = _train_grid(kind, options.pop("train_grid"))
    return ImageRule(EntropyScaling(**options), int(rows * cols))


def _train_grid(kind, grid) -> tuple[float, float]:
    if not (
        isinstance(grid, (tuple, list))
        and len(grid) == 2
        and all(isinstance(g, (int, float)) and not isinstance(g, bool) and g > 0 for g in grid)
    ):
        raise ValueError(f"{kind}: train_grid must be (rows, cols) of positive numbers, got {grid!r}")
    return grid[0], grid[1]


def _check_options(kind, options, known, required, what) -> None:
    if unknown := sorted(set(options) - known):
        raise ValueError(f"{kind}: unknown options {unknown}; expected some of {sorted(known)}")
    if required not in options:
        raise ValueError(f"{kind} needs {required} ({what})")


def set_attention_rule(transformer: nn.Module, rule) -> nn.Module:
    """Install ``rule`` (see :func:`rule_from_config`) on a model ``set_pe`` prepared; returns the model."""
    family = family_for(transformer)
    state = rule_from_config(rule)
    name = {VideoRule: "ultravico", ImageRule: "ultraimage", PrunedRule: "hap", BundleRule: "spa"}[type(state)]
    if family.name not in RULES[name]:
        raise ValueError(
            f"{name}: the {family.name} family is not supported (its processors are stock or it is not a "
            f"{'video' if name == 'ultravico' else 'text-to-image'} family{_order_note(name)}); supported: "
            f"{', '.join(RULES[name])}"
        )
    processors = encoding_processors(transformer)
    if not processors:
        raise ValueError(
            f"set_attention_rule needs mmpos processors: set_pe first (set_pe(model, 'native') keeps the stock "
            f"model{_native_hint(family.name)})"
        )
    clear_attention_rule(transformer)
    for processor in processors:
        processor.attention_rule = state

    def before_forward(module, args, kwargs):
        state.before_forward(module, family, args, kwargs)

    handle = transformer.register_forward_pre_hook(before_forward, with_kwargs=True)
    transformer._mmpos_attention_rule = (state, handle, processors)
    return transformer


def _order_note(name: str) -> str:
    return "; HAP's scopes need the text before the image tokens" if name == "hap" else ""


def _native_hint(family: str) -> str:
    if family in ("chroma", "flux2", "z_image"):
        return f"; {family} with 'native' keeps its stock processors: set_pe(model, 'rope_axial') installs mmpos'"
    return ""


def encoding_processors(transformer: nn.Module) -> list:
    """The mmpos processors of the encoding level (under a camera adapter or an edit too)."""
    installer = ProcessorInstaller.find(transformer)
    if installer is not None:
        found = [slot.levels.get(ENCODING) for slot in installer.slots]
    else:
        processors = getattr(transformer, "attn_processors", None)
        found = list(processors.values()) if isinstance(processors, Mapping) else []
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
