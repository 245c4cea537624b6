"""The edit processor: the one processor an edit installs, on every family.

:class:`EditAttnProcessor` sits in the ``"edit"`` level of each attention layer's slot of the one processor
installer (:mod:`mmpos.integrations.diffusers.installer`); a family's subclass (:mod:`.families`) has the stock
processor's signature. When the context has no active rule for its layer it calls the processor beneath it
(diffusers' stock processor, or the one ``set_pe`` installed), so an inactive edit is bit-identical to the model
without the edit; an active rule runs on the family adapter's :class:`~.families.LayerCall`, whose q, k, v follow the
stock processor's arithmetic step for step (FLUX.1: :func:`project_heads` / :func:`finish_attention`).

IP-Adapter: diffusers' ``FluxAttention`` hands a processor only the arguments its signature names, so the edit
processor names the ones diffusers' Flux processors take (``ip_hidden_states``, ``ip_adapter_masks``) and passes
every one the processor beneath accepts. With a rule active, the rule edits the joint text-image attention only;
the IP-Adapter term (a decoupled cross-attention from the image queries, before RoPE, to the image-prompt tokens:
it has no positions) is computed as the IP-Adapter processor beneath computes it and returned beside the rule's
output, so a loaded IP-Adapter keeps acting on edited layers unchanged.
"""

from __future__ import annotations

from mmpos.integrations.diffusers.families.flux import flux_finish_attention as finish_attention  # noqa: F401
from mmpos.integrations.diffusers.families.flux import flux_project_heads as project_heads  # noqa: F401
from mmpos.integrations.diffusers.installer import EDIT
from mmpos.integrations.diffusers.layer_rotation import LayerRotation


def attention_layer_names(transformer) -> list[str]:
    """Processor keys in layer order: double blocks 0..n-1, then single blocks (57 layers in FLUX.1)."""
    double = [f"transformer_blocks.{i}.attn.processor" for i in range(len(transformer.transformer_blocks))]
    num_single = len(transformer.single_transformer_blocks)
    single = [f"single_transformer_blocks.{i}.attn.processor" for i in range(num_single)]
    return double + single


def select_layers(spec, num_layers: int, num_double: int) -> list[int]:
    """Layer indices from ``"all"``, ``"double"``, ``"single"``, a list of indices or ``{"start": a, "stop": b}``.

    Indices count double blocks first (``0 .. num_double - 1``), then single blocks; all are checked.
    """
    if spec in (None, "all"):
        return list(range(num_layers))
    if spec == "double":
        return list(range(num_double))
    if spec == "single":
        return list(range(num_double, num_layers))
    if isinstance(spec, str):
        raise ValueError(f"layers={spec!r}: expected 'all', 'double', 'single', a list of indices or a range dict")
    if isinstance(spec, dict):
        start, stop = int(spec.get("start", 0)), int(spec.get("stop", num_layers))
        if not 0 <= start < stop <= num_layers:
            raise ValueError(f"layers range {spec} must satisfy 0 <= start < stop <= {num_layers}")
        return list(range(start, stop))
    indices = sorted({int(i) for i in spec})
    if not indices or indices[0] < 0 or indices[-1] >= num_layers:
        raise ValueError(f"layers={list(spec)!r}: expected a non-empty list of indices in [0, {num_layers})")
    return indices


class EditAttnProcessor:
    """The ``"edit"`` level of one layer's slot, on every family with an edit adapter (:mod:`.families`): a family's
    subclass names the stock processor's ``__call__`` parameters (diffusers hands a processor only those) and calls
    :meth:`run`.

    With no active rule, or no image tokens in this layer, it runs the processor beneath it in the slot (the stock
    one, or ``set_pe``'s) with the same arguments: the bit-exact identity path. Else the rule runs on the layer call
    the family's adapter makes, ``rule.attend_call(adapter.layer_call(...), context)``: q, k, v and the layer's
    :class:`~mmpos.integrations.diffusers.LayerRotation` (the table and operator the processor beneath applies, built
    once per forward and shared by the layers that share a table).
    """

    def __init__(self, context, layer_index: int, slot, adapter):
        self._context = context  # an EditContext, or the EditCalls of sessions running in several threads
        self.layer_index = layer_index
        self.slot = slot
        self.adapter = adapter

    @property
    def context(self):
        """The :class:`~mmpos.pipelines.edits.context.EditContext` of this call: the calling thread's session's when
        the level serves concurrent sessions (:class:`~mmpos.pipelines.edits.context.EditCalls`)."""
        source = self._context
        per_thread = getattr(type(source), "context", None)
        return source.context() if callable(per_thread) else source

    @property
    def beneath(self):
        """The processor this one runs over (looked up at call time: ``set_pe`` may change it)."""
        return self.slot.below(EDIT)

    # diffusers' set_attention_backend / enable_parallelism set these on the top processor: pass them down
    @property
    def _attention_backend(self):
        return getattr(self.beneath, "_attention_backend", None)

    @_attention_backend.setter
    def _attention_backend(self, backend):
        self.beneath._attention_backend = backend

    @property
    def _parallel_config(self):
        return getattr(self.beneath, "_parallel_config", None)

    @_parallel_config.setter
    def _parallel_config(self, config):
        self.beneath._parallel_config = config

    def run(self, attn, inputs: dict, passed: dict | None = None):
        """The layer on ``inputs`` (the stock processor's arguments by name); ``passed``: arguments only the
        processor beneath takes (FLUX.1's IP-Adapter), given to it when no rule runs."""
        rule = self.context.active_rule(self.layer_index)
        call = None if rule is None else self.adapter.layer_call(self, attn, inputs)
        if call is None:
            return self.beneath(attn, **inputs, **(passed or {}))
        return rule.attend_call(call, self.context)

    def layer_rotation(self, adapter, rotary_emb) -> LayerRotation:
        """The layer's :class:`LayerRotation`, built by ``adapter`` once per forward for the layers sharing a table
        (the cache holds the emb with it: ids are not reused)."""
        beneath = self.beneath
        rotation = getattr(beneath, "rotation", None)
        rotation = getattr(rotation, "rotation", rotation)  # FLUX.2's wrapper of the encoding's rotation
        index = self.layer_index if getattr(rotation, "per_layer", False) else 0
        key = ("layer_rotation", id(rotation), index, id(rotary_emb))
        cached = self.context.cache.get(key)
        if cached is None or cached[0] is not rotary_emb:
            cached = (rotary_emb, adapter.rotation(beneath, rotary_emb, self.layer_index))
            self.context.cache[key] = cached
        return cached[1]
