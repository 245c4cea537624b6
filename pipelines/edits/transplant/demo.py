"""PE transplant on the world Fill model: insertion-pair calls, a run, and the world demo's section."""

from __future__ import annotations

from .. import get_edit
from ..method import run_edit

WORLD_LAYOUT = "world"  # run_transplant's default: the world Fill model's canvas layout


DEMO_SEED = 434_343  # insertion pairs never seen in training (those come from fill_canvas_example seeds)


def world_calls(pipe, pairs, steps: int, guidance=None) -> list:
    """One call per :func:`~mmpos.world.edit_pairs.transplant_pair`: its reference object at its box."""
    from mmpos.models.world.image import conditioning

    return [
        dict(
            image=pair.background.image,
            target_box=pair.box,
            references=[pair.reference.image],
            reference_masks=[pair.reference.masks[0]],
            num_inference_steps=steps,
            **conditioning(pipe, [pair.caption], guidance),
        )
        for pair in pairs
    ]


def run_transplant(pipe, pairs, steps: int = 20, transplant=WORLD_LAYOUT, guidance: float | None = None, seed: int = 0):
    """Insert each pair's reference object at its box (uint8 outputs, and ``raw``: the scene part of each canvas
    output before compositing). ``transplant``: TransplantConfig or dict; the default is the world Fill model's canvas
    layout :data:`~mmpos.world.canvas.WORLD_TRANSPLANT` (a dict given replaces it: write
    ``{**WORLD_TRANSPLANT, "tau": 0.5}`` to keep it; ``{}`` is the paper's corner layout for FLUX.1-Fill)."""
    if isinstance(transplant, str) and transplant == WORLD_LAYOUT:
        from mmpos.world.canvas import WORLD_TRANSPLANT

        transplant = WORLD_TRANSPLANT
    return run_edit(
        get_edit("transplant"),
        pipe,
        world_calls(pipe, pairs, steps, guidance),
        transplant,
        seed,
        output_type="pt",
        progress="PE transplant",
    )


def demo_section(source, steps: int, count: int, out_dir):
    """Object insertion: plain Fill (transplant disabled, same canvas) vs PE transplant, beside the ground truth."""
    import numpy as np

    from mmpos.eval.edit_scores import SCORE_NOTES, transplant_row
    from mmpos.world.canvas import WORLD_TRANSPLANT, insertion_canvas, scene_part
    from mmpos.world.edit_pairs import transplant_pair

    from ...report import error_map, with_box
    from ...world.demo import Section
    from .figures import transplant_diagnostic

    pairs = [transplant_pair(DEMO_SEED + i, source.size("fill")) for i in range(count)]
    pipe, guidance = source.pipeline("transplant"), source.guidance("fill")
    options = WORLD_TRANSPLANT if source.is_world("fill") else {}  # pretrained Fill: the paper's layout
    plain = run_transplant(pipe, pairs, steps, {**options, "enabled": False}, guidance)
    edited = run_transplant(pipe, pairs, steps, options, guidance)
    truth = np.stack([p.target.image for p in pairs])
    rows = [
        ("background, target box", np.stack([with_box(p.background.image, p.box) for p in pairs])),
        ("reference", np.stack([p.reference.image for p in pairs])),
        ("plain Fill", plain.outputs),
        ("PE transplant", edited.outputs),
        ("ground truth", truth),
        ("|error| transplant", error_map(edited.outputs, truth)),
    ]
    last = edited.last
    figure = transplant_diagnostic(last.canvas, last.ids, last.native_ids, out_dir / "world_transplant_ids.png")
    regions = [scene_part(insertion_canvas(p).mask) for p in pairs]  # the repainted (dilated) box
    table = [
        transplant_row("plain Fill", plain.outputs, pairs, regions, plain.raw),
        transplant_row("PE transplant", edited.outputs, pairs, regions, edited.raw),
        transplant_row("ground truth", truth, pairs, regions),
    ]
    return Section(
        "Object insertion: plain Fill vs PE transplant (PosBridgeFillPipeline)",
        rows,
        [p.caption for p in pairs],
        [figure],
        "Both rows run the same pipeline on the same canvas (reference tile left of the scene); plain "
        "Fill is transplant.enabled=False. The red outline is the target box. The figure shows the last "
        "example's canvas and the ids its tokens carry while sigma >= tau.",
        table,
        SCORE_NOTES["transplant"],
    )
