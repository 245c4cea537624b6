"""Every registered encoding, tested by being registered (like timm's tests over ``list_models()``).

Each encoding is built from its ``example_options`` and checked against what its ``kind`` and ``capabilities``
claim: relative property (fp64), no input mutation, gradcheck, option validation, and a forward inside a timm
ViT and a tiny Flux. A check that does not apply is skipped with the capability that rules it out.
"""

import math

import pytest
import timm
import torch
from torch.func import functional_call

from mmpos.camera import Cameras, invert_pose, orthonormalize, pose_from_rotation_translation
from mmpos.coords.grids import image_grid
from mmpos.encodings import (
    Capabilities,
    PEKind,
    PositionalEncoding,
    create_pe,
    list_pes,
    pe_capabilities,
    pe_class,
    pe_options,
)
from mmpos.integrations.diffusers import set_pe
from mmpos.integrations.timm import convert, pe_parameters
from tests.conftest import logits
from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs

F64 = torch.float64
NAMES = list_pes()
ON_QK = (PEKind.ROTARY, PEKind.NONE)  # encodings called as q, k = pe(q, k, coords)
LENGTH = 5


def build(name, **overrides):
    return create_pe(name, **{**pe_class(name).example_options, **overrides})


def heads_of(pe) -> int:
    return getattr(pe, "num_heads", 2)


def qk(pe, seed=0, batch=1, length=LENGTH):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, heads_of(pe), length, pe.head_dim or 16)
    return torch.randn(shape, generator=g, dtype=F64), torch.randn(shape, generator=g, dtype=F64)


def coords_for(pe, seed=1, length=LENGTH):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(length, pe.num_axes, generator=g, dtype=F64) * 3


def absolute_inputs(pe):
    g = torch.Generator().manual_seed(0)
    coords = image_grid(*getattr(pe, "grid_size", (2, 3)), dtype=F64)  # integer cells: a table lookup
    return torch.randn(1, coords.shape[0], pe.embed_dim, generator=g, dtype=F64), coords


# ----------------------------------------------------------------------------------------------- camera inputs
GRID, IMAGE, CAMERAS = (2, 2), (16, 16), 2


def rig(world: torch.Tensor):
    """``(c2w, w2c, intrinsics, unit rays)`` of two cameras, seen from a world frame moved by ``world``."""
    g = torch.Generator().manual_seed(3)
    rotation = orthonormalize(torch.randn(1, CAMERAS, 3, 3, generator=g, dtype=F64))
    c2w = world @ pose_from_rotation_translation(rotation, torch.randn(1, CAMERAS, 3, generator=g, dtype=F64))
    k = torch.tensor([[20.0, 0, 8], [0, 22, 8], [0, 0, 1]], dtype=F64).expand(1, CAMERAS, 3, 3)
    rays = torch.randn(GRID[0] * GRID[1], 3, generator=g, dtype=F64)
    rays[:, 2] = rays[:, 2].abs() + 1
    return c2w, invert_pose(c2w), k, rays / rays.norm(dim=-1, keepdim=True)


def camera_forward(name, pe, x, world=None):
    """The encoding's output for tokens ``x`` through the camera contract (``geometry = pe.prepare(cameras)``):
    ``pe.embed_tokens(x [1, L, C], geometry)`` for an additive encoding, else ``pe.attention`` of ``q = k = v = x
    [1, H, L, D]`` (with per-token depths where it reads them)."""
    world = torch.eye(4, dtype=F64) if world is None else world
    c2w, _, k, rays = rig(world)
    cameras = Cameras(c2w=c2w, grid=GRID, image_size=IMAGE, intrinsics=k, rays=rays)
    geometry = pe.prepare(cameras)
    if pe.capabilities.additive:
        return pe.embed_tokens(x, geometry)
    per_layer = {}
    if pe.capabilities.predicts_depth:
        per_layer["depth_q"] = torch.linspace(-1, 1, 2 * x.shape[-2], dtype=F64).reshape(1, -1, 2)
    return pe.attention(x, x, x, geometry, **per_layer)


