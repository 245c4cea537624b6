"""open_clip vision towers converted with mmpos (random tiny towers built offline), and a converted timm Eva."""

from __future__ import annotations

import pytest
import timm
import torch
from open_clip.model import CLIP
from torch import nn

import mmpos.integrations.timm as mmpos_timm
from mmpos.integrations.open_clip import PositionalMultiheadAttention, _Positions, convert

TOWER_PES = ("rope_axial", "rope_mixed", "comrope_ld", "harope", "ape_learned", "ape_sincos", "nope")


def tiny_clip(seed: int = 0) -> CLIP:
    torch.manual_seed(seed)
    vision = dict(image_size=32, layers=2, width=64, head_width=16, patch_size=8)
    text = dict(context_length=8, vocab_size=100, width=32, heads=2, layers=1)
    return CLIP(embed_dim=32, vision_cfg=vision, text_cfg=text)


class IdentityPE(nn.Module):
    """Leaves q and k unchanged, through the two methods converted attention calls."""

    def table(self, coords, dtype, device):
        return None

    def rotate_qk(self, q, k, table):
        return q, k


def test_attention_rewrite_matches_torch_multihead_attention_fp64():
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(64, 4, batch_first=True).double().eval()
    converted = nn.MultiheadAttention(64, 4, batch_first=True).double().eval()
    converted.load_state_dict(reference.state_dict())
    converted.__class__ = PositionalMultiheadAttention
    converted.pe = IdentityPE()
    converted.mmpos_positions = _Positions()
    converted.mmpos_positions.start(torch.zeros(9, 2), torch.float64)
    x = torch.randn(2, 10, 64, dtype=torch.float64)
    expected = reference(x, x, x, need_weights=False)[0]
    assert torch.allclose(converted(x, x, x)[0], expected, atol=1e-12, rtol=0)


def test_rotary_encoding_sees_patch_tokens_only():
    """The class token is not encoded: its row of q and k reaches attention unchanged."""
    seen = {}

    class Recording(IdentityPE):
        def table(self, coords, dtype, device):
            seen.update(coords=coords.clone())

        def rotate_qk(self, q, k, table):
            seen.update(tokens=q.shape[2])
            return q, k

    model = tiny_clip()
    convert(model.visual, pe="rope_axial")
    model.visual.transformer.resblocks[0].attn.pe = Recording()
    model.encode_image(torch.randn(1, 3, 48, 32))
    assert seen["tokens"] == 6 * 4  # 48x32 px, patch 8: a 6x4 grid, cls token excluded
    assert seen["coords"].shape == (24, 2) and seen["coords"].max(0).values.tolist() == [5.0, 3.0]


@pytest.mark.parametrize("pe", TOWER_PES)
def test_converted_tower_forward_backward(pe):
    model = tiny_clip()
    original = {k: v.clone() for k, v in model.visual.state_dict().items() if k != "positional_embedding"}
    convert(model.visual, pe=pe)
    state = model.visual.state_dict()
    assert all(torch.equal(state[k], v) for k, v in original.items())  # every other weight kept, same name
    assert "positional_embedding" not in state
    for size in (32, 48):
        features = model.encode_image(torch.randn(2, 3, size, size))
        assert features.shape == (2, 32) and torch.isfinite(features).all()
    features.square().sum().backward()
    encoding_grads = [
        p.grad for name, p in model.visual.named_parameters() if ".pe." in name or name.startswith("mmpos_ape")
    ]
    assert all(g is not None and torch.isfinite(g).all() for g in encoding_grads)
    if pe in ("rope_mixed", "comrope_ld", "harope", "ape_learned"):
        assert encoding_grads and any(g.abs().sum() > 0 for g in encoding_grads)


def test_keep_abs_pos_with_nope_is_the_stock_tower():
    model = tiny_clip()
    x = torch.randn(2, 3, 32, 32)
    expected = model.encode_image(x)
    convert(model.visual, pe="nope", abs_pos="keep")
    assert torch.equal(model.encode_image(x), expected)


def test_rejects_wrong_input():
    with pytest.raises(TypeError, match="VisionTransformer"):
        convert(nn.Linear(2, 2), pe="rope_axial")
    model = tiny_clip()
    with pytest.raises(ValueError, match="abs_pos"):
        convert(model.visual, pe="rope_axial", abs_pos="drop")
    convert(model.visual, pe="rope_axial")
    with pytest.raises(ValueError, match="already converted"):
        convert(model.visual, pe="rope_mixed")
    with pytest.raises(ValueError, match="perturbation / offset_std"):  # as timm.convert and the DiT refuse it
        convert(tiny_clip().visual, pe="comrope_ld", perturbation=0.5, grid_size=(4, 4))


@pytest.mark.parametrize("pe", ("rope_mixed", "comrope_ld", "harope"))
def test_converted_eva_forward_backward(pe):
    torch.manual_seed(0)
    model = timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=56, num_classes=3)
    mmpos_timm.convert(model, pe=pe, dynamic_img_size=True)
    logits = model(torch.randn(2, 3, 56, 56))
    logits.sum().backward()
    assert logits.shape == (2, 3)
    grads = [p.grad for p in mmpos_timm.pe_parameters(model)]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model(torch.randn(1, 3, 84, 70)).shape == (1, 3)


@pytest.mark.parametrize("pe,tables", [("rope_axial", 1), ("rope_mixed", 2)])
def test_tables_are_built_once_per_forward_and_match_per_layer_tables(pe, tables):
    model = tiny_clip()
    convert(model.visual, pe=pe)
    x = torch.randn(2, 3, 48, 32)
    with torch.no_grad():
        once = model.encode_image(x)
        assert len(model.visual.mmpos_positions.tables) == tables  # shared: one; per block (2 layers): two
        model.visual.mmpos_positions.encodings = []  # no forward tables: each layer builds its own
        assert torch.equal(model.encode_image(x), once)


def test_an_image_size_the_patch_does_not_divide_is_refused_not_cropped():
    model = tiny_clip()
    convert(model.visual, pe="rope_axial")
    with pytest.raises(ValueError, match="36 x 36 pixels, not divisible by the patch size 8 x 8"):
        model.encode_image(torch.randn(1, 3, 36, 36))
    assert model.encode_image(torch.randn(1, 3, 40, 40)).shape == (1, 32)


@pytest.mark.parametrize("pe", ["prope", "ucpe", "plucker"])
def test_a_camera_encoding_is_refused_as_timm_refuses_it(pe):
    model = tiny_clip()
    with pytest.raises(TypeError, match="is a camera encoding"):
        convert(model.visual, pe=pe)
    assert not hasattr(model.visual, "mmpos_pe")
