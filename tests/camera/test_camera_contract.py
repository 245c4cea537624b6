"""The camera-encoding contract: one ``Cameras`` value (validated at construction, converters from the forms
users have), ``prepare(cameras)`` / ``attention(q, k, v, geometry)`` for every camera encoding (anything but one ``Cameras``
refused by name), and consumers that take their kinds from the registry."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import mmpos
from mmpos.camera import (
    Cameras,
    Equirectangular,
    Pinhole,
    UnifiedCamera,
    invert_pose,
    opengl_to_opencv,
    orthonormalize,
    pose_from_rotation_translation,
    preset_trajectory,
    ray_grid,
    video_cameras,
)
from mmpos.camera.rays import plucker_rays
from mmpos.encodings import UCPE, PluckerRays, PRoPE, RayDepthHead, RayRoPE, UCPEAdapter, sample_ray_depths

F64 = torch.float64
IMAGE, GRID, B, C = (48, 64), (3, 4), 2, 3
P = GRID[0] * GRID[1]


def random_c2w(seed, batch=B, cameras=C):
    g = torch.Generator().manual_seed(seed)
    rotation = orthonormalize(torch.randn(batch, cameras, 3, 3, generator=g, dtype=F64))
    return pose_from_rotation_translation(rotation, torch.randn(batch, cameras, 3, generator=g, dtype=F64))


def random_k(seed, batch=B, cameras=C):
    g = torch.Generator().manual_seed(seed)
    k = torch.zeros(batch, cameras, 3, 3, dtype=F64)
    k[..., 0, 0], k[..., 1, 1] = 50 + 20 * torch.rand(2, batch, cameras, generator=g, dtype=F64)
    k[..., 0, 2], k[..., 1, 2] = IMAGE[1] / 2 + 3 * torch.randn(batch, cameras, generator=g, dtype=F64), IMAGE[0] / 2
    k[..., 2, 2] = 1
    return k


def fisheye_rays():  # at the patches' corners: the image corner lies outside the image circle
    return ray_grid(UnifiedCamera.from_fov(IMAGE[1], IMAGE[0], 200, xi=2.3), GRID, offset=(0.0, 0.0), dtype=F64)


def qkv(head_dim, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, 2, C * P, head_dim, generator=g, dtype=F64) for _ in range(3)]


def assert_same_geometry(a, b):
    for name in vars(a):
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), name
        elif hasattr(x, "cis"):
            assert torch.equal(x.cis, y.cis), name
        else:
            assert x == y, name


# --- prepare(cameras) ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["prope", "ucpe", "rayrope", "plucker"])
def test_prepare_takes_one_cameras_value_and_names_anything_else(name):
    pe = mmpos.pe_class(name).for_head_dim(24)
    with pytest.raises(TypeError, match=r"prepare takes one mmpos.camera.Cameras, got Tensor"):
        pe.prepare(random_c2w(0))
    with pytest.raises(TypeError):
        pe.prepare(random_c2w(0), GRID)  # the old per-encoding tensor signatures are gone


def test_ucpe_adapter_prepares_its_encodings_geometry_with_the_mask():
    c2w, (rays, valid) = random_c2w(2), fisheye_rays()
    assert not valid.all()  # some tokens are masked: the mask travels through Cameras
    cameras = Cameras(c2w=c2w, grid=GRID, rays=rays, valid=valid)
    adapter = UCPEAdapter(32, num_heads=2, head_dim=16).double()
    assert_same_geometry(adapter.prepare(cameras), UCPE(16).double().prepare(cameras))


@pytest.mark.parametrize("num_rays", [1, 3])
def test_rayrope_known_depths_come_in_cameras(num_rays):
    c2w, k_mat = random_c2w(3), random_k(4)
    head_dim = 2 * (3 + 3 * num_rays) * 2
    pe = RayRoPE(head_dim, num_rays=num_rays)
    q, k, v = qkv(head_dim)
    raw = torch.randn(B, C * P, 2, generator=torch.Generator().manual_seed(5), dtype=F64) * 0.5
    now = pe.prepare(Cameras(c2w=c2w, grid=GRID, image_size=IMAGE, intrinsics=k_mat))
    # known depth of the first two views (RGB-D): Cameras.depth == known_depth_q of the sampled maps
    maps = 1 + torch.rand(B, 2, *IMAGE, generator=torch.Generator().manual_seed(6), dtype=F64)
    known = sample_ray_depths(maps, GRID, num_rays)
    with_depth = pe.prepare(Cameras(c2w=c2w, grid=GRID, image_size=IMAGE, intrinsics=k_mat, depth=maps))
    expected = pe.attention(q, k, v, now, depth_q=raw, known_depth_q=known)
    assert torch.equal(pe.attention(q, k, v, with_depth, depth_q=raw), expected)
    assert (expected - pe.attention(q, k, v, now, depth_q=raw)).abs().max() > 1e-6  # the depth matters


def test_plucker_embeds_and_maps_the_rays():
    c2w = random_c2w(7)
    rays, _ = ray_grid(Pinhole(40, 40, 32, 24, 64, 48), GRID, dtype=F64)
    cameras = Cameras(c2w=c2w, grid=GRID, rays=rays)
    pe = PluckerRays(16, zero_init=False).double()
    geometry = pe.prepare(cameras)
    assert torch.equal(geometry, plucker_rays(c2w[:, :, None], rays[None, None, None]).flatten(1, 3))
    maps = PluckerRays.maps(cameras)  # [B, C, 6, rows, cols]
    assert torch.equal(maps, geometry.unflatten(1, (C, *GRID)).permute(0, 1, 4, 2, 3))
    x = torch.randn(B, C * P, 16, dtype=F64)
    assert torch.equal(pe(x, geometry), x + pe.proj(geometry))
    q, k, v = qkv(8)
    assert torch.equal(pe.attention(q, k, v, geometry), F.scaled_dot_product_attention(q, k, v))
    assert PluckerRays.for_head_dim(8).proj is None and not PluckerRays.for_head_dim(8).capabilities.learnable


def test_plucker_maps_take_the_order_and_name_missing_rays():
    c2w = random_c2w(8)
    rays, _ = ray_grid(Pinhole(40, 40, 32, 24, 64, 48), GRID, dtype=F64)
    cameras = Cameras(c2w=c2w, grid=GRID, rays=rays)
    direction_first = PluckerRays.maps(cameras, order="direction_moment")
    assert torch.equal(direction_first, PluckerRays.maps(cameras)[:, :, [3, 4, 5, 0, 1, 2]])
    with pytest.raises(ValueError, match="cameras.rays"):  # was an AttributeError on None
        PluckerRays.maps(Cameras(c2w=c2w, grid=GRID))


def test_rayrope_takes_the_contracts_positional_attn_mask():
    """``attention(q, k, v, query, key, attn_mask)`` as every camera encoding takes it (the depth inputs are
    keyword-only: a positional mask once landed in ``depth_q``)."""
    c2w, k_mat = random_c2w(3), random_k(4)
    pe = RayRoPE(24, num_rays=1)
    side = pe.prepare(Cameras(c2w=c2w, grid=GRID, image_size=IMAGE, intrinsics=k_mat))
    q, k, v = qkv(24)
    raw = torch.randn(B, C * P, 2, generator=torch.Generator().manual_seed(5), dtype=F64) * 0.5
    mask = torch.rand(C * P, C * P, generator=torch.Generator().manual_seed(6)) > 0.3
    mask |= torch.eye(C * P, dtype=torch.bool)
    masked = pe.attention(q, k, v, side, None, mask, depth_q=raw)
    assert torch.equal(masked, pe.attention(q, k, v, side, attn_mask=mask, depth_q=raw))
    assert (masked - pe.attention(q, k, v, side, depth_q=raw)).abs().max() > 1e-3  # the mask is applied
    with pytest.raises(TypeError):
        pe.attention(q, k, v, side, None, None, None, raw)  # depth_q positionally


def test_the_contract_emits_no_warning():
    c2w, k_mat = random_c2w(0), random_k(1)
    rays, valid = fisheye_rays()
    cameras = Cameras(c2w=c2w, grid=GRID, image_size=IMAGE, intrinsics=k_mat, rays=rays, valid=valid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in mmpos.list_pes("camera"):
            pe = mmpos.pe_class(name).for_head_dim(24).double()
            geometry = pe.prepare(cameras)
            if pe.capabilities.additive:
                continue
            depth = {"depth_q": torch.zeros(B, C * P, 2, dtype=F64)} if pe.capabilities.predicts_depth else {}
            assert torch.isfinite(pe.attention(*qkv(24), geometry, **depth)).all()


# --- the Cameras value ------------------------------------------------------------------------------------------
def test_cameras_keep_the_given_pose_and_derive_its_inverse():
    c2w = random_c2w(0)
    cameras = Cameras(c2w=c2w, grid=GRID)
    assert cameras.c2w is c2w  # kept bit for bit
    assert torch.allclose(cameras.w2c @ c2w, torch.eye(4, dtype=F64).expand(B, C, 4, 4), atol=1e-12)
    assert (cameras.batch_size, cameras.num_cameras, cameras.num_tokens) == (B, C, C * P)
    w2c = invert_pose(c2w)
    assert Cameras(w2c=w2c, grid=GRID).w2c is w2c
    moved = cameras.to(dtype=torch.float32)
    assert moved.c2w.dtype == torch.float32 and torch.equal(moved.c2w, c2w.float())


def test_converters_agree_with_the_camera_models():
    c2w, k_mat = random_c2w(1), random_k(2)
    pinhole = Cameras.from_pinhole(k_mat, IMAGE, GRID, c2w=c2w)
    for b in range(B):
        for c in range(C):
            fx, fy, cx, cy = k_mat[b, c, 0, 0], k_mat[b, c, 1, 1], k_mat[b, c, 0, 2], k_mat[b, c, 1, 2]
            model = Pinhole(float(fx), float(fy), float(cx), float(cy), IMAGE[1], IMAGE[0])
            assert torch.allclose(pinhole.rays[b, c], ray_grid(model, GRID, dtype=F64)[0], atol=1e-14)
    gl = opengl_to_opencv(c2w)  # the same cameras written in OpenGL / Blender axes
    assert torch.equal(Cameras.from_opengl(gl, grid=GRID).c2w, c2w)
    fisheye = UnifiedCamera.from_fov(IMAGE[1], IMAGE[0], 200, xi=2.3)
    seen = Cameras.from_models(fisheye, GRID, c2w=c2w, offset=(0.0, 0.0))
    rays, valid = fisheye_rays()
    assert torch.equal(seen.rays[1], rays) and torch.equal(seen.valid[2], valid)
    assert seen.intrinsics.shape == (B, C, 3, 3) and seen.orientation.shape == (B, C * P, 3)
    panorama = Cameras.from_models(Equirectangular(IMAGE[1], IMAGE[0]), GRID, c2w=c2w)
    assert panorama.intrinsics is None and panorama.valid.all()
    with pytest.raises(ValueError, match="prope needs pixel intrinsics"):
        PRoPE(16).prepare(panorama)
    UCPE(16).prepare(panorama)  # any camera model: rays only
    path = preset_trajectory("orbit", 3, degrees=30)
    video = video_cameras(path, (3, *GRID), IMAGE, dtype=F64).cameras
    direct = Cameras.from_trajectory(path, GRID, IMAGE)
    assert torch.allclose(video.rays, direct.rays, atol=1e-12) and torch.allclose(video.c2w, direct.c2w)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda kw: kw.update(c2w=kw["c2w"].clone().index_fill_(2, torch.tensor([0]), float("nan"))), "non-finite|NaN"),
        (lambda kw: kw["c2w"].__setitem__((0, 1, 0, 1), 0.3), r"c2w\[\.\.\., :3, :3\] is not a rotation"),
        (lambda kw: kw.update(c2w=kw["c2w"][0]), r"c2w must be \[B, C, 4, 4\]"),
        (lambda kw: kw.update(w2c=kw["c2w"]), "exactly one of w2c"),
        (lambda kw: kw.update(rays=torch.randn(P + 1, 3, dtype=F64)), r"rays must be .* P = rows \* cols = 12"),
        (lambda kw: kw.update(valid=torch.ones(P)), "valid must be a bool mask"),
        (lambda kw: kw.update(intrinsics=random_k(0)[:, :2]), r"intrinsics must be \[B, C, 3, 3\]"),
        (lambda kw: kw.update(image_size=None), "pass image_size"),
        (lambda kw: kw.update(grid=(3, 0)), r"grid\[1\] \(cols\)"),
        (lambda kw: kw.update(depth=torch.ones(B, C + 1, 8, 8, dtype=F64)), "depth must be"),
        (lambda kw: kw.update(orientation=torch.zeros(B, P, 3, dtype=F64)), "orientation must be"),
    ],
)
def test_cameras_refuse_bad_inputs_by_name(change, match):
    rays, valid = fisheye_rays()
    fields = dict(
        c2w=random_c2w(0).clone(), grid=GRID, image_size=IMAGE, intrinsics=random_k(0), rays=rays, valid=valid
    )
    Cameras(**fields)  # the unchanged fields are fine
    change(fields)
    with pytest.raises((ValueError, TypeError), match=match):
        Cameras(**fields)


# --- consumers take the kinds from the registry -----------------------------------------------------------------
def test_adapter_kinds_come_from_the_registry_and_take_cameras():
    from mmpos.integrations.diffusers.camera_adapter import ADAPTER_KINDS, CameraAdapter, adapter_kinds

    assert set(ADAPTER_KINDS) == {"plucker", "prope", "ucpe"} == set(adapter_kinds())
    assert all(mmpos.pe_capabilities(kind).adapter for kind in ADAPTER_KINDS)
    cams = video_cameras(preset_trajectory("orbit", 5), (2, *GRID), IMAGE, dtype=F64)
    for kind in ADAPTER_KINDS:
        adapter = CameraAdapter(kind, dim=32, num_layers=1, num_heads=2, head_dim=16).double()
        for p in adapter.parameters():
            torch.nn.init.normal_(p, std=0.3)
        x = torch.randn(1, cams.num_tokens, 32, dtype=F64)
        a, b = adapter.conditioning(cams), adapter.conditioning(cams.cameras)
        assert torch.equal(a.attention_input(0, x), b.attention_input(0, x))
        ra, rb = a.residual(0, x), b.residual(0, x)
        assert (ra is None and rb is None) or torch.equal(ra, rb)
        assert (ra is None) == (not torch.equal(a.attention_input(0, x), x))  # each kind acts in one place
    with pytest.raises(ValueError, match="not a camera adapter"):
        CameraAdapter("rayrope", dim=32, num_layers=1)


def test_nvs_model_geometry_is_the_old_one_bit_for_bit():
    from mmpos.models.world.nvs import NVS_ENCODINGS, NovelViewTransformer

    assert NVS_ENCODINGS == ("none", *mmpos.list_pes("camera"))
    size, patch, n = 16, 4, 2
    c2w = random_c2w(4, batch=n)
    k_mat = torch.tensor([[14.0, 0, 8], [0, 14, 8], [0, 0, 1]], dtype=F64).expand(n, 3, 3, 3)
    camera = Pinhole(14.0, 14.0, 8.0, 8.0, size, size)
    batch = dict(
        images=torch.rand(n, 3, 3, size, size),
        c2w=c2w,
        intrinsics=k_mat,
        patch_rays=ray_grid(camera, (4, 4), dtype=F64)[0].expand(n, 3, -1, -1),
        pixel_rays=ray_grid(camera, (size, size), dtype=F64)[0].expand(n, 3, -1, -1),
    )
    prope = NovelViewTransformer("prope", size, patch, dim=32, depth=1, heads=2)
    assert_same_geometry(
        prope.geometry(batch),
        prope.pe.prepare(
            Cameras(w2c=invert_pose(c2w.float()), grid=(4, 4), intrinsics=k_mat.float(), image_size=(size, size))
        ),
    )
    plucker = NovelViewTransformer("plucker", size, patch, dim=32, depth=1, heads=2)
    rays = plucker_rays(c2w[:, :, None], batch["pixel_rays"][:, :, None]).float()  # the model's former formula
    maps = rays[:, :, 0].unflatten(2, (size, size)).permute(0, 1, 4, 2, 3)
    new = plucker.pe.prepare(plucker.pixel_cameras(batch)).float().unflatten(1, (3, size, size)).permute(0, 1, 4, 2, 3)
    assert torch.equal(maps, new)
    assert "rays.weight" in plucker.state_dict() and not any(k.startswith("pe.") for k in plucker.state_dict())
    ray = NovelViewTransformer("rayrope", size, patch, dim=48, depth=1, heads=2)
    assert isinstance(ray.blocks[0].attn.depth, RayDepthHead) and prope.blocks[0].attn.depth is None
    assert torch.isfinite(ray(batch)).all()
