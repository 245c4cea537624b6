"""``ucpe``: Unified Camera Positional Encoding (Zhang et al., CVPR 2026, arXiv 2512.07237).

Relative ray encoding: every token carries the world-to-ray frame of its own ray (from any camera model:
pinhole, distorted, fisheye, unified, panorama; :func:`mmpos.camera.ray_frames`) as the 4x4 transform on half
of each head, and 2D RoPE (base 100) of its patch (column, row) on the rest
(:mod:`mmpos.encodings.projective_base`). Logits depend on ray-to-ray transforms ``T_q T_k^-1`` only.

Absolute orientation: the latitude/up map (:func:`mmpos.camera.latitude_up_map`) is embedded by a linear
layer and added to the adapter's input. Both live in :class:`UCPEAdapter`, a zero-initialised attention
branch run in parallel with a frozen host attention (:class:`ParallelAdapter`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from .._validation import as_int_tuple, check_positive_int
from ..camera.base import CameraModel
from ..camera.cameras import Cameras
from ..camera.poses import check_pose, invert_pose
from ..camera.ray_frames import latitude_up_map, ray_frames
from .projective_base import CameraTransforms, ProjectiveRoPE
from .registry import register_pe


@register_pe("ucpe")
class UCPE(ProjectiveRoPE):
    """UCPE's relative ray encoding of q, k, v and the output (arguments as :class:`PRoPE`).

    ``prepare(cameras)`` reads ``cameras.c2w``, ``cameras.rays`` (any camera model), ``cameras.valid`` and
    ``cameras.grid``. Tokens whose ray is invalid or whose frame is degenerate are masked out as keys.
    """

    capabilities = dataclasses.replace(ProjectiveRoPE.capabilities, adapter=True)
    description = "UCPE: relative ray frames from any camera model on q, k, v and the output, plus 2D RoPE."

    def __init__(
        self,
        head_dim: int,
        projective_dim: int | None = None,
        rope_theta: float = 100.0,
        layout: str = "half",
        apply_vo: bool = True,
    ):
        super().__init__(head_dim, projective_dim, rope_theta, layout, apply_vo)

    def _prepare(self, cameras: Cameras) -> CameraTransforms:
        if cameras.rays is None:
            raise ValueError("cameras: ucpe needs the patches' rays (cameras.rays; e.g. Cameras.from_models)")
        return self._prepare_tensors(cameras.c2w, cameras.rays, cameras.grid, cameras.valid)

    @classmethod
    def adapter_layer(
        cls,
        dim: int,
        num_heads: int,
        head_dim: int,
        use_orientation: bool = True,
        rope_theta: float = 100.0,
        qkv_bias: bool = True,
    ) -> UCPEAdapter:
        """UCPE's zero-initialised parallel attention branch (:class:`UCPEAdapter`)."""
        return UCPEAdapter(
            dim, num_heads, head_dim, use_orientation=use_orientation, qkv_bias=qkv_bias, rope_theta=rope_theta
        )

    def _prepare_tensors(
        self, c2w: torch.Tensor, rays_cam: torch.Tensor, grid_size: Sequence[int], valid: torch.Tensor | None = None
    ) -> CameraTransforms:
        """The geometry of ``C`` cameras (or video frames) with ``P = rows * cols`` patches each, from tensors
        (what ``prepare(cameras)`` reads off the :class:`~mmpos.camera.Cameras`).

        Args:
            c2w: ``[B, C, 4, 4]`` camera-to-world (OpenCV axes), float32/float64.
            rays_cam: ``[P, 3]``, ``[C, P, 3]`` or ``[B, C, P, 3]`` unit camera-frame rays of the patches, e.g.
                ``mmpos.camera.ray_grid(camera, grid_size)`` for any camera model.
            grid_size: ``(rows, cols)``.
            valid: rays' validity, broadcastable to ``[B, C, P]`` (e.g. outside a fisheye's image circle).
        Tokens whose ray is invalid or whose frame is degenerate are masked out as keys.
        """
        c2w = check_pose("c2w", c2w)
        if c2w.dim() != 4:
            raise ValueError(f"c2w must be [B, C, 4, 4], got {tuple(c2w.shape)}")
        rows, cols = as_int_tuple("grid_size", grid_size)
        batch, cameras = c2w.shape[:2]
        if rays_cam.shape[-1] != 3 or rays_cam.shape[-2] != rows * cols or rays_cam.dim() > 4:
            raise ValueError(
                f"rays_cam must be [P, 3], [C, P, 3] or [B, C, P, 3] with P = rows * cols = "
                f"{rows * cols}, got {tuple(rays_cam.shape)}"
            )
        rays = rays_cam.expand(batch, cameras, rows * cols, 3)
        if valid is not None:
            valid = valid.expand(batch, cameras, rows * cols)
        w2l, ok = ray_frames(rays, c2w, valid)  # [B, C, P, 4, 4]
        w2l = w2l.flatten(1, 2)
        table = self.rope_table((rows, cols), cameras, c2w.dtype, c2w.device)
        return CameraTransforms(w2l, invert_pose(w2l), table, ok.flatten(1, 2))


