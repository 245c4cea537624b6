"""``mmpos demo``: a figure per registered encoding (spectrum and logit-vs-offset pattern; for camera
encodings, the pattern across two views), and camera figures (rig, ray and latitude/up maps) in ``cameras/``."""
from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from .encodings import create_pe, list_pes, pe_class, pe_options

DEMO_OPTIONS = {"head_dim": 64, "embed_dim": 64, "num_heads": 4, "grid_size": (16, 16), "seed": 0}
DEMO_OVERRIDES = {"rayrope": {"head_dim": 48}}  # head_dim must be a multiple of 24 (12 coordinates x 2)


def demo_encoding(name: str):
    """The encoding ``name`` with the demo's small settings (only the options it takes)."""
    valid = pe_options(name)
    options = {**DEMO_OPTIONS, **DEMO_OVERRIDES.get(name, {})}
    return create_pe(name, **{k: v for k, v in options.items() if k in valid})


def run_demo(out_dir: Path, size: int = 31) -> list[Path]:
    from .viz.cameras import camera_encoding_figure, demo_camera_figures
    from .viz.spectrum import encoding_figure

    out_dir = Path(out_dir)
    written = []
    for name in tqdm(list_pes(), desc="encodings", unit="pe"):
        if pe_class(name).kind == "camera":
            written.append(camera_encoding_figure(name, out_dir / f"{name}.png"))
        else:
            written.append(encoding_figure(demo_encoding(name), name, out_dir / f"{name}.png", size))
    return written + demo_camera_figures(out_dir / "cameras")
