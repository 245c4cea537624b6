"""Scheduled encodings (NTK, YaRN, DyPE presets) read the extent of the whole sequence, also under context
parallelism.

A schedule turns the coordinates' extent per axis into its spectrum. Under diffusers' context parallelism
(``enable_parallelism``) the seam of rank ``r`` sees only rank ``r``'s shard of the ids (Flux: ``img_ids`` and
``txt_ids`` are split by the ``_cp_plan``), whose extent is smaller: each rank would resolve another spectrum.
diffusers shards the inputs inside the transformer's ``forward`` (its hooks wrap it); a forward pre-hook runs
before that, on the whole sequence. So this pre-hook, registered after the processor installer's (whose edit
level may rewrite the ids), reads the family's :attr:`~.families.Family.global_coords`:

* one tensor (FLUX.1, Wan: the seam is called once per forward on the whole sequence): it measures the extents
  there and sets them on each scheduled encoding's step for this thread and this forward
  (``DiffusionStep.extents``);
* a tuple of tensors (FLUX.2: the seam is called on ``img_ids``, then on ``txt_ids``, each with its own extents):
  it records them on the seam for this thread and this forward (``seam.global_inputs``); the seam finds the
  tensor each call's ids are a part of (:func:`global_source`: a shard is a view of it) and measures there.

Where the family reads the output image's extents from the forward's inputs (:attr:`~.families.Family.image_extents`:
FLUX.2, Z-Image), a tier-1 seam publishes the spectrum resolved there for this forward (the tensors a
``torch.compile`` graph reads; the eager tables keep measuring their ids).

The post-hook (also called when the forward raises) puts back what the thread had before.
"""

from __future__ import annotations

from functools import partial

import torch

from ..._per_thread import PerThread


class GlobalExtents:
    """The pre- and post-forward hooks of one transformer (see the module docstring)."""

    def __init__(self, family):
        self.family = family
        self._saved = PerThread(None)  # this thread's undo steps, per nested forward

    def install(self, transformer) -> tuple[int, int]:
        """Register both hooks on ``transformer``; returns their ids (for :func:`remove`)."""
        pre = transformer.register_forward_pre_hook(self.pre_forward, with_kwargs=True)
        post = transformer.register_forward_hook(self.post_forward, always_call=True)
        return pre.id, post.id

    def scheduled(self, transformer) -> tuple:
        """The seam and its encodings that follow a schedule."""
        seam = getattr(transformer, self.family.position_attr)
        return seam, [pe for pe in getattr(seam, "encodings", ()) if getattr(pe, "schedule", None) is not None]

    @torch.compiler.disable  # eager under torch.compile(model): extents read with .tolist(), per-thread state
    def pre_forward(self, module, args, kwargs):
        seam, encodings = self.scheduled(module)
        stack = self._stack()
        global_coords = self.family.global_coords
        coords = global_coords(seam, args, kwargs) if encodings and global_coords else None
        undo = []
        if isinstance(coords, tuple):
            undo.append(partial(seam.global_inputs.restore, seam.global_inputs.swap(coords)))
        elif coords is not None:
            coords = seam.encoding_coords(coords)
            for pe in encodings:
                undo.append(partial(pe.step.restore_extents, pe.step.swap_extents(pe.coordinate_extents(coords))))
                if hasattr(pe, "publish_schedule"):  # the spectrum a compiled graph reads
                    pe.publish_schedule()
        publish = getattr(seam, "publish_image_extents", None)  # tier 1: the spectrum a compiled graph reads
        extents = (
            self.family.image_extents(args, kwargs) if encodings and publish and self.family.image_extents else None
        )
        if extents is not None:
            undo.append(partial(encodings[0].step.restore_extents, publish(extents)))
        stack.append(tuple(undo))
        self._saved.swap(stack)
        return None

    @torch.compiler.disable
    def post_forward(self, module, args, output):
        stack = self._stack()
        if stack:
            for step in reversed(stack.pop()):
                step()
            self._saved.swap(stack)
        return None

    def _stack(self) -> list:
        return list(self._saved.get() or ()) if self._saved.is_set_here() else []


def global_source(seam, ids: torch.Tensor):
    """The tensor of this forward's ``seam.global_inputs`` that ``ids`` is a part of (the whole of it in one
    process, this rank's shard of it under context parallelism: a view of its memory), else ``None``."""
    for source in seam.global_inputs.get() or ():
        if _is_part_of(ids, source):
            return source
    return None


def _is_part_of(part: torch.Tensor, whole: torch.Tensor) -> bool:
    if part.device != whole.device or part.dtype != whole.dtype or not part.numel() or not whole.numel():
        return False
    if part.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr():
        return False
    (low, high), (whole_low, whole_high) = _span(part), _span(whole)
    return whole_low <= low and high <= whole_high


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    """The first and last element of the storage ``tensor`` reads."""
    start = tensor.storage_offset()
    return start, start + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))


def remove(transformer, hook_ids) -> None:
    """Drop the hooks of :meth:`GlobalExtents.install` (by id: a deep copy's too)."""
    if not hook_ids:
        return
    pre, post = hook_ids
    for hooks in (transformer._forward_pre_hooks, transformer._forward_pre_hooks_with_kwargs):
        hooks.pop(pre, None)
    for hooks in (transformer._forward_hooks, transformer._forward_hooks_always_called):
        hooks.pop(post, None)
