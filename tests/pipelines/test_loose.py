"""LooseRoPE: factor tables, bins, token maps, the concatenated-q/k logit mix, Kontext bit-identity, step tracking."""

import math
from types import SimpleNamespace

import pytest
import torch
from diffusers import FluxKontextPipeline
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import FluxAttention, FluxPosEmbed

from mmpos.coords import flux_ids
from mmpos.coords.edits import shrink_ids
from mmpos.pipelines import LooseConfig, LooseRoPEKontextPipeline
from mmpos.pipelines.edits.context import EditContext, segments_from_ids
from mmpos.pipelines.edits.families import edit_attention
from mmpos.pipelines.edits.families.flux import flux_layer_call
from mmpos.pipelines.edits.loose.rule import LooseRoPERule, per_token, saliency_bins, tanh_ramp, token_maps
from mmpos.pipelines.edits.loose.saliency import SpectralResidualSaliency, UniformSaliency, make_saliency
from tests.fixtures.tiny_models import components, embeddings, explicit_qkv, image, softmax_attention


def test_factor_tables_and_phases_match_the_reference_numbers():
    config = LooseConfig()
    shrink, attention = config.factors(0)
    assert torch.allclose(shrink, torch.tensor([0.650, 0.660, 0.825, 0.990, 1.000], dtype=torch.float64), atol=5e-4)
    assert torch.allclose(attention, torch.tensor([0.650, 0.651, 0.998, 1.344, 1.345], dtype=torch.float64), atol=5e-4)
    shrink1, attention1 = config.factors(1)
    assert torch.allclose(shrink1, torch.tensor([0.910, 0.924, 1, 1, 1], dtype=torch.float64), atol=5e-4)
    assert torch.allclose(attention1, torch.tensor([0.755, 0.756, 0.998, 1.241, 1.242], dtype=torch.float64), atol=5e-4)
    shrink2, attention2 = config.factors(2)
    assert (shrink2 == 1).all()
    assert torch.allclose(attention2, torch.tensor([0.829, 0.829, 0.999, 1.169, 1.169], dtype=torch.float64), atol=5e-4)
    # the authors re-anneal the shrink table at a cutoff but count logit-factor phases from cutoffs strictly below
    steps = (0, 9, 10, 11, 17, 18, 19, 27)
    assert [config.shrink_phase(s) for s in steps] == [0, 0, 1, 1, 1, 2, 2, 2]
    assert [config.logit_phase(s) for s in steps] == [0, 0, 0, 1, 1, 1, 2, 2]
    for step, (shrink_table, logit_table) in {
        10: (shrink1, attention),
        18: ((shrink2), attention1),
        11: (shrink1, attention1),
        19: (shrink2, attention2),
    }.items():
        at_step = config.factors_at(step)
        assert torch.equal(at_step[0], shrink_table) and torch.equal(at_step[1], logit_table), step
    assert all((t == 1).all() for t in LooseConfig(strength=0.0).factors(0))
    assert torch.equal(tanh_ramp(2.0, 2.0, 5.0, 3), torch.full((3,), 2.0, dtype=torch.float64))


def test_bins_and_per_token_maps():
    saliency = torch.tensor([[0.0, 0.2, 0.4], [0.6, 0.8, 1.0]])
    region = torch.tensor([[True, True, True], [True, True, False]])
    bins = saliency_bins(saliency, region, boost=1.0, num_bins=5)
    assert bins.tolist() == [[0, 1, 2], [3, 4, -1]]
    assert saliency_bins(torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool), 1.0, 5).item() == 4  # top bin has 1
    assert saliency_bins(torch.full((1, 1), 0.9), torch.ones(1, 1, dtype=torch.bool), 2.0, 5).item() == 4  # clipped
    shrink, attention = LooseConfig().factors(0)
    loosening = per_token(bins, shrink)
    assert loosening[1, 2] == 1.0 and loosening[0, 0] == shrink[0] and loosening[1, 1] == shrink[4]
    assert per_token(bins, attention)[0, 2] == attention[2]


