"""mmpos encodings inside timm ViTs (VisionTransformer, Eva, NaFlexVit) through ``convert``."""

import copy

import pytest
import timm
import torch
from timm.models.eva import Eva
from timm.models.naflexvit import NaFlexVit, NaFlexVitCfg
from timm.models.vision_transformer import VisionTransformer

import mmpos
import mmpos.integrations.timm as mt
from mmpos.encodings import pe_class
from mmpos.integrations.timm.models import image_pes
from tests.fixtures.asserts import assert_grads_match

ROTARY = [pe for pe in image_pes() if pe_class(pe).kind == "rotary"]
RELATIVE = [pe for pe in ROTARY if pe != "liere"]  # LieRE is not relative by design (the negative control)
IMG, PATCH = 32, 8  # 4x4 patch grid; 1.5x resolution is 48 px, a 6x6 grid


def tiny_vit(**kw):
    args = dict(img_size=IMG, patch_size=PATCH, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    return VisionTransformer(**{**args, **kw})


def tiny_eva(**kw):
    args = dict(
        img_size=IMG,
        patch_size=PATCH,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=5,
        use_rot_pos_emb=True,
        use_abs_pos_emb=True,
    )
    if "reg_tokens" in kw:
        kw["num_reg_tokens"] = kw.pop("reg_tokens")
    return Eva(**{**args, **kw})


def tiny_naflex(**kw):
    cfg = NaFlexVitCfg(**{**dict(patch_size=PATCH, embed_dim=32, depth=2, num_heads=2), **kw})
    return NaFlexVit(cfg, num_classes=5, img_size=IMG)


MODELS = {"vit": tiny_vit, "eva": tiny_eva, "naflexvit": tiny_naflex}


def block0_input(model, images):
    """Run ``model`` on ``images`` and return what block 0's attention received."""
    seen = {}
    handle = model.blocks[0].attn.register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    model(images)
    handle.remove()
    return seen["x"]


@pytest.mark.parametrize("pe", image_pes())
@pytest.mark.parametrize("family", ["vit", "eva"])
def test_forward_backward_at_train_and_larger_resolution(family, pe):
    model = mt.convert(MODELS[family](dynamic_img_size=True, reg_tokens=1), pe=pe)
    for size in (IMG, IMG * 3 // 2):
        model.zero_grad()
        out = model(torch.randn(2, 3, size, size))
        assert out.shape == (2, 5)
        out.square().mean().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert model.mmpos_positions.grid == (size // PATCH,) * 2


def test_naflexvit_runs_on_images_and_patch_coords():
    model = mt.convert(tiny_naflex(), pe="rope_mixed")
    assert model(torch.randn(2, 3, 48, 32)).shape == (2, 5)
    assert model.mmpos_positions.grid == (6, 4)
    rows, cols = torch.meshgrid(torch.arange(3), torch.arange(5), indexing="ij")
    coord = torch.stack([rows, cols], -1).reshape(1, 15, 2).expand(2, -1, -1)
    patches = torch.randn(2, 15, PATCH * PATCH * 3)
    out = model.forward_features(patches, patch_coord=coord, patch_valid=torch.ones(2, 15, dtype=torch.bool))
    out = out["patches"]
    assert out.shape[:2] == (2, 15 + model.num_prefix_tokens)
    assert torch.equal(model.mmpos_positions.coords(out.shape[1], out.device), coord.float())


def _logits_by_offset(logits, coords):
    """Map each 2D offset between patch tokens to the logits ``[H]`` of all pairs with that offset."""
    groups = {}
    for i in range(coords.shape[0]):
        for j in range(coords.shape[0]):
            key = tuple((coords[i] - coords[j]).tolist())
            groups.setdefault(key, []).append(logits[:, i, j])
    return {k: torch.stack(v) for k, v in groups.items()}


@pytest.mark.parametrize("pe", RELATIVE)
@pytest.mark.parametrize("family", ["vit", "eva", "naflexvit"])
def test_attention_logits_depend_only_on_offsets(family, pe):
    """With identical patch contents, q_i . k_j must be a function of pos_i - pos_j alone (fp64)."""
    model = mt.convert(MODELS[family](), pe=pe).double().eval()
    image = torch.full((1, 3, IMG, IMG), 0.3, dtype=torch.float64)  # every patch token the same
    x = block0_input(model, image)
    n = model.num_prefix_tokens
    q, k, _ = model.blocks[0].attn.encoded_qkv(x)
    logits = (q @ k.transpose(-1, -2))[0, :, n:, n:]
    coords = model.mmpos_positions.coords(x.shape[1], x.device)
    groups = _logits_by_offset(logits, coords)
    spread = max((g - g[0]).abs().max().item() for g in groups.values())
    assert spread < 1e-10 * logits.abs().max().item()
    assert len(groups) == (2 * 4 - 1) ** 2  # and the offsets are told apart: not all logits equal
    assert logits.std() > 1e-3


@pytest.mark.parametrize("pe", ROTARY)
def test_prefix_tokens_are_untouched(pe):
    reference = tiny_vit(reg_tokens=2, pos_embed="none").double().eval()
    model = mt.convert(copy.deepcopy(reference), pe=pe).double().eval()
    images = torch.randn(2, 3, IMG, IMG, dtype=torch.float64)
    x = block0_input(model, images)
    assert torch.equal(x, block0_input(reference, images))
    q, k, v = model.blocks[0].attn.encoded_qkv(x)
    attn = reference.blocks[0].attn
    q0, k0, v0 = attn.qkv(x).reshape(2, x.shape[1], 3, 2, 16).permute(2, 0, 3, 1, 4)
    n = model.num_prefix_tokens
    assert n == 3
    assert torch.equal(q[:, :, :n], q0[:, :, :n]) and torch.equal(k[:, :, :n], k0[:, :, :n])
    assert torch.equal(v, v0)
    assert not torch.allclose(q[:, :, n:], q0[:, :, n:])


@pytest.mark.parametrize("family", ["vit", "eva"])
def test_patch_dropout_keeps_each_tokens_own_coordinates(family):
    """Dropped-out sequences must be encoded exactly as the same tokens in the full sequence (fp64)."""
    model = mt.convert(MODELS[family](patch_drop_rate=0.5), pe="rope_mixed").double()
    images = torch.randn(3, 3, IMG, IMG, dtype=torch.float64)
    n = model.num_prefix_tokens
    model.train()
    x_kept = block0_input(model, images)
    keep = model.mmpos_positions.keep_indices
    assert keep.shape == (3, 8) and not torch.equal(keep[0], keep[1])
    q_kept, k_kept, _ = model.blocks[0].attn.encoded_qkv(x_kept)
    model.eval()
    x_full = block0_input(model, images)
    q_full, k_full, _ = model.blocks[0].attn.encoded_qkv(x_full)
    rows = torch.cat([torch.arange(n).expand(3, -1), keep + n], dim=1)  # [B, n + K] token indices
    pick = lambda t: t.gather(2, rows[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[-1]))
    torch.testing.assert_close(q_kept, pick(q_full), rtol=0, atol=1e-12)
    torch.testing.assert_close(k_kept, pick(k_full), rtol=0, atol=1e-12)


def test_shared_encoding_builds_one_table_per_grid():
    model = mt.convert(tiny_vit(depth=3, dynamic_img_size=True), pe="rope_axial").eval()
    pes = {id(b.attn.pe) for b in model.blocks}
    assert len(pes) == 1
    cache = model.blocks[0].attn.pe.cache
    model(torch.randn(1, 3, IMG, IMG))
    model(torch.randn(1, 3, IMG, IMG))
    assert cache.builds == 1
    model(torch.randn(1, 3, 48, 48))
    assert cache.builds == 2


def test_repeated_grids_hit_the_table_cache_without_comparing_values(monkeypatch):
    model = mt.convert(tiny_vit(depth=2), pe="rope_axial").eval()
    x = torch.randn(1, 3, IMG, IMG)
    model(x)
    compared = []
    original = torch.equal
    monkeypatch.setattr(torch, "equal", lambda a, b: compared.append(1) or original(a, b))
    model(x)  # the same coordinate tensor: an identity hit (a value comparison would sync a GPU every step)
    assert not compared and model.blocks[0].attn.pe.cache.builds == 1
    model.set_input_size((48, 48))  # alternating resolutions keep hitting by identity (a few grids are kept)
    model(torch.randn(1, 3, 48, 48))
    compared.clear()
    model.set_input_size((IMG, IMG))
    model(x)
    model.set_input_size((48, 48))
    model(torch.randn(1, 3, 48, 48))
    assert not compared and model.blocks[0].attn.pe.cache.builds == 2


@pytest.mark.parametrize("pe", ["rope_mixed", "rope_axial"])
def test_conversion_keeps_every_other_weight(pe):
    model = tiny_vit(reg_tokens=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mt.convert(model, pe=pe, share_pe=False)
    after = model.state_dict()
    pe_keys = {k for k in after if ".attn.pe." in k}
    assert set(after) - pe_keys == set(before) - {"pos_embed"}
    for key in set(after) - pe_keys:
        assert torch.equal(after[key], before[key]), key
    # an APE checkpoint loads into the converted model: only the PE differs
    result = model.load_state_dict(before, strict=False)
    assert set(result.missing_keys) == pe_keys and result.unexpected_keys == ["pos_embed"]


def test_pretrained_checkpoint_through_registered_name(tmp_path):
    kw = dict(img_size=IMG, patch_size=PATCH, depth=2)  # 1000 classes, as the checkpoint cfg says
    source = timm.create_model("vit_tiny_patch16_224", **kw)
    path = tmp_path / "vit_tiny.pth"
    torch.save(source.state_dict(), path)
    model = timm.create_model(
        "vit_tiny_patch16_224_mmpos_rope_mixed",
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(path)),
        pe_theta=100.0,
        **kw,
    )
    assert isinstance(model.blocks[0].attn, mt.PositionalAttention) and model.pos_embed is None
    magnitudes = model.blocks[1].attn.pe.freqs.norm(dim=1)  # [H, P]: theta ** (-4p / head_dim)
    torch.testing.assert_close(magnitudes[:, 1], torch.full((3,), 100.0 ** (-4 / 64)))
    weights = source.state_dict()
    for key, value in model.state_dict().items():
        if ".pe." not in key:
            assert torch.equal(value, weights[key]), key


def test_learned_ape_takes_over_timm_pos_embed_and_resamples():
    reference = tiny_vit(reg_tokens=1, dynamic_img_size=True).double().eval()
    with torch.no_grad():
        reference.pos_embed.normal_()
        reference.cls_token.normal_()
    model = mt.convert(copy.deepcopy(reference), pe="ape_learned").double().eval()
    assert model.pos_embed is None and isinstance(model.mmpos_ape, mmpos.encodings.LearnedAPE)
    images = torch.randn(2, 3, IMG, IMG, dtype=torch.float64)
    torch.testing.assert_close(model(images), reference(images), rtol=1e-10, atol=1e-12)  # summation order
    big = torch.randn(2, 3, 48, 48, dtype=torch.float64)
    assert model(big).shape == (2, 5)  # resampled table (reference resamples the prefix rows too, so differs)


def test_frozen_backbone_trains_only_the_encoding():
    model = mt.convert(tiny_vit(), pe="rope_mixed")
    names = mt.freeze_all_but_pe(model)
    assert names == ["blocks.0.attn.pe.freqs", "blocks.1.attn.pe.freqs"]
    model(torch.randn(2, 3, IMG, IMG)).sum().backward()
    for name, param in model.named_parameters():
        assert (param.grad is not None) == (name in names), name
    assert all(model.get_parameter(n).grad.abs().sum() > 0 for n in names)


def test_no_weight_decay_reaches_timm_optimizer():
    from timm.optim import create_optimizer_v2

    model = mt.convert(tiny_vit(), pe="rope_mixed")
    assert {"blocks.0.attn.pe.freqs", "blocks.1.attn.pe.freqs", "cls_token"} <= model.no_weight_decay()
    optimizer = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    no_decay = next(g for g in optimizer.param_groups if g["weight_decay"] == 0.0)
    freqs = {id(model.blocks[i].attn.pe.freqs) for i in range(2)}
    assert freqs <= {id(p) for p in no_decay["params"]}
    assert mt.convert(copy.deepcopy(tiny_vit()), pe="rope_axial").no_weight_decay() == tiny_vit().no_weight_decay()


def test_registered_names_pass_options():
    model = timm.create_model(
        "vit_tiny_patch16_224_mmpos_rope_axial",
        img_size=IMG,
        patch_size=PATCH,
        depth=1,
        pe_theta=100.0,
        abs_pos="keep",
        dynamic_img_size=True,
    )
    assert model.pos_embed is not None and model.blocks[0].attn.pe.spectrum.inv_freq[1].item() == pytest.approx(
        100.0 ** (-2 / 32)
    )  # head_dim 64: 16 pairs per axis
    assert model(torch.randn(1, 3, 48, 40)).shape == (1, 1000)
    assert "vit_small_patch16_224_mmpos_rope_mixed" in timm.list_models("*_mmpos_*")
    assert not any(name.endswith("_mmpos_rope_1d") for name in timm.list_models("*_mmpos_*"))


def test_train_wrapper_runs_a_timm_script_with_the_names(tmp_path, capsys):
    from mmpos.integrations.timm.train import main

    script = tmp_path / "train.py"
    script.write_text(
        "import sys, timm\nm = timm.create_model(sys.argv[1], img_size=32, patch_size=8, depth=1)\n"
        "print('built', type(m.blocks[0].attn).__name__)\n"
    )
    main([str(script), "vit_tiny_patch16_224_mmpos_rope_mixed"])
    assert "built PositionalAttention" in capsys.readouterr().out


# ---------------------------------------------------------------- errors
def test_unknown_model_class():
    with pytest.raises(TypeError, match="cannot convert a .*ResNet.*supports timm VisionTransformer, Eva"):
        mt.convert(timm.create_model("resnet18", num_classes=2), pe="rope_axial")


def test_encoding_that_does_not_fit_the_heads():
    model = tiny_vit(embed_dim=12, num_heads=2)  # head_dim 6
    with pytest.raises(
        ValueError,
        match="encoding 'rope_mixed' does not fit VisionTransformer attention "
        r"\(head_dim=6.*multiple of 4",
    ):
        mt.convert(model, pe="rope_mixed")
    with pytest.raises(ValueError, match="built for head_dim=32 but block 0's attention has head_dim=16"):
        mt.convert(tiny_vit(), pe="rope_axial", head_dim=32)
    with pytest.raises(ValueError, match="reads 3 coordinate axes but block 0's attention gives its tokens 2"):
        mt.convert(tiny_vit(), pe="rope_axial", num_axes=3)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['thetta'\]"):
        mt.convert(tiny_vit(), pe="rope_axial", thetta=3)
    with pytest.raises(ValueError, match="unknown encoding 'rope_magic'"):
        mt.convert(tiny_vit(), pe="rope_magic")
    with pytest.raises(ValueError, match="abs_pos='drop'"):
        mt.convert(tiny_vit(), pe="rope_axial", abs_pos="drop")
    with pytest.raises(ValueError, match="grid_indexing='yx'"):
        mt.convert(tiny_vit(), pe="rope_axial", grid_indexing="yx")
    with pytest.raises(ValueError, match=r"ape_learned looks up a \(rows, cols\) table"):
        mt.convert(tiny_vit(), pe="ape_learned", grid_indexing="xy")


def test_grid_that_does_not_match_the_tokens():
    model = mt.convert(tiny_vit(), pe="rope_axial")
    x = torch.randn(1, 1 + 16, 32)
    model.mmpos_positions.start(grid=(3, 5))
    with pytest.raises(
        ValueError,
        match="a 3x5 patch grid gives 15 patch tokens but attention sees 17 tokens "
        r"with 1 prefix token\(s\), i.e. 16",
    ):
        model.blocks[0].attn(x)


def test_converting_twice_is_an_error():
    model = mt.convert(tiny_vit(), pe="rope_axial")
    with pytest.raises(ValueError, match="already converted to 'rope_axial'"):
        mt.convert(model, pe="rope_mixed")


@pytest.mark.parametrize("pe", ["rope_mixed", "ape_sincos"])
def test_deep_copies_track_their_own_positions(pe):
    """EMA copies (copy.deepcopy) must record and read their own token positions."""
    model = mt.convert(tiny_vit(dynamic_img_size=True), pe=pe).eval()
    ema = copy.deepcopy(model)
    assert ema.mmpos_positions is not model.mmpos_positions
    assert ema.blocks[1].attn.positions is ema.mmpos_positions if pe == "rope_mixed" else True
    model(torch.randn(1, 3, IMG, IMG))
    out = ema(torch.randn(1, 3, 48, 40))
    assert out.shape == (1, 5)
    assert ema.mmpos_positions.grid == (6, 5) and model.mmpos_positions.grid == (4, 4)


@pytest.mark.parametrize("pe", ["rope_axial", "ape_learned"])
def test_static_model_follows_set_input_size(pe):
    model = mt.convert(tiny_vit(), pe=pe).eval()
    model.set_input_size(img_size=(48, 40))
    assert model(torch.randn(1, 3, 48, 40)).shape == (1, 5)
    assert model.mmpos_positions.grid == (6, 5)
    coords = model.mmpos_positions.coords(1 + 30, torch.device("cpu"))
    assert coords[-1].tolist() == [5.0, 4.0]


@pytest.fixture
def new_learned_encoding():
    """A rotary encoding with parameters registered after import (as ComRoPE/HARoPE will be)."""
    from mmpos.encodings import MixedRoPE, registry

    cls = mmpos.register_pe("test_late_learned_rope")(type("LateLearnedRoPE", (MixedRoPE,), {}))
    yield cls.pe_name
    registry._REGISTRY.pop(cls.pe_name)
    from timm.models import _registry as timm_registry

    for name in timm.list_models(f"*_mmpos_{cls.pe_name}"):
        timm_registry._clear_model_entries(name)
        timm_registry._model_entrypoints.pop(name, None)


def test_encodings_registered_later_plug_in(new_learned_encoding):
    from mmpos.models import DiT

    pe = new_learned_encoding
    model = mt.convert(tiny_vit(depth=3), pe=pe)
    assert len({id(b.attn.pe) for b in model.blocks}) == 3  # parameters: one instance per block
    assert {f"blocks.{i}.attn.pe.freqs" for i in range(3)} <= model.no_weight_decay()
    assert model(torch.randn(1, 3, IMG, IMG)).shape == (1, 5)
    added = mt.register_timm_models(pes=[pe])
    assert f"vit_tiny_patch16_224_mmpos_{pe}" in added
    timm.create_model(f"vit_tiny_patch16_224_mmpos_{pe}", img_size=IMG, patch_size=PATCH, depth=1)
    dit = DiT(sample_size=8, patch_size=2, in_channels=3, hidden_size=32, depth=2, num_heads=2, num_classes=4, pe=pe)
    assert len(dit.rotary_pes) == 2


@pytest.mark.parametrize("indexing", ["xy", "ij"])
@pytest.mark.parametrize("timm_rope,pe,temperature", [("mixed", "rope_mixed", 10.0), ("cat", "rope_axial", 100.0)])
def test_timm_rope_models_keep_their_function(timm_rope, pe, temperature, indexing):
    """A timm rope Eva (rope-vit port layouts) converted to the matching mmpos encoding computes timm's own
    features: RoPE-Mixed frequencies are taken over, axial gets timm's temperature and axis order (timm
    computes angles in fp32, hence 1e-6)."""
    reference = (
        tiny_eva(
            use_abs_pos_emb=False,
            rope_type=timm_rope,
            attn_type="rope",
            rope_temperature=temperature,
            rope_grid_indexing=indexing,
        )
        .double()
        .eval()
    )
    with torch.no_grad():
        if timm_rope == "mixed":
            reference.rope.freqs.mul_(3.0)  # away from mmpos' own init
        for block in reference.blocks:
            block.attn.qkv.weight.mul_(10.0)  # peaked attention, so positions matter
    model = mt.convert(copy.deepcopy(reference), pe=pe).double().eval()
    assert model.rope is None and isinstance(model.blocks[0].attn, mt.PositionalAttentionRope)
    images = torch.randn(2, 3, IMG, IMG, dtype=torch.float64)
    expected = reference.forward_features(images)  # without the matching these differ by ~0.1-0.2 (of ~2)
    tolerance = 1e-6 * expected.abs().max().item()
    torch.testing.assert_close(model.forward_features(images), expected, rtol=0, atol=tolerance)
    if pe == "rope_axial":  # the axis order matters (mixed frequencies are taken over in either order)
        other = mt.convert(copy.deepcopy(reference), pe=pe, grid_indexing="ij" if indexing == "xy" else "xy")
        assert (other.forward_features(images) - expected).abs().max() > 1e-3


def test_unsupported_attention_class_fails_before_changing_the_model():
    from timm.layers.attention import AttentionRope

    class CustomAttention(AttentionRope):
        pass

    model = tiny_eva(attn_type="rope", dynamic_img_size=False)
    model.blocks[1].attn.__class__ = CustomAttention
    with pytest.raises(TypeError, match=r"blocks\[1\]\.attn is a .*CustomAttention; mmpos can convert Attention"):
        mt.convert(model, pe="rope_axial", dynamic_img_size=True)
    assert type(model.blocks[0].attn) is AttentionRope and model.rope is not None and not model.dynamic_img_size


@pytest.mark.parametrize("family", ["vit", "eva"])
def test_intermediates_and_gradient_checkpointing(family):
    model = mt.convert(MODELS[family](dynamic_img_size=True), pe="rope_mixed").double()
    images = torch.randn(2, 3, 48, 40, dtype=torch.float64)
    features = model.forward_intermediates(images, intermediates_only=True)
    assert [tuple(f.shape) for f in features] == [(2, 32, 6, 5)] * 2
    model(images).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(images).sum().backward()
    for name, param in model.named_parameters():  # recomputed blocks reach the per-block encodings too
        torch.testing.assert_close(param.grad, grads[name], rtol=1e-9, atol=1e-12, msg=name)


def test_self_jittering_encodings_are_refused_at_conversion():
    with pytest.raises(ValueError, match="perturbation / offset_std jitter the encoding's own grid"):
        mt.convert(tiny_vit(), pe="comrope_ld", block_size=2, offset_std=0.1, grid_size=(4, 4))


@pytest.mark.parametrize("pe", ["plucker", "prope", "rayrope", "ucpe"])
def test_camera_encodings_are_refused_instead_of_a_silent_nope(pe):
    model = tiny_vit()
    with pytest.raises(TypeError, match=f"{pe!r} is a camera encoding"):
        mt.convert(model, pe=pe)
    assert model.pos_embed is not None and not hasattr(model, "mmpos_pe")  # untouched


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed"])
def test_inference_mode_then_training(pe):
    model = mt.convert(tiny_vit(depth=2), pe=pe).eval()
    x = torch.randn(2, 3, IMG, IMG)
    with torch.inference_mode():  # first call: coordinates and tables are inference tensors (no version counter)
        first = model(x)
        again = model(x)
    with torch.no_grad():
        torch.testing.assert_close(model(x), first, rtol=0, atol=0)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    model.train()
    model(x).sum().backward()  # tables from inference_mode are never reused by autograd
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------- tables once per forward
def _count_calls(monkeypatch, owner, name):
    """Wrap ``owner.name`` with a call counter; returns the list that grows by one per call."""
    calls, original = [], getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **kw: calls.append(1) or original(*a, **kw))
    return calls


@pytest.mark.parametrize("family", ["vit", "eva", "naflexvit"])
@pytest.mark.parametrize("pe,distinct", [("rope_axial", 1), ("rope_mixed", 4), ("comrope_ap", 4)])
def test_coordinates_checked_and_tables_built_once_per_forward(monkeypatch, family, pe, distinct):
    """One finiteness check (a host sync on CUDA) per forward, and one table per distinct encoding (one for a
    shared encoding, one per block for learned ones), however deep the model."""
    import mmpos.ops.tables as tables

    model = mt.convert(MODELS[family](depth=4), pe=pe)
    assert len({id(b.attn.pe) for b in model.blocks}) == distinct
    checks = _count_calls(monkeypatch, tables, "check_finite")
    encodings = {id(b.attn.pe): b.attn.pe for b in model.blocks}.values()
    built = [_count_calls(monkeypatch, encoding, "table") for encoding in encodings]
    for grad in (False, True):  # cached tables (no grad) and tables rebuilt for autograd
        with torch.set_grad_enabled(grad):
            model(torch.randn(2, 3, IMG, IMG))
        assert len(checks) == 1 and [len(b) for b in built] == [1] * distinct
        checks.clear()
        for b in built:
            b.clear()


def _per_layer_encoded_qkv(self, x):
    """The attention path before tables were built once per forward: ``pe(q, k, coords)`` in every block."""
    q, k, v = self._project(x)
    q, k = self.q_norm(q), self.k_norm(k)
    groups = getattr(self, "num_kv_groups", 1)
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    q, k = self.pe(q, k, self.positions.coords(x.shape[1], x.device))
    return q, k, v.to(q.dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "pe,share",
    [("rope_axial", None), ("rope_mixed", None), ("comrope_ld", None), ("liere", None), ("rope_mixed", True)],
)
@pytest.mark.parametrize("family", ["vit", "eva", "naflexvit"])
def test_tables_once_per_forward_match_the_per_layer_path_bit_for_bit(monkeypatch, family, pe, share, dtype):
    """Outputs (with PatchDropout in training, at two resolutions) equal the per-layer ``pe(q, k, coords)`` path
    exactly; gradients too, except the order in which a shared learned table sums its blocks' gradients."""
    kw = dict(depth=3, patch_drop_rate=0.25) | ({} if family == "naflexvit" else dict(dynamic_img_size=True))
    torch.manual_seed(0)
    model = mt.convert(MODELS[family](**kw), pe=pe, share_pe=share).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)

    def run(images):
        model.zero_grad()
        torch.manual_seed(1)  # the same tokens dropped
        out = model(images)
        out.square().sum().backward()
        return out.detach(), [p.grad for p in model.parameters()]

    for size in (IMG, 48):
        images = torch.randn(2, 3, size, size, dtype=dtype)
        out, grads = run(images)
        with monkeypatch.context() as patch:
            patch.setattr(mt.attention._PositionalAttention, "encoded_qkv", _per_layer_encoded_qkv)
            expected, expected_grads = run(images)
        assert torch.equal(out, expected)
        assert_grads_match(grads, expected_grads, share, dtype)


@pytest.mark.parametrize("pe", ["rope_mixed", "comrope_ap"])
def test_two_threads_with_different_image_sizes(pe):
    """Per-forward state (patch grid, coordinates, tables) belongs to the calling thread, not the model: two
    threads at 32 and 48 px give exactly the single-threaded results. (Learned encodings with autograd on build
    their tables afresh: the encodings' own table cache is not what this test is about.)"""
    import sys
    import threading

    model = mt.convert(tiny_vit(depth=3, dynamic_img_size=True), pe=pe).eval()
    inputs = {size: torch.randn(2, 3, size, size) for size in (IMG, 48)}
    expected = {size: model(x).detach() for size, x in inputs.items()}
    results, errors = {size: [] for size in inputs}, []
    start = threading.Barrier(len(inputs))

    def work(size):
        try:
            start.wait()
            for _ in range(30):
                results[size].append(model(inputs[size]).detach())
        except Exception as error:  # reported below: an exception in a thread would otherwise be lost
            errors.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so forwards interleave
    try:
        threads = [threading.Thread(target=work, args=(size,)) for size in inputs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    for size, outs in results.items():
        assert len(outs) == 30 and all(torch.equal(out, expected[size]) for out in outs)
