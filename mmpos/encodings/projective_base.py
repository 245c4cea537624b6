"""Base of the projective camera encodings (PRoPE, GTA, UCPE's relative ray encoding).

Each head's channels are split in two: the first ``projective_dim`` channels are 4-vectors multiplied by a
4x4 matrix ``P`` per token (a camera's projective frame, or a ray's local frame), the rest carry 2D RoPE over
the token's (column, row) in its image (base 100): a block of channels for x, then one for y, each with its
own pair layout (``half`` by default, the split layout the PRoPE and UCPE notes describe).

=========  ======================  ===========================
tensor     projective channels     RoPE channels
=========  ======================  ===========================
q          ``P^T q``               rotate by ``-theta``
k, v       ``P^-1 k``              rotate by ``-theta``
output     ``P o``                 rotate by ``+theta``
=========  ======================  ===========================

So the logits are ``q^T P_q P_k^-1 k`` (+ RoPE of the offset) and the value path ``P_q P_k^-1 v``: both depend
only on the relative transform between tokens, hence are invariant to the choice of world frame. The RoPE
channels follow the same rule with ``P = R(theta)``: q, k, v are rotated by ``-theta`` and the output by
``+theta``, the sign of the references (PRoPE, GTA and UCPE apply ``[x1 cos + x2 sin, -x1 sin + x2 cos]`` to
q, k and v), so weights trained with them load unchanged.

Usage, shapes ``q [B, H, Lq, D]``, ``k, v [B, H, Lk, D]`` with tokens camera-major (frames of a video are
cameras), row-major inside an image::

    geo = pe.prepare(cameras)                 # a mmpos.camera.Cameras; once per step, shared by every layer
    out = pe.attention(q, k, v, geo)          # SDPA in between; or, with any attention kernel:
    q = pe.apply_q(q, geo); k, v = pe.apply_kv(k, v, geo); out = pe.apply_output(attn(q, k, v), geo)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, overload

import torch
import torch.nn.functional as F
from torch.types import Device

from .._validation import as_int_tuple, check_choice, check_not_meta, check_positive_int, check_theta
from ..coords.grids import image_grid
from ..ops.projective import transform_blocks
from ..ops.rotation import LAYOUTS, rotate
from ..ops.tables import RotaryTable
from .base import CameraPE, Capabilities
from .rope_axial import AxialRoPE


@dataclass(eq=False)
class CameraTransforms:
    """Geometry of one side of the attention (queries, or keys and values).

    matrices, inverse: ``[B or 1, G, 4, 4]`` ``P`` and ``P^-1`` for ``G`` consecutive token groups (cameras or
    tokens); rope: table ``[L, F]`` of the tokens' (column, row) rotation; valid: ``[B or 1, L]`` bool or
    ``None`` (keys that are not valid are masked out of attention).
    """

    matrices: torch.Tensor
    inverse: torch.Tensor
    rope: RotaryTable
    valid: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.rope.length


class ProjectiveRoPE(CameraPE):
    """Common operator; subclasses build :class:`CameraTransforms` in ``prepare``."""

    capabilities = Capabilities(needs_cameras=True, world_frame_invariant=True)
    example_options = dict(head_dim=16)

    def __init__(
        self,
        head_dim: int,
        projective_dim: int | None = None,
        rope_theta: float = 100.0,
        layout: str = "half",
        apply_vo: bool = True,
    ):
        super().__init__()
        check_positive_int("head_dim", head_dim)
        projective_dim = head_dim // 2 if projective_dim is None else projective_dim
        rope_dim = head_dim - projective_dim
        if projective_dim <= 0 or projective_dim % 4 or rope_dim < 0 or rope_dim % 4:
            raise ValueError(
                f"head_dim={head_dim} with projective_dim={projective_dim}: expected a positive multiple "
                f"of 4 projective channels and a multiple of 4 left for the 2D RoPE (head_dim % 8 == 0 "
                "for the default half split)"
            )
        check_choice("layout", layout, LAYOUTS)
        check_theta("rope_theta", rope_theta)
        self.head_dim, self.projective_dim, self.rope_dim = head_dim, projective_dim, rope_dim
        self.rope_theta, self.layout, self.apply_vo = rope_theta, layout, apply_vo
        self.rope = (
            AxialRoPE(rope_dim, axes_dims=(rope_dim // 2, rope_dim // 2), theta=rope_theta, layout=layout)
            if rope_dim
            else None
        )

    # --- geometry -------------------------------------------------------------------------------------------
    def rope_table(
        self, grid_size: Sequence[int], num_images: int, dtype: torch.dtype = torch.float32, device: Device = None
    ) -> RotaryTable:
        """``[num_images * rows * cols, F]`` table of each token's (column, row) in its image."""
        rows, cols = as_int_tuple("grid_size", grid_size)
        coords = image_grid(rows, cols, dtype=torch.float64, device=device).flip(-1).repeat(num_images, 1)
        if self.rope is None:
            return RotaryTable(torch.ones(coords.shape[0], 0, dtype=torch.complex64, device=device))
        table = self.rope.table(coords, dtype, device)
        assert isinstance(table, RotaryTable)  # axial RoPE builds RotaryTables
        return table

    # --- operator ---------------------------------------------------------------------------------------------
    def _transform(
        self, x: torch.Tensor, matrices: torch.Tensor, table: RotaryTable, transpose: bool, inverse: bool
    ) -> torch.Tensor:
        """Projective channels by ``matrices`` (transposed if asked); RoPE channels by ``+theta`` when ``inverse``
        (the output), else by ``-theta`` (q, k, v)."""
        self._check_x(x, table)
        n = self.projective_dim
        head = transform_blocks(x[..., :n], matrices, n, transpose=transpose)
        if self.rope is None:
            return head
        cis = table.cis if inverse else table.cis.conj()
        half, pairs = self.rope_dim // 2, self.rope_dim // 4  # x block, then y block, each its own pair layout
        x_block = rotate(x[..., n : n + half], RotaryTable(cis[..., :pairs]), self.layout)
        y_block = rotate(x[..., n + half :], RotaryTable(cis[..., pairs:]), self.layout)
        return torch.cat([head, x_block, y_block], dim=-1)

    def _check_x(self, x: torch.Tensor, table: RotaryTable) -> None:
        check_not_meta("q/k/v", x)
        check_not_meta("the camera geometry (prepare(cameras))", table.cis)
        if x.dim() != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(f"expected [B, H, L, {self.head_dim}] tensors, got {tuple(x.shape)}")
        if x.shape[-2] != table.length:
            raise ValueError(
                f"x has {x.shape[-2]} tokens; the camera geometry describes {table.length} "
                "(cameras x patches, camera-major)"
            )

    def apply_q(self, q: torch.Tensor, geo: CameraTransforms) -> torch.Tensor:
        return self._transform(q, geo.matrices, geo.rope, transpose=True, inverse=False)

    @overload
    def apply_kv(
        self, k: torch.Tensor, v: torch.Tensor, geo: CameraTransforms
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def apply_kv(self, k: torch.Tensor, v: None, geo: CameraTransforms) -> tuple[torch.Tensor, None]: ...
    def apply_kv(
        self, k: torch.Tensor, v: torch.Tensor | None, geo: CameraTransforms
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(k, v)`` of the key side encoded (``v`` only with ``apply_vo``; ``v=None`` gives ``(k, None)``)."""
        k = self._transform(k, geo.inverse, geo.rope, transpose=False, inverse=False)
        if v is not None and self.apply_vo:
            v = self._transform(v, geo.inverse, geo.rope, transpose=False, inverse=False)
        return k, v

    def apply_output(self, out: torch.Tensor, geo: CameraTransforms) -> torch.Tensor:
        if not self.apply_vo:
            return out
        return self._transform(out, geo.matrices, geo.rope, transpose=False, inverse=True)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        query: CameraTransforms,
        key: CameraTransforms | None = None,
        attn_mask: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """SDPA with the encoding; ``key`` defaults to ``query`` (self-attention). Invalid keys are masked."""
        key = query if key is None else key
        q = self.apply_q(q, query)
        k, v = self.apply_kv(k, v, key)
        attn_mask = merge_key_mask(attn_mask, key.valid)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
        return self.apply_output(out, query)

    def logits(
        self, q: torch.Tensor, k: torch.Tensor, query: CameraTransforms, key: CameraTransforms | None = None
    ) -> torch.Tensor:
        """``[B, H, Lq, Lk]`` encoded dot products (unscaled; invalid keys not masked), for tests and plots."""
        key = query if key is None else key
        return self.apply_q(q, query) @ self.apply_kv(k, None, key)[0].transpose(-1, -2)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        query: CameraTransforms,
        key: CameraTransforms | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As :meth:`attention` (without ``scale``)."""
        return self.attention(q, k, v, query, key, attn_mask)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, projective_dim={self.projective_dim}, rope_theta={self.rope_theta}, "
            f"apply_vo={self.apply_vo}"
        )


def merge_key_mask(attn_mask: torch.Tensor | None, key_valid: torch.Tensor | None) -> torch.Tensor | None:
    """Combine a user mask (bool, True = attend, or additive float) with ``key_valid [B, Lk]``."""
    if key_valid is None or bool(key_valid.all()):
        return attn_mask
    keys = key_valid[:, None, None, :]
    if attn_mask is None:
        return keys
    if attn_mask.dtype == torch.bool:
        return attn_mask & keys
    return attn_mask.masked_fill(~keys, float("-inf"))


def lift_intrinsics(k3: torch.Tensor) -> torch.Tensor:
    """``[..., 3, 3]`` -> ``diag(K, 1)`` ``[..., 4, 4]``."""
    out = torch.zeros(*k3.shape[:-2], 4, 4, dtype=k3.dtype, device=k3.device)
    out[..., :3, :3] = k3
    out[..., 3, 3] = 1
    return out
