"""The explicit edit context: which step, which noise level, which tokens, which rule per layer.

A :class:`EditContext` is filled by a forward pre-hook on the Flux transformer (:class:`EditSession`), never by
counting calls: the step is the scheduler's own index, checked against the ``timestep`` the pipeline passes
(``sigma = t / 1000``), or that sigma looked up in the scheduler's timesteps in fp64 (:func:`schedule_step`), so
true-CFG (two forwards per step), restarts and repeated calls see the same step.

Token layout inside the transformer (diffusers' Flux, Fill and Kontext): ``[text (L_txt) | target (N_t) |
context (N_c)]``; the context segment exists only in Kontext and is recognised by its ids' axis 0 (= 1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from mmpos.integrations.diffusers.installer import EDIT, ProcessorInstaller

from .attention import EditAttnProcessor


@dataclass
class TokenSegments:
    """Sequence ranges of one transformer forward; image ranges are offsets into the full ``[txt | img]``."""

    text_len: int
    target_len: int
    context_len: int = 0
    target_grid: tuple[int, int] = (0, 0)   # (rows, cols) of the target token grid
    context_grid: tuple[int, int] = (0, 0)

    @property
    def target(self) -> slice:
        return slice(self.text_len, self.text_len + self.target_len)

    @property
    def context(self) -> slice:
        start = self.text_len + self.target_len
        return slice(start, start + self.context_len)

    @property
    def image(self) -> slice:
        return slice(self.text_len, self.text_len + self.target_len + self.context_len)


@dataclass
class EditContext:
    """State shared by the pre-forward hook and the per-layer processors of one edit.

    ``rules`` maps a layer index (0..18 double blocks, then single blocks, the FreeFlux/LooseRoPE convention) to
    a rule object with ``is_active(context) -> bool`` and ``attend(attn, hidden_states, encoder_hidden_states,
    attention_mask, image_rotary_emb, context)``. ``rewriters`` are called by the hook with ``(context,
    kwargs)`` and return the transformer kwargs to use (id transplant, reference latents).
    """

    rules: dict = field(default_factory=dict)
    rewriters: list = field(default_factory=list)
    step: Optional[int] = None
    num_steps: Optional[int] = None
    sigma: Optional[float] = None
    segments: Optional[TokenSegments] = None
    img_ids: Optional[torch.Tensor] = None   # the ids of this forward, after rewriting
    enabled: bool = True
    cache: dict = field(default_factory=dict)  # per-forward tables shared by all layers (cleared by the hook)

    @property
    def progress(self) -> Optional[float]:
        """Step progress ``i / (N - 1)`` in [0, 1] (0 for a one-step schedule); None outside a pipeline."""
        if self.step is None or self.num_steps is None:
            return None
        return self.step / (self.num_steps - 1) if self.num_steps > 1 else 0.0

    def active_rule(self, layer_index: int):
        if not self.enabled:
            return None
        rule = self.rules.get(layer_index)
        if rule is None or not rule.is_active(self):
            return None
        return rule


def segments_from_ids(text_len: int, img_ids: torch.Tensor) -> TokenSegments:
    """Target tokens have id axis 0 == 0, Kontext context tokens == 1 (after the target, contiguous)."""
    if img_ids.ndim == 3:
        img_ids = img_ids[0]
    is_context = img_ids[:, 0] != 0
    target_len = int((~is_context).sum())
    if bool(is_context[:target_len].any()):
        raise ValueError("img_ids: expected the target tokens (axis 0 == 0) before the context tokens (axis 0 != 0)")
    return TokenSegments(text_len, target_len, img_ids.shape[0] - target_len,
                         _grid_shape(img_ids[:target_len]), _grid_shape(img_ids[target_len:]))


def _grid_shape(ids: torch.Tensor) -> tuple[int, int]:
    if ids.shape[0] == 0:
        return (0, 0)
    rows = int(ids[:, 1].max().round()) + 1
    cols = int(ids[:, 2].max().round()) + 1
    return (rows, cols) if rows * cols == ids.shape[0] else (0, 0)


def schedule_step(scheduler, sigma: torch.Tensor) -> tuple[Optional[int], Optional[int]]:
    """Index of this forward's step in the scheduler's timesteps and their count; ``(None, None)`` when the
    scheduler has no timesteps set.

    The scheduler's own index (``step_index``, or ``begin_index`` before its first ``step``) is taken when the
    timestep there, formed as the pipelines pass it (``t.to(dtype) / 1000``), is this ``sigma``: in bf16 two
    adjacent timesteps can round to one value (100 steps, mu 1.15: steps 2 and 3, 11 and 12), which no lookup by
    value can tell apart. Otherwise (a forward outside the pipeline's loop) the nearest timestep in fp64.
    """
    timesteps = getattr(scheduler, "timesteps", None) if scheduler is not None else None
    if timesteps is None or len(timesteps) == 0:
        return None, None
    index = getattr(scheduler, "step_index", None)
    index = getattr(scheduler, "begin_index", None) if index is None else index
    if index is not None and 0 <= index < len(timesteps):
        at_index = timesteps[index].to(device=sigma.device, dtype=sigma.dtype) / 1000
        if bool((at_index == sigma).all()):
            return int(index), len(timesteps)
    candidates = timesteps.to(device=sigma.device, dtype=torch.float64) / 1000
    step = int(torch.argmin((candidates - sigma.double()).abs()))
    return step, len(timesteps)


class EditSession:
    """Installs an :class:`EditContext` on a Flux transformer for the duration of a ``with`` block.

    Through the one processor installer (:class:`~mmpos.integrations.diffusers.ProcessorInstaller`), every
    attention layer named in ``context.rules`` gets an :class:`EditAttnProcessor` in its slot's ``"edit"`` level,
    which runs the processor beneath it (stock, or ``set_pe``'s) whenever its rule is inactive; the edit's
    pre-forward hook sets step, sigma and token segments and applies ``context.rewriters`` (after ``set_pe``'s
    hook). On exit, also after an exception, the edit level is emptied: the layers run what they ran before.
    """

    def __init__(self, transformer, context: EditContext, scheduler=None):
        self.transformer = transformer
        self.context = context
        self.scheduler = scheduler
        self._installer = None

    def __enter__(self) -> EditContext:
        installer = ProcessorInstaller.of(self.transformer)
        try:
            processors = {index: EditAttnProcessor(self.context, index, installer.slots[index])
                          for index in self._checked_layers(len(installer.slots))}
            installer.fill(EDIT, processors, hook=self._pre_forward)
        except BaseException:
            if not installer.filled(EDIT):
                installer.clear(self.transformer, EDIT)  # drops an installer made only for this session
            raise
        self._installer = installer
        return self.context

    def __exit__(self, *exc) -> None:
        if self._installer is not None:
            self._installer.clear(self.transformer, EDIT)
            self._installer = None

    def _checked_layers(self, num_layers: int) -> list[int]:
        for index in self.context.rules:
            if not 0 <= index < num_layers:
                raise ValueError(f"layer index {index} is out of range; the transformer has {num_layers} attention "
                                 "layers (double blocks first, then single blocks)")
        return list(self.context.rules)

    def _pre_forward(self, module, args, kwargs):
        if args:
            raise TypeError("EditSession expects the transformer to be called with keyword arguments, as the "
                            "diffusers Flux pipelines do")
        context = self.context
        timestep = kwargs["timestep"]
        context.sigma = float(timestep.flatten()[0])
        context.step, context.num_steps = schedule_step(self.scheduler, timestep.flatten()[:1])
        context.cache.clear()
        for rewrite in context.rewriters:
            kwargs = rewrite(context, kwargs)
        context.img_ids = kwargs["img_ids"]
        context.segments = segments_from_ids(kwargs["encoder_hidden_states"].shape[1], kwargs["img_ids"])
        for rule in {id(r): r for r in context.rules.values()}.values():  # each rule once, not once per layer
            prepare: Optional[Callable] = getattr(rule, "prepare", None)
            if prepare is not None and context.enabled and rule.is_active(context):
                prepare(context, module)  # per-forward tables shared by all of the rule's layers
        return args, kwargs
