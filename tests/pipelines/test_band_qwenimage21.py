"""Band modulation on Qwen-Image 2.1 (block-causal joint sequence, KV cache) through the edit seam, offline.

The edit off is the stock pipeline bit for bit (with and without the KV cache, under ``set_pe``, over the flex
processors); the reference's trajectory is the stock one; the KV cache gives the edit's result without it; the
rule's rotation is the spectrum at 2.1's coordinates times the band law (fp64); shared attention at strength 0
and 1 against explicit block-causal fp64 math; condition images and the target found by their frame positions.
"""

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline
from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21FlexAttnProcessor, QwenImage21KVCache

from mmpos.integrations.diffusers import set_pe
from mmpos.integrations.diffusers.families.tiny import randn, tiny_qwen21
from mmpos.integrations.diffusers.layer_rotation import LayerRotation
from mmpos.ops.tables import RotaryTable
from mmpos.pipelines import BandConfig, BandModulationQwenImage21Pipeline, EditContext, EditSession
from mmpos.pipelines.edits import get_edit
from mmpos.pipelines.edits.band.rule import SharedBandAttention
from mmpos.pipelines.edits.families import edit_attention
from mmpos.pipelines.edits.families.qwenimage21 import Qwen21LayerCall, prefix_blocks, qwen21_segments
from mmpos.pipelines.edits.segments import TokenSegments
from mmpos.spectrum import chunked_spectrum
from mmpos.spectrum.bands import band_scale_per_pair, band_spectrum


class _Tokenizer:
    def encode(self, text):
        return [7]


class _Processor:
    """What ``QwenImage21Pipeline.__init__`` reads of its processor (prompts come as embeddings here)."""

    tokenizer = _Tokenizer()

    def apply_chat_template(self, *args, **kwargs):
        return [[1, 2, 3]]


def _pipes():
    torch.manual_seed(0)
    c = dict(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=None,
        text_encoder=None,
        processor=_Processor(),
        transformer=tiny_qwen21().eval(),
    )
    return c, QwenImage21Pipeline(**c), BandModulationQwenImage21Pipeline(**c)


def _run(pipe, batch=3, **extra):
    embeds = torch.randn(batch, 5, 16, generator=torch.Generator().manual_seed(3))
    return pipe(
        prompt_embeds=embeds,
        height=64,
        width=64,
        num_inference_steps=3,
        output_type="latent",
        generator=torch.Generator().manual_seed(0),
        **extra,
    ).images  # 4 x 4 target tokens


@pytest.mark.parametrize("use_kv_cache", [True, False])
def test_band_off_is_the_stock_pipeline_and_on_keeps_the_references_trajectory(use_kv_cache):
    _, stock, band = _pipes()
    reference = _run(stock, use_kv_cache=use_kv_cache)
    assert torch.equal(_run(band, band={"enabled": False}, use_kv_cache=use_kv_cache), reference)
    assert torch.equal(_run(band, band={"window": (0.1, 0.4)}, use_kv_cache=use_kv_cache), reference)  # no step
    edited = _run(band, use_kv_cache=use_kv_cache)
    assert not torch.allclose(edited[1:], reference[1:])
    torch.testing.assert_close(edited[0], reference[0], rtol=1e-5, atol=1e-5)  # element 0 attends to itself


def test_the_kv_cache_gives_the_edit_without_it():
    """The prefix is unchanged by the edit: the cached prefix keys are the ones the edit would compute."""
    _, _, band = _pipes()
    config = {"s_hf": (0.2, 0.6), "s_lf": (1.1, 1.5)}
    cached, fresh = _run(band, band=config, use_kv_cache=True), _run(band, band=config, use_kv_cache=False)
    torch.testing.assert_close(cached, fresh, rtol=1e-5, atol=1e-5)


def _condition_inputs(sigma):
    """Batch ``[reference, target]``: 3 text tokens, a 2 x 4 condition image, 3 text tokens (one padded), the 4 x 4
    target; the transformer's own arguments (``t = sigma``)."""
    vlm = [False] * 3 + [True] * 2 + [False] * 3
    text_mask = torch.ones(2, len(vlm), dtype=torch.bool)
    text_mask[:, -1] = False
    return dict(
        hidden_states=randn(2, 8 + 16, 4),
        encoder_hidden_states=randn(2, len(vlm), 16, seed=2),
        timestep=torch.tensor([sigma, sigma]),
        img_shapes=[[(1, 2, 4), (1, 4, 4)]] * 2,
        img_mask=torch.tensor(vlm + [True] * 4)[None].expand(2, -1),
        encoder_hidden_states_mask=text_mask,
    )


