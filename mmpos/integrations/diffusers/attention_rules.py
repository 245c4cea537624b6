"""Attention rules beyond the training length (video: UltraViCo, FreeLOC) and size (images: UltraImage, HAP, SPA,
SEGA).

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

The families say where (``Family.latent_grid`` and ``Family.takes_attention_rules``): Wan, Wan VACE and Wan Animate through their mmpos processors; LTX,
whose processors are stock, through rule processors ``set_attention_rule`` installs (``Family.rule_processor``;
UltraViCo only: FreeLOC's time shift reads Wan's rope spectrum). Other families (HunyuanVideo 1.5: joint video and
text attention) are refused by name.

Image rules past the training size (:data:`IMAGE_RULES`), through the image families' mmpos processors (their joint
text+image self-attention): UltraImage's entropy-driven per-head sharpening (:mod:`mmpos.ops.entropy_scaling`;
FLUX.1, FLUX.2, Chroma, Qwen-Image, Z-Image), HRDiT's HAP (:mod:`mmpos.ops.head_scopes`) and SPA (:mod:`mmpos.coords.bundles`;
both on FLUX.1, Chroma, FLUX.2, Qwen-Image, Z-Image; SPA's tables from ``Family.bundle_tables``, Qwen-Image's
attention through the rule processors ``set_attention_rule`` installs under its seam), and SEGA's spectral-energy
factors per row / column RoPE pair (:mod:`mmpos.ops.spectral_energy`; FLUX.1, FLUX.2, Chroma, Z-Image, and Qwen-Image
through its seam's tables)::

    set_pe(flux, "native")
    set_attention_rule(flux, {"type": "ultraimage", "train_grid": (64, 64)})           # 1024 px trained
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from ..._per_thread import PerThread
from ...coords.bundles import bundle_variants
from ...coords.grids import video_grid
from ...ops.entropy_scaling import EntropyScaling
from ...ops.frame_reencoding import FrameReencoding
from ...ops.head_scopes import HeadScopes
from ...ops.rotation import rotate
from ...ops.spectral_energy import SpectralEnergyScaling, pair_channels
from ...ops.tables import RotaryTable
from ...ops.window_decay import WindowDecay
from .families import family_for, get_family, list_families
from .families.z_image import latent_tokens, z_image_inputs
from .installer import ENCODING, ProcessorInstaller
from .positions import PositionSeam
from .processors import PEProcessor

RULES = ("ultravico", "freeloc")
IMAGE_FAMILIES = ("flux", "chroma", "flux2", "qwen", "z_image")
HAP_FAMILIES = ("flux", "chroma", "flux2", "qwen", "z_image")  # joint sequences whose text and image parts are known
SPA_FAMILIES = ("flux", "chroma", "flux2", "qwen", "z_image")  # families with Family.bundle_tables
IMAGE_RULES = {"ultraimage": IMAGE_FAMILIES, "hap": HAP_FAMILIES, "spa": SPA_FAMILIES, "sega": IMAGE_FAMILIES}
TABLE_FAMILIES = ("qwen",)  # SEGA multiplies the seam's complex tables there (the port's route), not q and k


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

    def __call__(self, query, key, value, mask, parallel_config, layer=None, attend=None):
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
    (:class:`~mmpos.ops.head_scopes.HeadScopes`) on the forward's joint sequence (:func:`joint_layout`: the text
    moved before the image tokens where a family puts it after them, as Z-Image) or on an image-only attention
    (Z-Image's noise refiner: no text); a text-only attention (Z-Image's context refiner) stays stock. Samples padded
    to the batch's longest (Z-Image's captions of several lengths) attend one by one, their padding rows zero."""

    def __init__(self, alphas, betas, anchor_stride: int, train_tokens: int):
        self.alphas, self.betas, self.anchor_stride, self.train_tokens = alphas, betas, anchor_stride, train_tokens
        self.state = PerThread(None)  # (image tokens, joint_layout)

    def before_forward(self, transformer, family, args, kwargs) -> None:
        self.state.set((image_tokens(family.name, args, kwargs), joint_layout(family.name, args, kwargs)))

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
        if parallel_config is not None:
            raise ValueError("hap: context parallelism with the rule is not supported")
        images, texts, text_first = state[1]
        length = query.shape[1]
        if length == max(i + t for i, t in zip(images, texts)):
            parts = list(zip(images, texts))  # the joint attention
        elif length == max(images):
            if max(images) == max(texts):
                raise ValueError(f"hap: {length} image tokens and {length} text tokens: image-only attention or not?")
            parts = [(i, 0) for i in images]  # an image-only attention
        else:
            return None  # a text-only attention
        lengths = [i + t for i, t in parts]
        _check_prefix_mask(mask, lengths, query.shape[0], length)
        if all(n == length for n in lengths) and len(set(parts)) == 1:
            return self._attend_one(layer, query, key, value, parts[0][1], text_first)
        out = query.new_zeros(query.shape)
        for b, n in enumerate(lengths):
            rows = (t[b : b + 1, :n] for t in (query, key, value))
            out[b : b + 1, :n] = self._attend_one(layer, *rows, parts[b][1], text_first)
        return out

    def _attend_one(self, layer, query, key, value, text: int, text_first: bool):
        scopes = self.scopes(layer, text)
        if text_first or text == 0:
            return scopes.attend(query, key, value)
        order = [t.roll(text, dims=1) for t in (query, key, value)]  # the trailing text moved to the front
        return scopes.attend(*order).roll(-text, dims=1)


