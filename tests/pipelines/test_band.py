"""Band modulation (Untwisting RoPE): scale vector, schedule, shared attention, pipelines vs stock diffusers."""

import pytest
import torch
from diffusers import FluxKontextPipeline, FluxPipeline
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import FluxAttention, FluxAttnProcessor, FluxPosEmbed

from mmpos.coords import flux_ids
from mmpos.pipelines import BandConfig, BandModulationFluxPipeline, BandModulationKontextPipeline
from mmpos.pipelines.edits.band.rule import SharedBandAttention
from mmpos.pipelines.edits.context import EditContext, segments_from_ids
from mmpos.pipelines.edits.families.flux import flux_layer_call
from mmpos.spectrum.bands import band_channel_scales, band_pair_scales
from tests.fixtures.tiny_models import components, embeddings, explicit_qkv, image, softmax_attention

FLUX_AXES = (16, 56, 56)


def test_scale_vector_shape_pairs_endpoints_and_spec_values():
    scales = band_channel_scales(FLUX_AXES, 0.25, 1.0)
    assert scales.shape == (128,) and scales.dtype == torch.float64
    pairs = scales.view(64, 2)
    assert torch.equal(pairs[:, 0], pairs[:, 1])
    for axis_start in (8, 36):  # h and w pairs: 28 each
        axis = pairs[axis_start : axis_start + 28, 0]
        assert axis[0] == 0.25 and axis[-1] == 1.0
        assert (axis.diff() > 0).all()
        expected = torch.tensor([0.25, 0.30, 0.45, 0.70, 1.0], dtype=torch.float64)
        assert torch.allclose(axis[[0, 7, 14, 21, 27]], expected, atol=5e-3)
    assert (pairs[:8, 0] == 1.0).all()  # axis 0 takes s_lf ("low")
    end = band_pair_scales(FLUX_AXES, 0.75, 1.4)[8:36]
    assert torch.allclose(
        end[[0, 7, 14, 21, 27]], torch.tensor([0.75, 0.79, 0.93, 1.14, 1.40], dtype=torch.float64), atol=6e-3
    )
    assert (band_pair_scales(FLUX_AXES, 0.5, 2.0, axis0_mode="one")[:8] == 1).all()
    assert torch.equal(
        band_pair_scales(FLUX_AXES, 0.5, 2.0, axis0_mode="formula")[:8],
        0.5 + 1.5 * (torch.arange(8, dtype=torch.float64) / 7) ** 2,
    )
    with pytest.raises(ValueError, match="axis0_mode"):
        band_pair_scales(FLUX_AXES, 0.5, 1.0, axis0_mode="mid")


def test_schedule_endpoints_strength_and_window():
    config = BandConfig()
    assert config.endpoints(0.0) == (0.25, 1.0)
    assert config.endpoints(1.0) == pytest.approx((0.75, 1.4))
    assert config.endpoints(0.5) == pytest.approx((0.5, 1.2))
    assert torch.equal(BandConfig(strength=0.0).channel_scales(FLUX_AXES, 0.3), torch.ones(128, dtype=torch.float64))
    half = BandConfig(strength=0.5).channel_scales(FLUX_AXES, 0.0)
    assert torch.allclose(half, 1 + 0.5 * (config.channel_scales(FLUX_AXES, 0.0) - 1))
    assert not BandConfig(window=(0.2, 0.6)).in_window(0.7) and BandConfig(window=(0.2, 0.6)).in_window(0.6)
    with pytest.raises(ValueError, match="window"):
        BandConfig(window=(0.5, 0.2))


def test_scaling_before_or_after_rotation_is_the_same():
    axes = (4, 4, 8)
    ids = flux_ids(3, 5, text_length=2, dtype=torch.float64)
    rotary = FluxPosEmbed(10000, list(axes))(ids)
    rotary = tuple(t.double() for t in rotary)
    key = torch.randn(2, ids.shape[0], 3, 16, dtype=torch.float64)
    scales = band_channel_scales(axes, 0.3, 1.7)
    cos, sin = (t[None, :, None, :] for t in rotary)

    def rotate_fp64(x):  # adjacent pairs (2j, 2j+1), diffusers' Flux layout, kept in float64
        rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
        return x * cos + rotated * sin

    torch.testing.assert_close(rotate_fp64(key * scales), rotate_fp64(key) * scales, rtol=1e-14, atol=1e-14)
    key32, scales32 = key.float(), scales.float()  # diffusers' own rotation runs in float32
    torch.testing.assert_close(
        apply_rotary_emb(key32 * scales32, rotary, sequence_dim=1),
        apply_rotary_emb(key32, rotary, sequence_dim=1) * scales32,
        rtol=1e-6,
        atol=1e-6,
    )