class UCPEAdapter(nn.Module):
    """Zero-initialised camera attention branch: ``residual = out_proj(attention(x + cam_encoder(latup)))``.

    Shapes: ``x [B, L, dim]``, ``L = C * rows * cols`` (frame-major). ``num_heads`` and ``head_dim`` are explicit
    (the reference derives them by integer division, which can leave one oversized head). ``out_proj`` starts
    at zero (weight and bias), so the branch outputs exact zeros until trained. Query tokens whose ray is
    invalid get a zero residual; invalid keys are masked out.

    Args:
        dim: model width; num_heads, head_dim: of the adapter attention (``num_heads * head_dim`` inner width).
        use_orientation: add ``Linear(3, dim)`` of the latitude/up map to the adapter input.
        qkv_bias: biases of the q, k, v projections. Other options as :class:`UCPE`.
        encoding: the relative encoding of the branch (default ``UCPE(head_dim, projective_dim, rope_theta)``;
            a :class:`~.prope.PRoPE` for the PRoPE baseline of the same adapter).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        head_dim: int,
        use_orientation: bool = True,
        qkv_bias: bool = True,
        rope_theta: float = 100.0,
        projective_dim: int | None = None,
        encoding: ProjectiveRoPE | None = None,
    ):
        super().__init__()
        for name, value in (("dim", dim), ("num_heads", num_heads), ("head_dim", head_dim)):
            check_positive_int(name, value)
        inner = num_heads * head_dim
        self.dim, self.num_heads, self.head_dim = dim, num_heads, head_dim
        self.encoding = UCPE(head_dim, projective_dim, rope_theta) if encoding is None else encoding
        if self.encoding.head_dim != head_dim:
            raise ValueError(f"encoding has head_dim={self.encoding.head_dim}; the adapter's head_dim is {head_dim}")
        self.to_q = nn.Linear(dim, inner, bias=qkv_bias)
        self.to_k = nn.Linear(dim, inner, bias=qkv_bias)
        self.to_v = nn.Linear(dim, inner, bias=qkv_bias)
        self.out_proj = nn.Linear(inner, dim)
        nn.init.zeros_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)
        self.cam_encoder = nn.Linear(3, dim) if use_orientation else None

    def prepare(self, cameras: Cameras) -> CameraTransforms:
        """``prepare(cameras)``: the branch encoding's geometry (``ParallelAdapter.set_camera``'s ``camera``)."""
        return self.encoding.prepare(cameras)

    # --- the per-layer adapter protocol of mmpos.integrations.diffusers.CameraAdapter --------------------------
    def condition(self, cameras: Cameras) -> BranchCondition:
        """What every layer reads for one call: the geometry and (with ``use_orientation``) the latitude/up map."""
        orientation = None
        if self.cam_encoder is not None:
            if cameras.orientation is None:
                raise ValueError(
                    "cameras: this adapter adds the latitude/up map; build the cameras with an "
                    "orientation (Cameras.from_models, video_cameras)"
                )
            orientation = cameras.orientation
        return BranchCondition(self.encoding.prepare(cameras), orientation)

    def input_delta(self, x: torch.Tensor, condition: BranchCondition) -> None:
        """Nothing is added to the host attention's input (the branch runs beside it)."""
        return None

    def residual(self, x: torch.Tensor, condition: BranchCondition) -> torch.Tensor:
        """The branch output ``[B, L, dim]``, added to the host attention's output."""
        return self(x, condition.geometry, condition.orientation)

    @staticmethod
    def orientation_map(
        camera: CameraModel,
        c2w: torch.Tensor,
        grid_size: Sequence[int],
        offset: Sequence[float] = (0.5, 0.5),
        world_up: Sequence[float] = (0.0, -1.0, 0.0),
    ) -> torch.Tensor:
        """``[B, C * P, 3]`` latitude/up map of ``c2w [B, C, 4, 4]`` seen through ``camera`` (any model); the
        ``orientation`` input of :meth:`forward` (0 where undefined); ``offset`` as the rays' (patch centre)."""
        values, _ = latitude_up_map(camera, check_pose("c2w", c2w), grid_size, offset, world_up)
        return values.flatten(1, 2)

    def forward(self, x: torch.Tensor, geo: CameraTransforms, orientation: torch.Tensor | None = None) -> torch.Tensor:
        """The branch output ``[B, L, dim]`` of tokens ``x [B, L, dim]`` (zero for queries with an invalid ray)."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [B, L, {self.dim}], got {tuple(x.shape)}")
        if self.cam_encoder is not None:
            if orientation is None:
                raise ValueError("orientation [B, L, 3] (latitude/up map) is required when use_orientation=True")
            x = x + self.cam_encoder(orientation.to(x.dtype))
        b, length, _ = x.shape
        q, k, v = (
            proj(x).view(b, length, self.num_heads, self.head_dim).transpose(1, 2)
            for proj in (self.to_q, self.to_k, self.to_v)
        )
        out = self.encoding.attention(q, k, v, geo)
        out = out.transpose(1, 2).reshape(b, length, self.num_heads * self.head_dim)
        out = self.out_proj(out)
        if geo.valid is not None:
            out = out * geo.valid[..., None].to(out.dtype)
        return out


@dataclass(eq=False)
class BranchCondition:
    """One call's input of every :class:`UCPEAdapter` layer: ``geometry`` and ``orientation [B, L, 3]`` or None."""

    geometry: CameraTransforms
    orientation: torch.Tensor | None = None


