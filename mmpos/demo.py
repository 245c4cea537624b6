"""``mmpos demo``: a figure per registered encoding (spectrum and logit-vs-offset pattern)."""
from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from .encodings import create_pe, list_pes, pe_options

DEMO_OPTIONS = {"head_dim": 64, "embed_dim": 64, "num_heads": 4, "grid_size": (16, 16), "seed": 0}


def demo_encoding(name: str):
    """The encoding ``name`` with the demo's small settings (only the options it takes)."""
    valid = pe_options(name)
    return create_pe(name, **{k: v for k, v in DEMO_OPTIONS.items() if k in valid})


def run_demo(out_dir: Path, size: int = 31, world: bool = False, steps: int = 20, checkpoint=None) -> list[Path]:
    """Spectrum figures; with ``world``, also the mini-world generation/editing figures and report.html (from
    ``checkpoint``, or the shipped assets when they are there)."""
    from .viz.spectrum import encoding_figure

    out_dir = Path(out_dir)
    if world and checkpoint is not None:
        from .world.models import check_world_checkpoint

        check_world_checkpoint(checkpoint, tasks=("t2i",))
    written = []
    for name in tqdm(list_pes(), desc="encodings", unit="pe"):
        written.append(encoding_figure(demo_encoding(name), name, out_dir / f"{name}.png", size))
    if world:
        from .world.demo import run_world_demo, world_models_available

        if checkpoint is not None or world_models_available():
            written += run_world_demo(out_dir / "world", checkpoint, steps, extra_figures=written)
        else:
            print("no trained world models in assets/; wrote the encoding figures only")
    return written
