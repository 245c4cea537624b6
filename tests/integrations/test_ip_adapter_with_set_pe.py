"""An IP-Adapter and ``set_pe`` on a tiny FLUX.1 pipeline, in either order (``pipe.load_ip_adapter`` before or after
``set_pe``; ``unload_ip_adapter`` and ``set_ip_adapter_scale`` after it), built offline in diffusers' state-dict
layout. Properties: ``"native"`` + IP-Adapter is the IP-Adapter pipeline without mmpos bit for bit, in either order;
an encoding (``rope_axial``, DyPE) + IP-Adapter is the same in either order, is the encoding alone at IP scale 0 and
differs from it at scale 1 (the image-prompt term attends from the image queries before the rotation, without
positions, so no encoding changes it); unloading gives the set_pe pipeline without IP-Adapter, ``restore`` the stock
one with it."""

import pytest
import torch
from diffusers import FluxPipeline
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, FluxIPAdapterAttnProcessor

from mmpos.integrations.diffusers import DyPEConfig, apply_dype, restore, set_pe
from tests.fixtures.tiny_models import components, embeddings, ip_adapter_embeds, tiny_ip_adapter_state_dict

IP = dict(ip_adapter_image_embeds=ip_adapter_embeds(), negative_ip_adapter_image_embeds=ip_adapter_embeds(seed=5))
PES = ["native", "rope_axial", "dype"]


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def pipeline() -> FluxPipeline:
    return FluxPipeline(**components("flux"))


def load_ip_adapter(pipe: FluxPipeline) -> FluxPipeline:
    state = tiny_ip_adapter_state_dict(pipe.transformer)
    pipe.load_ip_adapter(state, weight_name="unused", image_encoder_pretrained_model_name_or_path=None)
    return pipe


def install(pipe: FluxPipeline, pe: str) -> FluxPipeline:
    if pe == "dype":  # trained on 1 x 1 tokens: the 2 x 2 token outputs are beyond it, DyPE is active
        apply_dype(pipe.transformer, DyPEConfig(trained_grid=(1, 1), shift=None))
    elif pe == "native":
        set_pe(pipe.transformer, "native")
    else:
        set_pe(pipe.transformer, pe, theta=300.0)
    return pipe


def generate(pipe: FluxPipeline, ip: bool = True) -> torch.Tensor:
    extra = IP if ip else {}
    return pipe(
        height=32,
        width=32,
        num_inference_steps=2,
        output_type="latent",
        generator=torch.Generator().manual_seed(0),
        **embeddings(1),
        **extra,
    ).images


def processor_classes(pipe):
    return [type(p) for p in pipe.transformer.attn_processors.values()]


@pytest.mark.parametrize("pe", PES)
def test_an_ip_adapter_and_set_pe_in_either_order(pe):
    ip_alone = generate(load_ip_adapter(pipeline()))
    encoding_alone = generate(install(pipeline(), pe), ip=False)
    ip_first = generate(install(load_ip_adapter(pipeline()), pe))
    pe_first_pipe = load_ip_adapter(install(pipeline(), pe))
    pe_first = generate(pe_first_pipe)
    assert torch.equal(ip_first, pe_first)
    if pe == "native":
        assert torch.equal(pe_first, ip_alone)
    else:
        assert (pe_first - ip_alone).abs().max() > 1e-4  # the encoding is in the forward
    assert (pe_first - encoding_alone).abs().max() > 1e-2  # and so is the image prompt
    pe_first_pipe.set_ip_adapter_scale(0.0)
    assert torch.equal(generate(pe_first_pipe), encoding_alone)


