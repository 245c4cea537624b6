"""LooseRoPE on the world Kontext model: harmonise-pair calls, a run, and the world demo's section."""

from __future__ import annotations

from .. import get_edit
from ..method import run_edit

SCHEDULE_STEPS = 28  # LooseConfig's step indices are for the authors' 28-step Kontext schedule


DEMO_SEED = 424_242  # harmonise pairs never seen in training (those come from instruction_pair seeds)


def loose_for_steps(steps: int, **options) -> dict:
    """LooseConfig options with its step indices (``cutoffs``, ``step_range``) rescaled from the 28-step
    schedule they were tuned for to ``steps`` (rounded: below about 10 steps phases merge)."""
    from .rule import LooseConfig

    defaults = LooseConfig()
    rescale = lambda values: tuple(int(round(v * steps / SCHEDULE_STEPS)) for v in values)  # noqa: E731
    return {"cutoffs": rescale(defaults.cutoffs), "step_range": rescale(defaults.step_range), **options}


def world_calls(pipe, pairs, steps: int, guidance=None) -> list:
    """One call per :func:`~mmpos.world.edit_pairs.harmonise_pair`: its collage, paste mask known."""
    from mmpos.models.world.image import conditioning

    calls = []
    for pair in pairs:
        size = pair.collage.shape[0]
        calls.append(
            dict(
                image=pair.collage,
                crop_mask=pair.paste_mask,
                num_inference_steps=steps,
                height=size,
                width=size,
                max_area=size * size,
                _auto_resize=False,
                **conditioning(pipe, [pair.instruction], guidance),
            )
        )
    return calls


def run_loose(pipe, pairs, steps: int = 20, loose=None, guidance: float | None = None, seed: int = 0):
    """Harmonise each pair's collage (paste mask known) with LooseRoPE (``loose``: LooseConfig or dict); uint8
    outputs, pair ``i`` sampled with ``seed + i``."""
    return run_edit(
        get_edit("loose"), pipe, world_calls(pipe, pairs, steps, guidance), loose, seed, progress="LooseRoPE"
    )


def demo_section(source, steps: int, count: int, out_dir):
    """Paste harmonisation: plain Kontext (strength 0) vs LooseRoPE, beside the ground truth."""
    import numpy as np

    from mmpos.eval.edit_scores import SCORE_NOTES, harmonise_row
    from mmpos.world.edit_pairs import harmonise_pair
    from mmpos.world.images import to_chw

    from ...report import error_map, mask_image
    from ...world.demo import Section
    from .figures import loose_diagnostic
    from .rule import LooseConfig

    pairs = [harmonise_pair(DEMO_SEED + i, source.size("kontext")) for i in range(count)]
    pipe, guidance = source.pipeline("loose"), source.guidance("kontext")
    plain = run_loose(pipe, pairs, steps, loose_for_steps(steps, strength=0.0), guidance)
    config = loose_for_steps(steps)
    edited = run_loose(pipe, pairs, steps, config, guidance)
    truth = np.stack([p.target.image for p in pairs])
    rows = [
        ("pasted", np.stack([p.collage for p in pairs])),
        ("plain Kontext", plain.outputs),
        ("LooseRoPE", edited.outputs),
        ("ground truth", truth),
        ("paste mask", mask_image(np.stack([p.paste_mask for p in pairs]))),
        ("|error| LooseRoPE", error_map(edited.outputs, truth)),
    ]
    figure = loose_diagnostic(
        edited.last.maps, LooseConfig(**config), out_dir / "world_loose_maps.png", to_chw(pairs[-1].collage)
    )
    table = [
        harmonise_row("unedited collage", np.stack([p.collage for p in pairs]), pairs),
        harmonise_row("plain Kontext", plain.outputs, pairs),
        harmonise_row("LooseRoPE", edited.outputs, pairs),
        harmonise_row("ground truth", truth, pairs),
    ]
    return Section(
        "Paste harmonisation: plain Kontext vs LooseRoPE (LooseRoPEKontextPipeline)",
        rows,
        [pairs[0].instruction],
        [figure],
        "Plain Kontext is the same pipeline at strength 0. The figure shows the last example's token "
        "saliency, bins and per-token factors.",
        table,
        SCORE_NOTES["harmonise"],
    )
