"""The one check of the parallelism a model with mmpos installed runs under: what is not verified is refused by name.

diffusers' ``enable_parallelism(config=...)`` (and ``from_pretrained(..., parallel_config=...)``) records a
``ParallelConfig`` on the model as ``_parallel_config`` (``None`` otherwise); its ``context_parallel_config`` is set
for context parallelism (the sequence split over the ranks by the model's ``_cp_plan`` or the caller's ``cp_plan``),
its ``tensor_parallel_config`` for tensor parallelism. :func:`check_parallelism` allows:

- context parallelism on a family whose seam a 2-process test showed equal to one process
  (:attr:`~.families.Family.context_parallel`: FLUX.1, FLUX.2, Wan, Qwen-Image, LTX-Video); every other family is refused
  (diffusers 0.42.1 ships no ``_cp_plan`` for most of them, so a plan would be the caller's, and the seam would see
  shards it was never checked on); the refusal says when the model's class has no ``_cp_plan`` in the installed
  diffusers;
- camera adapters alone (no ``set_pe``) on a family whose :class:`~.families.base.CameraSite` declares a
  ``context_parallel`` check (LTX-2, on the plan :func:`~.families.ltx2.ltx2_context_parallel_plan`), which runs instead
  of the refusal;
- no tensor parallelism (no family is verified under it), and no xDiT parallel state (:mod:`.xdit`).

It runs in ``set_pe`` (a model already parallel), when a camera adapter is installed, and at every forward with
mmpos installed: in the processor installer's pre-forward hook (tier-2 ``set_pe``, camera adapters, edits) and in
tier-1 ``set_pe``'s hook. Not while ``torch.compile`` traces (the check at install time stands).
"""

from __future__ import annotations

import diffusers
import torch

from .context_parallel import is_parallel, parallel_config
from .families import Family, get_family, list_families
from .xdit import check_no_xdit_parallelism

__all__ = ["check_parallelism", "is_parallel", "parallel_config", "verified_families"]


def verified_families() -> list[str]:
    """Names of the registered families verified under diffusers' context parallelism."""
    return [name for name in list_families() if get_family(name).context_parallel]


def check_parallelism(model, what: str, family: Family, camera_only: bool = False) -> None:
    """Refuse ``what`` (``"set_pe"``, ``"a forward with set_pe"``, ...) on ``model`` of ``family`` under a
    parallelism mmpos has not verified for it: one line naming the family and what runs instead. ``camera_only``:
    mmpos installs only a camera adapter on ``model`` (the family's camera site's ``context_parallel`` check, if
    any, decides)."""
    if torch.compiler.is_compiling():
        return
    check_no_xdit_parallelism(what)
    config = parallel_config(model)
    if config is None:
        return
    instead = (
        f"run one process per sample instead (data parallel), or a family verified under context parallelism "
        f"({', '.join(verified_families())})"
    )
    name = f"{type(model).__name__} (family {family.name!r})"
    if getattr(config, "tensor_parallel_config", None) is not None:
        raise RuntimeError(
            f"{what} on {name} under diffusers' tensor parallelism is refused: mmpos has not verified any family's "
            f"seam or processors with the heads sharded over ranks; {instead}"
        )
    if not family.context_parallel:
        camera_check = None if family.camera is None else family.camera.context_parallel
        if camera_only and camera_check is not None:
            camera_check(model)
            return
        plan = (
            f" ({type(model).__name__} has no _cp_plan in diffusers {diffusers.__version__}: the plan is the caller's)"
            if getattr(type(model), "_cp_plan", None) is None
            else ""
        )
        raise RuntimeError(
            f"{what} on {name} under diffusers' context parallelism (enable_parallelism) is refused: mmpos has not "
            f"verified the {family.name} seam on a context-parallel plan's shards{plan}; {instead}"
        )