def camera_tokens(name, pe, seed=0):
    g = torch.Generator().manual_seed(seed)
    length = CAMERAS * GRID[0] * GRID[1]
    shape = (1, length, pe.embed_dim) if pe.capabilities.additive else (1, 2, length, pe.head_dim)
    return torch.randn(shape, generator=g, dtype=F64)


# -------------------------------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("name", NAMES)
def test_kind_capabilities_and_example_options_agree(name):
    cls = pe_class(name)
    assert isinstance(cls.kind, PEKind) and isinstance(cls.capabilities, Capabilities)
    assert issubclass(cls, PositionalEncoding) and cls.pe_name == name  # the typed base the registry returns
    assert pe_capabilities(name) is cls.capabilities
    assert set(cls.example_options) <= set(pe_options(name))
    pe = build(name)
    caps = pe.capabilities
    assert pe.kind == cls.kind
    assert caps.needs_cameras == (cls.kind == PEKind.CAMERA)
    assert caps.learnable == any(p.requires_grad for p in pe.parameters())
    if cls.kind != PEKind.ROTARY:
        assert not (caps.per_head_tables or caps.takes_extrapolation or caps.jitters_coords)
    assert caps.takes_extrapolation == ("extrapolation" in pe_options(name))
    if not caps.needs_cameras:
        assert not caps.world_frame_invariant
    if caps.folds_into_qkv:  # what the timm attention and the DiT call on an encoding that claims it
        assert all(callable(getattr(pe, m, None)) for m in ("folds_into", "fold_into_qkv", "rotate_mapped_qk"))
    if cls.kind == PEKind.ROTARY:  # per-head tables have one row per head; the others none
        table = pe.table(coords_for(pe), F64)
        lead = table.cis.shape[:-2] if hasattr(table, "cis") else table.matrices.shape[:-4]
        assert lead == ((heads_of(pe),) if caps.per_head_tables else ())


@pytest.mark.parametrize("name", NAMES)
def test_relative_property_matches_the_claim(name):
    """Where ``relative`` is claimed, logits depend only on coordinate offsets (fp64); a rotary encoding that
    does not claim it must actually break it (the capability is not understated)."""
    pe = build(name).double()  # learned angles are computed at the parameters' precision
    if pe.kind not in ON_QK:
        pytest.skip(f"{name} is of kind {pe.kind!s}: it does not act on q, k by coordinates")
    q, k = qk(pe)
    coords = coords_for(pe)
    shift = torch.randn(pe.num_axes, generator=torch.Generator().manual_seed(5), dtype=F64) * 7
    before = logits(*pe(q, k, coords))
    after = logits(*pe(q, k, coords + shift))
    err = (before - after).abs().max().item()
    if pe.capabilities.relative:
        assert err < 1e-9
    else:
        assert err > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_inputs_are_not_modified(name):
    pe = build(name)
    if pe.kind in ON_QK:
        q, k = qk(pe)
        coords = coords_for(pe)
        inputs = (q, k, coords)
        saved = [t.clone() for t in inputs]
        pe(*inputs)
        if pe.kind == PEKind.ROTARY:
            pe.rotate_qk(q, k, pe.table(coords, F64))
    elif pe.kind == PEKind.ABSOLUTE:
        inputs = absolute_inputs(pe.double())
        saved = [t.clone() for t in inputs]
        pe(*inputs)
    else:
        inputs = (camera_tokens(name, pe.double()),)
        saved = [inputs[0].clone()]
        camera_forward(name, pe, inputs[0])
    for before, after in zip(saved, inputs):
        assert torch.equal(before, after)


