"""Each camera encoding against an independent fp64 implementation of its reference formula, the sign of the
2D-RoPE / ray rotations included (q, k, v by -theta, output by +theta; ``tests/fixtures/camera_reference.py``), on random
cameras, through the contract (``pe.prepare(cameras)``)."""

import pytest
import torch

from mmpos.camera import Cameras, invert_pose, orthonormalize, pose_from_rotation_translation
from mmpos.encodings import UCPE, PRoPE, RayRoPE
from tests.fixtures import camera_reference as ref

F64 = torch.float64
IMAGE = (96, 128)  # (H, W)
GRID = (3, 4)  # (rows, cols)
CAMERAS = 3
TOKENS = CAMERAS * GRID[0] * GRID[1]


def random_c2w(seed, batch=2, cameras=CAMERAS):
    g = torch.Generator().manual_seed(seed)
    rotation = orthonormalize(torch.randn(batch, cameras, 3, 3, generator=g, dtype=F64))
    return pose_from_rotation_translation(rotation, torch.randn(batch, cameras, 3, generator=g, dtype=F64))


def random_intrinsics(seed, batch=2, cameras=CAMERAS):
    g = torch.Generator().manual_seed(seed)
    k = torch.zeros(batch, cameras, 3, 3, dtype=F64)
    k[..., 0, 0] = 80 + 60 * torch.rand(batch, cameras, generator=g, dtype=F64)
    k[..., 1, 1] = 80 + 60 * torch.rand(batch, cameras, generator=g, dtype=F64)
    k[..., 0, 2] = IMAGE[1] / 2 + 10 * torch.randn(batch, cameras, generator=g, dtype=F64)
    k[..., 1, 2] = IMAGE[0] / 2 + 10 * torch.randn(batch, cameras, generator=g, dtype=F64)
    k[..., 2, 2] = 1
    return k


def qkv(head_dim, batch=2, heads=2, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, TOKENS, head_dim, generator=g, dtype=F64) for _ in range(3)]


def random_rays(seed, patches=GRID[0] * GRID[1]):
    g = torch.Generator().manual_seed(seed)
    rays = torch.randn(patches, 3, generator=g, dtype=F64) * 0.4
    rays[:, 2] = 1.0
    return rays / rays.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("with_intrinsics", [True, False], ids=["prope", "gta"])
def test_prope_and_gta_match_the_reference_formula(seed, with_intrinsics):
    w2c = invert_pose(random_c2w(seed))
    k_mat = random_intrinsics(seed + 10) if with_intrinsics else None
    q, k, v = qkv(16, seed=seed)
    pe = PRoPE(head_dim=16, gta=not with_intrinsics)
    cameras = Cameras(w2c=w2c, grid=GRID, image_size=IMAGE, intrinsics=random_intrinsics(seed + 10))
    ours = pe.attention(q, k, v, pe.prepare(cameras))
    expected = ref.projective_attention(q, k, v, ref.prope_matrices(w2c, GRID, k_mat, IMAGE), CAMERAS, GRID)
    assert (ours - expected).abs().max() < 1e-12


@pytest.mark.parametrize("seed", [0, 1])
def test_ucpe_matches_the_reference_formula(seed):
    c2w, rays = random_c2w(seed), random_rays(seed)
    q, k, v = qkv(32, seed=seed)
    pe = UCPE(head_dim=32)
    ours = pe.attention(q, k, v, pe.prepare(Cameras(c2w=c2w, grid=GRID, rays=rays)))
    expected = ref.projective_attention(q, k, v, ref.ucpe_ray_frames(c2w, rays), CAMERAS, GRID)
    assert (ours - expected).abs().max() < 1e-12


@pytest.mark.parametrize("num_rays", [1, 3])
def test_rayrope_matches_the_reference_formula(num_rays):
    head_dim = 2 * (3 + 3 * num_rays) * 2
    w2c, k_mat = invert_pose(random_c2w(5, batch=1)), random_intrinsics(6, batch=1)
    g = torch.Generator().manual_seed(7)
    raw = torch.randn(1, TOKENS, 2, generator=g, dtype=F64) * 0.5
    q, k, v = qkv(head_dim, batch=1)
    pe = RayRoPE(head_dim, num_rays=num_rays)
    ours = pe.attention(
        q, k, v, pe.prepare(Cameras(w2c=w2c, grid=GRID, image_size=IMAGE, intrinsics=k_mat)), depth_q=raw
    )[0]
    expected = ref.rayrope_attention(q[0], k[0], v[0], w2c[0], k_mat[0], IMAGE, GRID, raw[0], num_rays)
    assert (ours - expected).abs().max() < 1e-9  # the reference's small-spread fallback is O(spread^2)


def test_the_reference_sees_the_sign():
    """The comparison can fail: rotating q, k, v by +theta instead moves the output far above the tolerances."""
    w2c = invert_pose(random_c2w(0))
    q, k, v = qkv(16)
    frames = ref.prope_matrices(w2c, GRID)
    expected = ref.projective_attention(q, k, v, frames, CAMERAS, GRID)
    minus, plus = ref.rot_minus, ref.rot_plus
    try:
        ref.rot_minus, ref.rot_plus = plus, minus
        flipped = ref.projective_attention(q, k, v, frames, CAMERAS, GRID)
    finally:
        ref.rot_minus, ref.rot_plus = minus, plus
    assert (flipped - expected).abs().max() > 1e-2