class ParallelAdapter(nn.Module):
    """``host(x, ...) + adapter(x, geo, orientation)``: UCPE's "parallel" placement around a frozen attention.

    The camera comes from the call (``camera=``, ``orientation=``) or, so that a stock block that calls
    ``attn(x, ...)`` needs no change, from :meth:`set_camera` (set once per step; every layer can share the
    same geometry). Without a camera the host runs alone. With a zero-initialised adapter the sum equals the
    host's output bit for bit (adding exact zeros).
    """

    def __init__(self, host: nn.Module, adapter: UCPEAdapter):
        super().__init__()
        self.host, self.adapter = host, adapter
        self.camera: CameraTransforms | None = None
        self.orientation: torch.Tensor | None = None

    def set_camera(self, camera: CameraTransforms | None, orientation: torch.Tensor | None = None) -> None:
        self.camera, self.orientation = camera, orientation

    def forward(
        self,
        hidden_states: torch.Tensor,
        *args: Any,
        camera: CameraTransforms | None = None,
        orientation: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        """The host's output plus the adapter's residual (the host's alone without a camera)."""
        out = self.host(hidden_states, *args, **kwargs)
        if camera is None:
            camera, orientation = self.camera, self.orientation if orientation is None else orientation
        if camera is None:
            return out
        return out + self.adapter(hidden_states, camera, orientation)
