"""The explicit edit context: which step, which noise level, which tokens, which rule per layer.

A :class:`EditContext` is filled by a forward pre-hook on the Flux transformer (:class:`EditSession`), never by
counting calls: the step is the scheduler's own index, checked against the ``timestep`` the pipeline passes
(``sigma = t / 1000``), or that sigma looked up in the scheduler's timesteps in fp64 (:func:`schedule_step`), so
true-CFG (two forwards per step), restarts and repeated calls see the same step.

The session works on every family with an edit adapter (:mod:`.families`: FLUX.1, FLUX.2, Qwen-Image, Z-Image):
the adapter reads the forward's sigma and finds the token segments from the family's coordinates (FLUX.1:
``[text (L_txt) | target (N_t) | context (N_c)]``, Kontext's context image at id axis 0 = 1; see
:mod:`.segments`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from mmpos._per_thread import PerThread
from mmpos.integrations.diffusers.installer import EDIT, ProcessorInstaller
from mmpos.integrations.diffusers.parallelism import is_parallel

from .families import edit_attention_for
from .segments import TokenSegments, segments_from_ids  # noqa: F401  (re-exported: the names' old home)


@dataclass
class EditContext:
    """State shared by the pre-forward hook and the per-layer processors of one edit.

    ``rules`` maps a layer index (0..18 double blocks, then single blocks, the FreeFlux/LooseRoPE convention) to
    a rule object with ``is_active(context) -> bool`` and ``attend_call(call, context)`` (``call``: the family
    adapter's :class:`~mmpos.pipelines.edits.families.LayerCall` of one layer call; it returns the layer's output).
    ``rewriters`` are called by the hook with ``(context, kwargs)`` and return the transformer kwargs to use (id
    transplant, reference latents); a rewriter with ``on_positions(context, module, args, kwargs, output)`` also
    rewrites the position module's output (a family whose forward takes no ids).
    """

    rules: dict = field(default_factory=dict)
    rewriters: list = field(default_factory=list)
    step: Optional[int] = None
    num_steps: Optional[int] = None
    sigma: Optional[float] = None
    segments: Optional[TokenSegments] = None
    img_ids: Optional[torch.Tensor] = None  # the ids of this forward, after rewriting (FLUX.1, FLUX.2)
    inputs: dict = field(default_factory=dict)  # this forward's keyword inputs, after rewriting
    adapter: Optional[object] = None  # the family's edit adapter (mmpos.pipelines.edits.families)
    layout: Optional[object] = None  # per-layer-kind segments where they differ (Z-Image)
    group_size: Optional[int] = None  # batch elements per [reference, target, ...] group (batched CFG)
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


class EditCalls:
    """The edit sessions running on one transformer, each in its own thread (one model serving requests).

    The ``edit`` level is filled once, on every attention layer, while any session runs and emptied after the
    last; each layer's edit processor reads the calling thread's :class:`EditContext` (:meth:`context`) and the
    level's pre-forward hook runs the calling thread's session's, so concurrent calls with different rules, steps
    and token segments never see each other's. A thread with no session (a stock call of the same transformer)
    gets no edit: its layers run the level beneath unchanged.
    """

    _lock = threading.Lock()  # guards the count and the level of every transformer

    def __init__(self):
        self._sessions = PerThread(None)  # swapped without ``latest``: a thread without a session reads None
        self._running = 0
        self._installer = None

    @classmethod
    def of(cls, transformer) -> "EditCalls":
        with cls._lock:
            calls = transformer.__dict__.get("_mmpos_edit_calls")
            if calls is None:
                calls = transformer.__dict__["_mmpos_edit_calls"] = cls()
            return calls

    def session(self) -> Optional["EditSession"]:
        """The session the calling thread runs on this transformer, or None."""
        return self._sessions.get()

    def context(self) -> EditContext:
        """The calling thread's edit context (a disabled one when this thread runs no session)."""
        session = self._sessions.get()
        return _NO_EDIT if session is None else session.context

    def enter(self, session: "EditSession"):
        """Run ``session`` in this thread (the level is filled by the first running session); returns the state
        to hand to :meth:`exit`."""
        if self._sessions.get() is not None:
            raise RuntimeError(
                "an EditSession is already open on this transformer in this thread; close it before opening another"
            )
        transformer = session.transformer
        with self._lock:
            installer = ProcessorInstaller.of(transformer)
            try:
                session.check_layers(len(installer.slots))
                if self._running == 0:
                    processors = {i: session.processor(self, i, slot) for i, slot in enumerate(installer.slots)}
                    installer.fill(EDIT, processors, hook=self._pre_forward)
                    self._installer = installer
            except BaseException:
                if not installer.filled(EDIT):
                    installer.clear(transformer, EDIT)  # drops an installer made only for this session
                raise
            self._running += 1
        return self._sessions.swap(session)

    def exit(self, session: "EditSession", previous) -> None:
        """End this thread's ``session`` (``previous``: what :meth:`enter` returned); the last one running empties
        the level."""
        self._sessions.restore(previous)
        with self._lock:
            self._running -= 1
            if self._running == 0 and self._installer is not None:
                self._installer.clear(session.transformer, EDIT)
                self._installer = None

    def _pre_forward(self, module, args, kwargs):
        session = self._sessions.get()
        return None if session is None else session.pre_forward(module, args, kwargs)

    def __getstate__(self):  # a copied transformer has no sessions running
        return {}

    def __setstate__(self, state):
        self.__init__()


