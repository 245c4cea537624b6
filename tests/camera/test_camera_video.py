"""Camera-controlled Wan pipelines and camera adapters on tiny offline Wan components (no downloads)."""

import math

import pytest
import torch
from diffusers import WanImageToVideoPipeline, WanPipeline

from mmpos.camera import UnifiedCamera, orthonormalize, pose_from_rotation_translation, preset_trajectory
from mmpos.camera.video import CameraPath, video_cameras
from mmpos.integrations.diffusers.camera_adapter import CameraAdapter, camera_conditioning
from mmpos.models.tiny_wan import tiny_wan_components, tiny_wan_transformer
from mmpos.pipelines import CameraControlWanImageToVideoPipeline, CameraControlWanPipeline, load_camera_adapter
from tests.fixtures.tiny_models import CAMERA_VIDEO_CALL as CALL
from tests.fixtures.tiny_models import camera_video_frames as frames
from tests.fixtures.tiny_models import trained_looking

F64 = torch.float64
KINDS = ["ucpe", "prope", "plucker"]


def adapter_for(transformer, kind, seed=None, **options):
    adapter = CameraAdapter.for_transformer(transformer, kind, head_dim=16, **options)
    return adapter if seed is None else trained_looking(adapter, seed)


@pytest.fixture(scope="module")
def t2v():
    components = tiny_wan_components()
    stock, ours = WanPipeline(**components), CameraControlWanPipeline(**components)
    for pipe in (stock, ours):
        pipe.set_progress_bar_config(disable=True)
    return stock, ours


def processors(transformer):
    return [block.attn1.processor for block in transformer.blocks]


@pytest.mark.parametrize("kind", KINDS)
def test_zero_init_adapter_is_bit_identical_to_stock_and_trained_one_is_not(t2v, kind):
    stock, pipe = t2v
    before = processors(pipe.transformer)
    expected = frames(stock)
    pipe.camera_adapter = adapter_for(pipe.transformer, kind)
    assert torch.equal(frames(pipe, camera=preset_trajectory("orbit", 17, degrees=90)), expected)
    pipe.camera_adapter = adapter_for(pipe.transformer, kind, seed=1)
    changed = frames(pipe, camera=preset_trajectory("orbit", 17, degrees=90))
    assert (changed - expected).abs().max() > 1e-4
    assert torch.equal(frames(pipe, camera=preset_trajectory("orbit", 17, degrees=90), camera_scale=0.0), expected)
    assert processors(pipe.transformer) == before  # restored after every call
    assert torch.equal(frames(pipe), expected)  # no camera: the stock call


def test_frame_count_off_the_4k_plus_1_grid_follows_the_stock_rounding(t2v):
    stock, pipe = t2v  # 12 frames: the stock call makes 13 (4 latent frames), not 9 (3)
    pipe.camera_adapter = adapter_for(pipe.transformer, "plucker")
    expected = frames(stock, num_frames=12)
    assert torch.equal(frames(pipe, camera=preset_trajectory("orbit", 9), num_frames=12), expected)


def test_processors_are_restored_after_an_exception_mid_call(t2v):
    _, pipe = t2v
    before = processors(pipe.transformer)
    pipe.camera_adapter = adapter_for(pipe.transformer, "ucpe", seed=2)

    def fail(*_):
        assert processors(pipe.transformer) != before  # the adapter is in place during the call
        raise RuntimeError("stop at step 1")

    with pytest.raises(RuntimeError, match="stop at step 1"):
        frames(pipe, camera=preset_trajectory("pan", 9), callback_on_step_end=fail)
    assert processors(pipe.transformer) == before


def test_image_to_video_zero_init_is_bit_identical_to_stock():
    components = tiny_wan_components(image_to_video=True)
    stock, pipe = WanImageToVideoPipeline(**components), CameraControlWanImageToVideoPipeline(**components)
    image = torch.rand(1, 3, 32, 48, generator=torch.Generator().manual_seed(3))
    call = dict(CALL, image=image, max_sequence_length=512)  # the stock I2V processor assumes 512 text tokens
    for p in (stock, pipe):
        p.set_progress_bar_config(disable=True)
    expected = frames(stock, **call)
    pipe.camera_adapter = adapter_for(pipe.transformer, "ucpe")
    assert torch.equal(frames(pipe, **call, camera=preset_trajectory("dolly_in", 9)), expected)
    pipe.camera_adapter = adapter_for(pipe.transformer, "ucpe", seed=4)
    assert (frames(pipe, **call, camera=preset_trajectory("dolly_in", 9)) - expected).abs().max() > 1e-4