def test_token_maps_from_pixels():
    mask = torch.zeros(64, 64, dtype=torch.bool)
    mask[16:48, 0:32] = True
    saliency = torch.zeros(64, 64)
    saliency[16:48, 16:32] = 1.0
    maps = token_maps(LooseConfig(saliency_blur=0, saliency_boost=1.0, mask_dilation=0), saliency, mask, (4, 4), (4, 2))
    assert maps.target_region.tolist() == [
        [False] * 4,
        [True, True, False, False],
        [True, True, False, False],
        [False] * 4,
    ]
    assert maps.context_region.tolist() == [[False, False], [True, False], [True, False], [False, False]]
    assert maps.bins[1, 0] == 0 and maps.bins[1, 1] == 4 and maps.bins[0, 0] == -1


def test_mask_dilation_grows_query_and_crop_key_masks_by_two_tokens():
    """The authors' default: the paste mask grows by 2 tokens (8-neighbour) for the query bins and crop keys."""
    assert LooseConfig().mask_dilation == 2
    mask = torch.zeros(160, 160, dtype=torch.bool)
    mask[64:96, 64:80] = True  # tokens rows 4..5, col 4 on a 10x10 grid
    saliency = mask.float()
    maps = token_maps(LooseConfig(saliency_blur=0), saliency, mask, (10, 10), (10, 10))
    rows, cols = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
    distance = torch.maximum((rows - rows.clamp(4, 5)).abs(), (cols - 4).abs())  # Chebyshev distance to the paste
    assert torch.equal(maps.target_region, distance <= 2) and torch.equal(maps.context_region, distance <= 2)
    assert ((maps.bins >= 0) == (distance <= 2)).all()
    assert (maps.bins[(distance > 0) & (distance <= 2)] == 0).all()  # the seam ring: zero saliency, loosest bin
    plain = token_maps(LooseConfig(saliency_blur=0, mask_dilation=0), saliency, mask, (10, 10), (10, 10))
    assert torch.equal(plain.target_region, distance == 0)
    with pytest.raises(ValueError, match="mask_dilation"):
        LooseConfig(mask_dilation=-1)


