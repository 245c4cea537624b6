"""mmpos in diffusers' modular pipelines (``mmpos.integrations.diffusers.modular``): the ``"mmpos_pe"`` block before
the denoise block of FLUX.1, FLUX.2, Qwen-Image, Z-Image and Wan's modular blocks, on their tiny transformers (the
denoise blocks alone: prompt embeddings given, latents returned). ``pe_config=PEConfig("native")`` gives the stock
pipeline bit for bit; an encoding through the block equals the pipeline without the block run on a transformer
``set_pe`` by hand; a call without ``pe_config`` after one is stock again."""

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers import modular_pipelines as modular_blocks

from mmpos.integrations.diffusers import DyPEConfig, PEConfig, apply_dype, apply_pe
from mmpos.integrations.diffusers.families.tiny import CASES
from mmpos.integrations.diffusers.modular import PE_STEP, insert_pe_step


def _flux(i):
    return dict(prompt_embeds=i["encoder_hidden_states"], pooled_prompt_embeds=i["pooled_projections"])


def _qwen(i):
    text, mask = i["encoder_hidden_states"], i["encoder_hidden_states_mask"]
    return dict(
        prompt_embeds=text, prompt_embeds_mask=mask, negative_prompt_embeds=text, negative_prompt_embeds_mask=mask
    )


def _wan(i):
    text = i["encoder_hidden_states"]
    return dict(prompt_embeds=text, negative_prompt_embeds=text, num_frames=5, latents=i["hidden_states"])


BLOCKS = {  # family -> (modular blocks, the denoise inputs from the family case's forward inputs)
    "flux": ("FluxAutoBlocks", _flux),
    "flux2": ("Flux2AutoBlocks", lambda i: dict(prompt_embeds=i["encoder_hidden_states"])),
    "qwen": ("QwenImageAutoBlocks", _qwen),
    "z_image": ("ZImageAutoBlocks", lambda i: dict(prompt_embeds=i["cap_feats"])),
    "wan": ("WanBlocks", _wan),
}
AXIAL = PEConfig("rope_axial", options={"theta": 300.0})


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def pipeline(family, with_step=True):
    """The tiny ``family`` modular pipeline (its denoise block, ``"mmpos_pe"`` before it) and its call's inputs."""
    name, denoise_inputs = BLOCKS[family]
    blocks = getattr(modular_blocks, name)()
    for block in [block for block in blocks.sub_blocks if block != "denoise"]:
        blocks.sub_blocks.pop(block)
    if with_step:
        insert_pe_step(blocks)
    pipe = blocks.init_pipeline()
    case = CASES[family]
    pipe.update_components(transformer=case.model(), scheduler=FlowMatchEulerDiscreteScheduler())
    inputs = dict(denoise_inputs(case.inputs(4, 4)), height=64, width=64, num_inference_steps=2, output="latents")
    return pipe, inputs


def call(pipe, inputs, **extra):
    return pipe(**inputs, **extra, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", list(BLOCKS))
def test_the_block_runs_set_pe_and_removes_it(family):
    pipe, inputs = pipeline(family)
    assert list(pipe.blocks.sub_blocks) == [PE_STEP, "denoise"]
    stock = call(pipe, inputs)
    assert torch.equal(call(pipe, inputs, pe_config=PEConfig("native")), stock)
    axial = call(pipe, inputs, pe_config=AXIAL)
    assert torch.equal(call(pipe, inputs), stock)  # no pe_config: mmpos removed
    by_hand, inputs = pipeline(family, with_step=False)
    apply_pe(by_hand.transformer, AXIAL)
    assert torch.equal(axial, call(by_hand, inputs))
    assert (axial - stock).abs().max() > 1e-4  # the encoding did change the pipeline's result


def test_dype_through_the_block_is_apply_dype():
    config = DyPEConfig(trained_grid=(2, 2), shift=None)  # 64 px = 4 x 4 tokens: twice the trained grid
    pipe, inputs = pipeline("flux")
    stock, dype = call(pipe, inputs), call(pipe, inputs, pe_config=config)
    by_hand, inputs = pipeline("flux", with_step=False)
    apply_dype(by_hand.transformer, config)
    assert torch.equal(dype, call(by_hand, inputs))
    assert (dype - stock).abs().max() > 1e-4


def test_refusals_name_the_argument():
    pipe, inputs = pipeline("flux")
    with pytest.raises(ValueError, match="shift=None"):
        call(pipe, inputs, pe_config=DyPEConfig(trained_grid=(2, 2)))
    with pytest.raises(TypeError, match="pe_config must be"):
        call(pipe, inputs, pe_config="rope_axial")
    with pytest.raises(ValueError, match="before='denoiser'"):
        insert_pe_step(modular_blocks.FluxAutoBlocks(), before="denoiser")
    with pytest.raises(ValueError, match="already has"):
        insert_pe_step(insert_pe_step(modular_blocks.FluxAutoBlocks()))
