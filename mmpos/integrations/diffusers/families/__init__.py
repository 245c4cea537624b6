"""The diffusers transformer families mmpos reaches: one module each, registered here.

    from mmpos.integrations.diffusers.families import family_for, list_families
    list_families()            # ['chroma', 'flux', 'flux2', ...]
    family_for(transformer)    # the Family of a model (its class or a subclass), or a TypeError naming them all

Adding a family is one module in this package that calls :func:`register_family`, plus its line in
``_MODULES`` below (see ``docs/adding_a_family.md``).
"""

from __future__ import annotations

import importlib
from typing import Optional, Sequence

from torch import nn

from .base import STOCK, AxisSpectrum, Family, SpectrumSeam
from .coverage import EXCLUDED, rotary_transformer_classes, uncovered

FAMILIES: dict[str, Family] = {}

# one line per family module (imported on first use: diffusers is imported lazily)
_MODULES = (
    "flux",
    "wan",
    "qwen",
    "flux2",
    "hidream",
    "kandinsky6",
    "ltx",
    "chroma",
    "longcat_image",
    "flux3",
    "krea2",
    "z_image",
    "lumina2",
    "qwenimage21",
    "hunyuan_video15",
    "hunyuan_video",
    "skyreels_v2",
    "cogview4",
    "bria",
    "ovis_image",
    "hunyuan_image",
    "motif_video",
    "hunyuan_video_framepack",
    "nucleusmoe_image",
    "kandinsky5",
    "kandinsky6_sr",
    "ernie_image",
    "prx",
    "glm_image",
    "ideogram4",
    "bria_fibo2",
    "anyflow",
    "joyimage",
    "ltx2",
    "minimax_h3",
    "helios",
    "cosmos",
    "sana_wm",
    "wan_animate2",
    "cogvideox",
    "hunyuandit",
    "allegro",
    "cosmos3",
    "easyanimate",
    "lumina_next",
    "mochi",
)
_loaded = False
_BUILTIN: set[str] = set()


def register_family(family: Family) -> Family:
    """Add ``family`` to the registry (its name must be new); returns it."""
    if family.name in FAMILIES and FAMILIES[family.name] is not family:
        raise ValueError(f"a diffusers family named {family.name!r} is already registered")
    if family.tier not in (1, 2):
        raise ValueError(f"family {family.name!r}: tier must be 1 or 2, got {family.tier!r}")
    if family.camera is not None and family.latent_grid is None:
        raise ValueError(
            f"family {family.name!r}: camera adapters need the family's latent_grid (the video token grid)"
        )
    FAMILIES[family.name] = family
    return family


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for name in _MODULES:
            importlib.import_module(f"{__name__}.{name}")
        _BUILTIN.update(FAMILIES)


def list_families() -> list[str]:
    """Names of the registered families."""
    _load()
    return sorted(FAMILIES)


def builtin_families() -> list[str]:
    """Names of the families this package ships (not those a user registered)."""
    _load()
    return sorted(_BUILTIN)


def get_family(name: str) -> Family:
    _load()
    if name not in FAMILIES:
        raise ValueError(f"unknown diffusers family {name!r}; expected one of {sorted(FAMILIES)}")
    return FAMILIES[name]


def family_for_pipeline(class_name: str) -> Family | None:
    """The family whose ``pipelines`` name ``class_name`` (a ``model_index.json`` ``_class_name``), or ``None``."""
    _load()
    return next((f for f in FAMILIES.values() if class_name in f.pipelines), None)


def family_for(model: nn.Module) -> Family:
    """The family covering ``model``'s class (exact class first, then subclasses); a clear error otherwise."""
    _load()
    matches = [
        (family, cls) for family in FAMILIES.values() for cls in family.model_classes() if isinstance(model, cls)
    ]
    exact = [family for family, cls in matches if type(model) is cls]
    if exact or matches:
        return (exact or [matches[0][0]])[0]
    names = ", ".join(
        sorted(c.__name__ if isinstance(c, type) else c.split(":")[1] for f in FAMILIES.values() for c in f.classes)
    )
    raise TypeError(
        f"set_pe supports the diffusers families {sorted(FAMILIES)} ({names}); got "
        f"{type(model).__name__}. A new family is one module in mmpos/integrations/diffusers/families "
        "(docs/adding_a_family.md)."
    )


