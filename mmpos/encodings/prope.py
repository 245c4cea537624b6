"""``prope``: Projective Positional Encoding ("Cameras as Relative Positional Encoding", Li et al. 2025).

Every token of camera ``c`` carries the camera's full projective frame ``P_c = diag(K_c, 1) @ w2c_c`` (``K``
normalised to image coordinates in ``[-1/2, 1/2]``) on half of each head; 2D RoPE (base 100) of the patch
(column, row) on the rest (see :mod:`mmpos.encodings.projective_base`). Without intrinsics it is GTA
(``P_c = w2c_c``, SE(3) only). With a single camera ``P_q P_k^-1 = I``: the logits are those of 2D RoPE on the
RoPE channels plus a plain dot product on the projective ones.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from .._validation import as_int_tuple
from ..camera.cameras import Cameras
from ..camera.models import check_intrinsic_matrix, normalized_intrinsics
from ..camera.poses import check_pose, invert_pose
from .projective_base import CameraTransforms, ProjectiveRoPE, lift_intrinsics
from .registry import register_pe
from .ucpe import UCPEAdapter


@register_pe("prope")
class PRoPE(ProjectiveRoPE):
    """Projective camera encoding of q, k, v and the output (PRoPE; GTA without intrinsics).

    Args:
        head_dim: channels per head (multiple of 8 for the default split).
        projective_dim: channels carrying the 4x4 camera transform (default ``head_dim // 2``).
        rope_theta: base of the 2D RoPE on the other channels (100 as in PRoPE).
        layout: pair layout of the RoPE channels (``"half"`` or ``"interleaved"``).
        apply_vo: also transform values and outputs (default True, as the paper).
        gta: poses only (GTA): ``prepare`` ignores the cameras' intrinsics (default False: they are required).

    ``prepare(cameras)`` reads ``cameras.w2c``, ``cameras.grid`` and (unless ``gta``) ``cameras.intrinsics`` of
    ``cameras.image_size`` images.
    """

    capabilities = dataclasses.replace(ProjectiveRoPE.capabilities, adapter=True)
    description = "PRoPE: projective camera frames on q, k, v and the output, 2D RoPE on the rest of each head."

    def __init__(
        self,
        head_dim: int,
        projective_dim: int | None = None,
        rope_theta: float = 100.0,
        layout: str = "half",
        apply_vo: bool = True,
        gta: bool = False,
    ):
        super().__init__(head_dim, projective_dim, rope_theta, layout, apply_vo)
        self.gta = bool(gta)

    def _prepare(self, cameras: Cameras) -> CameraTransforms:
        if self.gta:
            return self._prepare_tensors(cameras.w2c, cameras.grid)
        if cameras.intrinsics is None:
            raise ValueError(
                "cameras: prope needs pixel intrinsics (cameras.intrinsics); this camera model has none "
                "(an equirectangular camera, or an OpenCV camera with distortion, which a K alone would "
                "drop); PRoPE(..., gta=True) uses the poses alone"
            )
        return self._prepare_tensors(cameras.w2c, cameras.grid, cameras.intrinsics, cameras.image_size)

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
        """UCPE's adapter branch with PRoPE's per-camera frames (the PRoPE baseline; no orientation map)."""
        return UCPEAdapter(
            dim,
            num_heads,
            head_dim,
            use_orientation=False,
            qkv_bias=qkv_bias,
            rope_theta=rope_theta,
            encoding=cls(head_dim, rope_theta=rope_theta),
        )

    def _prepare_tensors(
        self,
        w2c: torch.Tensor,
        grid_size: Sequence[int],
        intrinsics: torch.Tensor | None = None,
        image_size: Sequence[float] | None = None,
    ) -> CameraTransforms:
        """``prepare(cameras)`` on its tensors: ``C`` cameras with ``rows x cols`` patches each (``L = C * rows
        * cols`` tokens).

        Args:
            w2c: ``[B, C, 4, 4]`` world-to-camera (OpenCV axes), float32/float64.
            grid_size: ``(rows, cols)`` patches per image.
            intrinsics: ``[B, C, 3, 3]`` pixel intrinsics, or ``None`` for GTA.
            image_size: ``(H, W)`` in pixels (required with intrinsics).
        """
        w2c = check_pose("w2c", w2c)
        if w2c.dim() != 4:
            raise ValueError(f"w2c must be [B, C, 4, 4], got {tuple(w2c.shape)}")
        rows, cols = as_int_tuple("grid_size", grid_size)
        with torch.autocast(w2c.device.type, enabled=False):
            matrices, inverse = w2c, invert_pose(w2c)
            if intrinsics is not None:
                if image_size is None:
                    raise ValueError("image_size (H, W) is required with intrinsics")
                check_intrinsic_matrix("intrinsics", intrinsics)
                if intrinsics.shape[:-2] != w2c.shape[:-2]:
                    raise ValueError(
                        f"intrinsics {tuple(intrinsics.shape)} must be [B, C, 3, 3] like w2c {tuple(w2c.shape)}"
                    )
                k_norm = normalized_intrinsics(intrinsics.to(w2c.dtype), image_size)
                matrices = lift_intrinsics(k_norm) @ w2c
                inverse = inverse @ lift_intrinsics(torch.linalg.inv(k_norm))
        table = self.rope_table((rows, cols), w2c.shape[1], w2c.dtype, w2c.device)
        return CameraTransforms(matrices, inverse, table)
