"""A converted timm ViT under timm's own export paths, the properties timm's model tests check, on tiny models:

* torch.fx (timm's ``get_graph_node_names`` / ``create_feature_extractor``, as ``test_model_forward_fx`` uses them):
  the traced model's output equals the eager one on inputs other than the tracing ones, and on another model the
  converted attention reads its tables at run time (not frozen at trace time);
* ``features_only`` (``test_model_forward_features``): one feature map per ``out_indices`` entry, ``[B, C, H/r, W/r]``
  with the channels and reductions of ``feature_info``, equal to the converted model's ``forward_intermediates``;
* ``torch.jit.script`` (``test_model_forward_torchscript``): refused by name.
"""

import pytest
import timm
import torch
from timm.layers import create_feature_extractor, get_graph_node_names
from timm.models.eva import Eva
from timm.models.vision_transformer import VisionTransformer

import mmpos.integrations.timm as mt

IMG, PATCH = 32, 8  # a 4x4 patch grid
VARIANTS = ["rope_axial", "rope_mixed", "ape_sincos", "ape_learned"]


def tiny_vit(**kw):
    torch.manual_seed(0)
    args = dict(img_size=IMG, patch_size=PATCH, embed_dim=32, depth=3, num_heads=2, num_classes=0)
    return VisionTransformer(**{**args, **kw}).eval()


def tiny_eva():
    torch.manual_seed(0)
    return Eva(img_size=IMG, patch_size=PATCH, embed_dim=32, depth=2, num_heads=2, num_classes=0).eval()


def traced(model):
    """timm's fx path: the last eval node of ``get_graph_node_names``, through ``create_feature_extractor``."""
    _, eval_nodes = get_graph_node_names(model)
    extractor = create_feature_extractor(model, return_nodes=[eval_nodes[-1]])
    return lambda x: tuple(extractor(x).values())[0]


@pytest.mark.parametrize("pe", VARIANTS)
@pytest.mark.parametrize("make", [tiny_vit, tiny_eva], ids=["vit", "eva"])
def test_an_fx_traced_converted_model_equals_eager(make, pe):
    model = mt.convert(make(), pe=pe)
    fx_model = traced(model)
    x = torch.randn(2, 3, IMG, IMG, generator=torch.Generator().manual_seed(1))  # not the tracing inputs
    with torch.no_grad():
        eager, fx_out = model(x), fx_model(x)
        without = mt.convert(make(), pe="nope")(x)
    torch.testing.assert_close(fx_out, eager, rtol=1e-5, atol=1e-6)
    assert (eager - without).abs().max() > 1e-4  # the positions take part (the trace kept them)


def test_an_fx_traced_model_reads_its_tables_at_run_time():
    """The attention is a leaf of the trace: changing the encoding after tracing changes the traced output as it
    changes the eager one (a table frozen into the graph at trace time would not follow)."""
    model = mt.convert(tiny_vit(), pe="rope_axial", theta=100.0)
    fx_model = traced(model)
    x = torch.randn(2, 3, IMG, IMG)
    with torch.no_grad():
        before = fx_model(x)
        model.mmpos_positions.grid_scale = 3.0  # coordinates 3x further apart from now on
        model.mmpos_positions._init_runtime()  # drop the cached grid
        after, eager = fx_model(x), model(x)
    torch.testing.assert_close(after, eager, rtol=1e-5, atol=1e-6)
    assert (after - before).abs().max() > 1e-3


@pytest.mark.parametrize("pe", VARIANTS)
def test_features_only_gives_the_feature_maps_of_the_converted_model(pe):
    out_indices = (0, 2)
    features = timm.create_model(
        mt.timm_model_name("vit_tiny_patch16_224", pe),
        img_size=IMG,
        patch_size=PATCH,
        depth=3,
        features_only=True,
        out_indices=out_indices,
    ).eval()
    full = mt.convert(timm.create_model("vit_tiny_patch16_224", img_size=IMG, patch_size=PATCH, depth=3), pe=pe)
    full.load_state_dict(features.model.state_dict(), strict=False)  # pruned: no final norm / head
    full.eval()
    x = torch.randn(2, 3, IMG, IMG)
    with torch.no_grad():
        maps = features(x)
        expected = full.forward_intermediates(x, indices=list(out_indices), intermediates_only=True)
    channels, reductions = features.feature_info.channels(), features.feature_info.reduction()
    assert len(maps) == len(out_indices) == len(channels)
    for fmap, c, r, want in zip(maps, channels, reductions, expected):
        assert fmap.shape == (2, c, IMG // r, IMG // r)
        torch.testing.assert_close(fmap, want, rtol=1e-5, atol=1e-6)


def test_restore_of_a_features_only_wrapper_gives_the_stock_maps():
    torch.manual_seed(0)
    features = timm.create_model(
        "vit_tiny_patch16_224", img_size=IMG, patch_size=PATCH, depth=3, features_only=True, out_indices=(1,)
    ).eval()
    x = torch.randn(1, 3, IMG, IMG)
    with torch.no_grad():
        stock = features(x)[0]
        converted = mt.convert(features, pe="rope_axial")(x)[0]
        restored = mt.restore(features)(x)[0]
    assert (converted - stock).abs().max() > 1e-3
    assert torch.equal(restored, stock)


@pytest.mark.parametrize("pe", ["rope_axial", "ape_sincos"])
def test_torch_jit_script_is_refused_by_name(pe):
    model = mt.convert(tiny_vit(), pe=pe)
    with pytest.raises(TypeError, match=f"torch.jit.script.*{pe!r}.*torch.compile"):
        torch.jit.script(model)
    mt.restore(model)
    assert not hasattr(model, "__prepare_scriptable__")
