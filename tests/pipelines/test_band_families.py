"""Band modulation through the edit seam on FLUX.2 / Klein, Qwen-Image and Z-Image (tiny offline pipelines).

Per family: the edit off is the stock pipeline bit for bit (also under ``set_pe`` extrapolation); the rule's
rotation is the family's spectrum at the family's coordinates, scaled by the band law (fp64 math); shared
attention at strength 0 is plain shared attention and at strength 1 the band law, against explicit fp64 math on
each family's token layout; reference tokens are found by their coordinates, not their place in the sequence.
"""

import pytest
import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Pipeline,
    QwenImagePipeline,
    ZImagePipeline,
)

from mmpos.integrations.diffusers import set_pe
from mmpos.integrations.diffusers.families.tiny import flux2_inputs, randn, tiny_flux2, tiny_z_image
from mmpos.integrations.diffusers.layer_rotation import LayerRotation
from mmpos.ops.tables import RotaryTable
from mmpos.pipelines import (
    BandConfig,
    BandModulationFlux2KleinPipeline,
    BandModulationFlux2Pipeline,
    BandModulationQwenImagePipeline,
    BandModulationZImagePipeline,
    EditContext,
    EditSession,
)
from mmpos.pipelines.edits.band.rule import ContextBandScaling, SharedBandAttention
from mmpos.pipelines.edits.families import LayerCall, edit_attention
from mmpos.pipelines.edits.families.flux2 import flux2_segments
from mmpos.pipelines.edits.families.qwen import qwen_segments
from mmpos.pipelines.edits.families.z_image import z_image_segments
from mmpos.pipelines.edits.segments import TokenSegments
from mmpos.spectrum import chunked_spectrum
from mmpos.spectrum.bands import band_scale_per_pair, band_spectrum
from tests.fixtures.tiny_qwen_image import qwen_prompt_embeds, tiny_qwen_image_components

NTK = {"type": "ntk", "factor": 2.0}