def test_with_a_condition_image_the_cache_and_the_edit_agree():
    """Transformer level (the pipeline's ``image=`` needs its text encoder): the edit off is stock with the cache;
    the cached step under the edit is the uncached one (the prefix, text and condition image, stays stock)."""
    torch.manual_seed(0)
    model = tiny_qwen21().eval()
    rule = SharedBandAttention(BandConfig(s_hf=(0.2, 0.6), s_lf=(1.1, 1.5)), model.config.axes_dims_rope)

    def forward(sigma, rules=None, cache=None, mode=None, enabled=True):
        inputs = dict(_condition_inputs(sigma), kv_cache=cache, kv_cache_mode=mode)
        if rules is None:
            return model(**inputs).sample
        with EditSession(model, EditContext(rules=rules, enabled=enabled)):
            return model(**inputs).sample

    with torch.no_grad():
        stock_cache, edit_cache = QwenImage21KVCache(1), QwenImage21KVCache(1)
        stock = [forward(0.9, cache=stock_cache, mode="extract"), forward(0.5, cache=stock_cache, mode="cached")]
        off = [
            forward(0.9, {0: rule}, edit_cache, "extract", False),
            forward(0.5, {0: rule}, edit_cache, "cached", False),
        ]
        assert all(torch.equal(a, b) for a, b in zip(off, stock))
        edit_cache = QwenImage21KVCache(1)
        forward(0.9, {0: rule}, edit_cache, "extract")
        torch.testing.assert_close(edit_cache.get_layer(0).get()[0], stock_cache.get_layer(0).get()[0], rtol=0, atol=0)
        cached, fresh = forward(0.5, {0: rule}, edit_cache, "cached"), forward(0.5, {0: rule})
    torch.testing.assert_close(cached, fresh[:, -16:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fresh[0, -16:], stock[1][0], rtol=1e-5, atol=1e-5)  # the reference: stock
    assert not torch.allclose(fresh[1, -16:], stock[1][1])


def test_set_pe_extrapolation_under_the_edit_off_is_the_set_pe_model():
    c, stock, band = _pipes()
    plain = _run(stock)
    set_pe(c["transformer"], "native", extrapolation={"type": "ntk", "factor": 2.0})
    reference = _run(stock)
    assert not torch.equal(reference, plain)
    assert torch.equal(_run(band, band={"enabled": False}), reference)
    assert not torch.allclose(_run(band)[1:], reference[1:])


def test_over_the_flex_processors_the_edit_off_is_stock():
    c, stock, band = _pipes()
    c["transformer"].set_attn_processor(QwenImage21FlexAttnProcessor())  # uncompiled: dense, fine this small
    reference = _run(stock)
    assert torch.equal(_run(band, band={"enabled": False}), reference)
    edited = _run(band)
    torch.testing.assert_close(edited[0], reference[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(edited[1:], reference[1:])


def test_band_batch_is_checked_before_any_work():
    _, _, band = _pipes()
    with pytest.raises(ValueError, match=r"\[reference, target, ...\]"):
        _run(band, batch=1)
    with pytest.raises(ValueError, match="num_images_per_prompt"):
        _run(band, batch=2, num_images_per_prompt=2)


def test_registered_by_family_and_by_stock_pipeline():
    assert get_edit("band").pipeline_class("QwenImage21Pipeline") is BandModulationQwenImage21Pipeline
    assert edit_attention("qwenimage21").family == "qwenimage21"


# ---- the rotation: 2.1's spectrum at its coordinates, scaled by the band law --------------------------------------
class Spy:
    def __init__(self, rule):
        self.rule, self.calls = rule, []

    def __getattr__(self, name):
        return getattr(self.rule, name)

    def attend_call(self, call, context):
        self.calls.append((call, context.progress))
        return self.rule.attend_call(call, context)


def _exact_cis(spectrum, coords):
    phase = coords.double()[:, spectrum.axis_of_pair] * spectrum.inv_freq
    return spectrum.magnitude * torch.polar(torch.ones_like(phase), phase)


def _coords(text, rows, cols):
    """``[text | target]``, written out: text ``j`` on all three axes, the image at frame ``text``, rows and cols
    centred (``-(h - h // 2) .. h // 2 - 1``)."""
    r, c = torch.meshgrid(
        torch.arange(rows) - (rows - rows // 2), torch.arange(cols) - (cols - cols // 2), indexing="ij"
    )
    image = torch.stack([torch.full((rows * cols,), float(text)), r.flatten().float(), c.flatten().float()], -1)
    return torch.cat([torch.arange(text).float()[:, None].expand(-1, 3), image])


@pytest.mark.parametrize("use_kv_cache", [True, False])
def test_the_rules_rotation_is_the_spectrum_scaled_by_the_band_law(use_kv_cache):
    _, stock, _ = _pipes()
    config = BandConfig(s_hf=(0.2, 0.6), s_lf=(1.1, 1.5))
    axes = tuple(stock.transformer.config.axes_dims_rope)
    spy = Spy(SharedBandAttention(config, axes))
    with EditSession(stock.transformer, EditContext(rules={0: spy}), stock.scheduler):
        _run(stock, batch=2, use_kv_cache=use_kv_cache)
    call, progress = spy.calls[-1]
    image = call.segments.image
    assert (image, call.cached) == (slice(5, 21), use_kv_cache)
    spectrum = chunked_spectrum(axes, 10000.0)
    exact = _exact_cis(spectrum, _coords(5, 4, 4))
    cis = call.rotation.table.cis.to(torch.complex128)
    torch.testing.assert_close(cis[image], exact[image], rtol=1e-6, atol=1e-6)
    prefix = torch.ones_like(exact[:5]) if use_kv_cache else exact[:5]  # cached: identity rows (keys rotated)
    torch.testing.assert_close(cis[:5], prefix, rtol=1e-6, atol=1e-6)
    banded = band_spectrum(spectrum, *config.endpoints(progress), config.beta, config.spatial_axes, config.axis0_mode)
    got = spy.rule.band_table(EditContext(step=round(progress * 100), num_steps=101), call.rotation, image).cis
    torch.testing.assert_close(
        got.to(torch.complex128), _exact_cis(banded, _coords(5, 4, 4))[image], rtol=1e-6, atol=1e-6
    )


# ---- shared attention against explicit block-causal fp64 math -----------------------------------------------------
class _Attn:
    processor = None


def _softmax_attention(q, k, v, mask):
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    logits = logits.masked_fill(~mask[:, None], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", logits.softmax(-1), v)


def _allowed(blocks, length, extra):
    """``[S, S + extra]`` bool: the block-causal rule written out (a text row sees keys up to itself, an image
    block's row its block and all before it, a target row every key)."""
    allowed = torch.ones(length, length + extra, dtype=torch.bool)
    for start, stop, is_text in blocks:
        for row in range(start, stop):
            allowed[row, (row + 1 if is_text else stop) :] = False
    return allowed


@pytest.mark.parametrize("strength", [0.0, 1.0])
def test_shared_band_attention_matches_explicit_block_causal_math(strength):
    axes, heads, length = (4, 4, 8), 2, 17
    blocks = ((0, 3, True), (3, 7, False), (7, 9, True))  # text, a condition image, text; then 8 target tokens
    segments = TokenSegments(9, 8, target_start=9, references=(slice(3, 7),))
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, length, heads, 16, dtype=torch.float64) for _ in range(3))
    key_mask = torch.ones(3, length, dtype=torch.bool)
    key_mask[:, 1] = False  # a padded text token
    spectrum = chunked_spectrum(axes, 100.0)
    cis = _exact_cis(spectrum, torch.randn(length, 3, dtype=torch.float64) * 4)
    call = Qwen21LayerCall(
        _Attn(), q, k, v, segments, LayerRotation(RotaryTable(cis)), key_mask, lambda out, dtype: out, blocks=blocks
    )
    config = BandConfig(s_hf=(0.2, 0.6), s_lf=(1.1, 1.5), strength=strength)
    out = SharedBandAttention(config, axes).attend_call(call, EditContext(step=2, num_steps=5))

    def rotate(x, table):
        pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous()) * table[None, :, None, :]
        return torch.view_as_real(pairs).flatten(-2)

    target = slice(9, 17)
    scales = 1 + strength * (band_scale_per_pair(spectrum.axis_of_pair, *config.endpoints(0.5)) - 1)
    rq, rk, ref_k = rotate(q, cis), rotate(k, cis), rotate(k[:1, target], cis[target] * scales)
    own = _allowed(blocks, length, 0)[None] & key_mask[:1, None]
    expected = [_softmax_attention(rq[:1], rk[:1], v[:1], own)]
    shared = _allowed(blocks, length, 8)[None] & torch.cat([key_mask[:1], torch.ones(1, 8, dtype=torch.bool)], 1)
    for t in (1, 2):
        keys, values = torch.cat([rk[t : t + 1], ref_k], 1), torch.cat([v[t : t + 1], v[:1, target]], 1)
        expected.append(_softmax_attention(rq[t : t + 1], keys, values, shared))
    torch.testing.assert_close(out, torch.cat(expected), rtol=1e-12, atol=1e-12)


# ---- condition images and the target found by their frame positions ----------------------------------------------
def test_condition_images_and_the_target_are_found_by_frame_position():
    # 3 text tokens, two adjacent condition images (2 x 2, 2 x 4), 2 text tokens, the 4 x 4 target
    shapes = [(1, 2, 2), (1, 2, 4), (1, 4, 4)]
    mask = torch.tensor([False] * 3 + [True] * 12 + [False] * 2 + [True] * 16)
    seg = qwen21_segments(shapes, mask)
    assert (seg.target, seg.image, seg.target_grid, seg.text) == (slice(17, 33), slice(17, 33), (4, 4), slice(0, 17))
    assert seg.references == (slice(3, 7), slice(7, 15))  # adjacent, yet two blocks (two frame positions)
    assert prefix_blocks(shapes, mask, 17) == [(0, 3, True), (3, 7, False), (7, 15, False), (15, 17, True)]
    with pytest.raises(ValueError, match="end the sequence"):
        qwen21_segments(shapes, torch.cat([mask[:3], mask[17:], mask[3:17]]))  # the target not last
