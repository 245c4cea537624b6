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

Attention runs once per query camera: the camera's queries are rotated by minus their own encoding, all keys
and values by minus their encoding in that camera's frame, and the output by plus the query encoding (values
and output only with ``apply_vo``): the reference's sign, ``rot-(x) = [x1 c + x2 s, -x1 s + x2 c]`` on q, k, v
and ``rot+`` on the output, so weights trained with the reference load unchanged. Query and key sides may have different cameras, counts and grids
(cross-attention); tokens are camera-major, row-major inside an image, with nothing else in the sequence.

Numerics: geometry and angles in fp32 (fp64 for fp64 geometry) with autocast off; q, k, v are rotated by the
mmpos rotary operator in their own dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.types import Device

from .._validation import check_choice, check_not_meta, check_positive_int
from ..camera.cameras import Cameras
from ..ops.rotation import rotate
from ..ops.tables import RotaryTable
from .base import CameraPE, Capabilities
from .rayrope_rays import RAY_OFFSETS, RayDepthHead, RaySide, depth_hypotheses, ray_side, sample_ray_depths
from .registry import register_pe

__all__ = ["RayRoPE", "RayDepthHead", "RaySide", "sample_ray_depths"]

PERIODS = {"p0": 4.0, "dir": 8.0, "depth": 80.0}
DEPTH_CLAMP = 10.0  # query-frame depth coordinate clamp


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

    description = "RayRoPE: rays at predicted depth in each query camera's frame, rotated in expectation over depth."

    capabilities = Capabilities(needs_cameras=True, world_frame_invariant=True, predicts_depth=True)
    example_options = dict(head_dim=24)

    def __init__(
        self, head_dim: int, num_rays: int = 3, freq_base: float = 3.0, apply_vo: bool = True, layout: str = "half"
    ):
        super().__init__()
        check_positive_int("head_dim", head_dim)
        check_choice("num_rays", num_rays, tuple(RAY_OFFSETS))
        check_choice("layout", layout, ("half", "interleaved"))
        num_coords = 3 + 3 * num_rays
        if head_dim % (2 * num_coords):
            raise ValueError(
                f"head_dim={head_dim} must be a multiple of 2 * D_c = {2 * num_coords} "
                f"(D_c = 3 + 3 * num_rays coordinates, each rotating whole channel pairs)"
            )
        if not freq_base > 0:
            raise ValueError(f"freq_base must be positive, got {freq_base}")
        self.head_dim, self.num_rays, self.freq_base = head_dim, num_rays, freq_base
        self.apply_vo, self.layout, self.num_coords = apply_vo, layout, num_coords
        self.num_freqs = head_dim // (2 * num_coords)
        self._frequencies: dict = {}  # (dtype, device) -> [F * D_c], see frequencies()

    # --- geometry -------------------------------------------------------------------------------------------
    def _prepare(self, cameras: Cameras) -> RaySide:
        """``prepare(cameras)``: ``cameras.w2c``, pixel ``cameras.intrinsics`` of ``cameras.image_size`` images cut
        into ``cameras.grid`` patches (:func:`~.rayrope_rays.ray_side`); ``cameras.depth`` maps, when given, are
        read at the ray points as known depths (:func:`~.rayrope_rays.sample_ray_depths`)."""
        if cameras.intrinsics is None or cameras.image_size is None:
            raise ValueError(
                "cameras: rayrope needs pixel intrinsics (cameras.intrinsics); this camera model has "
                "none (an equirectangular camera?)"
            )
        side = ray_side(cameras.w2c, cameras.intrinsics, cameras.image_size, cameras.grid, self.num_rays)
        if cameras.depth is not None:
            side.known_depth = sample_ray_depths(cameras.depth, cameras.grid, self.num_rays)
        return side

    @classmethod
    def depth_head(cls, dim: int) -> RayDepthHead:
        """The per-layer depth head (:class:`~.rayrope_rays.RayDepthHead`) whose output is ``depth_q``."""
        return RayDepthHead(dim)

    def depths(
        self,
        raw: torch.Tensor | None,
        side: RaySide,
        known: torch.Tensor | None = None,
        names: tuple[str, str] = ("raw", "known"),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Depth hypotheses ``(d1, d2)`` ``[B, L, R]`` (:func:`~.rayrope_rays.depth_hypotheses`)."""
        return depth_hypotheses(raw, side, self.num_rays, known, names)

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

    def frequencies(self, dtype: torch.dtype = torch.float32, device: Device = None) -> torch.Tensor:
        """``[F * D_c]`` radians per unit of each flattened angle (frequency-major, coordinate-minor); built in
        fp64 once per (dtype, device) and cached (no host-to-device copy per call)."""
        key = (dtype, torch.device(device) if device is not None else torch.device("cpu"))
        if key not in self._frequencies:
            period = torch.tensor(
                [PERIODS["p0"]] * 3 + [PERIODS["dir"]] * (2 * self.num_rays) + [PERIODS["depth"]] * self.num_rays,
                dtype=torch.float64,
            )
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
    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        query: RaySide,
        key: RaySide | None = None,
        attn_mask: torch.Tensor | None = None,
        scale: float | None = None,
        *,
        depth_q: torch.Tensor | None = None,
        depth_k: torch.Tensor | None = None,
        known_depth_q: torch.Tensor | None = None,
        known_depth_k: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of ``q [B, H, Lq, D]`` to ``k, v [B, H, Lk, D]`` with RayRoPE.

        ``key`` defaults to ``query`` (self-attention; then ``depth_k`` defaults to ``depth_q``). ``depth_q/k``:
        raw depth-head outputs ``[B, L, 2]`` of the query and key inputs (for cross-attention the key side's
        comes from the key input). ``known_depth_q/k`` default to the sides' ``known_depth`` (``Cameras.depth``).
        ``attn_mask``: ``[.., Lq, Lk]`` bool (True attends) or additive.
        """
        plan = self._plan(q, k, v, query, key, depth_q, depth_k, known_depth_q, known_depth_k)
        key, q_table, key_depths = plan
        outputs = []
        for camera in range(query.num_cameras):
            rows = slice(camera * query.patches, (camera + 1) * query.patches)
            k_table = self._key_table(query, camera, key, key_depths).conj()  # rot-: q, k, v by -theta
            q_c = rotate(q[..., rows, :], RotaryTable(q_table.cis[..., rows, :]).conj(), self.layout)
            k_c = rotate(k, k_table, self.layout)
            v_c = rotate(v, k_table, self.layout) if self.apply_vo else v
            mask = None if attn_mask is None else attn_mask[..., rows, :]
            outputs.append(F.scaled_dot_product_attention(q_c, k_c, v_c, attn_mask=mask, scale=scale))
        out = torch.cat(outputs, dim=-2)
        return rotate(out, q_table, self.layout) if self.apply_vo else out  # rot+: output by +theta

    def logits(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        query: RaySide,
        key: RaySide | None = None,
        *,
        depth_q: torch.Tensor | None = None,
        depth_k: torch.Tensor | None = None,
        known_depth_q: torch.Tensor | None = None,
        known_depth_k: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, H, Lq, Lk]`` encoded dot products (unscaled), for tests and plots."""
        key, q_table, key_depths = self._plan(q, k, None, query, key, depth_q, depth_k, known_depth_q, known_depth_k)
        blocks = []
        for camera in range(query.num_cameras):
            rows = slice(camera * query.patches, (camera + 1) * query.patches)
            q_c = rotate(q[..., rows, :], RotaryTable(q_table.cis[..., rows, :]).conj(), self.layout)
            k_c = rotate(k, self._key_table(query, camera, key, key_depths).conj(), self.layout)
            blocks.append(q_c @ k_c.transpose(-1, -2))
        return torch.cat(blocks, dim=-2)

    def _plan(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor | None,
        query: RaySide,
        key: RaySide | None,
        depth_q: torch.Tensor | None,
        depth_k: torch.Tensor | None,
        known_depth_q: torch.Tensor | None,
        known_depth_k: torch.Tensor | None,
    ) -> tuple[RaySide, RotaryTable, tuple[torch.Tensor, torch.Tensor]]:
        """``(key side, query table, key depth hypotheses)`` after checking q, k, v against the sides."""
        self_attention = key is None
        key = query if key is None else key
        known_depth_q = query.known_depth if known_depth_q is None else known_depth_q
        if not self_attention and known_depth_k is None:
            known_depth_k = key.known_depth
        for name, x, side in (("q", q, query), ("k", k, key), ("v", v, key)):
            if x is None:
                continue
            check_not_meta(name, x)
            if x.dim() != 4 or x.shape[-1] != self.head_dim or x.shape[-2] != side.num_tokens:
                raise ValueError(
                    f"{name} must be [B, H, {side.num_tokens}, {self.head_dim}] "
                    f"({side.num_cameras} cameras x {side.patches} patches), got {tuple(x.shape)}"
                )
        if self_attention and depth_k is None and known_depth_k is None:
            depth_k, known_depth_k = depth_q, known_depth_q
        q_depths = self.depths(depth_q, query, known_depth_q, ("depth_q", "known_depth_q"))
        key_depths = self.depths(depth_k, key, known_depth_k, ("depth_k", "known_depth_k"))
        q_table = self.expected_table(*(self.query_coordinates(query, d) for d in q_depths))
        return key, q_table, key_depths

    def _key_table(
        self, frame: RaySide, camera: int, side: RaySide, depths: tuple[torch.Tensor, torch.Tensor]
    ) -> RotaryTable:
        return self.expected_table(*(self.key_coordinates(frame, camera, side, d) for d in depths))

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_rays={self.num_rays}, num_coords={self.num_coords}, "
            f"num_freqs={self.num_freqs}, freq_base={self.freq_base}, apply_vo={self.apply_vo}"
        )