def supported_classes() -> dict[type, Family]:
    """Every covered diffusers transformer class this install has, with its family."""
    _load()
    return {cls: family for family in FAMILIES.values() for cls in family.model_classes()}


def markdown_table(timings: Optional[Sequence[dict]] = None) -> str:
    """The README table of the shipped families (``python -m mmpos.integrations.diffusers.families``).

    ``timings``: the rows of ``benchmarks/bench_families.py --out`` (``family``, ``native_x``, ``dype_x``: forward
    time over stock; ``native_overhead_ms``, ``dype_overhead_ms``: the absolute difference, shown where given); a
    family without a row gets ``-`` in the forward-time column."""
    measured = {row["family"]: row for row in timings or ()}
    rows = [
        "| family | diffusers class | pipelines | tier | context parallel | extrapolation scales | camera adapters "
        "| forward vs stock (native / DyPE; ms per forward) | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in builtin_families():
        family = FAMILIES[name]
        classes = ", ".join(f"`{c.split(':')[1] if isinstance(c, str) else c.__name__}`" for c in family.classes)
        pipelines = ", ".join(family.pipelines) or "-"
        parallel = context_parallel_row(family)
        scales = extrapolation_row(family)
        cameras = camera_row(family)
        row = measured.get(name)
        timing = timing_cell(row) if row else "-"
        rows.append(
            f"| `{name}` | {classes} | {pipelines} | {family.tier} | {parallel} | {scales} | {cameras} | {timing} "
            f"| {family.notes} |"
        )
    return "\n".join(rows)


def timing_cell(row: dict) -> str:
    """The table's forward-time cell of a benchmark row: ``native / DyPE`` over stock, each with its absolute
    difference from stock per forward where the row has it (``0.99x (-0.01 ms) / 1.37x (+3.2 ms)``)."""
    cells = []
    for method in ("native", "dype"):
        overhead = row.get(f"{method}_overhead_ms")
        ms = "" if overhead is None else f" ({overhead:+.2f} ms)"
        cells.append(f"{row[f'{method}_x']:.2f}x{ms}")
    return " / ".join(cells)


def extrapolation_row(family: Family) -> str:
    """The table's extrapolation cell: the axes :func:`~..extrapolation.model_extrapolation`'s presets scale (the
    image rows and columns), and the time axis its ``time=`` policy (RIFLEx) takes, named as the family's axes."""
    image = ", ".join(family.axis_names[a] for a in family.image_axes)
    if family.time_axis is None:
        return image
    return f"{image}; `time=`: {family.axis_names[family.time_axis]}"


def camera_row(family: Family) -> str:
    """The table's camera-adapter cell: the kinds a family with a camera site takes (the registered camera encodings
    that build an adapter), and the per-token ones it keeps under context parallelism; ``-`` without a site."""
    if family.camera is None:
        return "-"
    from ....encodings.registry import list_pes, pe_capabilities

    kinds = [name for name in list_pes("camera") if pe_capabilities(name).adapter]
    cell = ", ".join(kinds)
    if family.context_parallel or family.camera.context_parallel is not None:
        cell += " (context parallel: " + ", ".join(k for k in kinds if pe_capabilities(k).additive) + ")"
    return cell


def context_parallel_row(family: Family) -> str:
    """The table's context-parallel cell: verified (:attr:`Family.context_parallel`), else refused by name, and
    whether this diffusers install has a ``_cp_plan`` for the family's classes; a family whose camera adapters alone
    are verified (its camera site's ``context_parallel``) says so first."""
    if family.context_parallel:
        return "yes (tested, 2 processes)"
    planned = any(getattr(cls, "_cp_plan", None) is not None for cls in family.model_classes())
    refused = "refused by name (diffusers plan, not verified)" if planned else "refused by name (no diffusers plan)"
    if family.camera is not None and family.camera.context_parallel is not None:
        return f"camera adapters alone (tested, 2 processes; see the family's plan); `set_pe`: {refused}"
    return refused


__all__ = [
    "Family",
    "AxisSpectrum",
    "STOCK",
    "SpectrumSeam",
    "FAMILIES",
    "register_family",
    "list_families",
    "builtin_families",
    "get_family",
    "family_for",
    "family_for_pipeline",
    "supported_classes",
    "markdown_table",
    "EXCLUDED",
    "rotary_transformer_classes",
    "uncovered",
]
