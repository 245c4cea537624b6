"""Build the ViT of a trainer config: timm model (or ``open_clip:NAME`` tower, :mod:`.open_clip_model`),
optional mmpos encoding, warm-start choice, frozen parts.

Warm start of a model pretrained with a learned absolute embedding (timm ``pos_embed``), ``ape``:

* ``drop`` (default): the APE is removed; the new encoding (``pe``) alone gives positions;
* ``keep``: the APE stays beside the new rotary encoding and keeps training (RoPE-ViT's "RoPE + APE"
  variants); at other resolutions timm interpolates it (``dynamic_img_size``);
* ``resample`` (timm models): no new rotary encoding (``pe`` must be None or ``ape_learned``): the table is taken over by
  mmpos ``ape_learned`` (same function at the training grid) and resampled to every other grid.
"""

from __future__ import annotations

import timm
import torch
from torch import nn

import mmpos.integrations.timm as mmpos_timm
from mmpos.encodings.registry import pe_class
from mmpos.integrations.pe_parameters import freeze_all_but, named_pe_parameters

from .open_clip_model import PREFIX as OPEN_CLIP_PREFIX
from .open_clip_model import build_open_clip
from .scaffold.config import ConfigError
from .task_configs import ViTConfig

TRAINABLE_GROUPS = ("pe", "head", "norm", "cls")


def build_vit(config: ViTConfig, num_classes: int, pe_options: dict | None = None) -> nn.Module:
    """timm ``config.model`` with ``num_classes`` outputs, converted to ``config.pe``.

    ``pe_options`` replaces ``config.pe_options`` (evaluation with extrapolation options)."""
    options = dict(config.pe_options or {}) if pe_options is None else dict(pe_options)
    if config.model.startswith(OPEN_CLIP_PREFIX):
        model = build_open_clip(config, num_classes, options)
        if config.train_only:
            freeze_except(model, config.train_only)
        return model
    kwargs = dict(config.model_kwargs or {})
    kwargs.setdefault("img_size", config.img_size)
    if config.drop_path:
        kwargs["drop_path_rate"] = config.drop_path
    model = timm.create_model(config.model, pretrained=config.pretrained, num_classes=num_classes, **kwargs)
    pe, ape = config.pe, config.ape
    if ape == "resample":
        if pe not in (None, "ape_learned"):
            raise ConfigError(
                f"ape=resample keeps the learned APE as the only encoding; got pe={pe!r} "
                f"(use ape=keep to keep it beside a rotary encoding)"
            )
        pe = "ape_learned"
    if pe is not None:
        abs_pos = "keep" if ape == "keep" and pe_class(pe).kind == "rotary" else "remove"
        mmpos_timm.convert(model, pe=pe, abs_pos=abs_pos, dynamic_img_size=True, **options)
    elif hasattr(model, "set_input_size") or hasattr(model, "dynamic_img_size"):
        _allow_any_size(model)
    if config.train_only:
        freeze_except(model, config.train_only)
    return model


def _allow_any_size(model: nn.Module) -> None:
    """Unconverted timm ViTs: evaluate at other resolutions with timm's own APE interpolation."""
    if hasattr(model, "patch_embed") and hasattr(model, "dynamic_img_size"):
        from timm.layers import Format

        model.dynamic_img_size = True
        model.patch_embed.strict_img_size = False
        model.patch_embed.flatten = False
        model.patch_embed.output_fmt = Format.NHWC


def freeze_except(model: nn.Module, groups) -> list[str]:
    """Freeze every parameter outside ``groups`` (``"pe,head"`` or a list): ``pe`` (mmpos encodings and timm's
    ``pos_embed``), ``head``, ``norm`` (final norms), ``cls`` (cls/register tokens). Returns trainable names."""
    names = [g.strip() for g in groups.split(",")] if isinstance(groups, str) else list(groups)
    bad = [g for g in names if g not in TRAINABLE_GROUPS]
    if bad:
        raise ConfigError(f"train_only: unknown group(s) {bad}; expected a subset of {list(TRAINABLE_GROUPS)}")
    pe_names = {name for name, _ in named_pe_parameters(model)}

    def kept(name: str) -> bool:
        return (
            ("pe" in names and (name in pe_names or name in ("pos_embed", "visual.positional_embedding")))
            or ("head" in names and name.startswith(("head.", "fc_norm.")))
            or ("norm" in names and name.startswith(("norm.", "fc_norm.", "visual.ln_post.")))
            or ("cls" in names and name in ("cls_token", "reg_token", "visual.class_embedding"))
        )

    trainable = freeze_all_but(model, {name for name, _ in model.named_parameters() if kept(name)})
    if not trainable:
        raise ConfigError(f"train_only={groups!r} leaves no trainable parameter in {type(model).__name__}")
    return trainable


def patch_size_of(model: nn.Module) -> int:
    """Patch side of a timm ViT or of an :class:`~.open_clip_model.OpenClipClassifier`."""
    patch = model.patch_embed.patch_size if hasattr(model, "patch_embed") else model.patch_size
    return int(patch[0])


def check_image_sizes(config: ViTConfig, model: nn.Module, sizes) -> None:
    """``img_size`` and every evaluation size (the evaluation heights; widths are rounded to the patch) are
    multiples of ``model``'s patch: timm stops with a bare ``AssertionError`` otherwise."""
    patch = patch_size_of(model)
    for key, values in (("img_size", [config.img_size]), ("eval_sizes", list(sizes))):
        bad = [int(v) for v in values if int(v) % patch]
        if bad:
            raise ConfigError(
                f"config {key}: {bad[0] if key == 'img_size' else bad} not divisible by the model's patch size "
                f"{patch}; expected multiples of {patch}"
            )


def count_parameters(model: nn.Module) -> dict:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"total": total, "trainable": trainable}


def plain_model(accelerator, model) -> nn.Module:
    """The module itself: without DDP, mixed-precision or ``torch.compile`` wrappers."""
    model = accelerator.unwrap_model(model)
    return getattr(model, "_orig_mod", model)


@torch.no_grad()
def load_weights(model: nn.Module, state_dict: dict) -> None:
    """Load a trained state dict into a freshly built model (same architecture and encoding)."""
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
