"""The PE editing pipelines (:mod:`mmpos.pipelines`) run on the world models and the world's edit pairs.

- :func:`run_transplant`: PE transplant (``PosBridgeFillPipeline``) on :func:`~mmpos.world.edits.transplant_pair`.
- :func:`run_loose`: LooseRoPE (``LooseRoPEKontextPipeline``) on :func:`~mmpos.world.edits.harmonise_pair`.
- :func:`run_band`: band modulation (``BandModulationFluxPipeline``) on :func:`~mmpos.world.edits.style_set`.

Each returns uint8 outputs ``[N, S, S, 3]`` in example order and the last call's pipeline output (for the
diagnostic figures). Configs are the pipelines' own (dataclass or dict); ``enabled=False`` (or strength 0) runs
the same pipeline as the stock model, which is the baseline every method is compared with.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._validation import check_choice
from .models import conditioning

METHODS = {"transplant": "fill", "loose": "kontext", "band": "t2i"}
LOOSE_SCHEDULE_STEPS = 28  # LooseConfig's step indices are for the authors' 28-step Kontext schedule


@dataclass
class EditRun:
    outputs: np.ndarray  # uint8 [N, S, S, 3]
    last: Any            # the last pipeline call's output (maps, canvas, ids) for diagnostics


def pipeline_class(method: str):
    from mmpos import pipelines

    check_choice("method", method, tuple(METHODS))
    return {"transplant": pipelines.PosBridgeFillPipeline, "loose": pipelines.LooseRoPEKontextPipeline,
            "band": pipelines.BandModulationFluxPipeline}[method]


def load_edit_pipeline(method: str, root=None, device="cpu"):
    """The editing pipeline for ``method`` (transplant, loose, band) on the world model it needs."""
    from .sources import ModelSource

    check_choice("method", method, tuple(METHODS))
    return ModelSource(root, device=device).pipeline(method)


def _uint8(images) -> np.ndarray:
    array = images.float().permute(0, 2, 3, 1).cpu().numpy() if isinstance(images, torch.Tensor) else images
    return (np.clip(np.asarray(array), 0, 1) * 255).round().astype(np.uint8)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def run_transplant(pipe, pairs, steps: int = 20, transplant=None, guidance: float | None = None,
                   seed: int = 0) -> EditRun:
    """Insert each pair's reference object at its box (``transplant``: TransplantConfig or dict; ``guidance``
    as in :func:`~mmpos.world.models.conditioning`, None: the pipeline's)."""
    outputs, result = [], None
    for pair in pairs:
        result = pipe(background=pair.background.image, target_box=pair.box, references=[pair.reference.image],
                      reference_masks=[pair.reference.masks[0]], transplant=transplant, num_inference_steps=steps,
                      generator=_generator(seed), output_type="pt", **conditioning(pipe, [pair.caption], guidance))
        outputs.append(_uint8(result.images)[0])
    return EditRun(np.stack(outputs), result)


def loose_for_steps(steps: int, **options) -> dict:
    """LooseConfig options with its step indices (``cutoffs``, ``step_range``) rescaled from the 28-step
    schedule they were tuned for to ``steps``."""
    from mmpos.pipelines import LooseConfig

    defaults = LooseConfig()
    rescale = lambda values: tuple(int(round(v * steps / LOOSE_SCHEDULE_STEPS)) for v in values)  # noqa: E731
    return {"cutoffs": rescale(defaults.cutoffs), "step_range": rescale(defaults.step_range), **options}


def run_loose(pipe, pairs, steps: int = 20, loose=None, guidance: float | None = 3.0, seed: int = 0) -> EditRun:
    """Harmonise each pair's collage (paste mask known) with LooseRoPE (``loose``: LooseConfig or dict)."""
    outputs, result = [], None
    for pair in pairs:
        size = pair.collage.shape[0]
        result = pipe(image=pair.collage, crop_mask=pair.paste_mask, loose=loose, num_inference_steps=steps,
                      height=size, width=size, max_area=size * size, _auto_resize=False,
                      generator=_generator(seed), output_type="np",
                      **conditioning(pipe, [pair.instruction], guidance))
        outputs.append(_uint8(result.images)[0])
    return EditRun(np.stack(outputs), result)


def run_band(pipe, style_sets, steps: int = 20, band=None, guidance: float | None = 3.0, seed: int = 0,
             reference_mode: str = "noise", probe=None) -> EditRun:
    """For each style set, generate its targets (content prompts) sharing attention with its reference image
    (``band``: BandConfig or dict); outputs are the targets of every set, in order."""
    outputs, result = [], None
    for style in style_sets:
        size = style.reference.image.shape[0]
        captions = [style.reference.spec.caption()] + list(style.prompts)
        result = pipe(band=band, reference_image=style.reference.image, reference_mode=reference_mode,
                      num_inference_steps=steps, height=size, width=size,
                      generator=_generator(seed), output_type="np", probe=probe,
                      **conditioning(pipe, captions, guidance))
        outputs.extend(_uint8(result.images)[1:])
    return EditRun(np.stack(outputs), result)