def _check_prefix_mask(mask, lengths: list[int], batch: int, length: int) -> None:
    """HAP takes a boolean key mask only where it keeps each sample's first ``lengths[b]`` tokens (its padding to
    the batch's longest masked), or no mask where every sample fills the sequence."""
    if mask is None:
        if any(n != length for n in lengths):
            raise ValueError("hap: samples shorter than the sequence need their padding masked")
        return
    if mask.dtype != torch.bool or mask.numel() != batch * length:
        raise ValueError(f"hap: only a boolean key mask is supported, got {mask.dtype} {tuple(mask.shape)}")
    prefix = torch.arange(length, device=mask.device)[None, :] < torch.tensor(lengths, device=mask.device)[:, None]
    if not torch.equal(mask.reshape(batch, length), prefix):
        raise ValueError("hap: an attention mask that masks text tokens (a padded prompt) is not supported")


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
            tables = family.bundle_tables(transformer, args, kwargs, lambda grid: bundle_variants(grid, self.group_num))
        self.state.set((tokens, sigma, count, tables))

    def tables(self, layer: int):
        """The rotary tables ``layer`` averages its attention over (one per bundle grid), or ``None``: stock."""
        state = self.state.get()
        return None if state is None or state[3] is None else state[3](layer)

    def __call__(self, query, key, value, mask, parallel_config, layer, attend):
        return None  # SPA acts where the processor rotates (PEProcessor._rotate_attend)


