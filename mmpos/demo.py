"""``mmpos demo``: a figure per registered encoding (spectrum and logit-vs-offset pattern; for camera
encodings, the pattern across two views), and camera figures (rig, ray and latitude/up maps) in ``cameras/``."""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from .encodings import create_pe, list_pes, pe_class, pe_options

DEMO_OPTIONS = {"head_dim": 64, "embed_dim": 64, "num_heads": 4, "grid_size": (16, 16), "seed": 0}
DEMO_OVERRIDES = {"rayrope": {"head_dim": 48}}  # head_dim must be a multiple of 24 (12 coordinates x 2)
FIGURE_NOTES = {  # what a figure would leave unexplained
    "mrope": "chunked (t, row, col): rows read pairs 12-21 (0.03-0.002 rad/px), columns pairs 22-31 (< 0.002 rad/px), "
    "so over +-15 px the logit barely moves, least along columns; MRoPE-I interleaves the axes",
}


def demo_encoding(name: str):
    """The encoding ``name`` with the demo's small settings (only the options it takes)."""
    valid = pe_options(name)
    options = {**DEMO_OPTIONS, **DEMO_OVERRIDES.get(name, {})}
    return create_pe(name, **{k: v for k, v in options.items() if k in valid})


def run_demo(
    out_dir: Path, size: int = 31, world: bool = False, steps: int = 20, checkpoint=None, source=None, count: int = 6
) -> list[Path]:
    """Spectrum and camera figures; with ``world``, also the mini-world generation/editing figures and
    report.html (from ``source``, a :class:`~mmpos.pipelines.world.sources.ModelSource`, else ``checkpoint``, else the
    shipped assets when they are there)."""
    from .viz.cameras import camera_encoding_figure, demo_camera_figures
    from .viz.spectrum import encoding_figure

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file; expected a folder")
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if world and checkpoint is not None and not (source is not None and source.models):
        from .models.world.image import check_world_checkpoint

        check_world_checkpoint(checkpoint, tasks=("t2i",))
    written = []
    for name in tqdm(list_pes(), desc="encodings", unit="pe"):
        if pe_class(name).capabilities.needs_cameras:
            written.append(camera_encoding_figure(name, out_dir / f"{name}.png"))
        else:
            written.append(
                encoding_figure(demo_encoding(name), name, out_dir / f"{name}.png", size, FIGURE_NOTES.get(name, ""))
            )
    written += demo_camera_figures(out_dir / "cameras")
    if world:
        from mmpos.pipelines.world.demo import run_world_demo, world_models_available

        if source is not None or checkpoint is not None or world_models_available():
            written += run_world_demo(out_dir / "world", checkpoint, steps, count, extra_figures=written, source=source)
        else:
            print("no trained world models in assets/; wrote the encoding figures only")
    return written