class Call(torch.nn.Module):
    """``call(pe, *args)`` as a module, so :func:`torch.func.functional_call` can substitute ``pe``'s parameters."""

    def __init__(self, pe, call):
        super().__init__()
        self.pe, self.call = pe, call

    def forward(self, *args):
        return self.call(self.pe, *args)


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck(name):
    """fp64 gradients through the activations, and through the parameters of learnable encodings."""
    pe = build(name).double()
    if pe.kind in ON_QK:
        q, k = qk(pe, length=3)
        coords = coords_for(pe, length=3)
        activations, module = (q, k), Call(pe, lambda pe, q, k: pe(q, k, coords))
    elif pe.kind == PEKind.ABSOLUTE:
        x, coords = absolute_inputs(pe)
        activations, module = (x,), Call(pe, lambda pe, x: pe(x, coords))
    else:
        activations, module = (camera_tokens(name, pe),), Call(pe, lambda pe, x: camera_forward(name, pe, x))
    params = dict(module.named_parameters())
    assert pe.capabilities.learnable == bool(params)

    def run(*args):
        values = args[len(activations) :]
        return functional_call(module, dict(zip(params, values)), args[: len(activations)])

    inputs = [t.detach().clone().requires_grad_() for t in (*activations, *params.values())]
    assert torch.autograd.gradcheck(run, inputs, fast_mode=True)


@pytest.mark.parametrize("name", NAMES)
def test_option_validation_names_the_option(name):
    with pytest.raises(TypeError, match="not_an_option"):
        build(name, not_an_option=1)
    size = "head_dim" if "head_dim" in pe_options(name) else "embed_dim"
    with pytest.raises(ValueError, match=size):
        build(name, **{size: -8})


# ------------------------------------------------------------------------------------------------- integrations
@pytest.mark.parametrize("name", NAMES)
def test_forward_inside_a_timm_vit(name):
    caps = pe_capabilities(name)
    if caps.needs_cameras:
        pytest.skip(f"{name} needs cameras; a ViT has only a patch grid")
    if not caps.reads_image_grid:
        pytest.skip(f"{name} does not read the (row, col) grid a ViT supplies (capabilities.reads_image_grid)")
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=3,
    )
    model = convert(model, pe=name)
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 3) and torch.isfinite(out).all()
    if caps.learnable:  # the encoding is trained with the model
        out.square().sum().backward()
        pe_grads = [p.grad for p in pe_parameters(model)]
        assert pe_grads and all(g is not None for g in pe_grads)


def reads_flux_grid(pe) -> bool:
    """Takes its axis count from the model (or wraps an encoding that does, as HARoPE)."""
    return pe.capabilities.reads_image_grid or (hasattr(pe, "base") and reads_flux_grid(pe.base))


@pytest.mark.parametrize("name", NAMES)
def test_forward_inside_a_tiny_flux(name):
    pe = build(name)
    if pe.kind not in ON_QK:
        pytest.skip(f"{name} is of kind {pe.kind!s}; the diffusers integration applies rotary encodings in attention")
    options = {}
    if reads_flux_grid(pe):
        options["coord_axes"] = (1, 2)  # Flux's (h, w) ids
    elif pe.num_axes != 3:
        pytest.skip(f"{name} reads {pe.num_axes} coordinate axes of its own design; Flux ids are (t, h, w)")
    model = tiny_flux(num_attention_heads=4)  # MHRoPE's default head split needs 4 heads
    inputs = tiny_flux_inputs()
    set_pe(model, name, **options)
    with torch.no_grad():
        out = model(**inputs).sample
    assert out.shape == inputs["hidden_states"].shape and torch.isfinite(out).all()


# ------------------------------------------------------------------------------------------- camera encodings
@pytest.mark.parametrize("name", list_pes(PEKind.CAMERA))
def test_world_frame_invariance_matches_the_claim(name):
    """Moving the world frame leaves a ``world_frame_invariant`` encoding's output unchanged and changes the
    others' (Plücker rays are absolute)."""
    pe = build(name).double()
    x = camera_tokens(name, pe)
    rotation = torch.tensor(
        [[math.cos(0.7), -math.sin(0.7), 0], [math.sin(0.7), math.cos(0.7), 0], [0, 0, 1]], dtype=F64
    )
    world = pose_from_rotation_translation(rotation, torch.tensor([0.3, -1.0, 2.0], dtype=F64))
    with torch.no_grad():
        err = (camera_forward(name, pe, x) - camera_forward(name, pe, x, world)).abs().max().item()
    if pe.capabilities.world_frame_invariant:
        assert err < 1e-9
    else:
        assert err > 1e-3
