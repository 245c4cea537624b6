"""The PE editing pipelines (:mod:`mmpos.pipelines`) run on the world models and the world's edit pairs.

- :func:`run_transplant`: PE transplant (``PosBridgeFillPipeline``) on :func:`~mmpos.world.edit_pairs.transplant_pair`.
- :func:`run_loose`: LooseRoPE (``LooseRoPEKontextPipeline``) on :func:`~mmpos.world.edit_pairs.harmonise_pair`.
- :func:`run_band`: band modulation (``BandModulationFluxPipeline``) on :func:`~mmpos.world.edit_pairs.style_set`.

Each returns uint8 outputs ``[N, S, S, 3]`` in example order and the last call's pipeline output (for the
diagnostic figures); example ``i`` samples with ``seed + i``. Configs are the pipelines' own (dataclass or dict);
``enabled=False`` (or strength 0) runs the same pipeline as the stock model, which is the baseline every method is
compared with. ``guidance`` is as in :func:`~mmpos.models.world.image.conditioning` (None: the pipeline's default; the
world's t2i and Kontext models sample with true CFG 3.0, see :data:`~mmpos.world.sources.WORLD_GUIDANCE`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from .canvas import WORLD_TRANSPLANT
from .images import to_uint8
from ..models.world.image import conditioning

LOOSE_SCHEDULE_STEPS = 28  # LooseConfig's step indices are for the authors' 28-step Kontext schedule


@dataclass
class EditRun:
    outputs: np.ndarray                  # uint8 [N, S, S, 3]
    last: Any                            # the last pipeline call's output (maps, canvas, ids) for diagnostics
    raw: Optional[np.ndarray] = None     # transplant: the scene part of each canvas output, before compositing


def load_edit_pipeline(method: str, root=None, device="cpu"):
    """The editing pipeline for ``method`` (transplant, loose, band) on the world model it needs."""
    from .sources import ModelSource

    return ModelSource(root, device=device).pipeline(method)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def run_transplant(pipe, pairs, steps: int = 20, transplant=WORLD_TRANSPLANT, guidance: float | None = None,
                   seed: int = 0) -> EditRun:
    """Insert each pair's reference object at its box. ``transplant``: TransplantConfig or dict; the default is
    the world Fill model's canvas layout :data:`~mmpos.world.canvas.WORLD_TRANSPLANT` (a dict given replaces it:
    write ``{**WORLD_TRANSPLANT, "tau": 0.5}`` to keep it; ``{}`` is the paper's corner layout for FLUX.1-Fill)."""
    outputs, raw, result = [], [], None
    for index, pair in enumerate(tqdm(pairs, desc="PE transplant", unit="pair", leave=False)):
        result = pipe(image=pair.background.image, target_box=pair.box, references=[pair.reference.image],
                      reference_masks=[pair.reference.masks[0]], transplant=transplant, num_inference_steps=steps,
                      generator=_generator(seed + index), output_type="pt",
                      **conditioning(pipe, [pair.caption], guidance))
        outputs.append(to_uint8(result.images)[0])
        rows, cols = result.canvas.layout.background.slices
        raw.append(to_uint8(result.canvas_images[..., rows, cols])[0])
    return EditRun(np.stack(outputs), result, np.stack(raw))


def loose_for_steps(steps: int, **options) -> dict:
    """LooseConfig options with its step indices (``cutoffs``, ``step_range``) rescaled from the 28-step
    schedule they were tuned for to ``steps`` (rounded: below about 10 steps phases merge)."""
    from mmpos.pipelines import LooseConfig

    defaults = LooseConfig()
    rescale = lambda values: tuple(int(round(v * steps / LOOSE_SCHEDULE_STEPS)) for v in values)  # noqa: E731
    return {"cutoffs": rescale(defaults.cutoffs), "step_range": rescale(defaults.step_range), **options}


def run_loose(pipe, pairs, steps: int = 20, loose=None, guidance: float | None = None, seed: int = 0) -> EditRun:
    """Harmonise each pair's collage (paste mask known) with LooseRoPE (``loose``: LooseConfig or dict)."""
    outputs, result = [], None
    for index, pair in enumerate(tqdm(pairs, desc="LooseRoPE", unit="pair", leave=False)):
        size = pair.collage.shape[0]
        result = pipe(image=pair.collage, crop_mask=pair.paste_mask, loose=loose, num_inference_steps=steps,
                      height=size, width=size, max_area=size * size, _auto_resize=False,
                      generator=_generator(seed + index), output_type="np",
                      **conditioning(pipe, [pair.instruction], guidance))
        outputs.append(to_uint8(result.images)[0])
    return EditRun(np.stack(outputs), result)


def run_band(pipe, style_sets, steps: int = 20, band=None, guidance: float | None = None, seed: int = 0,
             reference_mode: str = "noise", probe=None) -> EditRun:
    """For each style set, generate its targets (content prompts) sharing attention with its reference image
    (``band``: BandConfig or dict); outputs are the targets of every set, in order."""
    outputs, result = [], None
    for index, style in enumerate(tqdm(style_sets, desc="band modulation", unit="set", leave=False)):
        size = style.reference.image.shape[0]
        captions = [style.reference.spec.caption()] + list(style.prompts)
        result = pipe(band=band, reference_image=style.reference.image, reference_mode=reference_mode,
                      num_inference_steps=steps, height=size, width=size,
                      generator=_generator(seed + index), output_type="np", probe=probe,
                      **conditioning(pipe, captions, guidance))
        outputs.extend(to_uint8(result.images)[1:])
    return EditRun(np.stack(outputs), result)
