"""timm attention modules whose q and k go through an mmpos encoding.

Conversion swaps the class of an existing module in place (``attn.__class__ = ...``): its weights,
buffers, names and options (fused qkv, biases, qk-norm, gating, GQA) stay exactly as they were, so
pretrained state dicts load unchanged. The subclasses only replace ``forward``: they take their encoding's
table of the current forward from the model's :class:`~mmpos.integrations.timm.positions.TokenPositions`
(built once per forward, before the blocks) and apply it, ``q, k = pe.rotate_qk(q, k, table)``, so any
encoding in the registry (rotations, learned maps, block matrix exponentials) plugs in. Prefix tokens are
left to the encoding's ``num_prefix_tokens`` (no copies).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from timm.layers import Attention, AttentionRope, register_notrace_module
from timm.layers.attention import maybe_add_mask, resolve_self_attn_mask
from timm.models.eva import EvaAttention

from .positions import TokenPositions


class _PositionalAttention:
    """Shared forward: project, normalise, encode positions, attend, project out."""

    pe: torch.nn.Module  # the encoding: table = pe.table(coords, ...), then pe.rotate_qk(q, k, table)
    positions: TokenPositions  # shared by the model's blocks

    def _project(self, x: torch.Tensor):
        raise NotImplementedError

    def _folds_pe(self, x: torch.Tensor) -> bool:
        """Whether the encoding's linear map goes into the fused qkv weights (:meth:`HARoPE.fold_into_qkv`): the
        encoding can (``capabilities.folds_into_qkv``), nothing sits between projection and encoding (no
        qk-norm), and folding is cheaper."""
        return (
            self.pe.capabilities.folds_into_qkv
            and isinstance(self, PositionalAttention)
            and isinstance(self.q_norm, torch.nn.Identity)
            and isinstance(self.k_norm, torch.nn.Identity)
            and self.pe.folds_into(x, self.qkv)
        )

    def encoded_qkv(self, x: torch.Tensor):
        """``q, k, v`` ``[B, H, N, head_dim]`` as attention sees them (after qk-norm, GQA and the encoding)."""
        if self._folds_pe(x):  # HARoPE's per-head map folded into the qkv weights: once per call, not per token
            q, k, v = self._project(x, *self.pe.fold_into_qkv(self.qkv.weight, self.qkv.bias))
            return (*self.pe.rotate_mapped_qk(q, k, self.positions.table(self.pe, x.shape[1], q)), v)
        q, k, v = self._project(x)
        q, k = self.q_norm(q), self.k_norm(k)
        groups = getattr(self, "num_kv_groups", 1)
        if groups > 1:  # per-head encodings need one key per query head
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        q, k = self.pe.rotate_qk(q, k, self.positions.table(self.pe, x.shape[1], q))
        return q, k, v.to(q.dtype)

    def forward(
        self,
        x: torch.Tensor,
        *,
        rope: Optional[torch.Tensor] = None,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        if rope is not None:
            raise ValueError(
                "this attention block takes positions from mmpos; the model still passes a timm "
                "`rope` tensor (set model.rope = None, as mmpos.integrations.timm.convert does)"
            )
        B, N, _ = x.shape
        gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
        q, k, v = self.encoded_qkv(x)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=self.attn_drop.p if self.training else 0.0
            )
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            attn = maybe_add_mask(attn, resolve_self_attn_mask(N, attn, attn_mask, is_causal))
            x = self.attn_drop(attn.softmax(dim=-1)) @ v
        x = self.norm(x.transpose(1, 2).reshape(B, N, -1))
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))


class PositionalAttention(_PositionalAttention, Attention):
    """``timm.layers.Attention`` (VisionTransformer, DeiT, NaFlexVit standard blocks) with an mmpos encoding."""

    def _project(self, x, weight=None, bias=None):
        """``q, k, v`` ``[B, H, N, head_dim]``; ``weight``, ``bias``: in place of ``self.qkv``'s (folded)."""
        B, N, _ = x.shape
        qkv = self.qkv(x) if weight is None else F.linear(x, weight, bias)
        return qkv.reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)


class PositionalEvaAttention(_PositionalAttention, EvaAttention):
    """``timm.models.eva.EvaAttention`` (EVA-02, rope-vit ports, PE) with an mmpos encoding."""

    def _project(self, x):
        B, N, _ = x.shape
        if self.qkv is None:
            return [
                p(x).reshape(B, N, self.num_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
            ]
        if self.q_bias is None:
            qkv = self.qkv(x)
        else:
            bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
            qkv = self.qkv(x) + bias if self.qkv_bias_separate else F.linear(x, self.qkv.weight, bias)
        return qkv.reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)


class PositionalAttentionRope(_PositionalAttention, AttentionRope):
    """``timm.layers.AttentionRope`` (Eva/NaFlexVit ``attn_type='rope'``, GQA) with an mmpos encoding."""

    def _project(self, x):
        B, N, _ = x.shape
        if self.qkv is not None:
            qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            return qkv.unbind(0)
        q = self.q_proj(x).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).reshape(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).reshape(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v


POSITIONAL_ATTENTION = {
    Attention: PositionalAttention,
    EvaAttention: PositionalEvaAttention,
    AttentionRope: PositionalAttentionRope,
}
for _positional in POSITIONAL_ATTENTION.values():  # torch.fx (timm's feature extraction) calls them as leaves:
    register_notrace_module(_positional)  # their forward reads this forward's tables at run time, not at trace time


def check_convertible(attn: torch.nn.Module, where: str) -> None:
    cls = type(attn)
    if cls in POSITIONAL_ATTENTION.values():
        raise ValueError(f"{where} is already converted; convert a model only once")
    if cls not in POSITIONAL_ATTENTION:
        supported = ", ".join(c.__name__ for c in POSITIONAL_ATTENTION)
        raise TypeError(f"{where} is a {cls.__module__}.{cls.__name__}; mmpos can convert {supported}")


def make_positional(attn: torch.nn.Module, pe: torch.nn.Module, positions, where: str) -> None:
    """Turn the timm attention module ``attn`` into its positional subclass, in place."""
    check_convertible(attn, where)
    attn.__class__ = POSITIONAL_ATTENTION[type(attn)]
    attn.pe = pe
    attn.positions = positions
