"""Scores of the three editing tasks against ground truth, one row per method, shared by
``scripts/eval_editing.py`` (its tables) and the demo report (a table under each section, on the shown examples).

Each ``*_row`` returns ``{"method": name, score: mean over examples, ...}`` (rounded to 4 digits) from uint8
outputs ``[N, S, S, 3]`` in the order of the pairs / style sets they were made from.
"""

from __future__ import annotations

import numpy as np

from .metrics import (
    change_outside,
    colour_mask,
    insertion_scores,
    iou,
    layout_copy,
    palette_similarity,
    texture_similarity,
)

SCORE_NOTES = {  # what each score measures, and which way is better (the report's table captions)
    "transplant": "mask_iou: inserted object vs its true mask (higher is better); colour_error: mean |colour - true| "
    "inside it (lower); outside_change: mean |change| outside the repainted box on the raw output "
    "(lower)",
    "harmonise": "identity_iou: object kept inside the paste (higher is better); style_texture: object texture "
    "vs the target's (higher); margin_error: |error| on the pasted background margin (lower)",
    "style": "palette, texture: similarity to the reference (higher = more of its style); layout_copy: IoU with "
    "the reference's objects (lower = its layout not copied)",
}


def mean_scores(rows: list[dict]) -> dict:
    return {k: round(float(np.mean([r[k] for r in rows])), 4) for k in rows[0]}


def transplant_row(method: str, outputs, pairs, regions, raw=None) -> dict:
    """Object scores on the composited ``outputs``; change outside the repainted ``regions`` (bool ``[S, S]`` per
    pair) on the ``raw`` (uncomposited) outputs, where the pipeline has not pasted the input back."""
    raw = outputs if raw is None else raw
    return {
        "method": method,
        **mean_scores(
            [
                {
                    **insertion_scores(o, p.background.image, p.mask, p.target.spec.objects[-1].colour, region),
                    "outside_change": change_outside(r, p.background.image, region),
                }
                for o, r, p, region in zip(outputs, raw, pairs, regions)
            ]
        ),
    }


def harmonise_scores(output, pair) -> dict:
    obj = pair.target.spec.objects[-1]
    found = colour_mask(output, obj.colour) & pair.paste_mask
    margin = pair.paste_mask & ~pair.object_mask
    x0, y0, x1, y1 = obj.box
    crop = (slice(y0, y1), slice(x0, x1))
    return {
        "identity_iou": iou(found, pair.object_mask),
        "style_texture": texture_similarity(output[crop], pair.target.image[crop]),
        "margin_error": float(np.abs(output[margin].astype(float) - pair.target.image[margin]).mean() / 255),
    }


def harmonise_row(method: str, outputs, pairs) -> dict:
    return {"method": method, **mean_scores([harmonise_scores(o, p) for o, p in zip(outputs, pairs)])}


def style_row(method: str, outputs, references) -> dict:
    """``references``: the reference scene (``Rendered``) of each output, in order."""
    return {
        "method": method,
        **mean_scores(
            [
                {
                    "palette": palette_similarity(o, r.image),
                    "texture": texture_similarity(o, r.image),
                    "layout_copy": layout_copy(o, r.masks, r.spec.style.background),
                }
                for o, r in zip(outputs, references)
            ]
        ),
    }