def rotate_fp64(x, rotary):
    """diffusers' Flux rotation (adjacent pairs) of ``[B, S, H, D]`` kept in float64 (``apply_rotary_emb`` rounds
    its inputs to float32)."""
    cos, sin = (t[None, :, None, :] for t in rotary)
    rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    return x * cos + rotated * sin


def _shared_attention_setup(double: bool):
    torch.manual_seed(0)
    attn = FluxAttention(
        query_dim=32,
        heads=2,
        dim_head=16,
        added_kv_proj_dim=32 if double else None,
        bias=True,
        out_dim=32 if not double else None,
        pre_only=not double,
        eps=1e-6,
    ).double()
    text_len, grid = 3, (2, 3)
    ids = flux_ids(*grid, text_length=text_len, dtype=torch.float64)
    rotary = tuple(t.double() for t in FluxPosEmbed(10000, [4, 4, 8])(ids))
    context = EditContext(step=2, num_steps=5)
    context.segments = segments_from_ids(text_len, ids[text_len:])
    batch = 3
    if double:
        hidden = torch.randn(batch, 6, 32, dtype=torch.float64)
        text = torch.randn(batch, text_len, 32, dtype=torch.float64)
    else:
        hidden, text = torch.randn(batch, text_len + 6, 32, dtype=torch.float64), None
    return attn, rotary, context, hidden, text


@pytest.mark.parametrize("double", [True, False])
def test_shared_attention_matches_explicit_math(double):
    attn, rotary, context, hidden, text = _shared_attention_setup(double)
    config = BandConfig(s_hf=(0.2, 0.6), s_lf=(1.1, 1.5))
    rule = SharedBandAttention(config, (4, 4, 8))
    out = rule.attend_call(flux_layer_call(attn, hidden, text, rotary, context.segments), context)
    q, k, v = explicit_qkv(attn, hidden, text)
    q, k = rotate_fp64(q, rotary), rotate_fp64(k, rotary)  # the rule rotates exactly in fp64 (mmpos operator)
    image = slice(3, None)
    scales = band_channel_scales((4, 4, 8), *config.endpoints(0.5))
    expected = [softmax_attention(q[:1], k[:1], v[:1])]
    for t in (1, 2):
        keys = torch.cat([k[t : t + 1], k[:1, image] * scales], dim=1)
        values = torch.cat([v[t : t + 1], v[:1, image]], dim=1)
        expected.append(softmax_attention(q[t : t + 1], keys, values))
    expected = torch.cat(expected).flatten(2)
    exact = dict(rtol=1e-12, atol=1e-12)
    if double:
        hidden_out, text_out = out
        torch.testing.assert_close(text_out, attn.to_add_out(expected[:, :3]), **exact)
        torch.testing.assert_close(hidden_out, attn.to_out[0](expected[:, 3:]), **exact)
    else:
        torch.testing.assert_close(out, expected, **exact)
    # the reference row is the stock processor on the reference alone (whose apply_rotary_emb rounds fp64 q/k to
    # fp32: equal to fp32 accuracy here, bit for bit in the fp32 pipeline tests below)
    stock = FluxAttnProcessor()(attn, hidden[:1], None if text is None else text[:1], None, rotary)
    torch.testing.assert_close(out[0][:1] if double else out[:1], stock[0] if double else stock, rtol=1e-6, atol=1e-6)


def test_targets_never_attend_to_other_targets():
    attn, rotary, context, hidden, text = _shared_attention_setup(double=False)
    rule = SharedBandAttention(BandConfig(), (4, 4, 8))
    out = rule.attend_call(flux_layer_call(attn, hidden, text, rotary, context.segments), context)
    other = hidden.clone()
    other[2] = torch.randn_like(other[2])
    changed = rule.attend_call(flux_layer_call(attn, other, text, rotary, context.segments), context)
    assert torch.equal(out[:2], changed[:2])
    assert not torch.allclose(out[2], changed[2])
    ref_changed = hidden.clone()
    ref_changed[0] += 1
    assert not torch.allclose(
        rule.attend_call(flux_layer_call(attn, ref_changed, text, rotary, context.segments), context)[1], out[1]
    )


