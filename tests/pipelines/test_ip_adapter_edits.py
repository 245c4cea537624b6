"""Editing pipelines on a tiny Flux with an IP-Adapter (built offline with diffusers' loader): off == stock bit for
bit; on, the IP-Adapter term is the IP-Adapter processor's own."""

import pytest
import torch
from diffusers import FluxKontextPipeline, FluxPipeline
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

from mmpos.coords import flux_ids
from mmpos.pipelines import BandModulationFluxPipeline, BandModulationKontextPipeline, LooseRoPEKontextPipeline
from mmpos.pipelines.edits.context import EditContext, EditSession
from mmpos.pipelines.edits.processor import EditAttnProcessor
from mmpos.pipelines.edits.segments import segments_from_ids
from tests.fixtures.tiny_models import components, embeddings, image, ip_adapter_embeds, load_tiny_ip_adapter

IP = dict(ip_adapter_image_embeds=ip_adapter_embeds(), negative_ip_adapter_image_embeds=ip_adapter_embeds(seed=5))
MASK = torch.zeros(48, 48, dtype=torch.bool)
MASK[8:40, 0:32] = True


def _with_ip_adapter(kind):
    parts = components(kind)
    load_tiny_ip_adapter(parts["transformer"])
    return parts


def _run(pipe, **kwargs):
    return pipe(
        generator=torch.Generator().manual_seed(0), num_inference_steps=2, output_type="latent", **IP, **kwargs
    ).images


def test_band_t2i_off_equals_stock_flux_with_an_ip_adapter():
    parts = _with_ip_adapter("flux")
    common = dict(height=32, width=32, **embeddings(2))
    expected = _run(FluxPipeline(**parts), **common)
    band = BandModulationFluxPipeline(**parts)
    assert torch.equal(_run(band, band={"enabled": False}, **common), expected)
    edited = _run(band, **common)
    assert torch.isfinite(edited).all() and not torch.equal(edited, expected)


@pytest.mark.parametrize(
    "pipeline, off, on",
    [
        (BandModulationKontextPipeline, {"band": {"strength": 0.0}}, {"band": {"strength": 1.0}}),
        (
            LooseRoPEKontextPipeline,
            {"loose": {"enabled": False}, "crop_mask": MASK},
            {"loose": {"step_range": (0, 1)}, "crop_mask": MASK},
        ),
    ],
)
def test_kontext_edits_off_equal_stock_kontext_with_an_ip_adapter(pipeline, off, on):
    parts = _with_ip_adapter("kontext")
    common = dict(image=image(48, 48), height=48, width=48, max_area=48 * 48, _auto_resize=False, **embeddings(1))
    expected = _run(FluxKontextPipeline(**parts), **common)
    edit = pipeline(**parts)
    assert torch.equal(_run(edit, **off, **common), expected)
    edited = _run(edit, **on, **common)
    assert torch.isfinite(edited).all() and not torch.equal(edited, expected)


class _StockAttention:
    """A rule that recomputes the joint attention as the stock processor would (to isolate the IP term)."""

    def __init__(self, processor, rotary_emb, hidden_states, encoder_hidden_states):
        self.processor, self.rotary_emb = processor, rotary_emb
        self.inputs = hidden_states, encoder_hidden_states

    def is_active(self, context):
        return True

    def attend_call(self, call, context):
        return self.processor(call.attn, *self.inputs, None, self.rotary_emb)


def test_active_rule_keeps_the_ip_adapter_term():
    parts = _with_ip_adapter("flux")
    transformer = parts["transformer"]
    attn = transformer.transformer_blocks[0].attn
    ip_processor = attn.processor
    generator = torch.Generator().manual_seed(6)
    hidden, text = torch.randn(1, 4, 32, generator=generator), torch.randn(1, 3, 32, generator=generator)
    ip_states = [torch.randn(1, 4, 32, generator=generator)]
    rotary_emb = transformer.pos_embed(flux_ids(2, 2, text_length=3))
    expected = ip_processor(attn, hidden, text, None, rotary_emb, ip_hidden_states=ip_states)
    rule = _StockAttention(FluxAttnProcessor(), rotary_emb, hidden, text)
    context = EditContext(rules={0: rule}, segments=segments_from_ids(3, flux_ids(2, 2)))  # as the hook sets them
    with EditSession(transformer, context):
        assert isinstance(attn.processor, EditAttnProcessor)
        out = attn(hidden, text, image_rotary_emb=rotary_emb, ip_hidden_states=ip_states)  # FluxAttention filters
    assert len(out) == 3 and all(torch.equal(a, b) for a, b in zip(out, expected))
