"""``rayrope``: projective ray positional encoding (RayRoPE, arXiv 2601.15275).

Every token (a patch of camera ``k``) is described, in the frame of each query camera ``c``, by

- ``p0``: the key camera's centre in camera ``c`` (3 coordinates; exactly 0 for ``c``'s own tokens);
- ``dir``: for each of the patch's ``R`` rays, the point at predicted depth ``delta`` projected by ``c`` as the
  unit vector of ``K_c X_c`` (first 2 components; bounded even behind the camera);
- ``depth``: that point's z-depth ``|Z_c|`` in camera ``c`` (clamped to 10).

``D_c = 3 + 3 R`` coordinates, each at ``F = head_dim / (2 D_c)`` frequencies ``(2 pi / T) base^n`` (periods 4,
8, 80 for p0, dir, depth; ``base = 3``), flattened frequency-major. Depth is uncertain: a per-layer head
predicts ``(l, s)`` per token and the depths ``exp(min(l -+ s, 3))`` bound a uniform distribution of the
angle, whose expected ``(cos, sin)`` is the damped rotation ``sinc(D/2) * exp(i (t1 + t2) / 2)`` (no
cancellation for small ``D``; it equals the reference's ``(sin t2 - sin t1) / D`` form). Known depths (RGB-D)
make both hypotheses equal: an exact rotation.

Attention runs once per query camera: the camera's queries are rotated by their own encoding, all keys and
values by their encoding in that camera's frame, and the output back by the query encoding (values and
output only with ``apply_vo``). Query and key sides may have different cameras, counts and grids
(cross-attention); tokens are camera-major, row-major inside an image, with nothing else in the sequence.

Numerics: geometry and angles in fp32 (fp64 for fp64 geometry) with autocast off; q, k, v are rotated by the
mmpos rotary operator in their own dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._validation import as_int_tuple, check_choice, check_positive_int
from ..camera.models import check_intrinsic_matrix, normalized_intrinsics
from ..camera.poses import check_pose, invert_pose
from ..camera.rays import patch_pixels
from ..ops.rotation import rotate
from ..ops.tables import RotaryTable
from .base import Capabilities, CameraPE
from .registry import register_pe

RAY_OFFSETS = {1: ((0.5, 0.5),), 2: ((0.0, 0.0), (1.0, 1.0)), 3: ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0))}
PERIODS = {"p0": 4.0, "dir": 8.0, "depth": 80.0}
DEPTH_CLAMP = 10.0  # query-frame depth coordinate clamp
DEPTH_RANGE = (1e-2, 100.0)
MAX_LOG_DEPTH = 3.0


@dataclass(eq=False)
class RaySide:
    """Geometry of the cameras on one side of the attention (``C`` cameras, ``P`` patches, ``R`` rays each).

    w2c ``[B, C, 4, 4]``; k_norm ``[B, C, 3, 3]`` (normalised intrinsics); centers ``[B, C, 3]`` (world);
    ray_steps ``[B, C, P, R, 3]``: world displacement per unit of z-depth along each ray; own_dirs ``[P, R, 2]``:
    each ray's direction code in its own camera (``normalize(u, v, 1)[:2]``, independent of depth and K).
    """

    w2c: torch.Tensor
    k_norm: torch.Tensor
    centers: torch.Tensor
    ray_steps: torch.Tensor
    own_dirs: torch.Tensor

    @property
    def num_cameras(self) -> int:
        return self.w2c.shape[1]

    @property
    def patches(self) -> int:
        return self.ray_steps.shape[2]

    @property
    def num_tokens(self) -> int:
        return self.num_cameras * self.patches


class RayDepthHead(nn.Linear):
    """Per-layer depth head ``Linear(dim, 2)`` -> raw ``(log_depth, sigma)`` per token, shared by the heads.

    Initialised as the reference: zero weights and bias ``(init_depth, init_sigma) = (0, 3)``, so every token
    starts with depths ``[e^-3, e^3]``. Tip: exclude it from weight decay, which would pull the bias to 0.
    """

    def __init__(self, dim: int, init_depth: float = 0.0, init_sigma: float = 3.0):
        super().__init__(dim, 2)
        nn.init.zeros_(self.weight)
        with torch.no_grad():
            self.bias.copy_(torch.tensor([init_depth, init_sigma]))


@register_pe("rayrope")
class RayRoPE(CameraPE):
    """RayRoPE attention encoding (default ``d_pj+0_3d`` point types of the reference).

    Args:
        head_dim: channels per head, a multiple of ``2 * D_c`` with ``D_c = 3 + 3 * num_rays`` (24 for 3 rays).
        num_rays: rays per patch: 3 (corners, default), 2 (diagonal corners) or 1 (centre).
        freq_base: ratio of the frequency ladder (3).
        apply_vo: also rotate values and outputs (default True).
        layout: channel pairing, ``"half"`` (the reference's split layout) or ``"interleaved"``.
    """

    capabilities = Capabilities(needs_cameras=True, world_frame_invariant=True)
    example_options = dict(head_dim=24)

    def __init__(self, head_dim: int, num_rays: int = 3, freq_base: float = 3.0, apply_vo: bool = True,
                 layout: str = "half"):
        super().__init__()
        check_positive_int("head_dim", head_dim)
        check_choice("num_rays", num_rays, tuple(RAY_OFFSETS))
        check_choice("layout", layout, ("half", "interleaved"))
        num_coords = 3 + 3 * num_rays
        if head_dim % (2 * num_coords):
            raise ValueError(f"head_dim={head_dim} must be a multiple of 2 * D_c = {2 * num_coords} "
                             f"(D_c = 3 + 3 * num_rays coordinates, each rotating whole channel pairs)")
        if not freq_base > 0:
            raise ValueError(f"freq_base must be positive, got {freq_base}")
        self.head_dim, self.num_rays, self.freq_base = head_dim, num_rays, freq_base
        self.apply_vo, self.layout, self.num_coords = apply_vo, layout, num_coords
        self.num_freqs = head_dim // (2 * num_coords)
        self._frequencies: dict = {}  # (dtype, device) -> [F * D_c], see frequencies()

    # --- geometry -------------------------------------------------------------------------------------------
    def prepare(self, w2c: torch.Tensor, intrinsics: torch.Tensor, image_size: Sequence[float],
                grid_size: Sequence[int]) -> RaySide:
        """``w2c [B, C, 4, 4]``, pixel ``intrinsics [B, C, 3, 3]`` of ``image_size = (H, W)`` images cut into
        ``grid_size = (rows, cols)`` patches."""
        w2c = check_pose("w2c", w2c)
        if w2c.dim() != 4:
            raise ValueError(f"w2c must be [B, C, 4, 4], got {tuple(w2c.shape)}")
        check_intrinsic_matrix("intrinsics", intrinsics)
        if intrinsics.shape[:-2] != w2c.shape[:-2]:
            raise ValueError(f"intrinsics {tuple(intrinsics.shape)} must be [B, C, 3, 3] like w2c {tuple(w2c.shape)}")
        rows, cols = as_int_tuple("grid_size", grid_size)
        with torch.autocast(w2c.device.type, enabled=False):
            dtype, device = w2c.dtype, w2c.device
            pixels = torch.stack([patch_pixels((rows, cols), image_size, o, dtype, device)
                                  for o in RAY_OFFSETS[self.num_rays]], dim=1)  # [P, R, 2]
            homogeneous = torch.cat([pixels, torch.ones_like(pixels[..., :1])], -1)
            k_inv = torch.linalg.inv(intrinsics.to(dtype))  # [B, C, 3, 3]
            c2w = invert_pose(w2c)
            cam_steps = homogeneous @ k_inv[:, :, None].transpose(-1, -2)  # [B, C, P, R, 3], z = 1
            ray_steps = cam_steps @ c2w[:, :, None, :3, :3].transpose(-1, -2)
            height, width = (float(s) for s in image_size)
            image = torch.stack([pixels[..., 0] / width - 0.5, pixels[..., 1] / height - 0.5,
                                 torch.ones_like(pixels[..., 0])], -1)
            own_dirs = (image / image.norm(dim=-1, keepdim=True))[..., :2]
            return RaySide(w2c, normalized_intrinsics(intrinsics.to(dtype), image_size), c2w[..., :3, 3], ray_steps,
                           own_dirs)

    def depths(self, raw: torch.Tensor, side: RaySide, known: torch.Tensor | None = None):
        """Depth hypotheses ``(d1, d2)`` ``[B, L, R]`` from the depth head's raw ``(l, s)`` ``[B, L, 2]``.

        ``known [B, L_known, R]`` (e.g. :func:`sample_ray_depths`) replaces both for the first ``L_known``
        tokens (RGB-D context views). ``raw=None`` with ``known`` covering every token is allowed.
        """
        batch, length = side.w2c.shape[0], side.num_tokens
        dtype, device = side.w2c.dtype, side.w2c.device
        if raw is None:
            if known is None or known.shape[1] != length:
                raise ValueError(f"raw depth predictions [B, {length}, 2] are required unless known depths cover "
                                 "every token")
            d1 = d2 = torch.empty(batch, 0, self.num_rays, dtype=dtype, device=device)
        else:
            if raw.dim() != 3 or raw.shape[1:] != (length, 2):
                raise ValueError(f"raw depth predictions must be [B, {length}, 2] (log_depth, sigma), got "
                                 f"{tuple(raw.shape)}")
            with torch.autocast(device.type, enabled=False):
                log_depth, sigma = raw.to(device, dtype).unbind(-1)
                d1 = (log_depth - sigma).clamp(max=MAX_LOG_DEPTH).exp()[..., None].expand(-1, -1, self.num_rays)
                d2 = (log_depth + sigma).clamp(max=MAX_LOG_DEPTH).exp()[..., None].expand(-1, -1, self.num_rays)
        if known is not None:
            if known.dim() != 3 or known.shape[-1] != self.num_rays or known.shape[1] > length:
                raise ValueError(f"known depths must be [B, L_known <= {length}, R={self.num_rays}], got "
                                 f"{tuple(known.shape)}")
            known = known.to(device, dtype).expand(batch, -1, -1)
            n = known.shape[1]
            d1 = torch.cat([known, d1[:, n:]], 1)
            d2 = torch.cat([known, d2[:, n:]], 1)
        return d1.clamp(*DEPTH_RANGE), d2.clamp(*DEPTH_RANGE)

    def query_coordinates(self, side: RaySide, depth: torch.Tensor) -> torch.Tensor:
        """``[B, L, D_c]`` coordinates of each token in its own camera: ``(0, 0, 0, own dirs, depth)``."""
        batch = side.w2c.shape[0]
        dirs = side.own_dirs.flatten(-2).to(depth).expand(batch, side.num_cameras, -1, -1).flatten(1, 2)
        origin = torch.zeros(*dirs.shape[:-1], 3, dtype=dirs.dtype, device=dirs.device)
        return torch.cat([origin, dirs, depth.clamp(max=DEPTH_CLAMP)], -1)

    def key_coordinates(self, frame: RaySide, camera: int, side: RaySide, depth: torch.Tensor) -> torch.Tensor:
        """``[B, L, D_c]`` coordinates of ``side``'s tokens (at ``depth [B, L, R]``) in camera ``camera`` of
        ``frame``."""
        with torch.autocast(side.w2c.device.type, enabled=False):
            w2c = frame.w2c[:, camera]  # [B, 4, 4]
            rotation = w2c[:, None, :3, :3]  # [B, 1, 3, 3]
            center = (rotation @ side.centers[..., None])[..., 0] + w2c[:, None, :3, 3]  # [B, C, 3]
            steps = side.ray_steps @ rotation[:, :, None].transpose(-1, -2)  # [B, C, P, R, 3]
            points = center[:, :, None, None] + depth.unflatten(1, (side.num_cameras, side.patches))[..., None] * steps
            projected = points @ frame.k_norm[:, camera, None, None].transpose(-1, -2)
            dirs = projected / projected.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            z = points[..., 2].abs().clamp(max=DEPTH_CLAMP)
            p0 = center[:, :, None].expand(-1, -1, side.patches, -1)
            coords = torch.cat([p0, dirs[..., :2].flatten(-2), z], -1)  # [B, C, P, D_c]
        return coords.flatten(1, 2)

    def frequencies(self, dtype=torch.float32, device=None) -> torch.Tensor:
        """``[F * D_c]`` radians per unit of each flattened angle (frequency-major, coordinate-minor); built in
        fp64 once per (dtype, device) and cached (no host-to-device copy per call)."""
        key = (dtype, torch.device(device) if device is not None else torch.device("cpu"))
        if key not in self._frequencies:
            period = torch.tensor([PERIODS["p0"]] * 3 + [PERIODS["dir"]] * (2 * self.num_rays)
                                  + [PERIODS["depth"]] * self.num_rays, dtype=torch.float64)
            ladder = self.freq_base ** torch.arange(self.num_freqs, dtype=torch.float64)
            omega = (2 * math.pi / period)[None, :] * ladder[:, None]
            self._frequencies[key] = omega.flatten().to(key[1], dtype)
        return self._frequencies[key]

    def expected_table(self, coords1: torch.Tensor, coords2: torch.Tensor) -> RotaryTable:
        """Expected rotation ``E[exp(i theta)]`` for ``theta`` uniform between the angles of two coordinate
        hypotheses ``[B, L, D_c]``: ``sinc(D / 2) exp(i (t1 + t2) / 2)``, ``[B, 1, L, F * D_c]``."""
        with torch.autocast(coords1.device.type, enabled=False):
            omega = self.frequencies(coords1.dtype, coords1.device)
            theta1 = coords1.repeat(1, 1, self.num_freqs) * omega
            theta2 = coords2.repeat(1, 1, self.num_freqs) * omega
            mean, spread = (theta1 + theta2) / 2, theta2 - theta1
            damping = torch.sinc(spread / (2 * math.pi))  # torch.sinc(x) = sin(pi x) / (pi x)
            cis = torch.complex(damping * mean.cos(), damping * mean.sin())
        return RotaryTable(cis[:, None])

    # --- attention ------------------------------------------------------------------------------------------
    def attention(self, q, k, v, query: RaySide, key: RaySide | None = None, depth_q: torch.Tensor | None = None,
                  depth_k: torch.Tensor | None = None, known_depth_q: torch.Tensor | None = None,
                  known_depth_k: torch.Tensor | None = None, attn_mask=None, scale: float | None = None):
        """Attention of ``q [B, H, Lq, D]`` to ``k, v [B, H, Lk, D]`` with RayRoPE.

        ``key`` defaults to ``query`` (self-attention; then ``depth_k`` defaults to ``depth_q``). ``depth_q/k``:
        raw depth-head outputs ``[B, L, 2]`` of the query and key inputs (for cross-attention the key side's
        comes from the key input). ``attn_mask``: ``[.., Lq, Lk]`` bool (True attends) or additive.
        """
        plan = self._plan(q, k, v, query, key, depth_q, depth_k, known_depth_q, known_depth_k)
        key, q_table, key_depths = plan
        outputs = []
        for camera in range(query.num_cameras):
            rows = slice(camera * query.patches, (camera + 1) * query.patches)
            k_table = self._key_table(query, camera, key, key_depths)
            q_c = rotate(q[..., rows, :], RotaryTable(q_table.cis[..., rows, :]), self.layout)
            k_c = rotate(k, k_table, self.layout)
            v_c = rotate(v, k_table, self.layout) if self.apply_vo else v
            mask = None if attn_mask is None else attn_mask[..., rows, :]
            outputs.append(F.scaled_dot_product_attention(q_c, k_c, v_c, attn_mask=mask, scale=scale))
        out = torch.cat(outputs, dim=-2)
        return rotate(out, RotaryTable(q_table.cis.conj()), self.layout) if self.apply_vo else out

    def logits(self, q, k, query: RaySide, key: RaySide | None = None, depth_q=None, depth_k=None,
               known_depth_q=None, known_depth_k=None) -> torch.Tensor:
        """``[B, H, Lq, Lk]`` encoded dot products (unscaled), for tests and plots."""
        key, q_table, key_depths = self._plan(q, k, None, query, key, depth_q, depth_k, known_depth_q, known_depth_k)
        blocks = []
        for camera in range(query.num_cameras):
            rows = slice(camera * query.patches, (camera + 1) * query.patches)
            q_c = rotate(q[..., rows, :], RotaryTable(q_table.cis[..., rows, :]), self.layout)
            k_c = rotate(k, self._key_table(query, camera, key, key_depths), self.layout)
            blocks.append(q_c @ k_c.transpose(-1, -2))
        return torch.cat(blocks, dim=-2)

    def _plan(self, q, k, v, query, key, depth_q, depth_k, known_depth_q, known_depth_k):
        self_attention = key is None
        key = query if key is None else key
        for name, x, side in (("q", q, query), ("k", k, key), ("v", v, key)):
            if x is None:
                continue
            if x.dim() != 4 or x.shape[-1] != self.head_dim or x.shape[-2] != side.num_tokens:
                raise ValueError(f"{name} must be [B, H, {side.num_tokens}, {self.head_dim}] "
                                 f"({side.num_cameras} cameras x {side.patches} patches), got {tuple(x.shape)}")
        if self_attention and depth_k is None and known_depth_k is None:
            depth_k, known_depth_k = depth_q, known_depth_q
        q_depths = self.depths(depth_q, query, known_depth_q)
        key_depths = self.depths(depth_k, key, known_depth_k)
        q_table = self.expected_table(*(self.query_coordinates(query, d) for d in q_depths))
        return key, q_table, key_depths

    def _key_table(self, frame: RaySide, camera: int, side: RaySide, depths) -> RotaryTable:
        return self.expected_table(*(self.key_coordinates(frame, camera, side, d) for d in depths))

    def extra_repr(self):
        return (f"head_dim={self.head_dim}, num_rays={self.num_rays}, num_coords={self.num_coords}, "
                f"num_freqs={self.num_freqs}, freq_base={self.freq_base}, apply_vo={self.apply_vo}")


def sample_ray_depths(depth_maps: torch.Tensor, grid_size: Sequence[int], num_rays: int = 3) -> torch.Tensor:
    """Known z-depths at each patch's ray points: ``depth_maps [B, C, H, W]`` -> ``[B, C * P, R]``.

    Nearest pixel containing the ray point (corners sit on pixel boundaries and take the pixel right/below),
    clamped to the image border.
    """
    if depth_maps.dim() != 4:
        raise ValueError(f"depth_maps must be [B, C, H, W], got {tuple(depth_maps.shape)}")
    check_choice("num_rays", num_rays, tuple(RAY_OFFSETS))
    height, width = depth_maps.shape[-2:]
    pixels = torch.stack([patch_pixels(grid_size, (height, width), o, torch.float64, depth_maps.device)
                          for o in RAY_OFFSETS[num_rays]], dim=1)  # [P, R, 2]
    col = pixels[..., 0].floor().long().clamp(0, width - 1)
    row = pixels[..., 1].floor().long().clamp(0, height - 1)
    return depth_maps[:, :, row, col].flatten(1, 2)
