"""timm model names for mmpos encodings: ``<timm architecture>_mmpos_<encoding>``.

    timm.create_model("vit_small_patch16_224_mmpos_rope_mixed")                  # random init
    timm.create_model("vit_base_patch16_224_mmpos_rope_axial.augreg_in21k", pretrained=True)
    timm.create_model("deit3_small_patch16_224_mmpos_rope_axial", pe_theta=100.0, dynamic_img_size=True)

Each entry point builds the timm architecture (with its pretrained weights and tag when asked), then
:func:`~.convert.convert`s it. Keyword arguments starting with ``pe_`` are encoding options
(``pe_theta=100`` -> ``theta=100``); ``abs_pos``, ``share_pe``, ``grid_mode``, ``grid_scale``, ``grid_indexing`` go to
``convert``; everything else goes to the timm architecture, so timm's ``train.py`` works with
``--model vit_small_patch16_224_mmpos_rope_mixed --model-kwargs pe_theta=10 abs_pos=keep``
(start it through ``python -m mmpos.integrations.timm.train`` so that the names are registered).
"""

from __future__ import annotations

import sys

import timm
from timm.models import is_model, register_model

from ...encodings.registry import list_pes, pe_capabilities

BASE_ARCHITECTURES = (
    "vit_tiny_patch16_224",
    "vit_small_patch16_224",
    "vit_base_patch16_224",
    "vit_large_patch16_224",
    "vit_small_patch16_384",
    "vit_base_patch16_384",
    "deit3_small_patch16_224",
    "deit3_base_patch16_224",
    "deit3_large_patch16_224",
    # Eva rope-vit ports: swap their RoPE (``..._rope_mixed_224_mmpos_rope_mixed`` keeps the learned frequencies)
    "vit_small_patch16_rope_224",
    "vit_base_patch16_rope_224",
    "vit_small_patch16_rope_mixed_224",
    "vit_base_patch16_rope_mixed_224",
    "naflexvit_base_patch16_gap",
)
CONVERT_OPTIONS = ("abs_pos", "share_pe", "grid_mode", "grid_scale", "grid_indexing")
SEPARATOR = "_mmpos_"


def timm_model_name(architecture: str, pe: str) -> str:
    return f"{architecture}{SEPARATOR}{pe}"


def register_timm_models(architectures=BASE_ARCHITECTURES, pes=None) -> list[str]:
    """Register ``<architecture>_mmpos_<pe>`` for every pair (``pes``: default every registered encoding);
    names already registered are skipped, so call it again after registering new encodings."""
    added = []
    for architecture in architectures:
        if not is_model(architecture):
            continue  # older timm without this architecture
        for pe in image_pes() if pes is None else pes:
            name = timm_model_name(architecture, pe)
            if not is_model(name):
                register_model(_entrypoint(name, architecture, pe))
                added.append(name)
    return added


def image_pes() -> list[str]:
    """Registered encodings that can read 2D patch coordinates (``capabilities.reads_image_grid``; 1D-only ones
    such as ``rope_1d`` are left out)."""
    return [pe for pe in list_pes() if pe_capabilities(pe).reads_image_grid]


def _entrypoint(name: str, architecture: str, pe: str):
    def create(pretrained: bool = False, pretrained_cfg=None, **kwargs):
        from .convert import convert

        pe_options = {k[len("pe_") :]: kwargs.pop(k) for k in list(kwargs) if k.startswith("pe_")}
        convert_options = {k: kwargs.pop(k) for k in CONVERT_OPTIONS if k in kwargs}
        base = architecture
        if isinstance(pretrained_cfg, str):
            base, pretrained_cfg = f"{architecture}.{pretrained_cfg}", None
        model = timm.create_model(base, pretrained=pretrained, pretrained_cfg=pretrained_cfg, **kwargs)
        return convert(model, pe, **convert_options, **pe_options)

    create.__name__ = name
    create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = f"timm ``{architecture}`` with the mmpos encoding ``{pe}`` (see mmpos.integrations.timm)."
    setattr(sys.modules[__name__], name, create)
    return create
