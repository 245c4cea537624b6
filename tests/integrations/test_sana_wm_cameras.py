"""mmpos' camera geometry against SANA-WM's own functions in diffusers, on the same cameras: UCPE's per-pixel
``ray <- world`` matrices (``_process_camera_conditions_ucpe``: unified-camera unprojection, ``world_to_ray_mats``),
its latitude / up map (``compute_up_lat_map``) and the Plücker raymaps of the pipeline (``compute_raymap``).

SANA-WM casts each latent pixel's ray at integer pixel coordinates (mmpos' ``offset=(0, 0)``, one patch a pixel),
with ``xi = 0`` (pinhole) and ``fx`` through a field-of-view round trip; the up map is projected at the image size
(``patch_size`` 1 here: the latent grid). Ray matrices and Plücker rays run in float64 on both sides; SANA-WM builds
the latitude / up map in float32 whatever the cameras' dtype, so that comparison is to float32 rounding, and its
Rodrigues rotation carries a spurious term (``k * (k * (v * 1).sum(-1))`` where ``k (k . v) = 0`` belongs): mmpos'
up map is the exact one and differs from SANA-WM's by that term only (measured below).
"""

import math

import pytest
import torch

from mmpos.camera import Cameras
from mmpos.camera.fisheye import UnifiedCamera
from mmpos.encodings.plucker import PluckerRays
from mmpos.encodings.ucpe import UCPE

sana_wm = pytest.importorskip("diffusers.models.transformers.transformer_sana_wm")
cam_utils = pytest.importorskip("diffusers.pipelines.sana_wm.cam_utils")

FRAMES, ROWS, COLS = 4, 6, 8
INTRINSICS = (7.0, 6.5, 3.7, 2.9)  # fx, fy, cx, cy in latent pixels (off-centre, unequal focal lengths)


def c2w_trajectory(frames=FRAMES):
    """``[1, T, 4, 4]`` float64 camera-to-world poses (OpenCV axes): a dolly along x and z with yaw, pitch and roll."""
    poses = []
    for t in range(frames):
        yaw, pitch, roll = 0.15 * t, -0.1 * t, 0.05 * t
        cy, sy, cp, sp, cr, sr = (
            math.cos(yaw),
            math.sin(yaw),
            math.cos(pitch),
            math.sin(pitch),
            math.cos(roll),
            math.sin(roll),
        )
        r_yaw = torch.tensor([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]], dtype=torch.float64)
        r_pitch = torch.tensor([[1, 0, 0], [0, cp, -sp], [0, sp, cp]], dtype=torch.float64)
        r_roll = torch.tensor([[cr, -sr, 0], [sr, cr, 0], [0, 0, 1]], dtype=torch.float64)
        pose = torch.eye(4, dtype=torch.float64)
        pose[:3, :3] = r_yaw @ r_pitch @ r_roll
        pose[:3, 3] = torch.tensor([0.3 * t, -0.05 * t, 0.2 * t], dtype=torch.float64)
        poses.append(pose)
    return torch.stack(poses)[None]


def sana_camera_conditions(c2w):
    """SANA-WM's ``(B, T, 20)`` camera conditions: the flattened pose, then ``(fx, fy, cx, cy)``."""
    intrinsics = torch.tensor(INTRINSICS, dtype=c2w.dtype).expand(1, c2w.shape[1], 4)
    return torch.cat([c2w.reshape(1, c2w.shape[1], 16), intrinsics], dim=-1)


def mmpos_cameras(c2w):
    fx, fy, cx, cy = INTRINSICS
    camera = UnifiedCamera(fx, fy, cx, cy, COLS, ROWS, xi=0.0)
    return Cameras.from_models(camera, (ROWS, COLS), c2w=c2w, offset=(0.0, 0.0), dtype=torch.float64)


def test_ucpe_ray_matrices_equal_sana_wm_in_float64():
    c2w = c2w_trajectory()
    raymats, _ = sana_wm._process_camera_conditions_ucpe(
        sana_camera_conditions(c2w), 1, (FRAMES, ROWS, COLS), (1, 1, 1)
    )
    assert raymats.dtype == torch.float64 and raymats.shape == (1, FRAMES, ROWS, COLS, 4, 4)
    transforms = UCPE(head_dim=16).prepare(mmpos_cameras(c2w))
    ours = transforms.matrices.reshape(1, FRAMES, ROWS, COLS, 4, 4)
    assert (ours - raymats).abs().max() < 1e-12
    sana_inverse = sana_wm._invert_SE3(raymats.reshape(1, -1, 4, 4))  # the P^-1 SANA-WM applies to k and v
    assert (transforms.inverse - sana_inverse).abs().max() < 1e-12
    assert bool(transforms.valid.all())


