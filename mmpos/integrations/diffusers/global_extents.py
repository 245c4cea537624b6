"""Scheduled encodings (NTK, YaRN, DyPE presets) read the extent of the whole sequence, also under context
parallelism.

A schedule turns the coordinates' extent per axis into its spectrum. Under diffusers' context parallelism
(``enable_parallelism``) the seam of rank ``r`` sees only rank ``r``'s shard of the ids (Flux: ``img_ids`` and
``txt_ids`` are split by the ``_cp_plan``), whose extent is smaller: each rank would resolve another spectrum.
diffusers shards the inputs inside the transformer's ``forward`` (its hooks wrap it); a forward pre-hook runs
before that, on the whole sequence. So this pre-hook, registered after the processor installer's (whose edit
level may rewrite the ids), measures the extents on the family's :attr:`~.families.Family.global_coords` and
sets them on each scheduled encoding's step for this thread and this forward (``DiffusionStep.extents``); the
post-hook (also called when the forward raises) puts back what the thread had before.
"""

from __future__ import annotations

from ..._per_thread import PerThread


class GlobalExtents:
    """The pre- and post-forward hooks of one transformer (see the module docstring)."""

    def __init__(self, family):
        self.family = family
        self._saved = PerThread(None)  # this thread's (encoding, previous extents) pairs, per nested forward

    def install(self, transformer) -> tuple[int, int]:
        """Register both hooks on ``transformer``; returns their ids (for :func:`remove`)."""
        pre = transformer.register_forward_pre_hook(self.pre_forward, with_kwargs=True)
        post = transformer.register_forward_hook(self.post_forward, always_call=True)
        return pre.id, post.id

    def scheduled(self, transformer) -> tuple:
        """The seam and its encodings that follow a schedule."""
        seam = getattr(transformer, self.family.position_attr)
        return seam, [pe for pe in getattr(seam, "encodings", ()) if getattr(pe, "schedule", None) is not None]

    def pre_forward(self, module, args, kwargs):
        seam, encodings = self.scheduled(module)
        stack = self._stack()
        coords = self.family.global_coords(args, kwargs) if encodings else None
        if coords is None:
            stack.append(())
        else:
            coords = seam.encoding_coords(coords)
            stack.append(tuple((pe, pe.step.swap_extents(pe.coordinate_extents(coords))) for pe in encodings))
        self._saved.swap(stack)
        return None

    def post_forward(self, module, args, output):
        stack = self._stack()
        if stack:
            for pe, previous in stack.pop():
                pe.step.restore_extents(previous)
            self._saved.swap(stack)
        return None

    def _stack(self) -> list:
        return list(self._saved.get() or ()) if self._saved.is_set_here() else []


def remove(transformer, hook_ids) -> None:
    """Drop the hooks of :meth:`GlobalExtents.install` (by id: a deep copy's too)."""
    if not hook_ids:
        return
    pre, post = hook_ids
    for hooks in (transformer._forward_pre_hooks, transformer._forward_pre_hooks_with_kwargs):
        hooks.pop(pre, None)
    for hooks in (transformer._forward_hooks, transformer._forward_hooks_always_called):
        hooks.pop(post, None)