# --- world-frame invariance of the adapters' attention (fp64) -------------------------------------------------
GRID, IMAGE = (3, 2, 3), (32, 48)


def random_path(seed, frames=5):
    g = torch.Generator().manual_seed(seed)
    rotation = orthonormalize(torch.eye(3, dtype=F64) + 0.3 * torch.randn(frames, 3, 3, generator=g, dtype=F64))
    c2w = pose_from_rotation_translation(rotation, torch.randn(frames, 3, generator=g, dtype=F64))
    return c2w, UnifiedCamera.from_fov(48, 32, fov_degrees=120, xi=0.6) if seed % 2 else None


def world_motion(yaw_only: bool):
    """A rigid ``G`` (``c2w <- G c2w``): about world up (-y) only when the latitude/up map is in play."""
    angle = torch.tensor(0.7, dtype=F64)
    if yaw_only:
        c, s = torch.cos(angle), torch.sin(angle)
        rotation = torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=F64)
    else:
        rotation = orthonormalize(torch.randn(3, 3, generator=torch.Generator().manual_seed(9), dtype=F64))
    return pose_from_rotation_translation(rotation, torch.tensor([0.5, -1.0, 2.0], dtype=F64))


@pytest.mark.parametrize("kind,use_orientation", [("ucpe", True), ("ucpe", False), ("prope", False)])
def test_adapter_attention_is_invariant_to_the_world_frame(kind, use_orientation):
    transformer = tiny_wan_transformer().to(F64)
    adapter = adapter_for(transformer, kind, seed=5, use_orientation=use_orientation)
    c2w, unified = random_path(0)
    model = unified or preset_trajectory("orbit", 5).camera(0, 48, 32)
    g = world_motion(yaw_only=use_orientation)
    moved_c2w = g @ c2w
    one_changed = c2w.clone()
    one_changed[2, :3, 3] += torch.tensor([0.3, 0.0, 0.0], dtype=F64)
    x = torch.randn(2, math.prod(GRID), adapter.config.dim, generator=torch.Generator().manual_seed(6), dtype=F64)

    def residuals(poses):
        cams = video_cameras(CameraPath(poses, model), GRID, IMAGE, dtype=F64)
        conditioning = adapter.conditioning(cams)
        return torch.stack([conditioning.residual(i, x) for i in range(len(adapter.layers))])

    reference = residuals(c2w)
    assert reference.abs().max() > 1e-3
    assert (residuals(moved_c2w) - reference).abs().max() < 1e-10
    assert (residuals(one_changed) - reference).abs().max() > 1e-4


def test_whole_transformer_output_is_invariant_to_the_world_frame():
    transformer = tiny_wan_transformer().to(F64)
    adapter = adapter_for(transformer, "prope", seed=7)
    c2w, _ = random_path(2)
    model = preset_trajectory("orbit", 5).camera(0, 48, 32)
    g = torch.Generator().manual_seed(8)
    inputs = dict(
        hidden_states=torch.randn(1, 4, *GRID[:1], 4, 6, generator=g, dtype=F64),
        encoder_hidden_states=torch.randn(1, 5, 32, generator=g, dtype=F64),
        timestep=torch.tensor([500]),
    )

    def run(poses):
        with camera_conditioning(transformer, adapter, video_cameras(CameraPath(poses, model), GRID, IMAGE, F64)):
            return transformer(**inputs).sample

    assert (run(world_motion(False) @ c2w) - run(c2w)).abs().max() < 1e-10


