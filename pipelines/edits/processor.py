"""Per-layer attention processors for edits on diffusers' Flux transformer.

:class:`EditAttnProcessor` is the only processor an edit installs, in the ``"edit"`` level of the layer's slot of
the one processor installer (:mod:`mmpos.integrations.diffusers.installer`). When the context has no active rule
for its layer it calls the processor beneath it (diffusers' stock ``FluxAttnProcessor``, or the one ``set_pe``
installed), so an inactive edit is bit-identical to the model without the edit. Rules reuse :func:`project_heads`
/ :func:`finish_attention`, which follow the stock processor's arithmetic step for step, rotate with the mmpos
operator through a :class:`~mmpos.integrations.diffusers.LayerRotation`, and change only what their method changes.

IP-Adapter: diffusers' ``FluxAttention`` hands a processor only the arguments its signature names, so the edit
processor names the ones diffusers' Flux processors take (``ip_hidden_states``, ``ip_adapter_masks``) and passes
every one the processor beneath accepts. With a rule active, the rule edits the joint text-image attention only;
the IP-Adapter term (a decoupled cross-attention from the image queries, before RoPE, to the image-prompt tokens:
it has no positions) is computed as the IP-Adapter processor beneath computes it and returned beside the rule's
output, so a loaded IP-Adapter keeps acting on edited layers unchanged.
"""

from __future__ import annotations

import functools
import inspect

import torch
from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn
from diffusers.models.transformers.transformer_flux import _get_qkv_projections

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
    """The ``"edit"`` level of one layer's slot: runs the layer's rule when one is active, else the processor
    beneath it in the slot (the stock one, or ``set_pe``'s): the bit-exact identity path.

    An active rule gets the layer's :class:`~mmpos.integrations.diffusers.LayerRotation` (the table and operator
    the processor beneath applies, built once per forward and shared by the layers that share a table) in place
    of the raw ``image_rotary_emb``.
    """

    def __init__(self, context, layer_index: int, slot):
        self._context = context  # an EditContext, or the EditCalls of sessions running in several threads
        self.layer_index = layer_index
        self.slot = slot

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

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        image_rotary_emb=None,
        ip_hidden_states=None,
        ip_adapter_masks=None,
    ):
        rule = self.context.active_rule(self.layer_index)
        beneath = self.beneath
        given = {"ip_hidden_states": ip_hidden_states, "ip_adapter_masks": ip_adapter_masks}
        accepted = _call_parameters(type(beneath))
        extras = {name: value for name, value in given.items() if value is not None and name in accepted}
        if rule is None:
            return beneath(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb, **extras)
        if attention_mask is not None:
            raise NotImplementedError(f"{type(rule).__name__} does not support an attention_mask")
        rotation = self._rotation(beneath, image_rotary_emb)
        out = rule.attend(attn, hidden_states, encoder_hidden_states, rotation, self.context)
        if "ip_hidden_states" in extras and encoder_hidden_states is not None:
            return (*out, ip_adapter_term(beneath, attn, hidden_states, extras["ip_hidden_states"]))
        return out

    def _rotation(self, beneath, image_rotary_emb) -> LayerRotation:
        return self._cached_rotation(beneath, image_rotary_emb, LayerRotation.of_processor)

    def _cached_rotation(self, beneath, rotary_emb, build) -> LayerRotation:
        """``build(beneath, rotary_emb, layer)`` once per forward for the layers sharing a table."""
        rotation = getattr(beneath, "rotation", None)
        rotation = getattr(rotation, "rotation", rotation)  # FLUX.2's wrapper of the encoding's rotation
        index = self.layer_index if getattr(rotation, "per_layer", False) else 0
        key = ("layer_rotation", id(rotation), index, id(rotary_emb))
        cached = self.context.cache.get(key)
        if cached is None or cached[0] is not rotary_emb:  # the cache holds the emb: ids are not reused
            cached = (rotary_emb, build(beneath, rotary_emb, self.layer_index))
            self.context.cache[key] = cached
        return cached[1]


