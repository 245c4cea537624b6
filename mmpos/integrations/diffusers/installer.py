"""One processor installer for a diffusers transformer: a slot per attention layer, one pre-forward hook.

Every attention layer has a slot with levels, from the bottom up:

    original   the processor found when mmpos first installed anything (diffusers' stock one)
    encoding   filled by :func:`~mmpos.integrations.diffusers.set_pe`: applies an mmpos encoding
    camera     filled by a camera adapter (:mod:`~mmpos.integrations.diffusers.camera_adapter`): adds its
               camera branch around the level below
    edit       filled by an edit (``mmpos.pipelines.EditSession``): runs a rule, or the level below

A layer runs its highest filled level; a processor finds the one beneath it with :meth:`AttentionSlot.below`
at call time, so an edit installed over ``set_pe`` runs the ``set_pe`` processor whenever its rule is off, and
``set_pe`` called while an edit is installed slides under it. Each level may add a pre-forward hook; the
installer registers a single hook on the transformer that runs them in level order (the encoding's hook first:
it records the activation dtype the position module reads; then the edit's, which may rewrite the inputs).
Emptying a level puts back what the layers ran before; emptying the last one restores the original processors
and removes the hook and the installer.

    installer = ProcessorInstaller.of(transformer)
    installer.fill("edit", {3: processor_for_layer_3}, hook=pre_forward)
    ...
    installer.clear("edit")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

from .families import family_for, get_family
from .parallelism import check_parallelism
from .xdit import check_no_xdit_parallelism, check_no_xdit_processors

ENCODING, CAMERA, EDIT = "encoding", "camera", "edit"
LEVELS = (ENCODING, CAMERA, EDIT)
ATTRIBUTE = "_mmpos_attention_slots"


@dataclass(eq=False)
class AttentionSlot:
    """One attention layer: its module, the processor it had before mmpos, and the processor per level."""

    name: str
    module: nn.Module
    original: object
    levels: dict = field(default_factory=dict)  # level name -> processor

    def top(self):
        """The processor this layer runs now."""
        return self.below(None)

    def below(self, level: Optional[str]):
        """The processor of the highest filled level under ``level`` (``None``: of all), else the original."""
        order = LEVELS if level is None else LEVELS[: LEVELS.index(level)]
        for name in reversed(order):
            if name in self.levels:
                return self.levels[name]
        return self.original


class ProcessorInstaller:
    """The slots of one transformer (layer order: Flux double blocks then single blocks; Wan blocks)."""

    def __init__(self, transformer: nn.Module):
        family = family_for(transformer)
        self.family_name = family.name  # a name: the installer is copied and pickled with the transformer
        attention = family.attention_modules(transformer)
        check_no_xdit_processors((name, module.processor) for name, module in attention)
        self.slots = [AttentionSlot(name, module, module.processor) for name, module in attention]
        self.hooks: dict[str, Callable] = {}
        self.hook_id = transformer.register_forward_pre_hook(self._pre_forward, with_kwargs=True).id

    @classmethod
    def of(cls, transformer: nn.Module) -> "ProcessorInstaller":
        """The transformer's installer, created (original processors recorded) on first use."""
        installer = getattr(transformer, ATTRIBUTE, None)
        if installer is None:
            installer = cls(transformer)
            setattr(transformer, ATTRIBUTE, installer)
        return installer

    @staticmethod
    def find(transformer: nn.Module) -> Optional["ProcessorInstaller"]:
        return getattr(transformer, ATTRIBUTE, None)

    def filled(self, level: str) -> bool:
        return level in self.hooks or any(level in slot.levels for slot in self.slots)

    def fill(self, level: str, processors: dict, hook: Optional[Callable] = None) -> None:
        """Install ``processors`` (layer index -> processor) at ``level`` and the level's pre-forward ``hook``
        (``hook(module, args, kwargs) -> None | (args, kwargs)``). Checked before anything changes."""
        _check_level(level)
        check_no_xdit_parallelism(f"installing mmpos processors ({level!r} level)")
        if self.filled(level):
            raise RuntimeError(f"the {level!r} level is already filled; clear it first")
        for index in processors:
            if not 0 <= index < len(self.slots):
                raise ValueError(
                    f"layer index {index} is out of range; the transformer has {len(self.slots)} "
                    "attention layers (Flux: double blocks first, then single blocks)"
                )
        self.check_processors()  # a loader's replacement is taken back before a level goes over it
        for index, processor in processors.items():
            self.slots[index].levels[level] = processor
        if hook is not None:
            self.hooks[level] = hook
        self._apply()

    def add_processors(self, level: str, processors: dict) -> None:
        """Install ``processors`` (layer index -> processor) at ``level`` in the layers where it holds none, keeping
        its hook (a level ``set_pe`` filled with a hook only: Qwen-Image's stock processors read the seam's tables);
        :meth:`remove_processors` takes them back."""
        _check_level(level)
        if any(level in self.slots[index].levels for index in processors):
            raise RuntimeError(f"the {level!r} level already holds processors; clear it first")
        self.check_processors()
        for index, processor in processors.items():
            self.slots[index].levels[level] = processor
        self._apply()

    def remove_processors(self, level: str, processors) -> None:
        """Take :meth:`add_processors`' ``processors`` out of ``level`` (the level's hook and other processors stay)."""
        ours = {id(p) for p in processors}
        for slot in self.slots:
            if id(slot.levels.get(level)) in ours:
                del slot.levels[level]
        self._apply()

    def clear(self, transformer: nn.Module, level: str) -> None:
        """Empty ``level``; with every level empty, the original processors come back and the installer goes."""
        _check_level(level)
        for slot in self.slots:  # what a loader replaced safely is kept (restore then puts back its processors)
            if slot.levels and slot.module.processor is not slot.top():
                self._rebind(slot)
        for slot in self.slots:
            slot.levels.pop(level, None)
        self.hooks.pop(level, None)
        self._apply()
        if not any(slot.levels for slot in self.slots) and not self.hooks:
            transformer._forward_pre_hooks.pop(self.hook_id, None)  # by id: a deep copy's hook too
            transformer._forward_pre_hooks_with_kwargs.pop(self.hook_id, None)
            setattr(transformer, ATTRIBUTE, None)

    def _apply(self) -> None:
        for slot in self.slots:
            if slot.module.processor is not slot.top():
                slot.module.set_processor(slot.top())

    def check_processors(self) -> None:
        """Refuse a forward where a layer runs another processor than the one installed at its highest filled level
        (``set_attn_processor`` / ``set_default_attn_processor`` / a loader called after ``set_pe``): the stock
        processors would drop the encoding, or read its tables in another format (a silently wrong result on Wan,
        an unnamed shape error on FLUX.1 / FLUX.2 / Z-Image). What a loader replaced safely is taken back first
        (:meth:`_rebind`)."""
        for slot in self.slots:
            if slot.levels and slot.module.processor is not slot.top() and not self._rebind(slot):
                levels = [level for level in LEVELS if level in slot.levels]
                raise RuntimeError(
                    f"{slot.name} runs {type(slot.module.processor).__name__}, not the "
                    f"{type(slot.top()).__name__} mmpos installed there (levels {levels}): its processor was replaced "
                    "after set_pe / a camera adapter / an edit, and would not apply the encoding. Call "
                    "mmpos.integrations.diffusers.restore(transformer) before setting processors, then set_pe again"
                )

    def _rebind(self, slot: AttentionSlot) -> bool:
        """Take back a layer whose ``set_pe`` processor (the top level) a loader replaced, where that is safe: an
        unbound copy of it (``type(processor)()``, as ``load_ip_adapter`` makes) gets the bound one back; a processor
        the family carries (:attr:`~.families.Family.rebind_processor`: FLUX.1's IP-Adapter) becomes the layer's
        original (what ``restore`` puts back) under a new mmpos processor carrying it. Anything else: ``False``."""
        new, installed = slot.module.processor, slot.levels.get(ENCODING)
        if installed is None or slot.top() is not installed:
            return False
        if type(new) is type(installed) and not getattr(new, "bound", True):
            slot.module.set_processor(installed)
            return True
        rebind = get_family(self.family_name).rebind_processor
        replacement = None if rebind is None else rebind(installed, new)
        if replacement is None:
            return False
        slot.original, slot.levels[ENCODING] = new, replacement
        slot.module.set_processor(replacement)
        return True

    @torch.compiler.disable  # eager under torch.compile(model) (as diffusers' hooks' Python state): see _pre_forward
    def _pre_forward(self, module, args, kwargs):
        camera_only = all(not self.filled(level) for level in LEVELS if level != CAMERA)
        check_parallelism(module, "a forward with mmpos processors", get_family(self.family_name), camera_only)
        self.check_processors()
        for level in LEVELS:
            hook = self.hooks.get(level)
            if hook is not None:
                result = hook(module, args, kwargs)
                if result is not None:
                    args, kwargs = result
        return args, kwargs


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"level={level!r} is not supported; expected one of {LEVELS}")