@pytest.fixture(scope="module")
def flux_pipes():
    c = components("flux")
    return FluxPipeline(**c), BandModulationFluxPipeline(**c)


def _run(pipe, embeds, **kwargs):
    return pipe(
        height=32,
        width=48,
        num_inference_steps=3,
        output_type="latent",
        generator=torch.Generator().manual_seed(0),
        **embeds,
        **kwargs,
    ).images


def test_band_disabled_is_bit_identical_to_stock_flux(flux_pipes):
    stock, band = flux_pipes
    e = embeddings(3)
    reference = _run(stock, e)
    assert torch.equal(_run(band, e, band={"enabled": False}), reference)
    assert torch.equal(_run(band, e, band={"window": (0.9, 0.95)}), reference)  # no step in the window
    edited = _run(band, e)
    assert torch.equal(edited[0], reference[0])  # the reference's trajectory is the stock one
    assert not torch.allclose(edited[1:], reference[1:])


def test_targets_are_independent_in_the_pipeline(flux_pipes):
    _, band = flux_pipes
    e, other = embeddings(3), embeddings(3, seed=7)
    e2 = {k: torch.cat([v[:2], other[k][2:]]) for k, v in e.items()}
    a, b = _run(band, e), _run(band, e2)
    assert torch.equal(a[:2], b[:2]) and not torch.allclose(a[2], b[2])


def test_reference_image_mode_feeds_noised_reference(flux_pipes):
    _, band = flux_pipes
    sigmas, latents = [], []  # the embedder sees the latents after the edit's pre-forward hook
    hooks = [
        band.transformer.register_forward_pre_hook(
            lambda m, a, kw: sigmas.append(float(kw["timestep"][0])), with_kwargs=True
        ),
        band.transformer.x_embedder.register_forward_pre_hook(lambda m, a: latents.append(a[0].clone())),
    ]
    x0 = torch.randn(1, 6, 4)
    try:
        _run(band, embeddings(2), reference_latents=x0, reference_seed=3)
    finally:
        for hook in hooks:
            hook.remove()
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(3))
    assert len(sigmas) == len(latents) == 3 and sigmas[0] == 1.0
    for sigma, seen in zip(sigmas, latents):
        torch.testing.assert_close(seen[0], ((1 - sigma) * x0 + sigma * noise)[0])


def test_band_errors(flux_pipes):
    _, band = flux_pipes
    with pytest.raises(ValueError, match="output size 32x48"):
        _run(band, embeddings(2), reference_image=image(32, 32))
    with pytest.raises(ValueError, match="packed"):
        _run(band, embeddings(2), reference_latents=torch.randn(1, 5, 4))
    with pytest.raises(ValueError, match="num_images_per_prompt"):
        _run(band, embeddings(2), num_images_per_prompt=2)
    with pytest.raises(ValueError, match="unknown BandConfig"):
        _run(band, embeddings(2), band={"s_mid": 1.0})
    with pytest.raises(ValueError, match="batch of"):
        _run(band, embeddings(1))


def test_band_batch_is_checked_in_check_inputs_before_any_work(flux_pipes, monkeypatch):
    _, band = flux_pipes
    encoded = []
    encode = type(band).encode_prompt
    monkeypatch.setattr(
        type(band), "encode_prompt", lambda self, *a, **k: (encoded.append(1), encode(self, *a, **k))[1]
    )
    for bad, match in (({}, "batch of"), ({"num_images_per_prompt": 2}, "num_images_per_prompt=2")):
        embeds = embeddings(1) if not bad else embeddings(2)
        with pytest.raises(ValueError, match=match) as error:
            _run(band, embeds, **bad)
        assert any(frame.name == "check_inputs" for frame in error.traceback)
    with pytest.raises(ValueError, match="batch of"):
        band.check_inputs(["one prompt"], None, 32, 32)
    assert not encoded  # rejected before text encoding
    assert _run(band, embeddings(1), band={"enabled": False}).shape[0] == 1  # off: any batch, as stock


