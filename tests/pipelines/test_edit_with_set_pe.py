"""Edits and ``set_pe`` share one processor installer: they compose, and uninstalling restores what was there."""

import pytest
import torch
from diffusers import FluxKontextPipeline
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

from mmpos.coords.edits import shrink_ids
from mmpos.integrations.diffusers import FluxPEAttnProcessor, position_module, restore, set_pe
from mmpos.integrations.diffusers.installer import ATTRIBUTE, ProcessorInstaller
from mmpos.pipelines import BandModulationKontextPipeline, LooseRoPEKontextPipeline
from mmpos.pipelines.edits.band.rule import BandConfig, ContextBandScaling
from mmpos.pipelines.edits.context import EditContext, EditSession
from mmpos.pipelines.edits.loose.rule import LooseConfig, LooseRoPERule
from mmpos.pipelines.edits.loose.saliency import UniformSaliency
from mmpos.pipelines.edits.processor import EditAttnProcessor
from mmpos.spectrum.bands import band_spectrum
from tests.fixtures.tiny_models import TEXT_LEN, components, embeddings, image

YARN = {"type": "yarn", "factor": 2.0, "original_length": 64}
NTK = {"type": "ntk", "factor": 2.0}
AXES = (4, 4, 8)


class RecordRotation:
    """Wraps a rule; records the rotation each active layer hands it, with the step progress and ids."""

    def __init__(self, rule):
        self.rule, self.seen = rule, []

    def __getattr__(self, name):  # prepare, adain, ...
        return getattr(self.rule, name)

    def is_active(self, context):
        return self.rule.is_active(context)

    def attend_call(self, call, context):
        self.seen.append((call.rotation, context.progress, context.img_ids, context.segments))
        return self.rule.attend_call(call, context)


def _kontext(seed=0):
    c = components("kontext", seed=seed)
    return c, FluxKontextPipeline(**c)


def _run(pipe, **extra):
    kwargs = dict(
        image=extra.pop("image", image(32, 48)),
        height=32,
        width=48,
        max_area=32 * 48,
        _auto_resize=False,
        num_inference_steps=2,
        output_type="latent",
        **embeddings(1),
    )
    return pipe(generator=torch.Generator().manual_seed(0), **kwargs, **extra).images


def _exact_cis(spectrum, ids):
    """``magnitude * exp(i * phase)`` in fp64 from the spectrum (the math, not the library's tables)."""
    phase = ids.double()[:, spectrum.axis_of_pair] * spectrum.inv_freq
    return spectrum.magnitude * torch.polar(torch.ones_like(phase), phase)


@pytest.mark.parametrize("pe,options", [("rope_axial", {"extrapolation": YARN}), ("native", {"extrapolation": NTK})])
def test_band_over_set_pe_is_identity_at_strength_zero(pe, options):
    c, stock = _kontext()
    band = BandModulationKontextPipeline(**c)  # the same transformer
    plain = _run(stock)
    set_pe(c["transformer"], pe, **options)
    reference = _run(stock)
    assert not torch.equal(reference, plain)  # the extrapolated spectrum changes the model
    assert torch.equal(_run(band, band={"strength": 0.0}), reference)
    assert torch.equal(_run(band, band={"enabled": False}), reference)
    assert not torch.allclose(_run(band), reference)
    assert all(isinstance(p, FluxPEAttnProcessor) for p in c["transformer"].attn_processors.values())


def test_band_rotates_with_the_set_pe_spectrum_and_scales_its_magnitude():
    c, pipe = _kontext()
    transformer = c["transformer"]
    set_pe(transformer, "rope_axial", extrapolation=YARN)
    encoding = position_module(transformer).encodings[0]
    assert not bool((encoding.spectrum.magnitude == 1).all())  # YaRN's attention factor
    config = BandConfig()
    spy = RecordRotation(ContextBandScaling(config, AXES))
    with EditSession(transformer, EditContext(rules={0: spy, 1: spy}), pipe.scheduler):
        _run(pipe)
    rotation, progress, img_ids, segments = spy.seen[-1]
    assert rotation.encoding is encoding
    ids = torch.cat([torch.zeros(TEXT_LEN, 3), img_ids.float()])
    torch.testing.assert_close(
        rotation.table.cis.to(torch.complex128), _exact_cis(encoding.spectrum, ids), rtol=1e-6, atol=1e-6
    )
    s_hf, s_lf = config.endpoints(progress)
    banded = band_spectrum(encoding.spectrum, s_hf, s_lf, config.beta, config.spatial_axes, config.axis0_mode)
    got = spy.rule.band_table(_at_progress(progress), rotation, segments.context).cis
    torch.testing.assert_close(
        got.to(torch.complex128), _exact_cis(banded, ids)[segments.context], rtol=1e-6, atol=1e-6
    )


def _at_progress(progress: float) -> EditContext:
    """A context whose step progress is ``progress`` (step ``progress * 100`` of 101)."""
    return EditContext(step=round(progress * 100), num_steps=101)


