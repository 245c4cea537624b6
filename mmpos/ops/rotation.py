"""Apply a rotation table to q or k: the rotary operator.

Two pair layouts: ``interleaved`` (pairs are adjacent channels ``(2i, 2i+1)``: Flux, Wan, timm EVA) and
``half`` (pairs are ``(i, i + R/2)``, rotate-half: NeoX, transformers, DINOv3).

Speed and exactness on the CPU: 16-bit inputs are rotated in cache-sized chunks, each upcast to fp64,
multiplied by the fp64 table as complex numbers and rounded once, so a bf16 result is correctly rounded
(within 0.5 ulp of the exact rotation) at roughly the cost of two copies of the tensor. fp32/fp64 inputs
take one complex multiply. On GPUs, 16-bit inputs compute in fp32 through a buffer; under the ``"auto"`` rotary backend
(:func:`mmpos.ops.set_rotary_backend`) a fused Triton kernel (``ops.rotary_triton``, opt-in until it has been
checked on a GPU) reads each pair once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._validation import check_choice, sequence_length_error
from .rotary_triton import can_fuse, rotate_fused
from .tables import RotaryTable

LAYOUTS = ("interleaved", "half")
CHUNK_ELEMENTS = 1 << 19  # elements of one CPU chunk (4 MiB in fp64), best of a 2^16..2^30 sweep here


def rotate(
    x: torch.Tensor, table: RotaryTable, layout: str = "interleaved", *, seq_dim: int = -2, num_prefix_tokens: int = 0
) -> torch.Tensor:
    """Rotate ``x`` by ``table``; returns a new tensor (``x`` is never modified).

    Args:
        x: ``[..., L, D]`` (``seq_dim=-2``, e.g. ``[B, H, L, D]``) or ``[B, L, H, D]`` (``seq_dim=-3``).
        table: ``cis`` of shape ``[..., L - num_prefix_tokens, P]`` broadcastable against ``x`` with its
            sequence dim moved to ``-2``. The first ``2 * P`` channels rotate (partial rotary), the rest
            and the first ``num_prefix_tokens`` tokens pass through unchanged.
        layout: ``"interleaved"`` or ``"half"``.
    """
    check_choice("layout", layout, LAYOUTS)
    xv = _check_and_move(x, table, seq_dim, num_prefix_tokens)
    if torch.compiler.is_compiling():
        return _rotate_traceable(x, table, layout, seq_dim, num_prefix_tokens)
    if torch.is_grad_enabled() and (x.requires_grad or table.cis.requires_grad):
        return _RotateFunction.apply(x, table.cis, layout, seq_dim, num_prefix_tokens)
    return _rotate_into(torch.empty_like(x), x, xv, table.cis, layout, seq_dim, num_prefix_tokens)


def compute_dtype(x_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """Real dtype the arithmetic runs in: fp64 for fp64 inputs and for 16-bit inputs on the CPU, else fp32."""
    if x_dtype == torch.float64:
        return torch.float64
    if x_dtype in (torch.float16, torch.bfloat16) and device.type == "cpu":
        return torch.float64
    if not x_dtype.is_floating_point:
        raise TypeError(f"x must be a floating-point tensor, got {x_dtype}")
    return torch.float32


def _check_and_move(x: torch.Tensor, table: RotaryTable, seq_dim: int, num_prefix_tokens: int) -> torch.Tensor:
    if not isinstance(getattr(table, "cis", None), torch.Tensor):  # a RotaryTable (or one alike: its .cis)
        hint = " (pass the RotaryTable itself, not its .cis)" if isinstance(table, torch.Tensor) else ""
        raise TypeError(f"table must be a RotaryTable, got {type(table).__name__}{hint}")
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError(f"x must be a tensor with a sequence and a channel dim, got shape {getattr(x, 'shape', x)}")
    if seq_dim not in (-2, -3) and seq_dim != x.dim() - 2 and seq_dim != x.dim() - 3:
        raise ValueError(f"seq_dim must be -2 ([..., L, D]) or -3 ([B, L, H, D]), got {seq_dim}")
    if x.dtype == torch.float64 and table.cis.dtype != torch.complex128:
        raise TypeError(
            f"table is {table.cis.dtype} but x is float64: a float64 x needs a complex128 table "
            "(build it for x's dtype, e.g. pe.table(coords, torch.float64))"
        )
    rotary_dim = 2 * table.num_pairs
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"the table rotates {rotary_dim} channels but x has only {x.shape[-1]} (head dim)")
    if num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be >= 0, got {num_prefix_tokens}")
    length = x.shape[seq_dim] - num_prefix_tokens
    if table.length != length:
        raise sequence_length_error(table.length, tuple(x.shape), seq_dim, num_prefix_tokens)
    xv = x.movedim(seq_dim, -2)
    lead_table, lead_x = tuple(table.cis.shape[:-2]), tuple(xv.shape[:-2])
    aligned = lead_table[len(lead_table) - len(lead_x) :] if len(lead_table) > len(lead_x) else lead_table
    fits = len(lead_table) <= len(lead_x) and all(t in (1, x) for t, x in zip(reversed(aligned), reversed(lead_x)))
    if not fits:
        raise ValueError(
            f"table leading dims {lead_table} (batch/heads) must broadcast to x's {lead_x} without expanding x; "
            "e.g. a per-head table needs x with the same number of heads"
        )
    return xv


def _pairs(t: torch.Tensor, layout: str) -> torch.Tensor:
    """View ``[..., R]`` as ``[..., R/2, 2]`` (real, imaginary) pairs."""
    if layout == "interleaved":
        return t.unflatten(-1, (-1, 2))
    return t.unflatten(-1, (2, -1)).transpose(-1, -2)


def _rotate_into(
    out: torch.Tensor,
    x: torch.Tensor,
    xv: torch.Tensor,
    cis: torch.Tensor,
    layout: str,
    seq_dim: int,
    num_prefix_tokens: int,
) -> torch.Tensor:
    """Write the rotation of ``x`` into ``out`` (same shape and dtype); no autograd."""
    ov = out.movedim(seq_dim, -2)
    rotary_dim = 2 * cis.shape[-1]
    n = num_prefix_tokens
    if n:
        ov[..., :n, :].copy_(xv[..., :n, :])
    if rotary_dim < x.shape[-1]:
        ov[..., n:, rotary_dim:].copy_(xv[..., n:, rotary_dim:])
    src = _pairs(xv[..., n:, :rotary_dim], layout)
    dst = _pairs(ov[..., n:, :rotary_dim], layout)
    real = compute_dtype(x.dtype, x.device)
    cis = cis.to(x.device, torch.complex128 if real == torch.float64 else torch.complex64)
    if real == torch.float32 and can_fuse(xv[..., n:, :rotary_dim], cis):
        rotate_fused(xv[..., n:, :rotary_dim], cis, ov[..., n:, :rotary_dim], layout == "interleaved")
        return out
    if x.dtype == real and layout == "interleaved" and src.stride(-1) == 1 and dst.stride(-1) == 1:
        torch.mul(torch.view_as_complex(src), cis, out=torch.view_as_complex(dst))
        return out
    for src_chunk, cis_chunk, dst_chunk in _chunks(src, cis, dst):
        buffer = torch.empty(src_chunk.shape, dtype=real, device=x.device)
        buffer.copy_(src_chunk)
        torch.view_as_complex(buffer).mul_(cis_chunk)
        dst_chunk.copy_(buffer)
    return out


def _rotate_traceable(
    x: torch.Tensor, table: RotaryTable, layout: str, seq_dim: int, num_prefix_tokens: int
) -> torch.Tensor:
    """The same rotation in plain real arithmetic (no complex views, no writes into buffers), which
    ``torch.compile`` traces and fuses; its autograd is PyTorch's own. A table of learned phases
    (``table.phase``) is read as ``cos``/``sin`` of them, so that no complex tensor enters the graph."""
    xv = x.movedim(seq_dim, -2)
    n, rotary_dim = num_prefix_tokens, 2 * table.num_pairs
    real = compute_dtype(x.dtype, x.device)
    phase = getattr(table, "phase", None)
    if phase is not None:
        cos, sin = phase.cos().to(real), phase.sin().to(real)
    else:
        cos_sin = torch.view_as_real(table.cis.to(x.device)).to(real)
        cos, sin = cos_sin[..., 0], cos_sin[..., 1]
    pairs = _pairs(xv[..., n:, :rotary_dim], layout).to(real)
    re, im = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1)
    rotated = (rotated.flatten(-2) if layout == "interleaved" else rotated.transpose(-1, -2).flatten(-2)).to(x.dtype)
    body = torch.cat([rotated, xv[..., n:, rotary_dim:]], dim=-1)
    return torch.cat([xv[..., :n, :], body], dim=-2).movedim(-2, seq_dim)


def _chunks(
    src: torch.Tensor, cis: torch.Tensor, dst: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(src, table, dst) pieces sized to stay in cache on the CPU; the whole tensors elsewhere.

    ``src``/``dst``: ``[..., L, P, 2]`` views; ``cis``: ``[..., L, P]``. Short sequences with many batch
    elements (ViT) are split along the first dim (contiguous blocks); long ones along the sequence.
    """
    if src.device.type != "cpu" or src.dim() < 4 or src.numel() <= CHUNK_ELEMENTS:
        return [(src, cis, dst)]
    per_item = src[:1].numel()
    if per_item <= CHUNK_ELEMENTS // 2:
        step = CHUNK_ELEMENTS // per_item
        batched_table = cis.dim() == src.dim() - 1 and cis.shape[0] != 1
        return [
            (src[s : s + step], cis[s : s + step] if batched_table else cis, dst[s : s + step])
            for s in range(0, src.shape[0], step)
        ]
    length = src.shape[-3]
    step = max(1, CHUNK_ELEMENTS // src[..., :1, :, :].numel())
    return [
        (src[..., s : s + step, :, :], cis[..., s : s + step, :], dst[..., s : s + step, :, :])
        for s in range(0, length, step)
    ]


class _RotateFunction(torch.autograd.Function):
    """Rotation with the fast kernel forward and backward (the backward rotates by the conjugate)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, cis: torch.Tensor, layout: str, seq_dim: int, num_prefix_tokens: int
    ) -> torch.Tensor:
        xv = x.movedim(seq_dim, -2)
        ctx.save_for_backward(x, cis)
        ctx.args = (layout, seq_dim, num_prefix_tokens)
        return _rotate_into(torch.empty_like(x), x, xv, cis.detach(), layout, seq_dim, num_prefix_tokens)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        x, cis = ctx.saved_tensors
        layout, seq_dim, n = ctx.args
        grad_x = grad_cis = None
        if ctx.needs_input_grad[0]:
            g = grad_out.contiguous()
            grad_x = _rotate_into(
                torch.empty_like(g), g, g.movedim(seq_dim, -2), cis.detach().conj(), layout, seq_dim, n
            )
        if ctx.needs_input_grad[1]:
            real = torch.float64 if cis.dtype == torch.complex128 else torch.float32
            rotary_dim = 2 * cis.shape[-1]
            x_c = torch.view_as_complex(
                _pairs(x.movedim(seq_dim, -2)[..., n:, :rotary_dim], layout).to(real).contiguous()
            )
            g_c = torch.view_as_complex(
                _pairs(grad_out.movedim(seq_dim, -2)[..., n:, :rotary_dim], layout).to(real).contiguous()
            )
            grad_full = g_c * x_c.conj()
            grad_cis = sum_to_shape(grad_full, cis.shape)
        return grad_x, grad_cis, None, None, None


def sum_to_shape(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Sum the broadcast dims of ``t`` down to ``shape`` (the batch and head dims a table shares): the gradient of
    a broadcast operand."""
    extra = t.dim() - len(shape)
    if extra:  # leading dims of size 1 are dropped, not summed (a sum over them is a fill and a copy)
        t = t.reshape(t.shape[extra:]) if t.shape[:extra].numel() == 1 else t.sum(dim=tuple(range(extra)))
    dims = tuple(i for i, s in enumerate(shape) if s == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t
