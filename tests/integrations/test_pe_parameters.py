"""One PE-parameter / freeze API (mmpos.integrations.pe_parameters) for timm ViTs, the DiT and diffusers."""

import pytest
from timm.models.vision_transformer import VisionTransformer

import mmpos.integrations.timm as mt
from mmpos.integrations import diffusers as md
from mmpos.integrations.pe_parameters import freeze_all_but_pe, named_pe_parameters, pe_parameters, train_only_pe
from mmpos.models import DiT
from tests.fixtures.tiny_models import tiny_flux


def vit(pe):
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    return mt.convert(model, pe=pe)


def dit(pe):
    return DiT(sample_size=8, patch_size=2, in_channels=3, hidden_size=32, depth=2, num_heads=2, num_classes=4, pe=pe)


def flux(pe):
    model = tiny_flux()
    md.set_pe(model, pe)
    return model


@pytest.mark.parametrize("build", [vit, dit, flux])
def test_same_parameters_for_every_model_kind(build):
    model = build("rope_mixed")
    named = named_pe_parameters(model)
    assert named and all(name.endswith("freqs") for name, _ in named)
    assert [id(p) for p in pe_parameters(model)] == [id(p) for _, p in named]
    trainable = train_only_pe(model)
    assert [id(p) for p in trainable] == [id(p) for _, p in named]
    assert {id(p) for p in model.parameters() if p.requires_grad} == {id(p) for p in trainable}


def test_diffusers_names_are_the_shared_functions_after_set_pe():
    model = flux("rope_mixed")
    assert [id(p) for p in md.pe_parameters(model)] == [id(p) for p in pe_parameters(model)]
    assert [id(p) for p in md.train_only_pe(model, also=["proj_out"])] == [
        id(p) for p in train_only_pe(model, also=["proj_out"])
    ]
    with pytest.raises(ValueError, match="has no mmpos encoding installed"):
        md.pe_parameters(tiny_flux())


def test_also_keeps_named_parameters_trainable_and_checks_names():
    model = vit("rope_mixed")
    trainable = train_only_pe(model, also=["head"])
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names == ["blocks.0.attn.pe.freqs", "blocks.1.attn.pe.freqs", "head.weight", "head.bias"]
    assert [id(p) for p in trainable] == [id(model.get_parameter(n)) for n in names]
    with pytest.raises(ValueError, match="also: 'heads' names no parameter of VisionTransformer"):
        train_only_pe(model, also=["heads"])
    with pytest.raises(TypeError, match="also must be a list of names"):
        train_only_pe(model, also="head")


def test_parameter_free_encoding():
    model = vit("rope_axial")
    assert named_pe_parameters(model) == [] and pe_parameters(model) == []
    with pytest.raises(ValueError, match="no parameters to train"):
        train_only_pe(model)
    assert freeze_all_but_pe(model) == [] and not any(p.requires_grad for p in model.parameters())


def test_timm_exports_are_the_shared_functions():
    assert mt.pe_parameters is pe_parameters and mt.freeze_all_but_pe is freeze_all_but_pe
    assert mt.train_only_pe is train_only_pe and mt.named_pe_parameters is named_pe_parameters
