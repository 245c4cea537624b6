"""mmpos encodings in open_clip vision towers: ``convert(model.visual, pe=NAME, **options)``, in place.

    import open_clip
    from mmpos.integrations.open_clip import convert
    model = open_clip.create_model("ViT-B-32", pretrained=None)       # or pretrained weights
    convert(model.visual, pe="rope_mixed")                            # APE removed, RoPE-Mixed per block
    model.encode_image(torch.randn(2, 3, 224, 224))

What changes in the ``VisionTransformer``:

* its learned ``positional_embedding`` is removed (``abs_pos="remove"``, default) or kept (``"keep"``, trained
  grid only);
* rotary encodings: each ``ResidualAttentionBlock``'s ``nn.MultiheadAttention`` becomes a
  :class:`PositionalMultiheadAttention` (same class, same parameters and names, so checkpoints load): q and k
  of the patch tokens go through the encoding, the class token stays unrotated;
* absolute encodings (``ape_sincos``, ``ape_learned``): added to the patch tokens before ``ln_pre``;
* ``nope``: positions removed.

The patch grid is read from ``conv1``'s output each forward, so any image size the patch size divides works
(the tower's ``image_size`` is not checked by open_clip). Not supported: patch dropout during training (token
coordinates would need the kept indices) and attention masks other than none.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from open_clip.transformer import VisionTransformer, _expand_token
from torch import nn

from .._per_thread import PerThread
from ..coords.grids import image_grid
from ..encodings import create_pe, pe_class
from ..encodings.base import PEKind
from ..encodings.per_block import check_model_coordinates, create_block_pes, fitting_options
from ..ops.forward_tables import ForwardTables, run_dtype

ABS_POS = ("remove", "keep")


class PositionalMultiheadAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` (self-attention, ``batch_first``) whose q and k pass through ``self.pe``.

    Set by :func:`convert` by swapping the class of an existing module; ``pe`` and ``tower`` (whose
    ``mmpos_coords`` holds the patch coordinates ``[N - 1, 2]`` of the current forward) are attached."""

    def forward(self, query, key=None, value=None, need_weights=False, attn_mask=None, **kwargs):
        if key is not None and key is not query or value is not None and value is not query:
            raise ValueError("PositionalMultiheadAttention encodes self-attention only (key and value must be query)")
        if not self.batch_first:
            raise ValueError("PositionalMultiheadAttention expects batch_first=True (open_clip's default)")
        batch, tokens, width = query.shape
        heads, head_dim = self.num_heads, width // self.num_heads
        qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)
        q, k, v = qkv.view(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, N, D]
        positions = self.mmpos_positions
        prefix = tokens - positions().shape[0]
        if prefix < 0:
            raise ValueError(f"attention sees {tokens} tokens; this forward's patch grid has {positions().shape[0]}")
        q_patch, k_patch = self.pe.rotate_qk(q[:, :, prefix:], k[:, :, prefix:], positions.table(self.pe, q))
        q = torch.cat([q[:, :, :prefix], q_patch.to(q.dtype)], dim=2)
        k = torch.cat([k[:, :, :prefix], k_patch.to(k.dtype)], dim=2)
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            attn_mask = attn_mask.to(q.dtype)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
        )
        out = self.out_proj(out.transpose(1, 2).reshape(batch, tokens, width))
        return out, None


class _Positions:
    """The tower's patch coordinates and its blocks' tables, set by its embedding step each forward (checked and
    built once for all blocks, as timm's Eva does), per thread (:class:`~mmpos._per_thread.PerThread`): one
    tower serves concurrent calls at different image sizes. ``grid_scale`` multiplies the patch indices
    (1 / factor: position interpolation); ``encodings``: the rotary encoding of every block."""

    def __init__(self):
        self._forward = PerThread((None, None))  # (coords, tables) of this thread's forward
        self.grid_scale = 1.0
        self.encodings: list = []

    @property
    def coords(self):
        return self._forward.get()[0]

    @property
    def tables(self) -> ForwardTables | None:
        return self._forward.get()[1]

    def start(self, coords: torch.Tensor, dtype: torch.dtype) -> None:
        """A new forward on patch coordinates ``coords`` ``[N, 2]``, q and k of ``dtype``."""
        tables = ForwardTables(self.encodings, coords, dtype, coords.device) if self.encodings else None
        self._forward.set((coords, tables))

    def table(self, pe: nn.Module, q: torch.Tensor):
        """``pe``'s table of this forward for ``q`` ``[B, H, N, D]``."""
        coords, tables = self._forward.get()
        return tables.get(pe, q) if tables is not None else pe.table(self._checked(coords), q.dtype, q.device)

    def __call__(self) -> torch.Tensor:
        return self._checked(self.coords)

    @staticmethod
    def _checked(coords):
        if coords is None:
            raise RuntimeError("patch coordinates are set by the converted tower's forward; call the tower")
        return coords