class FamilyEditAttnProcessor(EditAttnProcessor):
    """The ``"edit"`` level on a family with an edit adapter (:mod:`mmpos.pipelines.edits.families`): subclasses name
    the stock processor's ``__call__`` parameters (diffusers hands a processor only those) and call :meth:`run`.

    With no active rule, or no image tokens in this layer, it runs the processor beneath with the same arguments
    (bit-identical to the model without the edit); else ``rule.attend_call(adapter.layer_call(...), context)``.
    """

    def __init__(self, context, layer_index: int, slot, adapter):
        super().__init__(context, layer_index, slot)
        self.adapter = adapter

    def run(self, attn, inputs: dict):
        rule = self.context.active_rule(self.layer_index)
        beneath = self.beneath
        call = None if rule is None else self.adapter.layer_call(self, attn, inputs)
        if call is None:
            return beneath(attn, **inputs)
        if not hasattr(rule, "attend_call"):
            raise NotImplementedError(
                f"{type(rule).__name__} runs on FLUX.1 only (it has no attend_call for the "
                f"{self.adapter.family} edit seam)"
            )
        return rule.attend_call(call, self.context)

    def layer_rotation(self, adapter, rotary_emb) -> LayerRotation:
        """The layer's :class:`LayerRotation` (built by the adapter once per forward and shared table)."""
        return self._cached_rotation(self.beneath, rotary_emb, adapter.rotation)


@functools.lru_cache(maxsize=None)
def _call_parameters(processor_type) -> frozenset:
    """Names a processor class's ``__call__`` takes (diffusers filters a processor's kwargs the same way)."""
    return frozenset(inspect.signature(processor_type.__call__).parameters)


def ip_adapter_term(processor, attn, hidden_states, ip_hidden_states) -> torch.Tensor:
    """The IP-Adapter output ``[B, N, heads * D]`` of a double block, as diffusers' ``FluxIPAdapterAttnProcessor``
    forms it: ``sum_i scale_i * softmax(q k_i^T / sqrt(D)) v_i`` with the image queries after their norm and
    before RoPE, and ``k_i, v_i`` projected from each adapter's image-prompt tokens ``ip_hidden_states[i]``."""
    batch = hidden_states.shape[0]
    query = attn.norm_q(_get_qkv_projections(attn, hidden_states, None)[0].unflatten(-1, (attn.heads, -1)))
    total = torch.zeros(
        batch, hidden_states.shape[1], attn.heads * attn.head_dim, dtype=query.dtype, device=query.device
    )
    for states, scale, to_k, to_v in zip(ip_hidden_states, processor.scale, processor.to_k_ip, processor.to_v_ip):
        key = to_k(states).view(batch, -1, attn.heads, attn.head_dim)
        value = to_v(states).view(batch, -1, attn.heads, attn.head_dim)
        out = dispatch_attention_fn(
            query, key, value, backend=processor._attention_backend, parallel_config=processor._parallel_config
        )
        total += scale * out.reshape(batch, -1, attn.heads * attn.head_dim).to(query.dtype)
    return total


def attend(attn, query, key, value, scale=None, native: bool = False) -> torch.Tensor:
    """``dispatch_attention_fn`` with the layer's backend, as the processor beneath the edit calls it.

    ``native=True`` forces PyTorch SDPA (needed when q/k and v widths differ, which flash kernels refuse).
    """
    processor = attn.processor
    backend = AttentionBackendName.NATIVE if native else getattr(processor, "_attention_backend", None)
    return dispatch_attention_fn(
        query,
        key,
        value,
        scale=scale,
        backend=backend,
        parallel_config=None if native else getattr(processor, "_parallel_config", None),
    )


def attend_wide(attn, query, key, value, scale: float) -> torch.Tensor:
    """Attention whose q and k (``[B, L, H, E]``) are wider than v (``[B, L, H, Ev]``, ``Ev < E``): v gets zero
    channels up to ``E`` and the output loses them again, so that PyTorch SDPA runs its fused kernel (it takes
    the unfused math path, slower on a CPU (``docs/results.md``), when the widths differ); the kept channels are the same
    weighted sums of v."""
    width = query.shape[-1] - value.shape[-1]
    padded = torch.cat([value, value.new_zeros(*value.shape[:-1], width)], dim=-1) if width > 0 else value
    return attend(attn, query, key, padded, scale=scale, native=True)[..., : value.shape[-1]]
