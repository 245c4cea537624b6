"""Which diffusers transformers mmpos reaches: the family registry (:mod:`.families`), under its older names.

``ModelSpec`` is :class:`~.families.Family`; ``spec_for(model)`` is :func:`~.families.family_for`.
"""

from __future__ import annotations

from .families import Family, family_for

ModelSpec = Family
spec_for = family_for


def supported_classes() -> dict[type, Family]:
    """Every covered diffusers transformer class this install has, with its family."""
    from .families import FAMILIES, list_families

    list_families()
    return {cls: family for family in FAMILIES.values() for cls in family.model_classes()}
