"""The forward of a converted timm ViT in its four documented steps (``mmpos.integrations.timm.positions``):
start (patch embedding), keep (PatchDropout), prepare (``norm_pre``), apply (each attention), once each per
forward and in that order; every hook ``convert`` installs is a ``ForwardStep`` and ``restore`` removes them all."""

import copy
import io

import pytest
import torch
from timm.layers import PatchDropout
from timm.models.eva import Eva
from timm.models.naflexvit import NaFlexVit, NaFlexVitCfg
from timm.models.vision_transformer import VisionTransformer

import mmpos.integrations.timm as mt
from mmpos.integrations.timm.positions import ForwardStep, PositionalPatchDropout

pytestmark = pytest.mark.usefixtures("one_thread")
IMG, PATCH = 32, 8  # a 4x4 patch grid
TINY = dict(patch_size=PATCH, embed_dim=32, depth=2, num_heads=2)
MODELS = {
    "vit": lambda **kw: VisionTransformer(**{**TINY, "img_size": IMG, "num_classes": 5, **kw}),
    "eva": lambda **kw: Eva(**{**TINY, "img_size": IMG, "num_classes": 5, "use_rot_pos_emb": True, **kw}),
    "naflexvit": lambda **kw: NaFlexVit(NaFlexVitCfg(**{**TINY, **kw}), num_classes=5, img_size=IMG),
}


def mmpos_hooks(model):
    """``(module name, "pre" | "post", hook)`` of every ForwardStep hook on ``model``."""
    return [
        (name, kind, hook)
        for name, module in model.named_modules()
        for kind, hooks in (("pre", module._forward_pre_hooks), ("post", module._forward_hooks))
        for hook in hooks.values()
        if isinstance(hook, ForwardStep)
    ]


def record_steps(positions, monkeypatch) -> list[str]:
    """The names of the step methods ``positions`` runs, in call order."""
    calls = []
    for step in ("start", "keep", "build_tables", "table"):
        method = getattr(positions, step)

        def recorded(*args, _step=step, _method=method, **kwargs):
            calls.append(_step)
            return _method(*args, **kwargs)

        monkeypatch.setattr(positions, step, recorded)
    return calls


@pytest.mark.parametrize("family", ["vit", "eva"])
def test_one_forward_runs_the_four_steps_once_each_in_order(family, monkeypatch):
    model = mt.convert(MODELS[family](patch_drop_rate=0.5, depth=3), pe="rope_axial").train()
    calls = record_steps(model.mmpos_positions, monkeypatch)
    model(torch.randn(2, 3, IMG, IMG))
    assert calls == ["start", "keep", "build_tables"] + ["table"] * 3
    calls.clear()
    model(torch.randn(2, 3, IMG, IMG))
    assert calls == ["start", "keep", "build_tables"] + ["table"] * 3  # each forward starts afresh


@pytest.mark.parametrize("pe, prepare", [("rope_axial", "BlockTablesHook"), ("ape_sincos", "AddAbsoluteHook")])
def test_convert_installs_one_start_and_one_prepare_step_and_restore_removes_them(pe, prepare):
    model = MODELS["vit"](patch_drop_rate=0.25)
    mt.convert(model, pe=pe)
    hooks = [(name, kind, type(hook).__name__) for name, kind, hook in mmpos_hooks(model)]
    assert hooks == [("patch_embed.proj", "post", "ConvGridHook"), ("norm_pre", "pre", prepare)]
    assert type(model.patch_drop) is PositionalPatchDropout and model.patch_drop.prob == 0.25
    assert all(hook.positions is model.mmpos_positions for _, _, hook in mmpos_hooks(model))
    mt.restore(model)
    assert mmpos_hooks(model) == [] and type(model.patch_drop) is PatchDropout


def test_naflexvit_starts_its_forward_from_its_embeds():
    model = mt.convert(MODELS["naflexvit"](), pe="rope_mixed")
    assert [(name, type(hook).__name__) for name, _, hook in mmpos_hooks(model)] == [
        ("embeds", "NaFlexEmbedsHook"),
        ("norm_pre", "BlockTablesHook"),
    ]


def test_a_deep_copy_drops_patches_into_its_own_positions():
    """EMA copies: the copy's PatchDropout reports to the copy's positions, not the original's."""
    model = mt.convert(MODELS["vit"](patch_drop_rate=0.5), pe="rope_axial").train()
    ema = copy.deepcopy(model)
    assert ema.patch_drop.positions is ema.mmpos_positions is not model.mmpos_positions
    ema(torch.randn(2, 3, IMG, IMG))
    assert ema.mmpos_positions.keep_indices.shape == (2, 8) and model.mmpos_positions.keep_indices is None


@pytest.mark.parametrize("pe", ["rope_mixed", "ape_learned"])
def test_a_converted_model_saves_and_loads_whole_and_computes_the_same(pe):
    """``torch.save(model)`` (pickle): the loaded copy has its own positions, hooks and PatchDropout, and the
    same outputs and ``no_weight_decay()``."""
    model = mt.convert(MODELS["vit"](patch_drop_rate=0.5, dynamic_img_size=True), pe=pe).eval()
    images = torch.randn(2, 3, IMG, IMG)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    assert loaded.mmpos_positions is not model.mmpos_positions
    assert all(hook.positions is loaded.mmpos_positions for _, _, hook in mmpos_hooks(loaded))
    assert loaded.patch_drop.positions is loaded.mmpos_positions
    assert loaded.no_weight_decay() == model.no_weight_decay()
    assert mt.no_weight_decay_names(loaded) and mt.no_weight_decay_names(loaded) <= loaded.no_weight_decay()
    with torch.no_grad():
        assert torch.equal(loaded(images), model(images))
        loaded(torch.randn(1, 3, 48, 40))
    assert loaded.mmpos_positions.grid == (6, 5) and model.mmpos_positions.grid == (4, 4)
