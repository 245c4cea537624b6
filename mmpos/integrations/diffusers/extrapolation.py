"""Extrapolation presets on a diffusers model's own axes: which axes are image axes, and their training extent.

from mmpos.integrations.diffusers import model_extrapolation, set_pe
set_pe(pipe.transformer, "native", extrapolation=model_extrapolation(pipe.transformer, "dype", (64, 64)))
# Wan: RIFLEx on time (a static policy), NTK on rows and columns
set_pe(wan, "native", extrapolation=model_extrapolation(wan, "ntk", (30, 52), time={"type": "riflex", ...}))
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

from ...spectrum.schedule import PRESETS, extrapolation_preset
from .families import family_for

NONE = "none"


def model_extrapolation(
    transformer: nn.Module, preset: str, trained_grid: Sequence[float], time=None, **overrides
) -> list:
    """Per-axis ``extrapolation`` for :func:`~.api.set_pe` (``"native"`` or ``"rope_axial"``).

    Args:
        transformer: a transformer of a registered family (its ``image_axes`` get the schedules; Flux: axes
            ``(index, row, col)``; Wan: ``(t, row, col)``; FLUX.2: ``(t, row, col, l)``).
        preset: ``"none"`` or a name of :data:`mmpos.spectrum.schedule.PRESETS` (``"dype"``, ``"ntk"``, ...).
        trained_grid: ``(rows, cols)`` tokens at the training resolution (FLUX.1 at 1024 px: ``(64, 64)``); a family
            whose image ids step by less than 1 a token (``extras["image_coords_per_token"]``: a number, a
            ``(rows, cols)`` pair or a function of the model giving one; FLUX.3: 0.5, Allegro: ``1 /
            interpolation_scale_h``, ``1 / interpolation_scale_w``) gets the schedules' original lengths in its
            coordinate units.
        time: video families: the time axis' policy (``{"type": "riflex", "k": 4, "target_length": 32}``).
        **overrides: schedule options (``lambda_t``, ``start_sigma``, ...).
    Returns:
        one entry per model axis: the schedules on the image rows and columns, ``time`` on the time axis,
        ``None`` elsewhere (text / index / reference axes).
    """
    family = family_for(transformer)
    if preset != NONE and preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is unknown; expected 'none' or one of {sorted(PRESETS)}")
    rows, cols = _grid(trained_grid)
    if time is not None and family.time_axis is None:
        raise ValueError(
            f"time= is for video models; the {family.name} model has no time axis (axes {family.axis_names})"
        )
    entries = [None] * len(family.axis_names)
    unit = family.extras.get("image_coords_per_token", 1.0)  # FLUX.3: image ids step by 0.5 a token
    unit_rows, unit_cols = _units(unit(transformer) if callable(unit) else unit)
    lengths = (rows * unit_rows, cols * unit_cols)
    image = [None, None] if preset == NONE else extrapolation_preset(preset, lengths, **overrides)
    for axis, entry in zip(family.image_axes, image):
        entries[axis] = entry
    if time is not None:
        entries[family.time_axis] = time
    return entries


def _units(unit) -> tuple[float, float]:
    """Coordinate units per token of the image rows and columns."""
    if isinstance(unit, (tuple, list)):
        return float(unit[0]), float(unit[1])
    return float(unit), float(unit)


def _grid(trained_grid):
    try:
        rows, cols = (float(v) for v in trained_grid)
    except (TypeError, ValueError):
        raise ValueError(f"trained_grid must be (rows, cols) tokens, got {trained_grid!r}") from None
    if not (rows > 0 and cols > 0):
        raise ValueError(f"trained_grid must be positive (rows, cols) tokens, got {trained_grid!r}")
    return rows, cols
