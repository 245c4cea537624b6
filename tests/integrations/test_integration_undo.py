"""Every integration's switch has a way back to the original model, bit for bit, trainable flags included:
timm ``convert`` -> ``restore``, diffusers ``set_pe`` -> ``restore``, transformers ``use_multimodal_rope`` ->
``.restore()`` (or the end of its ``with`` block)."""

import copy

import pytest
import torch

import mmpos.integrations.timm as mt
from mmpos.integrations.diffusers import restore, set_pe, train_only_pe
from mmpos.integrations.transformers_vlm import use_multimodal_rope
from tests.fixtures import tiny_qwen_vl
from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs
from tests.integrations.test_timm_integration import IMG, MODELS

pytestmark = pytest.mark.usefixtures("one_thread")


def _state(model):
    return {name: value.clone() for name, value in model.state_dict().items()}


def _flags(model):
    return {name: param.requires_grad for name, param in model.named_parameters()}


@pytest.mark.parametrize(
    "family,pe,options",
    [
        ("vit", "rope_mixed", dict(dynamic_img_size=True)),
        ("vit", "ape_learned", {}),
        ("vit", "ape_sincos", {}),
        ("vit", "nope", {}),
        ("eva", "rope_axial", {}),
        ("eva", "comrope_ld", dict(abs_pos="keep")),
        ("naflexvit", "rope_mixed", {}),
        ("vit", "rope_axial", dict(reg_tokens=2, no_embed_class=True)),
    ],
)
def test_timm_restore_gives_back_the_model_bit_for_bit(family, pe, options):
    build_options = {k: options.pop(k) for k in ("reg_tokens", "no_embed_class") if k in options}
    model = MODELS[family](**build_options).eval()
    model.head.requires_grad_(False)  # a flag of the user's own, which restore must keep
    images = torch.randn(2, 3, IMG, IMG)
    with torch.no_grad():
        before = model(images)
    state, flags, classes = _state(model), _flags(model), [type(b.attn) for b in model.blocks]
    mt.convert(model, pe=pe, **options)
    if mt.pe_parameters(model):
        mt.train_only_pe(model)
    with torch.no_grad():
        model(images)
    assert mt.restore(model) is model
    with torch.no_grad():
        after = model(images)
    assert torch.equal(after, before)
    assert _flags(model) == flags and [type(b.attn) for b in model.blocks] == classes
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[name], value) for name, value in model.state_dict().items())
    mt.convert(model, pe=pe, **options)  # a restored model converts again
    with pytest.raises(ValueError, match="not converted"):
        mt.restore(mt.restore(model))


def test_timm_restore_follows_the_model_to_another_dtype():
    model = MODELS["vit"]().eval()
    reference = copy.deepcopy(model).double()
    mt.convert(model, pe="rope_axial")
    mt.restore(model.double())
    images = torch.randn(1, 3, IMG, IMG, dtype=torch.float64)
    with torch.no_grad():
        assert model.pos_embed.dtype == torch.float64 and torch.equal(model(images), reference(images))


def test_diffusers_restore_after_train_only_pe_gives_back_trainable_stock_weights():
    transformer = tiny_flux()
    transformer.proj_out.requires_grad_(False)
    flags = _flags(transformer)
    inputs = tiny_flux_inputs()
    with torch.no_grad():
        stock = transformer(**inputs).sample
    set_pe(transformer, "rope_mixed")
    trainable = train_only_pe(transformer)
    assert trainable and not any(
        p.requires_grad for n, p in transformer.named_parameters() if ".pe" not in n and "encodings" not in n
    )
    restore(transformer)
    assert _flags(transformer) == flags
    with torch.no_grad():
        assert torch.equal(transformer(**inputs).sample, stock)


def test_transformers_restore_gives_back_the_logits_bit_for_bit():
    model = tiny_qwen_vl.build("qwen2_vl")
    inputs = tiny_qwen_vl.mixed_inputs("qwen2_vl")
    with torch.no_grad():
        stock = model(**inputs).logits
        with use_multimodal_rope(model, "vrope"):
            switched = model(**inputs).logits
        patch = use_multimodal_rope(model, "mhrope")
        patch.restore()
        after = model(**inputs).logits
    assert not torch.equal(switched, stock) and torch.equal(after, stock)