def test_camera_level_composes_with_set_pe_and_leaves_it_installed():
    from mmpos.integrations.diffusers import set_pe
    from mmpos.integrations.diffusers.installer import ProcessorInstaller

    stock, ours = tiny_wan_transformer(), tiny_wan_transformer()
    set_pe(ours, "native")
    g = torch.Generator().manual_seed(13)
    inputs = dict(
        hidden_states=torch.randn(1, 4, 3, 4, 6, generator=g),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, 5, 32, generator=g),
    )
    cams = video_cameras(preset_trajectory("orbit", 9), GRID, IMAGE)
    with camera_conditioning(ours, adapter_for(ours, "ucpe"), cams):
        assert torch.equal(ours(**inputs).sample, stock(**inputs).sample)
    with camera_conditioning(ours, adapter_for(ours, "ucpe", seed=14), cams):
        assert (ours(**inputs).sample - stock(**inputs).sample).abs().max() > 1e-4
    installer = ProcessorInstaller.find(ours)
    assert installer.filled("encoding") and not installer.filled("camera")
    assert torch.equal(ours(**inputs).sample, stock(**inputs).sample)


# --- saving, loading, errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_save_and_load_round_trip(t2v, kind, tmp_path):
    _, pipe = t2v
    adapter = adapter_for(pipe.transformer, kind, seed=10)
    adapter.save_pretrained(tmp_path / kind)
    assert (tmp_path / kind / "diffusion_pytorch_model.safetensors").is_file()
    loaded = load_camera_adapter(pipe, tmp_path / kind)
    public = lambda config: {
        k: list(v) if isinstance(v, tuple) else v  # noqa: E731  (JSON keeps lists)
        for k, v in config.items()
        if not k.startswith("_")
    }
    assert public(loaded.config) == public(adapter.config)
    assert all(torch.equal(a, b) for a, b in zip(adapter.state_dict().values(), loaded.state_dict().values()))
    camera = preset_trajectory("tilt", 9)
    with_loaded = frames(pipe, camera=camera)
    pipe.camera_adapter = adapter
    assert torch.equal(frames(pipe, camera=camera), with_loaded)


def test_bad_cameras_get_named_errors(t2v):
    _, pipe = t2v
    pipe.camera_adapter = adapter_for(pipe.transformer, "ucpe")
    before = processors(pipe.transformer)
    bad = preset_trajectory("orbit", 9)
    bad.c2w[3, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="camera.*non-finite"):
        frames(pipe, camera=bad)
    bad = preset_trajectory("orbit", 9)
    bad.intrinsics[2, 0] = 0.0
    with pytest.raises(ValueError, match="camera: intrinsics"):
        frames(pipe, camera=bad)
    with pytest.raises(ValueError, match="camera: expected one CameraModel or a list of 9"):
        frames(pipe, camera=(preset_trajectory("orbit", 9).c2w, [bad.camera(0, 48, 32)] * 3))
    with pytest.raises(TypeError, match="camera must be"):
        frames(pipe, camera="orbit")
    other = CameraAdapter(kind="ucpe", dim=24, num_layers=3, head_dim=16)  # another model's
    with pytest.raises(ValueError, match="3 layers of width 24; the transformer has 2"):
        pipe.camera_adapter = other  # refused at assignment (issue 35), as load_camera_adapter refuses it
    pipe.__dict__["_camera_adapter"] = other  # past the setter: the call still checks before any work
    with pytest.raises(ValueError, match="3 layers of width 24; the transformer has 2"):
        frames(pipe, camera=preset_trajectory("orbit", 9))
    pipe.camera_adapter = adapter_for(pipe.transformer, "ucpe")
    with pytest.raises(ValueError, match="camera_scale"):
        frames(pipe, camera=preset_trajectory("orbit", 9), camera_scale=float("nan"))
    assert processors(pipe.transformer) == before
    pipe.camera_adapter = None
    with pytest.raises(ValueError, match="no camera adapter"):
        frames(pipe, camera=preset_trajectory("orbit", 9))