def test_kontext_band_strength_zero_is_stock_and_scales_only_context_keys():
    c = components("kontext")
    stock, band = FluxKontextPipeline(**c), BandModulationKontextPipeline(**c)
    e, picture = embeddings(1), image(32, 48)
    kwargs = dict(
        image=picture,
        height=32,
        width=48,
        max_area=32 * 48,
        _auto_resize=False,
        num_inference_steps=2,
        output_type="latent",
        **e,
    )
    reference = stock(generator=torch.Generator().manual_seed(0), **kwargs).images
    same = band(generator=torch.Generator().manual_seed(0), band={"strength": 0.0}, **kwargs).images
    assert torch.equal(same, reference)
    edited = band(generator=torch.Generator().manual_seed(0), **kwargs).images
    assert not torch.allclose(edited, reference)


def test_inverted_reference_follows_inverse_euler(flux_pipes):
    _, band = flux_pipes
    e = embeddings(2)
    seen, sigmas = [], []
    hooks = [
        band.transformer.register_forward_pre_hook(
            lambda m, a, kw: sigmas.append(float(kw["timestep"][0])), with_kwargs=True
        ),
        band.transformer.x_embedder.register_forward_pre_hook(lambda m, a: seen.append(a[0][0].clone())),
    ]
    x0 = torch.randn(1, 6, 4)
    try:
        _run(band, e, reference_latents=x0, reference_mode="invert")
    finally:
        for hook in hooks:
            hook.remove()
    # inside the first step's hook: 3 inversion forwards at sigma 0, s2, s1 (batch 1); then the 3 steps' forwards
    assert len(seen) == 6 and sigmas[1] == 0.0
    step_sigmas = [sigmas[0], sigmas[4], sigmas[5]]
    with torch.no_grad():
        ids = FluxPipeline._prepare_latent_image_ids(1, 2, 3, "cpu", torch.float32)
        velocity = band.transformer(
            hidden_states=x0,
            timestep=torch.zeros(1),
            encoder_hidden_states=e["prompt_embeds"][:1],
            pooled_projections=e["pooled_prompt_embeds"][:1],
            txt_ids=torch.zeros(6, 3),
            img_ids=ids,
            return_dict=False,
        )[0]
    torch.testing.assert_close(seen[-1], (x0 + step_sigmas[-1] * velocity)[0])
    assert torch.equal(seen[0], x0[0]) and torch.equal(seen[1], seen[-1]) and torch.equal(seen[2], seen[4])
    with pytest.raises(ValueError, match="reference_mode"):
        _run(band, e, reference_latents=x0, reference_mode="ddim")


def test_adain_matches_reference_statistics_and_leaves_the_reference_alone():
    from mmpos.pipelines.edits.band.rule import adain

    x = torch.randn(2, 10, 3, 4, dtype=torch.float64) * 3 + 1
    ref = torch.randn(1, 7, 3, 4, dtype=torch.float64) * 0.5 - 2
    out = adain(x, ref, eps=0.0)
    torch.testing.assert_close(out.mean(1), ref.mean(1).expand(2, -1, -1))
    torch.testing.assert_close(out.std(1), ref.std(1).expand(2, -1, -1))
    attn, rotary, context, hidden, text = _shared_attention_setup(double=False)
    plain = SharedBandAttention(BandConfig(), (4, 4, 8)).attend_call(
        flux_layer_call(attn, hidden, text, rotary, context.segments), context
    )
    with_adain = SharedBandAttention(BandConfig(adain_qk=True), (4, 4, 8)).attend_call(
        flux_layer_call(attn, hidden, text, rotary, context.segments), context
    )
    assert torch.equal(plain[0], with_adain[0]) and not torch.allclose(plain[1:], with_adain[1:])


def test_attention_probe_records_what_the_rule_attends_with():
    from mmpos.pipelines.edits.band.figures import AttentionProbe

    attn, rotary, context, hidden, text = _shared_attention_setup(double=True)
    probes = {}
    for adain_qk in (False, True):
        probe = AttentionProbe(SharedBandAttention(BandConfig(adain_qk=adain_qk), (4, 4, 8)), progress=0.0)
        probe.attend_call(flux_layer_call(attn, hidden, text, rotary, context.segments), context)
        probes[adain_qk] = probe
    plain, matched = probes[False], probes[True]
    assert torch.equal(plain.query[0], matched.query[0])  # the reference is never AdaIN-ed
    assert not torch.allclose(plain.query[1:], matched.query[1:])  # the targets' recorded q follow adain_qk
