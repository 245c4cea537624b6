"""A small LVSM-style decoder-only novel-view transformer with a pluggable camera encoding.

Tokens: the patches of 2 posed context views (RGB) and of the target view (a learned query token); every
token gets a learned in-image patch position and a role (context / target) embedding, shared by all encodings.
A stack of pre-norm self-attention blocks over all ``3 * P`` tokens; the target tokens are decoded to RGB
patches by regression (sigmoid). The camera reaches the model only through the encoding, any registered camera
encoding (:data:`NVS_ENCODINGS`: ``"none"`` and the registry's camera kinds), through its contract:

- an attention encoding (``prope``, ``ucpe``, ``rayrope``) gets ``pe.prepare(cameras)`` of the patch grid (the
  true rays of each patch, any lens; pixel intrinsics) and acts in every layer (``pe.attention``), with a
  per-layer depth head where it reads depth (``cls.depth_head``: RayRoPE);
- an additive encoding (``plucker``) gets ``pe.prepare(cameras)`` of the pixel grid: per-pixel rays (6 * patch^2
  channels per token, LVSM's input) embedded by the model's ``Linear`` and added to every token;
- ``none``: no camera at all (a baseline: it can only guess the view).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..._validation import check_choice
from ...camera.cameras import Cameras
from ...encodings import list_pes, pe_class

NVS_ENCODINGS = ("none", *list_pes("camera"))  # the registry's camera encodings at import


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """``[B, C, ch, S, S]`` -> ``[B, C * P, ch * patch^2]`` (row-major patches, camera-major tokens)."""
    batch, views = images.shape[:2]
    patches = F.unfold(images.flatten(0, 1), patch, stride=patch)  # [B*C, ch*p*p, P]
    return patches.transpose(1, 2).reshape(batch, views * patches.shape[-1], -1)


def unpatchify(tokens: torch.Tensor, patch: int, size: int) -> torch.Tensor:
    """``[B, P, 3 * patch^2]`` -> ``[B, 3, S, S]``."""
    return F.fold(tokens.transpose(1, 2), (size, size), patch, stride=patch)


def encoding_class(encoding: str):
    """The camera encoding's class, or ``None`` for ``"none"``."""
    check_choice("encoding", encoding, ("none", *list_pes("camera")))
    return None if encoding == "none" else pe_class(encoding)


class CameraAttention(nn.Module):
    """Multi-head self-attention whose q, k, v and output pass through the camera encoding."""

    def __init__(self, dim: int, heads: int, encoding: str):
        super().__init__()
        self.heads, self.head_dim, self.encoding = heads, dim // heads, encoding
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        cls = encoding_class(encoding)
        self.depth = None if cls is None else cls.depth_head(dim)  # RayRoPE's per-layer depth head

    def forward(self, x: torch.Tensor, pe, geometry) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, self.head_dim)).permute(2, 0, 3, 1, 4)
        if pe is None:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            per_layer = {} if self.depth is None else {"depth_q": self.depth(x)}
            out = pe.attention(q, k, v, geometry, **per_layer)
        return self.out(out.transpose(1, 2).flatten(2))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, encoding: str, mlp_ratio: int = 4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CameraAttention(dim, heads, encoding)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x, pe, geometry):
        x = x + self.attn(self.norm1(x), pe, geometry)
        return x + self.mlp(self.norm2(x))


class NovelViewTransformer(nn.Module):
    """Predicts the target view ``[B, 3, S, S]`` of a batch of triples (see :mod:`mmpos.world.nvs_data`).

    Args:
        encoding: ``"none"`` or a registered camera encoding (:data:`NVS_ENCODINGS`).
        image_size, patch: square views of ``image_size`` pixels cut into ``patch``-pixel patches.
        dim, depth, heads: transformer width, blocks, heads (``dim / heads`` must suit the encoding: a multiple
            of 24 for ``rayrope`` with 3 rays, of 8 for ``prope`` / ``ucpe``).
    """

    def __init__(
        self, encoding: str, image_size: int = 32, patch: int = 4, dim: int = 96, depth: int = 4, heads: int = 2
    ):
        super().__init__()
        cls = encoding_class(encoding)
        if image_size % patch or dim % heads:
            raise ValueError(
                f"image_size must be a multiple of patch and dim of heads, got {image_size}, {patch}, {dim}, {heads}"
            )
        self.encoding, self.image_size, self.patch = encoding, image_size, patch
        self.grid = (image_size // patch, image_size // patch)
        patches = self.grid[0] * self.grid[1]
        self.embed = nn.Linear(3 * patch * patch, dim)
        self.target_token = nn.Parameter(torch.zeros(dim))
        self.position = nn.Parameter(0.02 * torch.randn(patches, dim))
        self.role = nn.Parameter(0.02 * torch.randn(2, dim))  # context, target
        self.additive = cls is not None and cls.capabilities.additive
        self.rays = nn.Linear(6 * patch * patch, dim) if self.additive else None  # the additive encoding's embedding
        self.pe = None if cls is None else cls.for_head_dim(dim // heads)
        self.blocks = nn.ModuleList(Block(dim, heads, encoding) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 3 * patch * patch)

    def cameras(self, batch: dict) -> Cameras:
        """The batch's views at the patch grid, in the model's dtype: poses, pixel intrinsics, each patch's ray."""
        dtype = self.head.weight.dtype
        return Cameras(
            c2w=batch["c2w"].to(dtype),
            grid=self.grid,
            image_size=(self.image_size, self.image_size),
            intrinsics=batch["intrinsics"].to(dtype),
            rays=batch["patch_rays"].to(dtype),
        )

    def pixel_cameras(self, batch: dict) -> Cameras:
        """The batch's views at the pixel grid (a ray per pixel, the batch's dtype): an additive encoding's input."""
        return Cameras(c2w=batch["c2w"], grid=(self.image_size, self.image_size), rays=batch["pixel_rays"])

    def geometry(self, batch: dict):
        """The attention encoding's per-forward geometry (computed once, shared by every block); ``None`` without
        one (an additive encoding acts on the tokens, :meth:`tokens`)."""
        if self.pe is None or self.additive:
            return None
        return self.pe.prepare(self.cameras(batch))

    def tokens(self, batch: dict) -> torch.Tensor:
        """``[B, 3 * P, dim]``: context patches and target queries with positions, roles (and Plücker rays)."""
        context = self.embed(patchify(batch["images"][:, :2].to(self.head.weight.dtype), self.patch))
        batch_size, patches = context.shape[0], self.position.shape[0]
        target = self.target_token.expand(batch_size, patches, -1)
        roles = self.role.repeat_interleave(torch.tensor([2 * patches, patches]), dim=0)
        x = torch.cat([context, target], 1) + self.position.repeat(3, 1) + roles
        if self.additive:
            size = self.image_size
            rays = self.pe.prepare(self.pixel_cameras(batch)).to(x.dtype)  # [B, 3 * S * S, channels]
            maps = rays.unflatten(1, (3, size, size)).permute(0, 1, 4, 2, 3)
            x = x + self.rays(patchify(maps, self.patch))
        return x

    def forward(self, batch: dict) -> torch.Tensor:
        x = self.tokens(batch)
        geometry = self.geometry(batch)
        for block in self.blocks:
            x = block(x, self.pe, geometry)
        target = self.head(self.norm(x[:, -self.position.shape[0] :]))
        return torch.sigmoid(unpatchify(target, self.patch, self.image_size))