@pytest.mark.parametrize("pe", ["native", "rope_axial"])
@pytest.mark.parametrize("order", ["ip_first", "pe_first"])
def test_restore_gives_the_ip_adapter_pipeline_back_with_its_scale(pe, order):
    pipe = install(load_ip_adapter(pipeline()), pe) if order == "ip_first" else load_ip_adapter(install(pipeline(), pe))
    generate(pipe)  # after load_ip_adapter, the next forward takes the layers back under the encoding
    pipe.set_ip_adapter_scale(0.5)  # set while mmpos is on: reaches the IP-Adapter's own processors
    restore(pipe.transformer)
    assert all(c in (FluxIPAdapterAttnProcessor, FluxAttnProcessor) for c in processor_classes(pipe))
    assert processor_classes(pipe).count(FluxIPAdapterAttnProcessor) == len(pipe.transformer.transformer_blocks)
    reference = load_ip_adapter(pipeline())
    reference.set_ip_adapter_scale(0.5)
    assert torch.equal(generate(pipe), generate(reference))


@pytest.mark.parametrize("pe", ["native", "rope_axial"])
def test_unload_ip_adapter_after_set_pe_gives_the_set_pe_pipeline(pe):
    without = generate(install(pipeline(), pe), ip=False)
    pipe = install(load_ip_adapter(pipeline()), pe)
    generate(pipe)
    pipe.unload_ip_adapter()
    assert torch.equal(generate(pipe, ip=False), without)
    restore(pipe.transformer)
    assert set(processor_classes(pipe)) == {FluxAttnProcessor}
    assert torch.equal(generate(pipe, ip=False), generate(pipeline(), ip=False))


def test_a_processor_re_made_without_its_encoding_names_restore_when_it_runs_alone():
    pipe = install(pipeline(), "rope_axial")
    processor = next(iter(pipe.transformer.attn_processors.values()))
    copy = type(processor)()  # what diffusers' loaders do
    assert not copy.bound and processor.bound
    with pytest.raises(RuntimeError, match=r"re-created without its encoding.*restore\(transformer\), then set_pe"):
        copy.rotation(None, None, None, 0)


def test_another_processor_swapped_in_after_set_pe_is_still_refused():
    pipe = install(pipeline(), "rope_axial")
    pipe.transformer.set_attn_processor(FluxAttnProcessor())
    with pytest.raises(RuntimeError, match=r"runs FluxAttnProcessor, not the FluxPEAttnProcessor.*restore"):
        generate(pipe, ip=False)


def test_restore_right_after_load_ip_adapter_keeps_the_ip_adapter():
    """No forward between ``load_ip_adapter`` and ``restore``: the IP-Adapter's processors stay."""
    pipe = load_ip_adapter(install(pipeline(), "rope_axial"))
    restore(pipe.transformer)
    assert processor_classes(pipe).count(FluxIPAdapterAttnProcessor) == len(pipe.transformer.transformer_blocks)
    assert torch.equal(generate(pipe), generate(load_ip_adapter(pipeline())))


@pytest.mark.parametrize("order", ["ip_first", "pe_first"])
def test_an_edit_over_set_pe_native_and_an_ip_adapter_is_the_edit_over_the_ip_adapter(order):
    """An edit installs its level over the encoding's as the pipeline starts: a loader's replacement is taken back
    first, so the edit runs over the processor carrying the IP-Adapter (off: the IP-Adapter pipeline; on: the same
    edit on the stock IP-Adapter pipeline, bit for bit)."""
    from mmpos.pipelines import BandModulationFluxPipeline

    def band(pipe, **kwargs):
        edit = BandModulationFluxPipeline(**pipe.components)
        return edit(
            height=32,
            width=32,
            num_inference_steps=2,
            output_type="latent",
            generator=torch.Generator().manual_seed(0),
            **embeddings(2),
            **IP,
            **kwargs,
        ).images

    pipe = install(load_ip_adapter(pipeline()), "native") if order == "ip_first" else None
    pipe = pipe or load_ip_adapter(install(pipeline(), "native"))
    stock = load_ip_adapter(pipeline())
    expected = stock(
        height=32,
        width=32,
        num_inference_steps=2,
        output_type="latent",
        generator=torch.Generator().manual_seed(0),
        **embeddings(2),
        **IP,
    ).images
    assert torch.equal(band(pipe, band={"enabled": False}), expected)
    edited = band(pipe)
    assert torch.equal(edited, band(stock)) and not torch.equal(edited, expected)
