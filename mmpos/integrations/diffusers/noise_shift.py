"""DyPE's noise-schedule shift: the ``mu`` a flow-matching pipeline hands its scheduler, by a DyPE convention.

The FLUX.1, Chroma, Qwen-Image and Z-Image pipelines (and the others that call ``calculate_shift``) compute, for
``n`` image tokens and their scheduler's config::

    mu = base_shift + (n - base_image_seq_len) * (max_shift - base_shift) / (max_image_seq_len - base_image_seq_len)

linear in ``n`` and extrapolated above ``max_image_seq_len`` (FLUX.1 at 2048 px: n = 16384, mu = 3.23 against 1.15
at its 1024 px training size); the scheduler then shifts each sigma to ``e^mu / (e^mu + 1 / sigma - 1)``.

Conventions (re-implemented from their formulas):

* ``"authors"``: the DyPE authors' FLUX.1 pipeline (guyyariv/DyPE ``flux/pipeline_flux.py``; their comment in
  wildminder/ComfyUI-DyPE#1) calls ``calculate_shift`` with ``max_image_seq_len = n``, which makes ``mu = max_shift``
  at every size: the shift FLUX.1 has at its training size. Their Qwen-Image script runs the stock pipeline;
  mmpos applies the FLUX.1 rule to every family (``docs/extrapolation.md``).
* ``"comfyui"``: ComfyUI-DyPE sets ``base_seq_len`` to the training grid's tokens and ``max_seq_len = n``:
  ``mu = max(0, max_shift if n > base_seq_len else base_shift)``, with its node's ``base_shift`` / ``max_shift``
  (defaults 0.5 / 1.15, not the scheduler's).
* ``None``: off, the pipeline's own ``mu``.

The value is installed as a scheduler whose config has ``base_shift = max_shift = mu`` (the pipeline's own
``calculate_shift`` then returns ``mu`` for any ``n``); DyPE's sigma stays in step with it on every scheduler
path because the transformer reads sigma from the ``timestep`` the pipeline passes.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Optional

CONVENTIONS = ("authors", "comfyui")
COMFYUI_SHIFTS = (0.5, 1.15)  # ComfyUI-DyPE's node defaults (base_shift, max_shift)


@dataclass(frozen=True)
class NoiseShift:
    """DyPE's shift of the noise schedule (see the module docstring).

    Args:
        convention: ``"authors"``, ``"comfyui"``, or ``None`` (off: the pipeline's ``mu``).
        base_shift, max_shift: ``None``: the scheduler's (``"authors"``) or ComfyUI-DyPE's 0.5 / 1.15
            (``"comfyui"``).
    """

    convention: Optional[str] = "authors"
    base_shift: Optional[float] = None
    max_shift: Optional[float] = None

    def __post_init__(self) -> None:
        if self.convention is not None and self.convention not in CONVENTIONS:
            raise ValueError(f"shift convention={self.convention!r} is unknown; expected one of {CONVENTIONS} or None")
        for name in ("base_shift", "max_shift"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"{name}={value!r}: expected a finite number or None")
        if self.convention == "authors" and self.base_shift is not None:
            raise ValueError("base_shift has no effect under the 'authors' convention (mu = max_shift at every size)")

    def mu(self, image_seq_len: int, train_seq_len: float, scheduler_config) -> Optional[float]:
        """The ``mu`` for ``image_seq_len`` tokens (``train_seq_len``: the training grid's tokens), ``None`` when
        off."""
        if self.convention is None:
            return None
        if self.convention == "authors":
            return float(self.max_shift if self.max_shift is not None else scheduler_config.get("max_shift", 1.15))
        base = COMFYUI_SHIFTS[0] if self.base_shift is None else self.base_shift
        top = COMFYUI_SHIFTS[1] if self.max_shift is None else self.max_shift
        return max(0.0, float(top if image_seq_len > train_seq_len else base))


def shift_refusal(pipe) -> Optional[str]:
    """Why ``pipe`` cannot take DyPE's noise shift, or ``None`` when it can: its pipeline computes ``mu`` with
    ``calculate_shift`` from a dynamic-shifting scheduler's config."""
    if not hasattr(sys.modules[type(pipe).__module__], "calculate_shift"):
        return (
            f"{type(pipe).__name__} does not compute mu with calculate_shift (the law DyPE's shift conventions "
            "change; FLUX.2: an empirical mu)"
        )
    config = pipe.scheduler.config
    if not config.get("use_dynamic_shifting", False) or "max_shift" not in config:
        return (
            f"{type(pipe.scheduler).__name__} does not take a resolution-dependent mu (use_dynamic_shifting=False or "
            "no base_shift / max_shift)"
        )
    return None


def apply_noise_shift(pipe, shift: NoiseShift, height: int, width: int, train_grid) -> Optional[float]:
    """Give ``pipe`` a copy of its scheduler whose config makes the pipeline's ``calculate_shift`` return the
    ``mu`` of ``shift`` for ``height x width`` outputs (``base_shift = max_shift = mu``; ``train_grid``: the training
    ``(rows, cols)`` tokens); returns ``mu``, or ``None`` (off: nothing changed). A pipeline that cannot take it is
    refused by name (:func:`shift_refusal`)."""
    if not isinstance(shift, NoiseShift):
        raise TypeError(f"shift must be a NoiseShift, got {type(shift).__name__}")
    if shift.convention is None:
        return None
    refusal = shift_refusal(pipe)
    if refusal is not None:
        raise ValueError(f"{refusal}: DyPE's noise shift cannot apply; pass shift=None")
    per_token = pipe.vae_scale_factor * 2
    tokens = (int(height) // per_token) * (int(width) // per_token)
    mu = shift.mu(tokens, float(train_grid[0]) * float(train_grid[1]), pipe.scheduler.config)
    pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config, base_shift=mu, max_shift=mu)
    return mu