class SpectralRule:
    """SEGA past the training grid: each forward's latent (read before the blocks) gives the row and column RoPE
    pairs their factors (:class:`~mmpos.ops.spectral_energy.SpectralEnergyScaling`); the processors attend with q
    and k times them, every token of the joint sequence (as the port's scaled tables do). Qwen-Image, whose stock
    processors multiply the seam's complex tables into q and k: the tables times them (:meth:`scale_tables`)."""

    def __init__(self, scaling: SpectralEnergyScaling, train_grid: tuple[float, float]):
        self.scaling, self.train_grid = scaling, train_grid
        self.state = PerThread(None)  # (channel factors [D], per-pair factors (rows, cols), pair factors [P])
        self.pairs = None  # (row pairs, column pairs, frequencies [P], pair count, layout, head_dim)

    def bind(self, transformer: nn.Module, family) -> None:
        """Read which pairs of the model's encoding turn with the image rows and columns, and their frequencies."""
        seam = getattr(transformer, family.position_attr)
        encoding = axial_encoding(seam, "sega", "spectrum")
        spectrum, axes = encoding.spectrum, getattr(seam, "coord_axes", None)
        model_axis = spectrum.axis_of_pair if axes is None else torch.tensor(axes)[spectrum.axis_of_pair]
        rows, cols = (torch.nonzero(model_axis == a).flatten() for a in family.image_axes)
        self.pairs = (rows, cols, spectrum.inv_freq, spectrum.num_pairs, encoding.layout, encoding.head_dim)

    def before_forward(self, transformer, family, args, kwargs) -> None:
        latent, grid = latent_map(family.name, args, kwargs)
        if grid[0] <= self.train_grid[0] and grid[1] <= self.train_grid[1]:
            self.state.set(None)
            return
        rows, cols, inv_freq, pairs, layout, head_dim = self.pairs
        m_rows, m_cols = self.scaling.factors(latent, grid, self.train_grid, (inv_freq[rows], inv_freq[cols]))
        pair_scale = torch.ones(pairs, dtype=m_rows.dtype, device=m_rows.device)
        pair_scale[rows.to(pair_scale.device)], pair_scale[cols.to(pair_scale.device)] = m_rows, m_cols
        self.state.set((pair_channels(pair_scale, head_dim, layout), (m_rows, m_cols), pair_scale))

    def factors(self):
        """The row and column pairs' factors of the forward in flight (``None`` within the training grid)."""
        state = self.state.get()
        return None if state is None else state[1]

    def scale_tables(self, seam, args, tables):
        """A forward hook on Qwen-Image's seam: its complex ``(image [S, P], text [S, P])`` tables times the pair
        factors (a factor on both q and k, as on the processors' path); within the training grid as they are."""
        state = self.state.get()
        if state is None or tables is None:
            return tables
        return tuple(t * state[2].to(t.device, t.real.dtype) for t in tables)

    def __call__(self, query, key, value, mask, parallel_config, layer, attend):
        state = self.state.get()
        if state is None:
            return None
        scale = state[0].to(query.device, query.dtype)
        return attend(query * scale, key * scale, value, mask, parallel_config)


