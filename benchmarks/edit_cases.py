"""The edits timed by ``bench_edit.py``: each pipeline's rule with the edit on, off, and the baseline it is held to.

A case is one pipeline's transformer forward (one denoising step) on a fixed input. Its variants all run inside one
:class:`~mmpos.pipelines.EditSession`; a variant only sets the session's context (rules, rewriters, ``enabled``),
so the variants can be interleaved call by call. "off" is what a pipeline runs with ``enabled=False``: the edit
processors installed, every layer falling through to the stock processor.

The cost each method implies is its attention work (query-key pairs times the q/k plus v widths, per layer) over
the stock forward's: band modulation's targets also attend to the reference's image keys (shared attention; the
band law itself only rescales the reference keys' table); LooseRoPE adds, per saliency bin, one SDPA from the
paste's queries over all keys at twice the q/k width (standard and loosened logits side by side); PE transplant
only changes ids (its cost is the canvas, which on and off share).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

AXES = (16, 56, 56)
MODEL_CHANNELS = {"flux": 64, "kontext": 64, "fill": 384}  # Fill: latents + mask + masked-image latents


@dataclass
class Case:
    """One pipeline's step: ``variants`` name -> ``configure(context)``; ``target``: (variant, baseline, max)."""

    name: str
    model: str
    batch: int
    variants: dict
    rules: dict = field(default_factory=dict)  # the layers the session installs the edit processor on
    target: Optional[tuple] = None
    implied: Callable = lambda context, text_len, image_len: 1.0
    method_cost: str = ""


def _variant(rules: Optional[dict] = None, rewriters: tuple = (), enabled: bool = True) -> Callable:
    def configure(context):
        if rules is not None:
            context.rules.update(rules)
        context.rewriters[:] = list(rewriters)
        context.enabled = enabled

    return configure


def _work(queries: int, keys: int, qk_width: int, v_width: int) -> int:
    return queries * keys * (qk_width + v_width)


def plain_shared_attention(config, axes=AXES):
    """StyleAligned-style shared attention with the stock table on the reference keys (the band law off): the
    baseline band modulation is held to."""
    from mmpos.integrations.diffusers.layer_rotation import sequence_slice
    from mmpos.pipelines.edits.band.rule import SharedBandAttention

    class PlainSharedAttention(SharedBandAttention):
        def band_table(self, context, rotation, tokens, sample=0):
            return sequence_slice(rotation.table, tokens)

    return PlainSharedAttention(config, axes)


def band_case(
    num_layers: int, axes=AXES, name: str = "band (Flux, batch [reference, 2 targets])", model: str = "flux"
) -> Case:
    from mmpos.pipelines import BandConfig
    from mmpos.pipelines.edits.band.rule import SharedBandAttention

    band = {i: SharedBandAttention(BandConfig(), axes) for i in range(num_layers)}
    plain = {i: plain_shared_attention(BandConfig(), axes) for i in range(num_layers)}

    def implied(context, text_len, image_len):  # [reference, target, target]: targets see L + N keys
        tokens, targets = text_len + image_len, 2
        shared = _work(tokens, tokens, 1, 1) + targets * _work(tokens, tokens + image_len, 1, 1)
        return shared / (3 * _work(tokens, tokens, 1, 1))

    return Case(
        name,
        model,
        3,
        {"off": _variant(band, enabled=False), "plain shared": _variant(plain), "on": _variant(band)},
        rules=band,
        target=("on", "plain shared", 1.10),
        implied=implied,
        method_cost="shared attention: the targets also attend to the reference's image keys",
    )


def loose_case(num_layers: int, side: int, pos_embed) -> Case:
    from mmpos.pipelines import LooseConfig
    from mmpos.pipelines.edits.loose.rule import LooseRoPERule

    pixels = side * 16
    crop = torch.zeros(pixels, pixels, dtype=torch.bool)
    crop[pixels // 4 : 3 * pixels // 4, pixels // 4 : 3 * pixels // 4] = True
    saliency = torch.linspace(0, 1, pixels * pixels).reshape(pixels, pixels)
    rule = LooseRoPERule(LooseConfig(saliency_blur=0), saliency, crop)
    rules = dict.fromkeys(range(num_layers), rule)

    def implied(context, text_len, image_len):  # + per bin: paste queries x all keys at 2d (q/k) + d (v)
        tokens = text_len + image_len
        extra = sum(_work(len(entry[1]), tokens, 2, 1) for entry in context.cache["loose"])
        return 1 + extra / _work(tokens, tokens, 1, 1)

    return Case(
        "looserope (Kontext, paste = 1/4 of the image)",
        "kontext",
        1,
        {"off": _variant(rules, enabled=False), "on": _variant(rules)},
        rules=rules,
        target=("on", "off", 1.50),
        implied=implied,
        method_cost="per saliency bin, logits from the paste's queries at twice the q/k width",
    )


def transplant_case(side: int) -> Case:
    from mmpos.coords.edits import transplant_ids
    from mmpos.pipelines.edits.transplant.positions import TransplantPositions

    source = torch.zeros(side, side, dtype=torch.bool)
    source[: side // 4, : side // 4] = True  # the reference object in a canvas corner
    target = torch.zeros(side, side, dtype=torch.bool)
    target[side // 4 : 3 * side // 4, side // 3 : 2 * side // 3] = True
    rewrite = TransplantPositions(transplant_ids((side, side), source, target), (side, side), tau=0.85)
    return Case(
        "pe transplant (Fill, transplant window)",
        "fill",
        1,
        {"off": _variant(enabled=False), "on": _variant(rewriters=(rewrite,))},
        target=("on", "off", 1.05),
        method_cost="none beyond the canvas (only the ids change)",
    )


FAMILY_AXES = {"flux2": (32, 32, 32, 32), "qwen": (16, 56, 56)}  # FLUX.2 / Klein, Qwen-Image


def family_band_case(family: str, num_layers: int) -> Case:
    """Band modulation through the edit seam on a FLUX.2- or Qwen-Image-shaped transformer."""
    label = {"flux2": "FLUX.2", "qwen": "Qwen-Image"}[family]
    return band_case(num_layers, FAMILY_AXES[family], f"band ({label}, batch [reference, 2 targets])", family)


def cases(num_layers: int, side: int, pos_embed) -> list:
    """The three pipelines' cases; ``pos_embed``: the Kontext transformer's (LooseRoPE's loosened tables)."""
    return [transplant_case(side), band_case(num_layers), loose_case(num_layers, side, pos_embed)]