_NO_EDIT = EditContext(enabled=False)


def check_not_context_parallel(transformer) -> None:
    """The edits' rules read whole segments of the joint sequence (reference, targets, paste region); under
    diffusers' context parallelism (``enable_parallelism``) each rank holds a shard of the tokens, so an edit is
    refused by name rather than run on a shard."""
    if is_parallel(transformer):
        raise RuntimeError(
            "the edit methods (band, transplant, loose) do not run under diffusers' context parallelism "
            "(enable_parallelism): their rules read whole token segments while each rank holds a shard; run "
            "edits on one process per image (data parallel), or call them before enable_parallelism"
        )


class EditSession:
    """Installs an :class:`EditContext` on a transformer of a family with an edit adapter (:mod:`.families`) for
    the duration of a ``with`` block, for the calling thread (:class:`EditCalls`: sessions in other threads on the
    same transformer run side by side, each with its own context).

    Through the one processor installer (:class:`~mmpos.integrations.diffusers.ProcessorInstaller`), every
    attention layer gets the adapter's edit processor in its slot's ``"edit"`` level, which runs this thread's
    rule for the layer (``context.rules``) and otherwise the processor beneath it (stock, or ``set_pe``'s); the
    edit's pre-forward hook sets step, sigma and token segments and applies ``context.rewriters`` (after
    ``set_pe``'s hook). On exit, also after an exception, the session ends; after the last running session the
    edit level is emptied: the layers run what they ran before.
    """

    def __init__(self, transformer, context: EditContext, scheduler=None):
        self.transformer = transformer
        self.context = context
        self.scheduler = scheduler
        self.adapter = edit_attention_for(transformer)
        self._running = None  # (EditCalls, previous state) while the block runs
        self._position_hook = None

    def __enter__(self) -> EditContext:
        check_not_context_parallel(self.transformer)
        calls = EditCalls.of(self.transformer)
        self._running = calls, calls.enter(self)
        if any(hasattr(rewrite, "on_positions") for rewrite in self.context.rewriters):
            module = self.adapter.position_module(self.transformer)
            self._position_hook = module.register_forward_hook(self._on_positions, with_kwargs=True)
        return self.context

    def __exit__(self, *exc) -> None:
        if self._position_hook is not None:
            self._position_hook.remove()
            self._position_hook = None
        if self._running is not None:
            calls, previous = self._running
            self._running = None
            calls.exit(self, previous)

    def _on_positions(self, module, args, kwargs, output):
        """Forward hook of the position module: the rewriters' ``on_positions(context, module, args, kwargs,
        output)`` (a table rewrite, e.g. PE transplant on Qwen-Image), in this session's thread only."""
        if self._running is None or self._running[0].session() is not self:
            return None
        changed = None
        for rewrite in self.context.rewriters:
            on_positions = getattr(rewrite, "on_positions", None)
            out = None if on_positions is None else on_positions(self.context, module, args, kwargs, output)
            if out is not None:
                output = changed = out
        return changed

    def processor(self, contexts: EditCalls, index: int, slot):
        """Layer ``index``'s edit processor, reading its context from ``contexts`` (per thread)."""
        return self.adapter.processor_class(slot)(contexts, index, slot, self.adapter)

    def check_layers(self, num_layers: int) -> None:
        for index in self.context.rules:
            if not 0 <= index < num_layers:
                raise ValueError(
                    f"layer index {index} is out of range; the transformer has {num_layers} attention "
                    "layers (double blocks first, then single blocks)"
                )

    def pre_forward(self, module, args, kwargs):
        check_not_context_parallel(module)  # (a model made parallel inside the session)
        context = self.context
        sigma = self.adapter.sigma(args, kwargs)
        context.sigma = float(sigma[0])
        context.step, context.num_steps = schedule_step(self.scheduler, sigma)
        context.cache.clear()
        if context.rewriters and args:
            raise TypeError("EditSession's rewriters expect the transformer to be called with keyword arguments")
        context.adapter = self.adapter
        for rewrite in context.rewriters:
            kwargs = rewrite(context, kwargs)
        context.inputs = kwargs
        self.adapter.observe(context, module, args, kwargs)
        for rule in {id(r): r for r in context.rules.values()}.values():  # each rule once, not once per layer
            prepare: Optional[Callable] = getattr(rule, "prepare", None)
            if prepare is not None and context.enabled and rule.is_active(context):
                prepare(context, module)  # per-forward tables shared by all of the rule's layers
        return args, kwargs