def test_trajectory_is_resampled_to_the_latent_frames_and_intrinsics_follow_the_output_size():
    traj = preset_trajectory("orbit", 40, degrees=120)
    cams = video_cameras(traj, (5, 2, 3), (32, 48), dtype=F64)  # 17 video frames -> 5 latent frames
    assert cams.c2w.shape == (1, 5, 4, 4)
    assert torch.allclose(cams.c2w[0, 0], traj.c2w[0]) and torch.allclose(cams.c2w[0, -1], traj.c2w[-1])
    assert torch.allclose(cams.intrinsics[0, 0], traj.intrinsic_matrices(48, 32)[0])


# --- UCPE's released checkpoints -------------------------------------------------------------------------------
def reference_checkpoint(layers=2, dim=24, attn_dim=16, prefix="dit.", seed=11):
    """A state dict with UCPE's key names and shapes (DiffSynth Wan blocks with a ``cam_self_attn`` module)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "q_proj": (attn_dim, dim),
        "k_proj": (attn_dim, dim),
        "v_proj": (attn_dim, dim),
        "out_proj": (dim, attn_dim),
        "cam_encoder": (dim, 3),
    }
    state = {f"{prefix}blocks.{i}.self_attn.q.weight": torch.randn(dim, dim, generator=g) for i in range(layers)}
    for i in range(layers):
        for name, shape in shapes.items():
            state[f"{prefix}blocks.{i}.cam_self_attn.{name}.weight"] = torch.randn(*shape, generator=g, dtype=F64)
            state[f"{prefix}blocks.{i}.cam_self_attn.{name}.bias"] = torch.randn(shape[0], generator=g, dtype=F64)
    return state


def test_ucpe_checkpoint_converts_and_matches_the_reference_layer_formula(tmp_path):
    from safetensors.torch import save_file

    from mmpos.integrations.diffusers.ucpe_checkpoint import convert_ucpe_state_dict, load_ucpe_checkpoint
    from tests.fixtures import camera_reference as ref

    state = reference_checkpoint()
    save_file(state, str(tmp_path / "ucpe.safetensors"))
    adapter = load_ucpe_checkpoint(tmp_path / "ucpe.safetensors", num_heads=1)
    assert adapter.dtype == F64  # the checkpoint's dtype
    assert (adapter.config.dim, adapter.config.num_layers, adapter.config.head_dim) == (24, 2, 16)
    assert adapter.config.use_orientation and tuple(adapter.config.ray_offset) == (0.0, 0.0)  # their rays' offset
    c2w, unified = random_path(1)
    cams = video_cameras(CameraPath(c2w, unified), GRID, IMAGE, dtype=F64)
    x = torch.randn(2, math.prod(GRID), 24, generator=torch.Generator().manual_seed(12), dtype=F64)
    residual = adapter.conditioning(cams).residual(1, x)

    def linear(name, t):  # the reference layer's own weights, by their reference names
        return (
            t @ state[f"dit.blocks.1.cam_self_attn.{name}.weight"].T + state[f"dit.blocks.1.cam_self_attn.{name}.bias"]
        )

    h = x + linear("cam_encoder", cams.orientation)
    q, k, v = (linear(n, h)[:, None] for n in ("q_proj", "k_proj", "v_proj"))  # one head: [B, 1, L, 16]
    frames = ref.ucpe_ray_frames(cams.c2w, cams.rays[0, 0])  # the patch rays are the same in every frame here
    attended = ref.projective_attention(q, k, v, frames.expand(2, -1, -1, -1), GRID[0], GRID[1:])
    expected = linear("out_proj", attended[:, 0]) * cams.valid.flatten(1)[..., None]
    assert (residual - expected).abs().max() < 1e-10
    with pytest.raises(ValueError, match="num_heads=3"):
        convert_ucpe_state_dict(state, num_heads=3)
    with pytest.raises(ValueError, match="no UCPE adapter keys"):
        convert_ucpe_state_dict({"blocks.0.self_attn.q.weight": torch.zeros(2, 2)})
    partial = {k: v for k, v in state.items() if ".1.cam_self_attn" not in k}
    partial.update({k.replace("blocks.1.", "blocks.2."): v for k, v in state.items() if ".1.cam_self_attn" in k})
    with pytest.raises(ValueError, match="expected every block"):
        convert_ucpe_state_dict(partial)
