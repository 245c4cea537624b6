"""Per-family edit adapters (the edit seam, :mod:`.base`): one module per family, registered here.

    from mmpos.pipelines.edits.families import edit_attention_for
    adapter = edit_attention_for(transformer)   # FluxEditAttention, Flux2EditAttention, ...

``EDIT_FAMILIES`` maps a registered diffusers family name (:mod:`mmpos.integrations.diffusers.families`) to the
module holding its adapter; modules are imported on first use.
"""

from __future__ import annotations

from importlib import import_module

from .base import FamilyEditAttention, LayerCall

EDIT_FAMILIES = {
    "flux": ".flux",
    "flux2": ".flux2",
    "qwen": ".qwen",
    "qwenimage21": ".qwenimage21",
    "z_image": ".z_image",
}
_ADAPTERS: dict[str, FamilyEditAttention] = {}


def edit_attention(family: str) -> FamilyEditAttention:
    """The adapter of the diffusers family named ``family``."""
    if family not in EDIT_FAMILIES:
        raise ValueError(f"the edits run on the families {sorted(EDIT_FAMILIES)}; got {family!r}")
    if family not in _ADAPTERS:
        _ADAPTERS[family] = import_module(EDIT_FAMILIES[family], __name__).ADAPTER
    return _ADAPTERS[family]


def edit_attention_for(transformer) -> FamilyEditAttention:
    """The adapter of ``transformer``'s family (a ``ValueError`` naming the supported families otherwise)."""
    from mmpos.integrations.diffusers.families import family_for

    return edit_attention(family_for(transformer).name)


__all__ = ["EDIT_FAMILIES", "FamilyEditAttention", "LayerCall", "edit_attention", "edit_attention_for"]
