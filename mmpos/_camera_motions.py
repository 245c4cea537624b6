"""The camera-motion vocabulary every model and command takes: ``NAME[:AMOUNT]`` (``preset:`` prefix optional).

    orbit:35   arc:60   dolly:-0.5   pan:20   tilt:-10   roll:15   zoom:2

Amounts are signed: degrees for ``orbit``, ``arc``, ``pan`` (positive turns right), ``tilt`` (positive looks up)
and ``roll``; scene units for ``dolly`` (positive moves in); a focal-length factor for ``zoom`` (above 1 zooms in,
below 1 out). The earlier names ``dolly_in``, ``dolly_out``, ``zoom_in`` and ``zoom_out`` are aliases (their
amount is a size; the name gives the direction). Plain Python (no torch): ``--help`` texts read it; the
trajectories are :func:`mmpos.camera.vocabulary.motion_trajectory`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MOTIONS = ("orbit", "arc", "dolly", "pan", "tilt", "roll", "zoom")
DEFAULT_AMOUNTS = {"orbit": 360.0, "arc": 60.0, "dolly": 1.0, "pan": 45.0, "tilt": 30.0, "roll": 30.0, "zoom": 2.0}
UNITS = {
    "orbit": "DEGREES",
    "arc": "DEGREES",
    "dolly": "UNITS",
    "pan": "DEGREES",
    "tilt": "DEGREES",
    "roll": "DEGREES",
    "zoom": "FACTOR",
}
ALIASES = {"dolly_in": "dolly", "dolly_out": "dolly", "zoom_in": "zoom", "zoom_out": "zoom"}
KEYWORDS = {
    "orbit": "degrees",
    "arc": "degrees",
    "pan": "degrees",
    "tilt": "degrees",
    "roll": "degrees",
    "dolly": "distance",
    "zoom": "factor",
}  # the amount's argument in mmpos.camera.presets


@dataclass(frozen=True)
class CameraMotion:
    """A motion of :data:`MOTIONS` with its signed amount (see the module docstring for the units)."""

    name: str
    amount: float

    def __str__(self) -> str:
        return f"{self.name}:{self.amount:g}"


def vocabulary_help() -> str:
    """One line for ``--help``: every name with its amount's unit and default."""
    names = ", ".join(f"{name}[:{UNITS[name]}]" for name in MOTIONS)
    return (
        f"{names} (signed; defaults {', '.join(f'{n}:{a:g}' for n, a in DEFAULT_AMOUNTS.items())}; "
        "aliases dolly_in, dolly_out, zoom_in, zoom_out)"
    )


def is_motion(spec: str) -> bool:
    """Whether ``spec`` names a motion (``preset:`` anything, or a vocabulary name with an optional amount)."""
    name = spec.removeprefix("preset:").partition(":")[0]
    return spec.startswith("preset:") or name in MOTIONS or name in ALIASES


def parse_motion(spec: str, defaults: dict | None = None) -> CameraMotion:
    """``"orbit:35"``, ``"preset:dolly_out"``, ... -> :class:`CameraMotion`; ``ValueError`` naming the vocabulary.
    ``defaults``: a model's own amounts for names given without one (else :data:`DEFAULT_AMOUNTS`)."""
    name, _, amount_text = spec.removeprefix("preset:").partition(":")
    if name not in MOTIONS and name not in ALIASES:
        raise ValueError(
            f"unknown camera motion {name!r}; expected one of {', '.join(MOTIONS)} "
            f"(aliases: {', '.join(ALIASES)}), e.g. orbit:35 or dolly:-0.5"
        )
    motion = ALIASES.get(name, name)
    try:
        amount = float(amount_text) if amount_text else {**DEFAULT_AMOUNTS, **(defaults or {})}[motion]
    except ValueError:
        amount = math.nan
    if not math.isfinite(amount):
        raise ValueError(f"{spec}: the amount after ':' must be a finite number ({UNITS[motion].lower()})")
    if motion == "zoom" and amount <= 0:
        raise ValueError(f"{spec}: a zoom factor must be positive (2: zoom in 2x, 0.5: zoom out 2x)")
    return CameraMotion(motion, _aliased(name, amount))


def _aliased(name: str, amount: float) -> float:
    if name == "dolly_in":
        return abs(amount)
    if name == "dolly_out":
        return -abs(amount)
    if name == "zoom_in":
        return max(amount, 1 / amount)
    if name == "zoom_out":
        return min(amount, 1 / amount)
    return amount
