"""What every mmpos attention processor shares: the rotation it delegates to and diffusers' dispatch settings.

A family's processors (in its module under :mod:`.families`) are its stock processor (diffusers 0.42, Apache-2.0)
with the rotation step delegated to a ``rotation(q, k, rotary_emb, layer) -> (q, k)`` callable: the family's stock
arithmetic on the stock tables (``pe="native"``: bit-identical to the stock model), or :class:`EncodingRotation`.
Attention runs through diffusers' ``dispatch_attention_fn`` (SDPA by default; any dispatch backend, and context
parallelism, via ``_attention_backend`` / ``_parallel_config`` like the stock processors).

* :class:`EncodingRotation`: an mmpos encoding's operator on its own tables: every ``RotaryPE`` has
  ``table(coords, dtype, device)`` and ``rotate_qk(q, k, table)`` (HARoPE's applies ``M q`` and ``M^-T k``);
* :class:`PEProcessor`: the base of the families' processors; :func:`processors_beneath` makes one per layer.
"""

from __future__ import annotations

from typing import Sequence

from diffusers.models.attention_dispatch import dispatch_attention_fn

from .positions import LayerTables, unpack_table


class EncodingRotation:
    """Rotate q and k (``[B, S, H, D]``) with mmpos encodings.

    Args:
        encodings: one encoding shared by every layer, or one per attention layer (``per_layer``).
        group_sizes: per encoding, the table's group count (1, or the heads for per-head tables): where
            its table sits in Wan's packed format.
    """

    def __init__(self, encodings: Sequence, per_layer: bool, group_sizes: Sequence[int]):
        self.encodings = list(encodings)
        self.per_layer = per_layer
        self.group_starts = [sum(group_sizes[:i]) for i in range(len(group_sizes))]
        self.group_sizes = list(group_sizes)

    def table(self, rotary_emb, index: int):
        if isinstance(rotary_emb, LayerTables):
            return rotary_emb[index]
        packed = rotary_emb[0]
        return unpack_table(packed, self.group_starts[index], self.group_sizes[index])

    def __call__(self, query, key, rotary_emb, layer: int):
        index = layer if self.per_layer else 0
        pe, table = self.encodings[index], self.table(rotary_emb, index)
        return pe.rotate_qk(query, key, table)


class PEProcessor:
    """Shared state of the processors: the rotation, this layer's index, and diffusers' dispatch settings."""

    _attention_backend = None
    _parallel_config = None
    attention_rule = None  # an :mod:`~.attention_rules` rule (set by ``set_attention_rule``)

    def __init__(self, rotation=None, layer: int | None = None, attention_backend=None, parallel_config=None):
        # no rotation: an unbound copy, as diffusers' loaders make with ``type(processor)()``; the installer puts
        # the bound one back at the next forward (:meth:`~.installer.ProcessorInstaller.check_processors`)
        self.rotation = _unbound if rotation is None else rotation
        self.layer = layer
        self._attention_backend, self._parallel_config = attention_backend, parallel_config

    @property
    def bound(self) -> bool:
        """Made by ``set_pe`` (its rotation and layer index), not re-created by a loader with ``type(processor)()``."""
        return self.rotation is not _unbound

    def _attend(self, query, key, value, mask, parallel_config, video: bool = False, image: bool = False):
        """Attention through diffusers' dispatch; ``video``: a self-attention over the video tokens, ``image``: an
        image family's joint text+image self-attention, where an ``attention_rule`` applies (it returns ``None``
        inside the training length or size: the stock attention runs)."""
        if (video or image) and self.attention_rule is not None:
            out = self.attention_rule(query, key, value, mask, parallel_config, self.layer, self._dispatch)
            if out is not None:
                return out
        return self._dispatch(query, key, value, mask, parallel_config)

    def _rotate_attend(self, query, key, value, rotary_emb, mask, parallel_config):
        """Rotate q and k by ``rotary_emb`` and attend (``image``); under a rule that hands several tables (HRDiT's
        SPA: ``attention_rule.tables(layer)``), the attention outputs averaged over them."""
        tables = getattr(self.attention_rule, "tables", lambda layer: None)(self.layer)
        if tables is None:
            if rotary_emb is not None:
                query, key = self.rotation(query, key, rotary_emb, self.layer)
            return self._attend(query, key, value, mask, parallel_config, image=True)
        if parallel_config is not None:
            raise ValueError("spa: context parallelism is not supported (the bundle grids' tables are the whole ids')")
        total = None
        for table in tables:
            q, k = self.rotation(query, key, table, self.layer)
            out = self._dispatch(q, k, value, mask, parallel_config)
            total = out if total is None else total + out
        return total / len(tables)

    def _dispatch(self, query, key, value, mask, parallel_config):
        return dispatch_attention_fn(
            query, key, value, attn_mask=mask, backend=self._attention_backend, parallel_config=parallel_config
        )


def _unbound(query, key, rotary_emb, layer):
    raise RuntimeError(
        "this mmpos processor was re-created without its encoding (type(processor)(), as diffusers' loaders do) "
        "outside the model set_pe installed it on; call mmpos.integrations.diffusers.restore(transformer), then set_pe"
    )


def processors_beneath(beneath, rotation, processor_class) -> dict:
    """One mmpos processor per layer (layer index -> processor) over ``beneath`` (``(name, stock processor)``
    pairs), keeping each stock processor's dispatch backend and parallel config; ``processor_class(stock)`` picks
    the class (families with several attention kinds)."""
    return {
        layer: processor_class(stock)(
            rotation, layer, getattr(stock, "_attention_backend", None), getattr(stock, "_parallel_config", None)
        )
        for layer, (_, stock) in enumerate(beneath)
    }