# ---- tiny pipelines ---------------------------------------------------------------------------------------------
def _flux2_vae():
    torch.manual_seed(0)
    return AutoencoderKLFlux2(
        block_out_channels=(4,),
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def _z_image_vae():
    torch.manual_seed(0)
    return AutoencoderKL(
        block_out_channels=(4,),
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=1,
        shift_factor=0.0,
        scaling_factor=1.0,
    )


def _components(family):
    if family in ("flux2", "klein"):
        torch.manual_seed(0)
        return dict(
            scheduler=FlowMatchEulerDiscreteScheduler(),
            vae=_flux2_vae(),
            text_encoder=None,
            tokenizer=None,
            transformer=tiny_flux2().eval(),
        )
    if family == "qwen":
        return tiny_qwen_image_components(text_encoder=False)
    torch.manual_seed(0)
    return dict(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_z_image_vae(),
        text_encoder=None,
        tokenizer=None,
        transformer=tiny_z_image().eval(),
    )


PIPES = {
    "flux2": (Flux2Pipeline, BandModulationFlux2Pipeline),
    "klein": (Flux2KleinPipeline, BandModulationFlux2KleinPipeline),
    "qwen": (QwenImagePipeline, BandModulationQwenImagePipeline),
    "z_image": (ZImagePipeline, BandModulationZImagePipeline),
}


def _pipes(family):
    c = _components(family)
    stock, band = PIPES[family]
    return c, stock(**c), band(**c)


def _embeds(family, batch):
    if family in ("flux2", "klein"):
        return dict(prompt_embeds=randn(batch, 5, 16, seed=3))
    if family == "qwen":
        return qwen_prompt_embeds(batch, 5, seed=3)
    return dict(prompt_embeds=[randn(5 + i, 16, seed=3 + i) for i in range(batch)])  # captions of unequal lengths


def _run(family, pipe, batch=3, **extra):
    size = 64 if family == "qwen" else 8  # 4 x 4 tokens (VAE factors 8 and 1)
    kwargs = dict(height=size, width=size, num_inference_steps=2, output_type="latent", **_embeds(family, batch))
    if family == "klein":
        kwargs["guidance_scale"] = 1.0
    if family == "z_image":
        kwargs.update(guidance_scale=0.0)
    kwargs.update(extra)
    out = pipe(generator=torch.Generator().manual_seed(0), **kwargs).images
    return torch.stack(list(out)) if isinstance(out, (list, tuple)) else out


FAMILIES = ("flux2", "klein", "qwen", "z_image")


@pytest.mark.parametrize("family", FAMILIES)
def test_band_off_is_the_stock_pipeline_and_on_keeps_the_references_trajectory(family):
    _, stock, band = _pipes(family)
    reference = _run(family, stock)
    assert torch.equal(_run(family, band, band={"enabled": False}), reference)
    assert torch.equal(_run(family, band, band={"window": (0.2, 0.8)}), reference)  # no step in the window (2 steps)
    edited = _run(family, band)
    assert not torch.allclose(edited[1:], reference[1:])
    # element 0 attends to itself only: its trajectory is the stock one (mmpos' rotation in fp32)
    torch.testing.assert_close(edited[0], reference[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_set_pe_extrapolation_under_the_edit_off_is_the_set_pe_model(family):
    c, stock, band = _pipes(family)
    plain = _run(family, stock)
    set_pe(c["transformer"], "native", extrapolation=NTK)
    reference = _run(family, stock)
    assert not torch.equal(reference, plain)  # the extrapolated spectrum changes the model
    assert torch.equal(_run(family, band, band={"enabled": False}), reference)
    assert not torch.allclose(_run(family, band)[1:], reference[1:])


@pytest.mark.parametrize("family", ["flux2", "z_image"])
def test_set_pe_encoding_processors_under_the_edit(family):
    """``rope_axial`` runs through mmpos processors (packed tables): the edit rotates with the encoding's table."""
    c, stock, band = _pipes(family)
    set_pe(c["transformer"], "rope_axial", extrapolation={"type": "yarn", "factor": 2.0, "original_length": 4})
    processors = [m.processor for m in c["transformer"].modules() if hasattr(m, "processor")]
    assert processors and not any(type(p).__module__.startswith("diffusers") for p in processors)
    reference = _run(family, stock)
    assert torch.equal(_run(family, band, band={"enabled": False}), reference)
    edited = _run(family, band)
    assert not torch.allclose(edited[1:], reference[1:])
    torch.testing.assert_close(edited[0], reference[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["klein", "z_image"])
def test_band_batch_is_checked_before_any_work(family):
    _, _, band = _pipes(family)
    with pytest.raises(ValueError, match=r"\[reference, target, ...\]"):
        _run(family, band, batch=1)
    with pytest.raises(ValueError, match="num_images_per_prompt"):
        _run(family, band, batch=2, num_images_per_prompt=2)


def test_z_image_cfg_batches_are_shared_within_each_half():
    _, stock, band = _pipes("z_image")
    negative = dict(negative_prompt_embeds=[randn(4, 16, seed=9 + i) for i in range(3)], guidance_scale=2.0)
    reference = _run("z_image", stock, **negative)
    assert torch.equal(_run("z_image", band, band={"enabled": False}, **negative), reference)
    edited = _run("z_image", band, **negative)
    torch.testing.assert_close(edited[0], reference[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(edited[1:], reference[1:])


def test_the_band_record_maps_each_stock_pipeline_to_its_band_pipeline():
    from mmpos.integrations.diffusers.families import family_for_pipeline
    from mmpos.pipelines.edits import get_edit

    band = get_edit("band")
    assert band.pipeline_class("Flux2Pipeline") is BandModulationFlux2Pipeline
    assert band.pipeline_class("QwenImagePipeline") is BandModulationQwenImagePipeline
    assert band.pipeline_class("ZImagePipeline") is BandModulationZImagePipeline
    for stock in band.pipelines:  # each a subclass of the stock pipeline it runs on, of a family with an adapter
        assert stock in [cls.__name__ for cls in band.pipeline_class(stock).__mro__]
        family = family_for_pipeline(stock)
        assert family is not None and edit_attention(family.name).family == family.name


# ---- the rotation: the family's spectrum at the family's coordinates, scaled by the band law ----------------------
class Spy:
    """Wraps a rule; records each layer call it gets."""

    def __init__(self, rule):
        self.rule, self.calls = rule, []

    def __getattr__(self, name):
        return getattr(self.rule, name)

    def is_active(self, context):
        return self.rule.is_active(context)

    def attend_call(self, call, context):
        self.calls.append((call, context.progress))
        return self.rule.attend_call(call, context)


def _exact_cis(spectrum, coords):
    phase = coords.double()[:, spectrum.axis_of_pair] * spectrum.inv_freq
    return spectrum.magnitude * torch.polar(torch.ones_like(phase), phase)


def _flux2_coords(text, rows, cols):
    """``[text | image]`` ids of FLUX.2 (text ``(0, 0, 0, l)``, image ``(0, r, c, 0)``), written out here."""
    txt = torch.stack([torch.zeros(text), torch.zeros(text), torch.zeros(text), torch.arange(text)], dim=-1)
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    img = torch.stack([torch.zeros(rows * cols), r.flatten(), c.flatten(), torch.zeros(rows * cols)], dim=-1)
    return torch.cat([txt, img.float()])


def _qwen_coords(text, rows, cols):
    """Qwen-Image's centred ``[text | image]`` coordinates: rows ``r - (h - h // 2)``, text ``m + j`` on all axes."""
    r, c = torch.meshgrid(
        torch.arange(rows) - (rows - rows // 2), torch.arange(cols) - (cols - cols // 2), indexing="ij"
    )
    img = torch.stack([torch.zeros(rows * cols), r.flatten().float(), c.flatten().float()], dim=-1)
    start = max(rows // 2, cols // 2)
    return torch.cat([(start + torch.arange(text).float())[:, None].expand(-1, 3), img])


@pytest.mark.parametrize("family", ["flux2", "qwen", "z_image"])
def test_the_rules_rotation_is_the_familys_spectrum_scaled_by_the_band_law(family):
    _, stock, _ = _pipes(family)
    transformer = stock.transformer
    config = BandConfig(s_hf=(0.2, 0.6), s_lf=(1.1, 1.5))
    axes = tuple(transformer.config.axes_dims_rope if family != "z_image" else transformer.config.axes_dims)
    theta = {
        "flux2": transformer.config.get("rope_theta", None),
        "qwen": 10000.0,
        "z_image": transformer.config.get("rope_theta", None),
    }[family]
    spy = Spy(SharedBandAttention(config, axes))
    with EditSession(transformer, EditContext(rules={0: spy}), stock.scheduler):
        _run(family, stock, batch=2)
    call, progress = spy.calls[-1]
    image = call.segments.image
    assert image.stop - image.start == 16  # 4 x 4 tokens
    spectrum = chunked_spectrum(axes, float(theta))
    if family == "flux2":
        coords = _flux2_coords(5, 4, 4)
    elif family == "qwen":
        coords = _qwen_coords(5, 4, 4)
    else:  # Z-Image: image tokens (caption length + 1, r, c), the caption padded to 32 tokens
        r, c = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
        coords = torch.stack([torch.full((16,), 33.0), r.flatten().float(), c.flatten().float()], dim=-1)
        coords = torch.cat([coords, torch.zeros(32 - 16, 3)])  # padding to 32
    cis = call.rotation.table.cis
    cis = cis[0, 0] if cis.dim() == 4 else cis
    exact = _exact_cis(spectrum, coords)
    torch.testing.assert_close(cis[: exact.shape[0]].to(torch.complex128), exact, rtol=1e-6, atol=1e-6)
    banded = band_spectrum(spectrum, *config.endpoints(progress), config.beta, config.spatial_axes, config.axis0_mode)
    got = spy.rule.band_table(EditContext(step=round(progress * 100), num_steps=101), call.rotation, image).cis
    got = got[0, 0] if got.dim() == 4 else got
    torch.testing.assert_close(got.to(torch.complex128), _exact_cis(banded, coords)[image], rtol=1e-6, atol=1e-6)


# ---- shared attention against explicit fp64 math, on each family's token layout ----------------------------------
class _Attn:
    processor = None


def _layouts():
    """``(name, segments, sequence length, key mask)``: FLUX.2 ``[text | image]``, Qwen ``[text | image]`` with a
    padded text token, Z-Image ``[image | padding | caption]`` with batch padding."""
    mask = torch.ones(3, 30, dtype=torch.bool)
    mask[1, -3:] = False
    qwen_mask = torch.ones(3, 12, dtype=torch.bool)
    qwen_mask[:, 3] = False
    return [
        ("flux2", TokenSegments(4, 8), 12, None),
        ("qwen", TokenSegments(4, 8), 12, qwen_mask),
        ("z_image", TokenSegments(14, 8, text_start=16, target_start=0), 30, mask),
    ]


def _softmax_attention(q, k, v, mask=None):
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if mask is not None:
        logits = logits.masked_fill(~mask[:, None, None, :], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", logits.softmax(-1), v)


@pytest.mark.parametrize("strength", [0.0, 1.0])
@pytest.mark.parametrize("layout", _layouts(), ids=lambda layout: layout[0])
def test_shared_band_attention_matches_explicit_math(layout, strength):
    _, segments, length, mask = layout
    axes, heads = (4, 4, 8), 2
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, length, heads, 16, dtype=torch.float64) for _ in range(3))
    coords = torch.randn(length, 3, dtype=torch.float64) * 4
    spectrum = chunked_spectrum(axes, 100.0)
    cis = _exact_cis(spectrum, coords)
    call = LayerCall(_Attn(), q, k, v, segments, LayerRotation(RotaryTable(cis)), mask, lambda out, dtype: out)
    config = BandConfig(s_hf=(0.2, 0.6), s_lf=(1.1, 1.5), strength=strength)
    out = SharedBandAttention(config, axes).attend_call(call, EditContext(step=2, num_steps=5))

    def rotate(x, table):
        pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous()) * table[None, :, None, :]
        return torch.view_as_real(pairs).flatten(-2)

    image = segments.image
    scales = 1 + strength * (band_scale_per_pair(spectrum.axis_of_pair, *config.endpoints(0.5)) - 1)
    rq, rk = rotate(q, cis), rotate(k, cis)
    ref_k = rotate(k[:1, image], cis[image] * scales)
    expected = [_softmax_attention(rq[:1], rk[:1], v[:1], None if mask is None else mask[:1])]
    for t in (1, 2):
        keys, values = torch.cat([rk[t : t + 1], ref_k], 1), torch.cat([v[t : t + 1], v[:1, image]], 1)
        key_mask = None if mask is None else torch.cat([mask[t : t + 1], torch.ones(1, 8, dtype=torch.bool)], 1)
        expected.append(_softmax_attention(rq[t : t + 1], keys, values, key_mask))
    torch.testing.assert_close(out, torch.cat(expected), rtol=1e-12, atol=1e-12)


# ---- reference tokens found by their coordinates ------------------------------------------------------------------
def test_flux2_references_are_found_by_t_not_by_their_place():
    ids = torch.cat(
        [
            _flux2_coords(0, 2, 2)[:, :] + torch.tensor([20.0, 0, 0, 0]),  # reference t = 20 first
            _flux2_coords(0, 3, 3),
            _flux2_coords(0, 2, 3) + torch.tensor([10.0, 0, 0, 0]),
        ]
    )
    with pytest.raises(ValueError, match="before or after"):
        flux2_segments(5, ids)
    ids = torch.cat(
        [
            _flux2_coords(0, 3, 3),
            _flux2_coords(0, 2, 2) + torch.tensor([20.0, 0, 0, 0]),
            _flux2_coords(0, 2, 3) + torch.tensor([10.0, 0, 0, 0]),
        ]
    )
    seg = flux2_segments(5, ids)
    assert (seg.target, seg.context) == (slice(5, 14), slice(14, 24))
    assert seg.references == (slice(18, 24), slice(14, 18))  # t = 10 first, although it comes last
    seg = flux2_segments(5, torch.cat([ids[9:], ids[:9]]))  # references before the target
    assert (seg.target, seg.context, seg.target_grid) == (slice(15, 24), slice(5, 15), (3, 3))


def test_flux2_reference_band_follows_the_reference_tokens_when_the_sequence_is_reordered():
    model = tiny_flux2().eval()
    inputs = flux2_inputs(3, 3, reference=(2, 2))  # target t = 0 (9 tokens), then a reference at t = 10 (4)
    order = torch.cat([torch.arange(9, 13), torch.arange(9)])  # the reference's tokens first
    moved = dict(inputs, hidden_states=inputs["hidden_states"][:, order], img_ids=inputs["img_ids"][:, order])
    rule = ContextBandScaling(BandConfig(), model.config.axes_dims_rope)
    with torch.no_grad():
        stock = model(**inputs).sample
        with EditSession(model, EditContext(rules={0: rule, 1: rule})):
            edited = model(**inputs).sample
            edited_moved = model(**moved).sample
    assert not torch.allclose(edited[:, :9], stock[:, :9])
    torch.testing.assert_close(edited_moved, edited[:, order], rtol=1e-5, atol=1e-5)


def test_qwen_condition_images_are_found_by_frame_index():
    seg = qwen_segments(6, [[(1, 4, 4), (1, 2, 3), (1, 2, 2)]])
    assert (seg.target, seg.context, seg.target_grid) == (slice(6, 22), slice(22, 32), (4, 4))
    assert seg.references == (slice(22, 28), slice(28, 32))


def test_z_image_padding_is_neither_target_nor_reference():
    ids = torch.cat([torch.tensor([[8, r, c] for r in range(3) for c in range(5)]), torch.zeros(17, 3)]).int()
    layout = z_image_segments([ids, ids.clone()], text_len=32)
    assert layout["context_refiner"] is None
    main, refiner = layout["layers"], layout["noise_refiner"]
    assert (main.target, main.text, main.target_grid) == (slice(0, 15), slice(32, 64), (3, 5))
    assert (refiner.target, refiner.text_len) == (slice(0, 15), 0)


@pytest.mark.parametrize("family", ["klein"])  # Flux2Pipeline lays out the references the same way
def test_flux2_reference_images_band_scales_their_keys(family):
    from PIL import Image

    _, stock, band = _pipes(family)
    images = [
        Image.fromarray((torch.rand(64, 64, 3, generator=torch.Generator().manual_seed(s)) * 255).byte().numpy())
        for s in (1, 2)
    ]
    reference = _run(family, stock, batch=1, image=images)
    assert torch.equal(_run(family, band, batch=1, image=images, band={"enabled": False}), reference)
    assert torch.equal(_run(family, band, batch=1, image=images, band={"strength": 0.0}), reference)  # scales 1
    spy = Spy(ContextBandScaling(BandConfig(), (4, 4, 4, 4)))
    with EditSession(stock.transformer, EditContext(rules={0: spy, 1: spy}), stock.scheduler):
        edited = _run(family, stock, batch=1, image=images)
    assert not torch.allclose(edited, reference)
    segments = spy.calls[-1][0].segments
    assert (segments.target_len, segments.context_len, len(segments.references)) == (16, 2048, 2)  # 32 x 32 each
    torch.testing.assert_close(_run(family, band, batch=1, image=images), edited, rtol=0, atol=0)
