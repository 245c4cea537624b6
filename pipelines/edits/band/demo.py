"""Band modulation on the world t2i model: style-set calls, a run, and the world demo's section."""

from __future__ import annotations

from .. import get_edit
from ..method import run_edit

STRENGTHS = (0.0, 0.5, 1.0)  # the demo's rows; 0: shared attention with the bands unscaled


DEMO_SEED = 444_444  # the demo's style sets


def world_calls(pipe, style_sets, steps: int, guidance=None, reference_mode: str = "noise", probe=None) -> list:
    """One call per :func:`~mmpos.world.edit_pairs.style_set`: its reference image shared with its targets
    (content prompts)."""
    from mmpos.models.world.image import conditioning

    calls = []
    for style in style_sets:
        size = style.reference.image.shape[0]
        captions = [style.reference.spec.caption()] + list(style.prompts)
        calls.append(
            dict(
                reference_image=style.reference.image,
                reference_mode=reference_mode,
                num_inference_steps=steps,
                height=size,
                width=size,
                probe=probe,
                **conditioning(pipe, captions, guidance),
            )
        )
    return calls


def run_band(
    pipe,
    style_sets,
    steps: int = 20,
    band=None,
    guidance: float | None = None,
    seed: int = 0,
    reference_mode: str = "noise",
    probe=None,
):
    """For each style set, generate its targets sharing attention with its reference image (``band``: BandConfig
    or dict); outputs (uint8) are the targets of every set, in order; set ``i`` samples with ``seed + i``."""
    return run_edit(
        get_edit("band"),
        pipe,
        world_calls(pipe, style_sets, steps, guidance, reference_mode, probe),
        band,
        seed,
        progress="band modulation",
    )


def demo_section(source, steps: int, count: int, out_dir):
    """Style-aligned sets: no sharing, then band modulation at :data:`STRENGTHS`, beside the ground truth."""
    import numpy as np

    from mmpos.eval.edit_scores import SCORE_NOTES, style_row
    from mmpos.world.edit_pairs import style_set
    from mmpos.world.images import to_chw

    from ...world.demo import Section
    from .figures import band_attention_maps, band_diagnostic

    size = source.size("t2i")
    sets = [style_set(DEMO_SEED + i, 2, size) for i in range(max(count // 2, 1))]
    pipe, guidance = source.pipeline("band"), source.guidance("t2i")
    references = [s.reference for s in sets for _ in s.targets]
    rows = [
        ("reference", np.stack([r.image for r in references])),
        ("no sharing", run_band(pipe, sets, steps, {"enabled": False}, guidance).outputs),
    ]
    for strength in STRENGTHS:
        probe = (0, 0.5) if strength == STRENGTHS[-1] else None
        rows.append(
            (
                f"band strength {strength}",
                run_band(pipe, sets, steps, {"strength": strength}, guidance, probe=probe).outputs,
            )
        )
    rows.append(("ground truth", np.stack([t.image for s in sets for t in s.targets])))
    table = [style_row(label, images, references) for label, images in rows[1:]]
    grid = (size // pipe.token_pixels,) * 2
    token = grid[0] // 2 * grid[1] + grid[1] // 2
    maps = band_attention_maps(pipe.probe.query, pipe.probe.key, pipe.transformer.config.axes_dims_rope, grid, token)
    figure = band_diagnostic(maps, grid, token, out_dir / "world_band_attention.png", to_chw(sets[-1].reference.image))
    strengths = ", ".join(str(s) for s in STRENGTHS)
    return Section(
        f"Style-aligned sets: band modulation at strengths {strengths} (BandModulationFluxPipeline)",
        rows,
        [p for s in sets for p in s.prompts],
        [figure],
        "Targets get their content prompt only; the style comes from the shared reference image (no "
        "sharing: no attention to it; strength 0: shared attention with the bands unscaled). The "
        "figure: attention of the centre query of the last set's first target over its reference "
        f"(layer 0, strength {STRENGTHS[-1]}, half-way through sampling), per frequency band.",
        table,
        SCORE_NOTES["style"],
    )