def up_map_reference(c2w, sana_term: bool):
    """float64 ``(up_x, up_y, latitude)`` ``[1, T, H, W, 3]`` written from the maths: each pixel's world ray ``v`` turned
    by 0.1 rad towards world up ``(0, -1, 0)`` (``v cos + t sin``, ``t`` the unit tangent towards up), projected back
    with the pinhole, the shift from the pixel normalised. ``sana_term``: plus the third term SANA-WM's Rodrigues
    formula adds, ``k * (k * sum(v)) * (1 - cos)`` (``(v * 1).sum(-1)``, the sum of ``v``'s components, where
    ``k . v = 0`` belongs: ``k = v x up / |v x up|``)."""
    fx, fy, cx, cy = INTRINSICS
    v_pix, u_pix = torch.meshgrid(
        torch.arange(ROWS, dtype=torch.float64), torch.arange(COLS, dtype=torch.float64), indexing="ij"
    )
    rays = torch.stack([(u_pix - cx) / fx, (v_pix - cy) / fy, torch.ones_like(u_pix)], -1)
    rotation = c2w[0, :, None, None, :3, :3]  # [T, 1, 1, 3, 3]
    v = (rotation @ (rays / rays.norm(dim=-1, keepdim=True))[..., None])[..., 0]
    up = torch.tensor([0.0, -1.0, 0.0], dtype=torch.float64)
    k = torch.cross(v, up.expand_as(v), dim=-1)
    k = k / k.norm(dim=-1, keepdim=True)
    step = 0.1
    turned = v * math.cos(step) + torch.cross(k, v, dim=-1) * math.sin(step)
    if sana_term:
        turned = turned + k * (k * v.sum(-1, keepdim=True)) * (1 - math.cos(step))
    cam = (rotation.transpose(-1, -2) @ turned[..., None])[..., 0]
    shift = torch.stack([fx * cam[..., 0] / cam[..., 2] + cx - u_pix, fy * cam[..., 1] / cam[..., 2] + cy - v_pix], -1)
    latitude = torch.atan2(-v[..., 1], v[..., [0, 2]].norm(dim=-1))
    return torch.cat([shift / shift.norm(dim=-1, keepdim=True), latitude[..., None]], -1)[None]


def test_ucpe_latitude_up_map_against_sana_wm_differs_by_its_rodrigues_term_only():
    """SANA-WM's up map (float32 inside) is the maths plus the spurious ``k * (k * sum(v))`` term (0.075 off the exact
    map on this trajectory; with an identity pose its up vectors lean off vertical, where a pinhole's exact ones are
    vertical); mmpos' map is the exact one. Latitude: equal."""
    c2w = c2w_trajectory()
    _, absmap = sana_wm._process_camera_conditions_ucpe(sana_camera_conditions(c2w), 1, (FRAMES, ROWS, COLS), (1, 1, 1))
    ours = mmpos_cameras(c2w).orientation.reshape(1, FRAMES, ROWS, COLS, 3)
    assert (absmap - up_map_reference(c2w, sana_term=True)).abs().max() < 2e-5  # the reference reads SANA-WM right
    assert (ours - up_map_reference(c2w, sana_term=False)).abs().max() < 1e-10
    assert (ours[..., 2] - absmap[..., 2]).abs().max() < 2e-6  # latitude
    gap = (ours[..., :2] - absmap[..., :2]).abs().max()
    assert 0.05 < gap < 0.1
    assert ours[0, 0, ..., 0].abs().max() < 1e-12  # identity pose: vertical up vectors


def test_plucker_rays_equal_the_sana_wm_raymap_in_float64():
    """``compute_raymap(..., use_plucker=True)`` is ``(d, o x d)``: mmpos' ``order="direction_moment"``."""
    c2w = c2w_trajectory()
    intrinsics = torch.tensor(INTRINSICS, dtype=torch.float64).expand(FRAMES, 4)
    raymap = cam_utils.compute_raymap(intrinsics, c2w[0], ROWS, COLS, use_plucker=True)  # [T, H, W, 6]
    rays = PluckerRays(embed_dim=None, order="direction_moment").prepare(mmpos_cameras(c2w))
    assert rays.dtype == torch.float64
    assert (rays.reshape(FRAMES, ROWS, COLS, 6) - raymap).abs().max() < 1e-12