def test_shrunk_ids_equal_frequency_scaled_rope():
    ids = torch.cat([flux_ids(3, 4), flux_ids(3, 4, index=1.0)]).double()
    shrunk = shrink_ids(ids, 0.6, (1.0, 1.5)).double()
    assert torch.equal(shrunk[:, 0], ids[:, 0])
    pos_embed = FluxPosEmbed(10000, [4, 4, 8])
    cos, sin = pos_embed(shrunk)
    q, k = torch.randn(1, 24, 1, 16), torch.randn(1, 24, 1, 16)
    loosened = torch.einsum(
        "bqhd,bkhd->qk",
        apply_rotary_emb(q, (cos, sin), sequence_dim=1),
        apply_rotary_emb(k, (cos, sin), sequence_dim=1),
    )
    # the logit depends on sigma * (p - p'): RoPE whose spatial frequencies are scaled by sigma on native ids
    angles = []
    for axis, dim in enumerate([4, 4, 8]):
        freqs = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        scale = 0.6 if axis else 1.0
        angles.append(ids[:, axis : axis + 1] * freqs * scale)
    angles = torch.cat(angles, dim=1).repeat_interleave(2, dim=1)
    scaled = (angles.cos().float(), angles.sin().float())
    expected = torch.einsum(
        "bqhd,bkhd->qk", apply_rotary_emb(q, scaled, sequence_dim=1), apply_rotary_emb(k, scaled, sequence_dim=1)
    )
    torch.testing.assert_close(loosened, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("double", [True, False])
def test_logit_mix_matches_explicit_attention(double):
    torch.manual_seed(0)
    attn = FluxAttention(
        query_dim=32,
        heads=2,
        dim_head=16,
        added_kv_proj_dim=32 if double else None,
        bias=True,
        out_dim=None if double else 32,
        pre_only=not double,
        eps=1e-6,
    ).double()
    text_len, grid = 2, (3, 3)
    img_ids = torch.cat([flux_ids(*grid), flux_ids(*grid, index=1.0)])
    ids = torch.cat([torch.zeros(text_len, 3), img_ids])
    pos_embed = FluxPosEmbed(10000, [4, 4, 8])
    rotary = tuple(t.double() for t in pos_embed(ids))
    mask = torch.zeros(48, 48, dtype=torch.bool)
    mask[0:32, 0:32] = True  # tokens (0..1, 0..1) of the 3x3 grids
    saliency = torch.zeros(48, 48)
    saliency[0:16, 0:16] = 1.0
    config = LooseConfig(saliency_blur=0, saliency_boost=1.0, step_range=(0, 5), mask_dilation=0)
    rule = LooseRoPERule(config, saliency, mask)
    context = EditContext(step=0, num_steps=6)
    context.segments = segments_from_ids(text_len, img_ids)
    context.img_ids, context.inputs = img_ids, {"img_ids": img_ids, "txt_ids": torch.zeros(text_len, 3)}
    context.adapter = edit_attention("flux")
    assert rule.is_active(context)
    rule.prepare(context, SimpleNamespace(pos_embed=lambda i: tuple(t.double() for t in pos_embed(i))))
    hidden = torch.randn(2, 18, 32, dtype=torch.float64)
    text = torch.randn(2, text_len, 32, dtype=torch.float64) if double else None
    if not double:
        hidden = torch.randn(2, text_len + 18, 32, dtype=torch.float64)
    out = rule.attend_call(flux_layer_call(attn, hidden, text, rotary, context.segments), context)

    q, k, v = explicit_qkv(attn, hidden, text)
    standard = torch.einsum(
        "bqhd,bkhd->bhqk", apply_rotary_emb(q, rotary, sequence_dim=1), apply_rotary_emb(k, rotary, sequence_dim=1)
    )
    bins = rule.maps.bins.flatten()
    shrink, attention = config.factors(0)
    logits = standard.clone()
    context_keys = slice(text_len + 9, None)
    pasted = rule.maps.context_region.flatten()
    for token in range(9):
        if bins[token] < 0:
            continue
        b = int(bins[token])
        loose_ids = torch.cat([torch.zeros(text_len, 3), shrink_ids(img_ids, float(shrink[b]), (1.0, 1.0))])
        loose = tuple(t.double() for t in pos_embed(loose_ids))
        ql = apply_rotary_emb(q, loose, sequence_dim=1)[:, text_len + token]
        kl = apply_rotary_emb(k, loose, sequence_dim=1)[:, context_keys]
        row = torch.einsum("bhd,bkhd->bhk", ql, kl) * torch.where(pasted, attention[b], 1.0)
        logits[:, :, text_len + token, context_keys] = row
    expected = torch.einsum("bhqk,bkhd->bqhd", (logits / math.sqrt(16)).softmax(-1), v).flatten(2)
    assert set(bins.tolist()) == {-1, 0, 4}
    if double:
        torch.testing.assert_close(out[0], attn.to_out[0](expected[:, text_len:]))
        torch.testing.assert_close(out[1], attn.to_add_out(expected[:, :text_len]))
    else:
        torch.testing.assert_close(out, expected)
    # the logits of queries outside the paste are the standard ones
    rotated_q, rotated_k = (apply_rotary_emb(x, rotary, sequence_dim=1) for x in (q, k))
    outside = softmax_attention(rotated_q, rotated_k, v).flatten(2)
    row = text_len + 8  # token (2, 2): not pasted
    torch.testing.assert_close(
        (out[0] if double else out)[:, (8 if double else row)],
        attn.to_out[0](outside[:, row]) if double else outside[:, row],
    )


@pytest.fixture(scope="module")
def kontext_pipes():
    c = components("kontext")
    return FluxKontextPipeline(**c), LooseRoPEKontextPipeline(**c)


COLLAGE = image(48, 48)
MASK = torch.zeros(48, 48, dtype=torch.bool)
MASK[8:40, 0:32] = True
SCHEDULE = dict(cutoffs=(1, 2), step_range=(0, 2), saliency="spectral_residual", mask_dilation=0)


def _kwargs(**extra):
    return dict(num_inference_steps=4, _auto_resize=False, output_type="latent", **embeddings(1), **extra)


def test_disabled_or_zero_strength_is_bit_identical_to_stock_kontext(kontext_pipes):
    stock, loose = kontext_pipes
    expected = stock(
        image=COLLAGE, height=48, width=48, max_area=48 * 48, generator=torch.Generator().manual_seed(0), **_kwargs()
    ).images
    for config in ({**SCHEDULE, "enabled": False}, {**SCHEDULE, "strength": 0.0}, {**SCHEDULE, "step_range": (9, 9)}):
        out = loose(
            image=COLLAGE, crop_mask=MASK, loose=config, generator=torch.Generator().manual_seed(0), **_kwargs()
        )
        assert torch.equal(out.images, expected), config
    edited = loose(
        image=COLLAGE, crop_mask=MASK, loose=SCHEDULE, generator=torch.Generator().manual_seed(0), **_kwargs()
    )
    assert not torch.allclose(edited.images, expected)
    assert edited.maps.bins.shape == (3, 3) and (edited.maps.bins >= 0).sum() == 2  # tokens over half covered


def test_behaviour_is_independent_of_calls_per_step(kontext_pipes):
    _, loose = kontext_pipes
    e = embeddings(1)
    once = loose(
        image=COLLAGE, crop_mask=MASK, loose=SCHEDULE, generator=torch.Generator().manual_seed(0), **_kwargs()
    ).images
    # true-CFG with a negative equal to the positive: two forwards per step, same prediction
    twice = loose(
        image=COLLAGE,
        crop_mask=MASK,
        loose=SCHEDULE,
        generator=torch.Generator().manual_seed(0),
        true_cfg_scale=3.0,
        negative_prompt_embeds=e["prompt_embeds"],
        negative_pooled_prompt_embeds=e["pooled_prompt_embeds"],
        **_kwargs(),
    ).images
    assert torch.equal(once, twice)
    again = loose(
        image=COLLAGE, crop_mask=MASK, loose=SCHEDULE, generator=torch.Generator().manual_seed(0), **_kwargs()
    ).images
    assert torch.equal(once, again)  # a restart starts from step 0


def test_saliency_providers():
    mask = MASK.clone()
    for provider in (SpectralResidualSaliency(), UniformSaliency(0.3), make_saliency("uniform")):
        s = provider(COLLAGE, mask)
        assert s.shape == (48, 48) and s.min() >= 0 and s.max() <= 1 and (s[~mask] == 0).all()
    s = SpectralResidualSaliency()(COLLAGE, mask)
    assert s[mask].min() == 0 and s[mask].max() == 1
    import timm

    from mmpos.pipelines.edits.loose.saliency import FeatureEnergySaliency

    backbone = timm.create_model("resnet10t", pretrained=False, features_only=True, out_indices=(1,))
    s = FeatureEnergySaliency(backbone)(COLLAGE, mask)
    assert s.shape == (48, 48) and s[mask].max() == 1
    with pytest.raises(ValueError, match="saliency"):
        make_saliency("detectron")


def test_loose_input_errors(kontext_pipes):
    _, loose = kontext_pipes
    with pytest.raises(ValueError, match="expected the image size 48x48"):
        loose(image=COLLAGE, crop_mask=torch.ones(32, 48), **_kwargs())
    with pytest.raises(ValueError, match="empty"):
        loose(image=COLLAGE, crop_mask=torch.zeros(48, 48), **_kwargs())
    with pytest.raises(ValueError, match="same size"):
        loose(image=COLLAGE, original=image(32, 48), **_kwargs())
    with pytest.raises(ValueError, match="16-pixel token grid"):
        loose(image=image(40, 48), crop_mask=torch.ones(40, 48), **_kwargs())
    with pytest.raises(ValueError, match="saliency is"):
        loose(image=COLLAGE, crop_mask=MASK, saliency=torch.rand(16, 16), **_kwargs())
    with pytest.raises(ValueError, match="exactly one"):
        loose(image=COLLAGE, **_kwargs())


@pytest.mark.parametrize(
    "bad, name",
    [({"shrink": (0.5, 3.0)}, "shrink"), ({"shrink": (0.0, 1.0)}, "shrink"), ({"saliency_blur": 4}, "saliency_blur")],
)
def test_config_refuses_out_of_range_shrink_and_even_blur(bad, name):
    with pytest.raises(ValueError, match=name):
        LooseConfig(**bad)


class _LatentsPrepared(Exception):
    pass


@pytest.mark.parametrize(
    "size, auto_resize, grid",
    [
        ((512, 512), True, (64, 64)),
        ((512, 512), False, (32, 32)),
        ((48, 80), True, (50, 83)),
        ((48, 80), False, (3, 5)),
    ],
)
def test_default_output_grid_equals_the_context_grid(kontext_pipes, monkeypatch, size, auto_resize, grid):
    """By default the output is generated at the size Kontext gives the collage as context: equal token grids
    (512x512 with auto-resize: 64x64 and 64x64, as stock Kontext and the authors' code; 48x80: 50x83 or 3x5)."""
    _, loose = kontext_pipes
    seen = {}
    prepare = type(loose).prepare_latents

    def prepare_and_stop(self, *args, **kwargs):  # the grids are fixed here; stop before denoising
        latents, image_latents, latent_ids, image_ids = prepare(self, *args, **kwargs)
        seen.update(output=_grid_of(latent_ids), context=_grid_of(image_ids))
        raise _LatentsPrepared

    monkeypatch.setattr(type(loose), "prepare_latents", prepare_and_stop)
    mask = torch.zeros(*size, dtype=torch.bool)
    mask[: size[0] // 2, : size[1] // 2] = True
    with pytest.raises(_LatentsPrepared):
        loose(
            image=image(*size),
            crop_mask=mask,
            num_inference_steps=1,
            output_type="latent",
            _auto_resize=auto_resize,
            **embeddings(1),
        )
    assert seen["output"] == seen["context"] == grid


def _grid_of(ids):
    return (int(ids[:, 1].max()) + 1, int(ids[:, 2].max()) + 1)


def test_return_dict_false_gives_a_tuple(kontext_pipes):
    _, loose = kontext_pipes
    run = lambda **extra: loose(
        image=COLLAGE,
        crop_mask=MASK,
        loose=SCHEDULE,  # noqa: E731
        generator=torch.Generator().manual_seed(0),
        **_kwargs(),
        **extra,
    )
    output, as_tuple = run(), run(return_dict=False)
    from diffusers.utils import BaseOutput

    assert isinstance(output, BaseOutput) and isinstance(as_tuple, tuple) and len(as_tuple) == 5
    assert torch.equal(as_tuple[0], output.images) and torch.equal(as_tuple[2], output.crop_mask)


class _Judge:
    """A verdict callable with scripted answers; records what it was shown."""

    def __init__(self, *answers):
        self.answers, self.seen = list(answers), []

    def __call__(self, images, attempt):
        self.seen.append((tuple(images.shape), attempt, float(images.min()), float(images.max())))
        return self.answers[min(attempt, len(self.answers) - 1)]


def test_verdict_loop_restarts_with_the_same_noise_and_a_moved_boost(kontext_pipes):
    _, loose = kontext_pipes
    config = {**SCHEDULE, "verdict_step": 1, "verdict_retries": 2}
    run = lambda boost, **extra: loose(  # noqa: E731
        image=COLLAGE,
        crop_mask=MASK,
        loose={**config, "saliency_boost": boost},
        generator=torch.Generator().manual_seed(0),
        **_kwargs(),
        **extra,
    )
    judge = _Judge("neglect", "suppression", "success")
    judged = run(0.83, verdict=judge)
    assert [s[:2] for s in judge.seen] == [((1, 3, 48, 48), 0), ((1, 3, 48, 48), 1), ((1, 3, 48, 48), 2)]
    assert all(0 <= low <= high <= 1 for _, _, low, high in judge.seen)
    boosts = [boost for boost, _ in judged.verdicts]
    assert [answer for _, answer in judged.verdicts] == ["neglect", "suppression", "success"]
    assert boosts == [0.83, 0.83 - 0.045, 0.83 - 0.045 + 0.05]
    # the final attempt equals a plain run at its boost from the same initial noise
    assert torch.equal(judged.images, run(boosts[-1]).images)
    stubborn = run(0.83, verdict=_Judge("neglect"))  # never a success: the last allowed attempt runs to the end
    assert len(stubborn.verdicts) == 3 and stubborn.verdicts[-1][1] == "neglect"
    with pytest.raises(ValueError, match="verdict answer"):
        run(0.83, verdict=lambda images, attempt: "fine")
    assert run(0.83).verdicts is None