@pytest.mark.parametrize("pe,options", [("rope_axial", {"extrapolation": YARN}), ("native", {"extrapolation": NTK})])
def test_loose_over_set_pe_is_identity_at_strength_zero_and_uses_its_tables(pe, options):
    c, stock = _kontext()
    loose = LooseRoPEKontextPipeline(**c)
    collage, mask = image(48, 48), torch.zeros(48, 48, dtype=torch.bool)
    mask[8:40, 0:32] = True
    schedule = dict(cutoffs=(1, 2), step_range=(0, 2), saliency="spectral_residual")

    def run(pipe, **extra):
        return pipe(
            image=collage,
            height=48,
            width=48,
            max_area=48 * 48,
            num_inference_steps=4,
            _auto_resize=False,
            output_type="latent",
            generator=torch.Generator().manual_seed(0),
            **embeddings(1),
            **extra,
        ).images

    set_pe(c["transformer"], pe, **options)
    reference = run(stock)
    assert torch.equal(run(loose, crop_mask=mask, loose={**schedule, "strength": 0.0}), reference)
    edited = run(loose, crop_mask=mask, loose=schedule)
    assert not torch.allclose(edited, reference)


def test_loose_tables_come_from_the_set_pe_spectrum():
    c, pipe = _kontext()
    transformer = c["transformer"]
    set_pe(transformer, "rope_axial", extrapolation=YARN)
    encoding = position_module(transformer).encodings[0]
    collage, mask = image(32, 48), torch.zeros(32, 48, dtype=torch.bool)
    mask[0:32, 0:32] = True
    config = LooseConfig(saliency_blur=0, saliency_boost=1.0, step_range=(0, 5))
    spy = RecordRotation(LooseRoPERule(config, UniformSaliency()(collage, mask), mask))
    context = EditContext(rules={0: spy, 1: spy})
    with EditSession(transformer, context, pipe.scheduler):
        _run(pipe, image=collage)
    rotation, _, img_ids, segments = spy.seen[-1]
    assert rotation.encoding is encoding and context.cache["loose"]
    rows, cols = segments.target_grid
    for b, _, loose_emb, _ in context.cache["loose"]:
        shrink = float(config.factors_at(context.step)[0][b])
        ids = torch.cat([torch.zeros(TEXT_LEN, 3), shrink_ids(img_ids, shrink, ((rows - 1) / 2, (cols - 1) / 2))])
        torch.testing.assert_close(
            rotation.table_of(loose_emb).cis.to(torch.complex128),
            _exact_cis(encoding.spectrum, ids),
            rtol=1e-6,
            atol=1e-6,
        )


def test_uninstall_restores_what_was_there_in_any_order():
    c, _ = _kontext()
    transformer = c["transformer"]
    stock = dict(transformer.attn_processors)
    rule = ContextBandScaling(BandConfig(), AXES)

    set_pe(transformer, "native")
    with_pe = dict(transformer.attn_processors)
    with EditSession(transformer, EditContext(rules={0: rule})):
        edit = transformer.attn_processors["transformer_blocks.0.attn.processor"]
        assert isinstance(edit, EditAttnProcessor) and edit.beneath is with_pe["transformer_blocks.0.attn.processor"]
        restore(transformer)  # the encoding level goes; the edit now runs over the stock processor
        assert edit.beneath is stock["transformer_blocks.0.attn.processor"]
        set_pe(transformer, "rope_axial")  # and slides back under the edit
        assert isinstance(edit.beneath, FluxPEAttnProcessor)
        assert transformer.attn_processors["transformer_blocks.0.attn.processor"] is edit
    assert all(isinstance(p, FluxPEAttnProcessor) for p in transformer.attn_processors.values())
    restore(transformer)
    assert transformer.attn_processors == stock
    assert not transformer._forward_pre_hooks and getattr(transformer, ATTRIBUTE) is None


def test_an_exception_inside_the_session_restores_the_processors():
    c, _ = _kontext()
    transformer = c["transformer"]
    set_pe(transformer, "native")
    before, hooks = dict(transformer.attn_processors), dict(transformer._forward_pre_hooks)
    with pytest.raises(RuntimeError, match="boom"):
        with EditSession(transformer, EditContext(rules={0: ContextBandScaling(BandConfig(), AXES)})):
            raise RuntimeError("boom")
    assert transformer.attn_processors == before and dict(transformer._forward_pre_hooks) == hooks
    with pytest.raises(ValueError, match="out of range"):
        EditSession(transformer, EditContext(rules={7: ContextBandScaling(BandConfig(), AXES)})).__enter__()
    assert transformer.attn_processors == before and ProcessorInstaller.find(transformer) is not None
    restore(transformer)
    assert all(type(p) is FluxAttnProcessor for p in transformer.attn_processors.values())
    with pytest.raises(ValueError, match="out of range"):  # an installer made only for a failed session goes
        EditSession(transformer, EditContext(rules={7: ContextBandScaling(BandConfig(), AXES)})).__enter__()
    assert ProcessorInstaller.find(transformer) is None and not transformer._forward_pre_hooks


def test_attention_backend_set_over_an_edit_reaches_the_processor_beneath():
    c, _ = _kontext()
    transformer = c["transformer"]
    set_pe(transformer, "native")
    with EditSession(transformer, EditContext(rules={0: ContextBandScaling(BandConfig(), AXES)})):
        transformer.set_attention_backend("native")  # diffusers sets it on each layer's top processor
        edit = transformer.attn_processors["transformer_blocks.0.attn.processor"]
        assert edit.beneath._attention_backend == "native" and edit._attention_backend == "native"
    restore(transformer)