def _embeds(self, x: torch.Tensor) -> torch.Tensor:
    """open_clip's ``VisionTransformer._embeds`` with mmpos positions (bound to converted towers)."""
    _check_divisible(x, self.conv1)
    x = self.conv1(x)  # [B, C, gh, gw]
    grid = tuple(x.shape[-2:])
    coords = image_grid(*grid, scale=self.mmpos_positions.grid_scale, device=x.device)  # [gh * gw, 2] (row, col)
    self.mmpos_positions.start(coords, run_dtype(x))
    x = x.flatten(2).transpose(1, 2)
    if getattr(self, "mmpos_ape", None) is not None:
        x = x + _absolute_embedding(self.mmpos_ape, grid, coords).to(x.dtype)
    x = torch.cat([_expand_token(self.class_embedding, x.shape[0]).to(x.dtype), x], dim=1)
    if self.positional_embedding is not None:
        if self.positional_embedding.shape[0] != x.shape[1]:
            raise ValueError(
                f"abs_pos='keep': the kept positional_embedding has {self.positional_embedding.shape[0]}"
                f" positions, the image gives {x.shape[1]} tokens; use the trained image size"
            )
        x = x + self.positional_embedding.to(x.dtype)
    x = self.patch_dropout(x)
    return self.ln_pre(x)


def _check_divisible(images: torch.Tensor, conv1: nn.Conv2d) -> None:
    """Refuse an image size the patch size does not divide (the strided conv would drop the edge pixels)."""
    size, patch = tuple(images.shape[-2:]), tuple(conv1.stride)
    if any(n % p for n, p in zip(size, patch)):
        raise ValueError(
            f"images are {size[0]} x {size[1]} pixels, not divisible by the patch size "
            f"{patch[0]} x {patch[1]} (the tower would silently drop the remainder); resize or pad "
            "them to a multiple of the patch size"
        )


def _absolute_embedding(ape, grid, coords):
    if hasattr(ape, "resample") and tuple(getattr(ape, "grid_size", grid)) != grid:
        return ape.resample(grid)
    return ape.embed(coords)


def convert(
    visual: nn.Module, pe: str = "rope_axial", *, abs_pos: str = "remove", share_pe: bool | None = None, **options
) -> nn.Module:
    """Switch an open_clip ``VisionTransformer`` (``model.visual``) to the encoding ``pe``; returns it.

    Args:
        visual: open_clip ``VisionTransformer`` (random or pretrained).
        pe: registered encoding name (``mmpos.list_pes()``).
        abs_pos: ``"remove"`` or ``"keep"`` the tower's ``positional_embedding``.
        share_pe: rotary encodings: one instance for all blocks (``True``) or one per block (``False``); default:
            per block for encodings with parameters, shared otherwise.
        **options: the encoding's options (``theta``, ``seed``, ...); ``head_dim``, ``num_heads``, ``num_axes=2``
            (and ``embed_dim``, ``grid_size`` for absolute encodings) come from the tower.
    """
    if not isinstance(visual, VisionTransformer):
        raise TypeError(f"convert expects an open_clip VisionTransformer (model.visual), got {type(visual).__name__}")
    if hasattr(visual, "mmpos_pe"):
        raise ValueError(f"this tower is already converted to {visual.mmpos_pe!r}; convert a fresh one")
    if abs_pos not in ABS_POS:
        raise ValueError(f"abs_pos must be one of {ABS_POS}, got {abs_pos!r}")
    if not isinstance(visual.patch_dropout, nn.Identity):
        raise ValueError("convert does not support open_clip patch dropout (patch_dropout > 0)")
    kind = pe_class(pe).kind
    if kind == PEKind.CAMERA:
        raise TypeError(
            f"{pe!r} is a camera encoding (its inputs are cameras, not a patch grid); convert installs "
            "grid encodings: rotary, absolute or 'nope'. Use it through its own prepare/attention "
            "(docs/cameras.md) or a camera adapter"
        )
    visual.mmpos_positions = _Positions()
    visual.mmpos_ape = None
    if kind == "rotary":
        _install_rotary(visual, pe, share_pe, options)
    elif kind == "absolute":
        facts = dict(embed_dim=visual.conv1.out_channels, num_axes=2, grid_size=tuple(visual.grid_size))
        visual.mmpos_ape = create_pe(pe, **fitting_options(pe, facts, options))
    elif options:
        raise TypeError(f"encoding {pe!r} takes no options, got {sorted(options)}")
    if abs_pos == "remove":
        visual.positional_embedding = None
    visual._embeds = types.MethodType(_embeds, visual)
    visual.mmpos_pe = pe
    return visual


def _install_rotary(visual, pe, share_pe, options):
    blocks = list(visual.transformer.resblocks)
    for index, block in enumerate(blocks):
        if type(block.attn) is not nn.MultiheadAttention or not block.attn._qkv_same_embed_dim:
            raise TypeError(
                f"resblocks[{index}].attn is a {type(block.attn).__name__}; expected nn.MultiheadAttention "
                f"with one in_proj"
            )
    attn = blocks[0].attn
    facts = dict(head_dim=attn.embed_dim // attn.num_heads, num_heads=attn.num_heads, num_axes=2)
    where = "the open_clip tower"
    encodings = create_block_pes(pe, len(blocks), facts, options, share=share_pe, where=where)
    check_model_coordinates(encodings[0], where)  # the tower passes its patches' coordinates
    visual.mmpos_positions.encodings = encodings
    for block, block_pe in zip(blocks, encodings):
        block.attn.__class__ = PositionalMultiheadAttention
        block.attn.pe = block_pe
        block.attn.mmpos_positions = visual.mmpos_positions