def latent_map(family: str, args, kwargs) -> tuple[torch.Tensor, tuple[int, int]]:
    """The forward's latent averaged over its channels, ``[B, H, W]`` (the pixels' latent grid, 2 x 2 per token),
    and the output image's token grid ``(rows, cols)``: Z-Image's latents (a list of ``[C, F, H, W]``), or the
    packed tokens ``hidden_states [B, S, 4 C]`` of FLUX.1, Chroma, FLUX.2 and Qwen-Image (channels ``(c, row, col)``
    per 2 x 2 patch), the output image's tokens first, its grid from ``img_ids`` (the tokens of the first image
    index) or Qwen-Image's ``img_shapes`` (the first image)."""
    if family == "z_image":
        latents, _, patch, _ = z_image_inputs(args, kwargs)
        patch = int(patch)
        items = latents if isinstance(latents, (list, tuple)) else [latents]
        if len({tuple(x.shape) for x in items}) != 1:
            raise ValueError("sega: a batch of latents of different sizes is not supported")
        maps = torch.stack([x.mean(dim=(0, 1)) for x in items])
        return maps, (maps.shape[-2] // patch, maps.shape[-1] // patch)
    tokens = kwargs.get("hidden_states", args[0] if args else None)
    if family == "qwen":
        shapes = kwargs["img_shapes"]
        shapes = shapes[0] if isinstance(shapes, list) else shapes  # the first sample's, as QwenEmbedRope
        _, rows, cols = shapes[0] if isinstance(shapes, list) else shapes
    else:
        ids = kwargs.get("img_ids")
        if not isinstance(ids, torch.Tensor):
            raise ValueError(f"sega: {family} needs img_ids as a keyword argument (its token grid), got {ids!r}")
        ids = ids[0] if ids.dim() == 3 else ids
        first = ids[ids[:, 0] == ids[0, 0]]
        rows, cols = int(first[:, 1].max()) + 1, int(first[:, 2].max()) + 1
    batch, channels = tokens.shape[0], tokens.shape[-1] // 4
    patches = tokens[:, : rows * cols].reshape(batch, rows, cols, channels, 2, 2).mean(dim=3)
    return patches.permute(0, 1, 3, 2, 4).reshape(batch, 2 * rows, 2 * cols), (rows, cols)


def image_tokens(family: str, args, kwargs) -> int | None:
    """The forward's image tokens: packed ``hidden_states [B, S, C]`` (FLUX.1, FLUX.2, Chroma: ``S``, reference
    images included) or Z-Image's latents (a list of ``[C, F, H, W]``, patches ``f_patch_size x patch_size^2``)."""
    if family == "z_image":
        latents, _, patch, frames = z_image_inputs(args, kwargs)
        items = latents if isinstance(latents, (list, tuple)) else [latents]
        return max(latent_tokens(x, int(patch), int(frames)) for x in items)
    hidden_states = kwargs.get("hidden_states", args[0] if args else None)
    return int(hidden_states.shape[1]) if isinstance(hidden_states, torch.Tensor) else None


def joint_layout(family: str, args, kwargs) -> tuple[tuple[int, ...], tuple[int, ...], bool] | None:
    """``(image tokens per sample, text tokens per sample, text first)`` of the forward's joint attention sequence:
    FLUX.1, FLUX.2, Chroma and Qwen-Image put ``encoder_hidden_states`` before the image tokens; Z-Image puts each
    sample's caption after its image, each padded to a multiple of 32 tokens, the batch to its longest sample."""
    if family == "z_image":
        from diffusers.models.transformers.transformer_z_image import SEQ_MULTI_OF

        latents, captions, patch, frames = z_image_inputs(args, kwargs)
        if not (isinstance(latents, (list, tuple)) and isinstance(captions, (list, tuple))):
            return None
        if not all(isinstance(x, torch.Tensor) and isinstance(c, torch.Tensor) for x, c in zip(latents, captions)):
            return None  # Omni's nested lists

        def padded(n: int) -> int:
            return n + (-n) % SEQ_MULTI_OF

        images = [padded(latent_tokens(x, int(patch), int(frames))) for x in latents]
        return tuple(images), tuple(padded(len(c)) for c in captions), False
    hidden_states = kwargs.get("hidden_states", args[0] if args else None)
    text = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
    if not isinstance(text, torch.Tensor) or not isinstance(hidden_states, torch.Tensor):
        return None
    batch = hidden_states.shape[0]
    return (int(hidden_states.shape[1]),) * batch, (int(text.shape[1]),) * batch, True


def key_mask(mask, key) -> torch.Tensor | None:
    """A boolean key mask ``[B, 1, 1, L]`` / ``[B, L]`` (Z-Image's padded captions) as ``[B, L]``; other masks:
    ValueError."""
    if mask is None:
        return None
    if mask.dtype == torch.bool and mask.shape[-1] == key.shape[1] and mask.numel() == mask.shape[0] * key.shape[1]:
        return mask.reshape(mask.shape[0], key.shape[1])
    raise ValueError(f"ultraimage: only a boolean key mask is supported, got {mask.dtype} {tuple(mask.shape)}")


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
            f"rule must be a WindowDecay, a FrameReencoding or a dict with 'type' in {RULES + tuple(IMAGE_RULES)}, "
            f"got {config!r}"
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


def image_rule_from_config(config: Mapping) -> ImageRule | PrunedRule | BundleRule | SpectralRule:
    """``{"type": "ultraimage", "train_grid": (64, 64), ...}``, ``{"type": "spa", "train_grid": (64, 64), ...}``,
    ``{"type": "hap", "train_grid": (64, 64), "scope_plan": {"alphas": ..., "betas": ...}, "anchor_stride": 32}``
    -> the image rule's state for :func:`set_attention_rule`."""
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
    if kind == "sega":
        known = {"train_grid", *SpectralEnergyScaling.__dataclass_fields__}
        _check_options(kind, options, known, "train_grid", "(rows, cols) tokens of the training size; FLUX.1: (64, 64)")
        grid = _train_grid(kind, options.pop("train_grid"))
        return SpectralRule(SpectralEnergyScaling(**options), grid)
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


def axial_encoding(seam, rule: str, needs: str):
    """The one axial rotary encoding of ``seam`` (it has the attribute ``needs``, one table for every layer); else a
    ValueError naming ``rule`` and the encodings found."""
    encodings = getattr(seam, "encodings", ())
    encoding = encodings[0] if len(encodings) == 1 else None
    if encoding is None or not hasattr(encoding, needs) or getattr(seam, "per_layer", False):
        raise ValueError(
            f"{rule} needs one axial rotary encoding on the model (set_pe 'native' or 'rope_axial'), got "
            f"{[type(e).__name__ for e in encodings]}"
        )
    return encoding


def time_shift(transformer: nn.Module, family):
    """``shift(x [B, L, H, D], frames [L], grid) -> x``: ``x`` rotated by ``frames`` more on the time pairs of the
    model's encoding (its spectrum resolved at ``grid``'s coordinates), in the encoding's channel layout."""
    seam = getattr(transformer, family.position_attr)
    encoding = axial_encoding(seam, "freeloc", "spectrum_at")
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
    if isinstance(rule, Mapping) and rule.get("type") in IMAGE_RULES:
        return _set_image_rule(transformer, rule)
    rule, layers = rule_from_config(rule)
    family = family_for(transformer)
    name = rule_name(rule)
    if not family.takes_attention_rules or (name == "freeloc" and family.rule_processor is not None):
        supported = [f for f in list_families() if get_family(f).takes_attention_rules]
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


def _set_image_rule(transformer: nn.Module, rule: Mapping) -> nn.Module:
    """An image rule (:func:`image_rule_from_config`) on the mmpos processors ``set_pe`` installed."""
    family = family_for(transformer)
    state = image_rule_from_config(rule)
    name = rule["type"]
    if family.name not in IMAGE_RULES[name]:
        raise ValueError(
            f"{name}: the {family.name} family is not supported (its processors are stock or it is not a "
            f"text-to-image family); supported: {', '.join(IMAGE_RULES[name])}"
        )
    if isinstance(state, SpectralRule) and family.name in TABLE_FAMILIES:
        return _set_table_rule(transformer, family, state)
    clear_attention_rule(transformer)
    installer = ProcessorInstaller.find(transformer)
    added = installer is not None and family.rule_processor is not None and not encoding_processors(transformer)
    if added:  # set_pe kept the stock processors (Qwen-Image): the rule processors go under its hook
        installer.add_processors(
            ENCODING, {i: family.rule_processor(s.original, i) for i, s in enumerate(installer.slots)}
        )
    processors = encoding_processors(transformer)
    if not processors:
        raise ValueError(
            f"set_attention_rule needs mmpos processors: set_pe first (set_pe(model, 'native') keeps the stock "
            f"model{_native_hint(family.name)})"
        )
    if isinstance(state, SpectralRule):
        state.bind(transformer, family)
    for processor in processors:
        processor.attention_rule = state

    def before_forward(module, args, kwargs):
        state.before_forward(module, family, args, kwargs)

    handle = transformer.register_forward_pre_hook(before_forward, with_kwargs=True)
    transformer._mmpos_attention_rule = (state, handle, processors, "added" if added else False)
    return transformer


def _set_table_rule(transformer: nn.Module, family, state: SpectralRule) -> nn.Module:
    """SEGA on a family whose stock processors read the seam's tables (Qwen-Image): a pre-forward hook measures, a
    forward hook on the seam scales its tables."""
    seam = getattr(transformer, family.position_attr)
    if not isinstance(seam, PositionSeam):
        raise ValueError(f"sega needs set_pe first on {family.name} (set_pe(model, 'native') keeps the stock model)")
    state.bind(transformer, family)
    clear_attention_rule(transformer)

    def before_forward(module, args, kwargs):
        state.before_forward(module, family, args, kwargs)

    handles = Handles(
        transformer.register_forward_pre_hook(before_forward, with_kwargs=True),
        seam.register_forward_hook(state.scale_tables),
    )
    transformer._mmpos_attention_rule = (state, handles, [], False)
    return transformer


class Handles:
    """Several hook handles removed as one."""

    def __init__(self, *handles):
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


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
    """Remove :func:`set_attention_rule`'s rule (no-op without one); the processors attend as stock again (the rule
    processors it installed give the stock ones back)."""
    installed = getattr(transformer, "_mmpos_attention_rule", None)
    if installed is not None:
        _, handle, processors, own = installed
        handle.remove()
        for processor in processors:
            processor.attention_rule = None
        if own == "added":  # the image rule processors under set_pe's hook (Qwen-Image)
            ProcessorInstaller.of(transformer).remove_processors(ENCODING, processors)
        elif own:
            ProcessorInstaller.of(transformer).clear(transformer, ENCODING)
        del transformer._mmpos_attention_rule
    return transformer
