"""xDiT (``xfuser``): mmpos refuses to run with it, by name, rather than be silently wrong.

xDiT's USP replaces a transformer's attention processors with its own (``xfuser.model_executor...``), and its
wrappers split the sequence outside diffusers' context-parallel plan: the rank's position module then sees its
shard as if it were the whole sequence (no global coordinates, no global extents), and mmpos processors in place of
xDiT's would attend within the shard only. Neither composes exactly, so:

- :func:`check_no_xdit_processors`: installing anything (``set_pe``, a camera adapter, an edit) on a transformer
  whose processors are xDiT's is refused;
- :func:`check_no_xdit_parallelism`: installing, or running a forward of a model with mmpos installed, while
  xDiT's sequence, pipeline or tensor parallel state is initialised with a degree above 1 is refused (read from
  ``sys.modules``: xfuser is never imported here).

Use diffusers' own context parallelism instead (``transformer.enable_parallelism(config=ContextParallelConfig(
ulysses_degree=N))`` after ``set_pe``: exact, tested), see ``docs/scaling.md``.
"""

from __future__ import annotations

import sys

import torch

PREFIX = "xfuser"
STATE_MODULES = ("xfuser.core.distributed.parallel_state", "xfuser.distributed.parallel_state")
GROUPS = (("sequence", "_SP"), ("pipeline", "_PP"), ("tensor", "_TP"))
USE_INSTEAD = (
    "use diffusers' context parallelism instead (transformer.enable_parallelism(config=ContextParallelConfig("
    "ulysses_degree=N)) after set_pe; docs/scaling.md), or xDiT without mmpos"
)


def is_xdit(processor) -> bool:
    module = type(processor).__module__ or ""
    return module == PREFIX or module.startswith(PREFIX + ".")


def check_no_xdit_processors(processors) -> None:
    """Refuse ``(layer name, processor)`` pairs where a processor is xDiT's."""
    for name, processor in processors:
        if is_xdit(processor):
            cls = type(processor)
            raise TypeError(
                f"{name} runs xDiT's {cls.__name__} ({cls.__module__}): mmpos does not compose with xDiT's USP "
                f"processors, and putting the stock ones back under xDiT would attend within each rank's shard; "
                f"{USE_INSTEAD}"
            )


def parallel_degrees() -> dict:
    """xDiT's initialised parallel groups with a degree above 1 (``{"sequence": 2}``); ``{}`` without xfuser
    loaded. A group whose size cannot be read counts as parallel (its degree ``None``)."""
    for name in STATE_MODULES:
        state = sys.modules.get(name)
        if state is None:
            continue
        groups = [(label, getattr(state, attribute, None)) for label, attribute in GROUPS]
        sizes = [(label, getattr(group, "world_size", None)) for label, group in groups if group is not None]
        return {label: size for label, size in sizes if not isinstance(size, int) or size > 1}
    return {}


def check_no_xdit_parallelism(what: str) -> None:
    """Refuse ``what`` while xDiT's parallel state shards the sequence, the pipeline or the heads (not checked while
    ``torch.compile`` traces: the check at install time stands)."""
    if torch.compiler.is_compiling():
        return
    degrees = parallel_degrees()
    if degrees:
        named = ", ".join(
            f"{label} degree {size if isinstance(size, int) else 'unknown'}" for label, size in degrees.items()
        )
        raise RuntimeError(
            f"{what} under xDiT (xfuser) parallelism ({named}) is not supported: xDiT splits the sequence outside "
            f"diffusers' context-parallel plan, so each rank would build its positions as if its shard were the "
            f"whole sequence; {USE_INSTEAD}"
        )
