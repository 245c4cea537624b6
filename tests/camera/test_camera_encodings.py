"""Camera encodings in fp64: SE(3) invariance, reductions, own-frame identities, expected encoding vs Monte
Carlo, cross-attention with different camera counts, zero-init adapter, masks and errors."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import mmpos
from mmpos.camera import (
    Cameras,
    Pinhole,
    UnifiedCamera,
    invert_pose,
    latitude_up_map,
    orthonormalize,
    pose_from_rotation_translation,
    ray_frames,
    ray_grid,
)
from mmpos.encodings import UCPE, ParallelAdapter, PluckerRays, PRoPE, RayDepthHead, RayRoPE, UCPEAdapter
from tests.conftest import logits

F64 = torch.float64
IMAGE = (96, 128)  # (H, W)
GRID = (3, 4)  # (rows, cols)


def rigid(seed, batch_shape=()):
    g = torch.Generator().manual_seed(seed)
    rotation = orthonormalize(torch.randn(*batch_shape, 3, 3, generator=g, dtype=F64))
    return pose_from_rotation_translation(rotation, torch.randn(*batch_shape, 3, generator=g, dtype=F64))


def intrinsics(batch, cameras):
    k = torch.tensor([[100.0, 0, 60], [0, 110, 50], [0, 0, 1]], dtype=F64)
    k = k.expand(batch, cameras, 3, 3).clone()
    k[..., 0, 0] += torch.arange(cameras, dtype=F64) * 7  # cameras differ
    return k


def qkv(batch, length, head_dim, heads=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, head_dim, generator=g, dtype=F64) for _ in range(3)]


def pin(w2c, k, image=IMAGE, grid=GRID):
    """Pinhole cameras: ``w2c [B, C, 4, 4]`` and pixel ``K [B, C, 3, 3]`` of ``image`` images on ``grid``."""
    return Cameras(w2c=w2c, grid=grid, image_size=image, intrinsics=k)


def tokens(cameras, grid=GRID):
    return cameras * grid[0] * grid[1]


# --- PRoPE ------------------------------------------------------------------------------------------------------
def prope_logits(pe, q, k, geo):
    return logits(pe.apply_q(q, geo), pe.apply_kv(k, None, geo)[0])


@pytest.mark.parametrize("with_intrinsics", [True, False])
def test_prope_logits_and_output_are_se3_invariant(with_intrinsics):
    pe = PRoPE(head_dim=16, gta=not with_intrinsics)
    w2c = invert_pose(rigid(0, (2, 3)))
    k_mat = intrinsics(2, 3)
    q, k, v = qkv(2, tokens(3), 16)
    geo = pe.prepare(pin(w2c, k_mat))
    moved = pe.prepare(pin(w2c @ invert_pose(rigid(9)), k_mat))
    assert (prope_logits(pe, q, k, geo) - prope_logits(pe, q, k, moved)).abs().max() < 1e-10
    assert (pe.attention(q, k, v, geo) - pe.attention(q, k, v, moved)).abs().max() < 1e-10
    scaled = w2c.clone()
    scaled[..., :3, 3] *= 2  # a different rig: the test can fail
    assert (prope_logits(pe, q, k, pe.prepare(pin(scaled, k_mat))) - prope_logits(pe, q, k, geo)).abs().max() > 1e-3


def test_prope_with_one_camera_is_2d_rope():
    """One camera: P_q P_k^-1 = I, so the logits are a plain dot product on the projective channels plus 2D RoPE
    (base 100) on the rest: a block for the column index, then one for the row, each rotate-half. q and k turn by
    -theta (the references' sign): plain RoPE at the negated positions."""
    pe = PRoPE(head_dim=16, apply_vo=False)
    rope = mmpos.create_pe("rope_1d", head_dim=4, theta=100.0, layout="half").double()
    q, k, v = qkv(1, tokens(1), 16)
    geo = pe.prepare(pin(invert_pose(rigid(3, (1, 1))), intrinsics(1, 1)))
    row, col = torch.meshgrid(torch.arange(GRID[0], dtype=F64), torch.arange(GRID[1], dtype=F64), indexing="ij")
    q_x, k_x = rope(q[..., 8:12], k[..., 8:12], -col.reshape(-1))
    q_y, k_y = rope(q[..., 12:], k[..., 12:], -row.reshape(-1))
    expected = logits(q[..., :8], k[..., :8]) + logits(q_x, k_x) + logits(q_y, k_y)
    assert (prope_logits(pe, q, k, geo) - expected).abs().max() < 1e-12
    reference = F.scaled_dot_product_attention(
        torch.cat([q[..., :8], q_x, q_y], -1), torch.cat([k[..., :8], k_x, k_y], -1), v
    )
    assert (pe.attention(q, k, v, geo) - reference).abs().max() < 1e-12
    two = pe.prepare(pin(invert_pose(rigid(3, (1, 2))), intrinsics(1, 2)))
    q2, k2, _ = qkv(1, tokens(2), 16)
    across = prope_logits(pe, q2, k2, two)[..., : tokens(1), tokens(1) :]  # two cameras: not plain RoPE any more
    same_camera = prope_logits(pe, q2[..., : tokens(1), :], k2[..., tokens(1) :, :], geo)
    assert (across - same_camera).abs().max() > 1e-3


def test_prope_cross_attention_between_different_rigs():
    pe = PRoPE(head_dim=16)
    w2c = invert_pose(rigid(7, (2, 5)))
    q, _, _ = qkv(2, tokens(3), 16)
    _, k, v = qkv(2, tokens(2, (2, 2)), 16, seed=4)

    def run(world):
        query = pe.prepare(pin(w2c[:, :3] @ world, intrinsics(2, 3)))
        key = pe.prepare(pin(w2c[:, 3:] @ world, intrinsics(2, 2), (64, 64), (2, 2)))
        return pe.attention(q, k, v, query, key)

    out = run(torch.eye(4, dtype=F64))
    assert out.shape == q.shape and (run(invert_pose(rigid(8))) - out).abs().max() < 1e-10


def test_projective_value_path_is_relative():
    """With values and outputs transformed, a token attending only to itself gets its own value back."""
    pe = PRoPE(head_dim=16)
    geo = pe.prepare(pin(invert_pose(rigid(4, (1, 2))), intrinsics(1, 2)))
    q, _, v = qkv(1, tokens(2), 16)
    eye = torch.eye(tokens(2), dtype=torch.bool)
    out = pe.apply_output(
        F.scaled_dot_product_attention(pe.apply_q(q, geo), *pe.apply_kv(q, v, geo), attn_mask=eye), geo
    )
    assert (out - v).abs().max() < 1e-12


# --- UCPE -------------------------------------------------------------------------------------------------------
def fisheye_rays():
    camera = UnifiedCamera.from_fov(IMAGE[1], IMAGE[0], 200, xi=2.3)
    return ray_grid(camera, GRID, offset=(0.0, 0.0), dtype=F64)  # corner rays: the image corner is outside


def test_ucpe_logits_and_output_are_se3_invariant():
    pe = UCPE(head_dim=16)
    c2w = rigid(1, (2, 3))
    rays, valid = fisheye_rays()
    assert not valid.all()  # includes rays outside the image circle
    q, k, v = qkv(2, tokens(3), 16)
    geo = pe.prepare(Cameras(c2w=c2w, grid=GRID, rays=rays, valid=valid))
    moved = pe.prepare(Cameras(c2w=rigid(5) @ c2w, grid=GRID, rays=rays, valid=valid))
    assert (prope_logits(pe, q, k, geo) - prope_logits(pe, q, k, moved)).abs().max() < 1e-10
    out = pe.attention(q, k, v, geo)
    assert torch.isfinite(out).all() and (out - pe.attention(q, k, v, moved)).abs().max() < 1e-10
    assert torch.equal(geo.valid, valid.repeat(3).expand(2, -1))


def test_ray_frames_are_rigid_and_the_optical_axis_frame_is_w2c():
    c2w = rigid(2, (4,))
    rays = torch.nn.functional.normalize(torch.randn(4, 10, 3, dtype=F64), dim=-1)
    rays[:, 0] = torch.tensor([0, 0, 1.0], dtype=F64)
    w2l, ok = ray_frames(rays, c2w)
    assert ok.all()
    rotation = w2l[..., :3, :3]
    assert torch.allclose(
        rotation @ rotation.transpose(-1, -2), torch.eye(3, dtype=F64).expand_as(rotation), atol=1e-14
    )
    assert torch.allclose(torch.linalg.det(rotation), torch.ones(4, 10, dtype=F64), atol=1e-14)
    assert torch.allclose(w2l[:, 0], invert_pose(c2w), atol=1e-14)
    world_dirs = (c2w[:, None, :3, :3] @ rays[..., None])[..., 0]
    assert torch.allclose(rotation[..., 2, :], world_dirs, atol=1e-14)  # z along the ray


def test_ray_parallel_to_the_vertical_axis_is_finite_and_masked():
    rays = torch.tensor([[[0.0, 1.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 1.0]]], dtype=F64)
    w2l, ok = ray_frames(rays, rigid(4, (1,)))
    assert torch.isfinite(w2l).all() and ok.tolist() == [[False, False, True]]
    rotation = w2l[..., :3, :3]
    assert torch.allclose(
        rotation @ rotation.transpose(-1, -2), torch.eye(3, dtype=F64).expand_as(rotation), atol=1e-14
    )


def _rotation(axis, degrees):
    from mmpos.camera import axis_angle_to_matrix

    return axis_angle_to_matrix(torch.tensor(axis, dtype=F64) * math.radians(degrees))


def _pose(rotation, translation=(0.0, 0.0, 0.0)):
    return pose_from_rotation_translation(rotation, torch.tensor(translation, dtype=F64))


@pytest.mark.parametrize("camera", [Pinhole(80, 80, 64, 48, 128, 96), UnifiedCamera.from_fov(128, 96, 160, 1.5)])
def test_latitude_up_map_is_yaw_invariant_and_sees_pitch_and_roll(camera):
    base = _rotation((1.0, 0, 0), 12) @ _rotation((0, 0, 1.0), -8)  # some pitch and roll
    reference, ok = latitude_up_map(camera, _pose(base), GRID)
    assert ok.all()
    yawed, _ = latitude_up_map(camera, _pose(_rotation((0, 1.0, 0), 73) @ base, (3.0, -1.0, 2.0)), GRID)
    assert (yawed - reference).abs().max() < 1e-12
    for axis in ((1.0, 0, 0), (0, 0, 1.0)):  # pitch, roll
        changed, _ = latitude_up_map(camera, _pose(_rotation(axis, 10) @ base), GRID)
        assert (changed - reference).abs().max() > 0.05


def test_latitude_up_map_of_a_level_camera():
    camera = Pinhole(80, 80, 64, 48, 128, 96)
    values, ok = latitude_up_map(camera, torch.eye(4, dtype=F64), (3, 3))
    centre = values[4]
    assert centre[2].abs() < 1e-15 and torch.allclose(centre[:2], torch.tensor([0.0, -1.0], dtype=F64), atol=1e-12)
    assert values[1, 2] > 0 > values[7, 2]  # top row looks up (positive latitude), bottom row down
    pitched_down, _ = latitude_up_map(camera, _pose(_rotation((1.0, 0, 0), -30)), (3, 3))
    assert pitched_down[4, 2] == pytest.approx(-math.radians(30))


def test_latitude_up_map_masks_straight_up_rays():
    camera = Pinhole(80, 80, 64, 48, 128, 96)
    looking_up = _pose(_rotation((1.0, 0, 0), 90))
    values, ok = latitude_up_map(camera, looking_up, (3, 3))
    assert not ok[4] and torch.equal(values[4], torch.zeros(3, dtype=F64)) and torch.isfinite(values).all()


# --- UCPE adapter -----------------------------------------------------------------------------------------------
def _host_and_adapter(dim=32):
    from diffusers.models.attention_processor import Attention

    host = Attention(query_dim=dim, heads=4, dim_head=8).double().eval()
    adapter = UCPEAdapter(dim, num_heads=2, head_dim=16).double()
    return ParallelAdapter(host, adapter)


def test_zero_init_adapter_leaves_the_host_bit_identical():
    block = _host_and_adapter()
    x = torch.randn(2, tokens(2), 32, dtype=F64)
    rays, valid = fisheye_rays()
    geo = block.adapter.prepare(Cameras(c2w=rigid(6, (2, 2)), grid=GRID, rays=rays, valid=valid))
    orientation = block.adapter.orientation_map(
        UnifiedCamera.from_fov(IMAGE[1], IMAGE[0], 200, xi=2.3), rigid(6, (2, 2)), GRID, offset=(0.0, 0.0)
    )
    assert orientation.shape == (2, tokens(2), 3) and orientation.abs().sum() > 0
    with torch.no_grad():
        host_only = block.host(x)
        combined = block(x, camera=geo, orientation=orientation)
        assert torch.equal(combined, host_only)
        torch.nn.init.normal_(block.adapter.out_proj.weight)
        trained = block(x, camera=geo, orientation=orientation)
        assert torch.equal(block(x), host_only)  # no camera: the host alone
        block.set_camera(geo, orientation)  # how a stock block that calls attn(x) gets the camera
        assert torch.equal(block(x), trained)
    change = (trained - host_only).abs().amax(-1)
    assert (change[:, valid.repeat(2)] > 1e-3).all()
    assert (change[:, ~valid.repeat(2)] == 0).all()  # tokens without a ray get no residual


def test_adapter_requires_orientation_when_configured():
    block = _host_and_adapter()
    rays, _ = fisheye_rays()
    geo = block.adapter.prepare(Cameras(c2w=rigid(6, (1, 1)), grid=GRID, rays=rays))
    with pytest.raises(ValueError, match="orientation"):
        block.adapter(torch.randn(1, tokens(1), 32, dtype=F64), geo)


# --- RayRoPE ----------------------------------------------------------------------------------------------------
def ray_setup(cameras=3, batch=2, head_dim=48, num_rays=3, seed=0):
    pe = RayRoPE(head_dim, num_rays=num_rays)
    w2c = invert_pose(rigid(seed, (batch, cameras)))
    side = pe.prepare(pin(w2c, intrinsics(batch, cameras)))
    raw = torch.randn(batch, tokens(cameras), 2, dtype=F64) * 0.5
    return pe, w2c, side, raw


@pytest.mark.parametrize("num_rays", [1, 2, 3])
def test_rayrope_logits_and_output_are_se3_invariant(num_rays):
    pe, w2c, side, raw = ray_setup(head_dim=2 * (3 + 3 * num_rays) * 2, num_rays=num_rays)
    q, k, v = qkv(2, tokens(3), pe.head_dim)
    moved = pe.prepare(pin(w2c @ invert_pose(rigid(11)), intrinsics(2, 3)))
    assert (pe.logits(q, k, side, depth_q=raw) - pe.logits(q, k, moved, depth_q=raw)).abs().max() < 1e-10
    assert (pe.attention(q, k, v, side, depth_q=raw) - pe.attention(q, k, v, moved, depth_q=raw)).abs().max() < 1e-10


def test_rayrope_is_not_scale_invariant():
    pe, w2c, side, raw = ray_setup()
    q, k, _ = qkv(2, tokens(3), 48)
    scaled = w2c.clone()
    scaled[..., :3, 3] *= 2.0
    other = pe.prepare(pin(scaled, intrinsics(2, 3)))
    assert (pe.logits(q, k, side, depth_q=raw) - pe.logits(q, k, other, depth_q=raw)).abs().max() > 1e-2


def test_rayrope_attention_agrees_with_its_logits():
    pe, _, side, raw = ray_setup()
    q, k, v = qkv(2, tokens(3), 48)
    plain = RayRoPE(48, apply_vo=False)
    weights = torch.softmax(plain.logits(q, k, side, depth_q=raw) / math.sqrt(48), dim=-1)
    assert (plain.attention(q, k, v, side, depth_q=raw) - weights @ v).abs().max() < 1e-12
    assert (pe.attention(q, k, v, side, depth_q=raw) - weights @ v).abs().max() > 1e-3  # values are encoded too


def test_rayrope_own_frame_identities():
    pe, _, side, raw = ray_setup()
    near, far = pe.depths(raw, side)
    own_near, own_far = pe.query_coordinates(side, near), pe.query_coordinates(side, far)
    assert torch.equal(own_near[..., :3], torch.zeros_like(own_near[..., :3]))  # own camera centre -> origin
    assert torch.equal(own_near[..., 3:9], own_far[..., 3:9])  # own ray directions ignore depth
    assert torch.equal(own_near[..., 9:], near.clamp(max=10))  # own depth coordinate is the depth
    for camera in range(3):
        rows = slice(camera * tokens(1), (camera + 1) * tokens(1))
        as_key = pe.key_coordinates(side, camera, side, near)[:, rows]
        assert as_key[..., :3].abs().max() < 1e-12  # the generic path agrees
        assert (as_key - own_near[:, rows]).abs().max() < 1e-12


def test_rayrope_key_coordinates_match_the_homogeneous_formula():
    """Independent re-derivation: X(d) = P_k^-1 (u, v, 1, 1/d), Y = P_c X, dir = Y[:3] / |Y[:3]|, depth = |Y_z| / Y_w."""
    pe, w2c, side, raw = ray_setup(cameras=2, batch=1)
    depth = pe.depths(raw, side)[0]
    h, w = IMAGE
    normaliser = torch.tensor([[1 / w, 0, -0.5], [0, 1 / h, -0.5], [0, 0, 1]], dtype=F64)
    lift = torch.eye(4, dtype=F64).repeat(2, 1, 1)
    lift[:, :3, :3] = normaliser @ intrinsics(1, 2)[0]
    proj = lift @ w2c[0]
    coords = pe.key_coordinates(side, 1, side, depth)[0]
    corners = ((0, 0), (1, 0), (0, 1))
    for token in (0, 5, tokens(1) + 7):
        camera, patch = divmod(token, tokens(1))
        row, col = divmod(patch, GRID[1])
        for ray, (ox, oy) in enumerate(corners):
            u, v = (col + ox) / GRID[1] - 0.5, (row + oy) / GRID[0] - 0.5
            point = torch.linalg.inv(proj[camera]) @ torch.tensor([u, v, 1, 1 / depth[0, token, ray]], dtype=F64)
            y = proj[1] @ point
            direction = y[:3] / y[:3].norm()
            assert torch.allclose(coords[token, 3 + 2 * ray : 5 + 2 * ray], direction[:2], atol=1e-12)
            assert coords[token, 9 + ray] == pytest.approx(min((y[2].abs() / y[3]).item(), 10.0), abs=1e-10)
        centre = w2c[0, 1] @ torch.linalg.inv(w2c[0, camera])[:, 3]
        assert torch.allclose(coords[token, :3], centre[:3], atol=1e-12)


def test_rayrope_expected_encoding_matches_monte_carlo():
    pe, _, side, _ = ray_setup(cameras=2, batch=1, head_dim=48, num_rays=1)
    g = torch.Generator().manual_seed(0)
    near = torch.full((1, tokens(2), 1), 1.5, dtype=F64)
    far = near + torch.rand(1, tokens(2), 1, generator=g, dtype=F64) * 2
    expected = pe.expected_table(pe.key_coordinates(side, 0, side, near), pe.key_coordinates(side, 0, side, far)).cis[
        0, 0
    ]  # [L, F * D_c]
    samples = 40000
    t = torch.rand(samples, 1, 1, generator=g, dtype=F64)
    many = dataclasses.replace(
        side,
        w2c=side.w2c.expand(samples, -1, -1, -1),
        k_norm=side.k_norm.expand(samples, -1, -1, -1),
        centers=side.centers.expand(samples, -1, -1),
        ray_steps=side.ray_steps.expand(samples, -1, -1, -1, -1),
    )
    coords = pe.key_coordinates(many, 0, many, near + t * (far - near))  # depth uniform in [near, far]
    angles = coords.repeat(1, 1, pe.num_freqs) * pe.frequencies(F64)
    monte_carlo = torch.polar(torch.ones_like(angles), angles).mean(0)
    depth_channels = torch.arange(pe.num_freqs) * pe.num_coords + pe.num_coords - 1
    # the query-frame depth is affine in the key depth: uniform depth = uniform angle, the closed form is exact
    assert (monte_carlo[:, depth_channels] - expected[:, depth_channels]).abs().max() < 0.01
    assert expected.abs().max() <= 1 + 1e-12 and expected[:, depth_channels].abs().min() < 0.9  # damped
    theta1 = pe.key_coordinates(side, 0, side, near).repeat(1, 1, pe.num_freqs)[0] * pe.frequencies(F64)
    theta2 = pe.key_coordinates(side, 0, side, far).repeat(1, 1, pe.num_freqs)[0] * pe.frequencies(F64)
    uniform_angle = theta1 + t * (theta2 - theta1)  # the closed form itself, every channel
    assert (torch.polar(torch.ones_like(uniform_angle), uniform_angle).mean(0) - expected).abs().max() < 0.01


def test_rayrope_known_depth_gives_orthogonal_rotations():
    pe, _, side, raw = ray_setup()
    known = torch.rand(2, tokens(3), 3, dtype=F64) * 3 + 0.5
    q, k, v = qkv(2, tokens(3), 48)
    out = pe.attention(q, k, v, side, known_depth_q=known)
    near, far = pe.depths(None, side, known)
    table = pe.expected_table(pe.query_coordinates(side, near), pe.query_coordinates(side, far))
    assert torch.allclose(table.cis.abs(), torch.ones_like(table.cis.abs()), atol=1e-14)
    wide = torch.stack([raw[..., 0], torch.full_like(raw[..., 0], 2.0)], -1)  # sigma 2: [e^-2, e^2] x e^l
    uncertain = pe.expected_table(*(pe.query_coordinates(side, d) for d in pe.depths(wide, side)))
    assert uncertain.cis.abs().min() < 0.9  # with uncertainty: damped
    assert torch.isfinite(out).all()
    partial = pe.depths(raw, side, known[:, : tokens(1)])  # RGB-D for the first camera only
    assert torch.equal(partial[0][:, : tokens(1)], partial[1][:, : tokens(1)])
    assert not torch.equal(partial[0][:, tokens(1) :], partial[1][:, tokens(1) :])


def test_rayrope_depth_head_initialisation():
    head = RayDepthHead(64)
    raw = head(torch.randn(3, 10, 64))
    assert torch.equal(raw, torch.tensor([0.0, 3.0]).expand(3, 10, 2))
    pe, _, side, _ = ray_setup(batch=1)
    near, far = pe.depths(RayDepthHead(8).double()(torch.randn(1, tokens(3), 8, dtype=F64)), side)
    assert torch.allclose(near, torch.full_like(near, math.exp(-3))) and torch.allclose(
        far, torch.full_like(far, math.exp(3))
    )


def test_rayrope_depth_head_receives_gradients():
    pe, _, side, _ = ray_setup(batch=1)
    head = RayDepthHead(8).double()
    x = torch.randn(1, tokens(3), 8, dtype=F64)
    q, k, v = qkv(1, tokens(3), 48)
    pe.attention(q, k, v, side, depth_q=head(x)).square().sum().backward()
    assert head.weight.grad.abs().sum() > 0 and head.bias.grad.abs().sum() > 0


def test_rayrope_cross_attention_with_different_camera_counts():
    pe = RayRoPE(48)
    w2c = invert_pose(rigid(3, (2, 4)))
    query = pe.prepare(pin(w2c[:, :3], intrinsics(2, 3)))
    key = pe.prepare(pin(w2c[:, 3:], intrinsics(2, 1), (64, 64), (2, 2)))  # 1 key camera, another grid
    q, _, _ = qkv(2, tokens(3), 48)
    _, k, v = qkv(2, 4, 48, seed=5)
    raw_q, raw_k = torch.randn(2, tokens(3), 2, dtype=F64), torch.randn(2, 4, 2, dtype=F64)
    out = pe.attention(q, k, v, query, key, depth_q=raw_q, depth_k=raw_k)
    assert out.shape == q.shape and torch.isfinite(out).all()
    # each query camera is independent: attending with that camera alone gives the same rows
    for camera in range(3):
        rows = slice(camera * tokens(1), (camera + 1) * tokens(1))
        alone = pe.prepare(pin(w2c[:, camera : camera + 1], intrinsics(2, 3)[:, camera : camera + 1]))
        single = pe.attention(q[..., rows, :], k, v, alone, key, depth_q=raw_q[:, rows], depth_k=raw_k)
        assert (single - out[..., rows, :]).abs().max() < 1e-12
    g = invert_pose(rigid(12))
    moved_q = pe.prepare(pin(w2c[:, :3] @ g, intrinsics(2, 3)))
    moved_k = pe.prepare(pin(w2c[:, 3:] @ g, intrinsics(2, 1), (64, 64), (2, 2)))
    assert (pe.attention(q, k, v, moved_q, moved_k, depth_q=raw_q, depth_k=raw_k) - out).abs().max() < 1e-10
    with pytest.raises(ValueError, match=r"raw depth predictions must be \[B, 4, 2\]"):
        pe.attention(q, k, v, query, key, depth_q=raw_q, depth_k=raw_q)


def test_rayrope_points_behind_the_query_camera_stay_finite():
    pe = RayRoPE(24, num_rays=1)
    facing = torch.stack([torch.eye(4, dtype=F64), _pose(_rotation((0, 1.0, 0), 180), (0.0, 0.0, 5.0))])[None]
    side = pe.prepare(pin(invert_pose(facing), intrinsics(1, 2)))
    q, k, v = qkv(1, tokens(2), 24)
    out = pe.attention(q, k, v, side, depth_q=torch.tensor([2.5, 0.0], dtype=F64).expand(1, tokens(2), 2))
    assert torch.isfinite(out).all()


# --- Plücker ----------------------------------------------------------------------------------------------------
def test_plucker_rays_and_zero_init():
    c2w = rigid(8, (2, 3))
    rays, _ = ray_grid(Pinhole(80, 80, 64, 48, 128, 96), GRID, dtype=F64)
    cameras = Cameras(c2w=c2w, grid=GRID, rays=rays)
    plucker = PluckerRays(None).prepare(cameras)
    moment, direction = plucker[..., :3], plucker[..., 3:]  # CameraCtrl's order (o x d, d)
    assert plucker.shape == (2, tokens(3), 6)
    assert torch.allclose(direction.norm(dim=-1), torch.ones(2, tokens(3), dtype=F64), atol=1e-14)
    assert (direction * moment).sum(-1).abs().max() < 1e-14  # moment is orthogonal to the direction
    centre = c2w[:, :, None, :3, 3].expand(-1, -1, tokens(1), -1).flatten(1, 2)
    assert torch.allclose(moment, torch.cross(centre + 2.5 * direction, direction, dim=-1), atol=1e-13)  # any point
    maps = PluckerRays.maps(cameras)
    assert maps.shape == (2, 3, 6, *GRID) and torch.equal(maps[0, 1, :, 2, 3], plucker[0, tokens(1) + 11])
    pe = mmpos.create_pe("plucker", embed_dim=16).double()
    x = torch.randn(2, tokens(3), 16, dtype=F64)
    assert torch.equal(pe(x, pe.prepare(cameras)), x)
    moved = PluckerRays(None).prepare(
        Cameras(c2w=rigid(2) @ c2w, grid=GRID, rays=rays)
    )  # absolute: changes with the world frame
    assert (moved - plucker).abs().max() > 0.1


def camera_ctrl_ray_condition(intrinsics, c2w, height, width):
    """CameraCtrl's ``ray_condition`` (hehao13/CameraCtrl), re-implemented in fp64: ``intrinsics [B, V, 4]``
    ``(fx, fy, cx, cy)``, ``c2w [B, V, 4, 4]`` -> ``[B, V, H, W, 6]``, channels ``cat([o x d, d])``, a ray
    through every pixel centre."""
    rows, cols = torch.meshgrid(
        torch.arange(height, dtype=F64) + 0.5, torch.arange(width, dtype=F64) + 0.5, indexing="ij"
    )
    fx, fy, cx, cy = (intrinsics[..., i, None] for i in range(4))
    x, y = (cols.reshape(1, 1, -1) - cx) / fx, (rows.reshape(1, 1, -1) - cy) / fy
    directions = torch.stack([x, y, torch.ones_like(x)], -1)
    directions = directions / directions.norm(dim=-1, keepdim=True)
    world_directions = directions @ c2w[..., :3, :3].transpose(-1, -2)
    origins = c2w[..., None, :3, 3].expand_as(world_directions)
    moments = torch.linalg.cross(origins, world_directions, dim=-1)
    return torch.cat([moments, world_directions], -1).reshape(*c2w.shape[:2], height, width, 6)


def test_plucker_maps_are_camera_ctrl_ray_condition():
    height, width = 6, 8
    camera = Pinhole(9.0, 7.5, 4.2, 2.9, width, height)
    c2w = rigid(12, (2, 3))
    rays, _ = ray_grid(camera, (height, width), dtype=F64)
    intrinsics = torch.tensor([camera.fx, camera.fy, camera.cx, camera.cy], dtype=F64).expand(2, 3, 4)
    expected = camera_ctrl_ray_condition(intrinsics, c2w, height, width)
    cameras = Cameras(c2w=c2w, grid=(height, width), rays=rays)
    maps = PluckerRays.maps(cameras)  # [B, V, 6, H, W]
    torch.testing.assert_close(maps.permute(0, 1, 3, 4, 2), expected, rtol=0, atol=1e-14)
    embedded = PluckerRays(None).prepare(cameras)
    torch.testing.assert_close(embedded, expected.flatten(2, 3).flatten(1, 2), rtol=0, atol=1e-14)
    swapped = PluckerRays(None, order="direction_moment").prepare(cameras)
    assert torch.equal(swapped, torch.cat([embedded[..., 3:], embedded[..., :3]], -1))
    pe = PluckerRays(16, zero_init=False, order="direction_moment").double()
    x = torch.zeros(2, 3 * height * width, 16, dtype=F64)
    torch.testing.assert_close(pe(x, pe.prepare(cameras)), pe.proj(swapped), rtol=0, atol=0)


def test_plucker_weights_reordered_give_the_same_output():
    from mmpos.camera import reorder_plucker_inputs

    g = torch.Generator().manual_seed(3)
    weight, rays = torch.randn(5, 6, generator=g, dtype=F64), torch.randn(7, 6, generator=g, dtype=F64)
    old_order = torch.cat([rays[:, 3:], rays[:, :3]], -1)  # the same rays as (d, o x d)
    converted = reorder_plucker_inputs(weight, "direction_moment")
    torch.testing.assert_close(rays @ converted.T, old_order @ weight.T, rtol=1e-15, atol=1e-15)
    assert torch.equal(reorder_plucker_inputs(converted, "moment_direction", "direction_moment"), weight)
    assert torch.equal(reorder_plucker_inputs(weight, "moment_direction"), weight)
    with pytest.raises(ValueError, match="source must be one of"):
        reorder_plucker_inputs(weight, "dm")
    with pytest.raises(ValueError, match=r"weight must be \[out, 6"):
        reorder_plucker_inputs(weight[:, :5], "direction_moment")
    with pytest.raises(ValueError, match="order must be one of"):
        PluckerRays(8, order="d_m")


# --- registry and errors ------------------------------------------------------------------------------------
def test_camera_encodings_are_registered():
    assert {"plucker", "prope", "rayrope", "ucpe"} <= set(mmpos.list_pes())
    assert isinstance(mmpos.create_pe("rayrope", head_dim=144), RayRoPE)
    assert mmpos.create_pe("rayrope", head_dim=144).num_freqs == 6  # the paper's LVSM setting


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: RayRoPE(64), "multiple of 2 \\* D_c = 24"),
        (lambda: RayRoPE(48, num_rays=4), "num_rays=4"),
        (lambda: PRoPE(12), "multiple of 4"),
        (lambda: UCPE(20), "head_dim % 8"),
        (lambda: UCPEAdapter(32, num_heads=0, head_dim=16), "num_heads must be a positive integer"),
    ],
)
def test_bad_options_raise(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_camera_inputs_raise():
    pe = PRoPE(16)
    w2c = invert_pose(rigid(0, (1, 2)))
    bad_k = intrinsics(1, 2)
    bad_k[0, 1, 0, 0] = -5
    with pytest.raises(ValueError, match="focal lengths"):
        pe.prepare(pin(w2c, bad_k))
    bad_k[0, 1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        RayRoPE(24, num_rays=1).prepare(pin(w2c, bad_k))
    sheared = w2c.clone()
    sheared[0, 0, 0, 1] = 0.3
    with pytest.raises(ValueError, match="not a rotation"):
        pe.prepare(pin(sheared, intrinsics(1, 2)))
    geo = pe.prepare(pin(w2c, intrinsics(1, 2)))
    q = torch.randn(1, 2, tokens(2) + 1, 16, dtype=F64)
    with pytest.raises(ValueError, match="describes 24"):
        pe.apply_q(q, geo)
    with pytest.raises(ValueError, match="rays must be"):
        UCPE(16).prepare(Cameras(c2w=rigid(0, (1, 2)), grid=GRID, rays=torch.randn(5, 3, dtype=F64)))
    side = RayRoPE(24, num_rays=1).prepare(pin(w2c, intrinsics(1, 2)))
    with pytest.raises(ValueError, match=r"q must be \[B, H, 24, 24\]"):
        RayRoPE(24, num_rays=1).attention(q[..., :8], q[..., :24, :8], q[..., :24, :8], side)


def test_bf16_error_of_each_encoding_is_that_of_bf16_attention():
    from bench_camera import check_accuracy  # benchmarks/bench_camera.py

    rows = check_accuracy("cpu")
    assert [r["encoding"] for r in rows] == mmpos.list_pes("camera") and len(rows) >= 4  # every camera encoding
    assert all(r["finite"] for r in rows)
    for row in rows:
        if mmpos.pe_capabilities(row["encoding"]).additive:
            assert row["rel_max_error"] < 1e-6  # plucker: fp32 geometry
        else:  # bf16 q, k, v, fp32 geometry vs all-fp64: within 3x of plain bf16 SDPA's own error
            assert row["rel_max_error"] < 3 * row["sdpa_bf16_rel_max_error"]


def test_sample_ray_depths_reads_the_pixel_under_each_ray_point():
    from mmpos.encodings import sample_ray_depths

    height, width = 6, 8
    index = torch.arange(height * width, dtype=F64).reshape(1, 1, height, width)  # value = row * W + col
    depths = sample_ray_depths(torch.cat([index, index + 100], 1), (3, 4), num_rays=3)  # 2x2-pixel patches
    assert depths.shape == (1, 2 * 12, 3)
    # patch (row 1, col 2): corners (0, 0) -> pixel (2, 4); (1, 0) -> pixel (2, 6); (0, 1) -> pixel (4, 4)
    assert depths[0, 6].tolist() == [2 * 8 + 4, 2 * 8 + 6, 4 * 8 + 4]
    assert depths[0, 12 + 11].tolist() == [100 + 4 * 8 + 6, 100 + 4 * 8 + 7, 100 + 5 * 8 + 6]  # clamped at the border
    centre = sample_ray_depths(index, (3, 4), num_rays=1)
    assert centre[0, 0].tolist() == [1 * 8 + 1]
