"""Edit context machinery: step lookup from sigma, token segments, processor install/restore, layer selection."""

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

from mmpos.coords import flux_ids
from mmpos.pipelines.edits.context import EditContext, EditSession, schedule_step, segments_from_ids
from mmpos.pipelines.edits.processor import EditAttnProcessor, attention_layer_names, select_layers
from tests.fixtures.tiny_models import components, embeddings


class StepSpy:
    """A rule that never activates but records what the context says at every forward."""

    def __init__(self):
        self.seen = []

    def is_active(self, context):
        self.seen.append(
            (
                context.step,
                context.num_steps,
                round(context.sigma, 6),
                context.segments.text_len,
                context.segments.target_len,
            )
        )
        return False


def test_schedule_step_finds_every_shifted_sigma_in_fp32_and_bf16():
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    scheduler.set_timesteps(sigmas=[1.0 - i / 28 for i in range(28)], mu=1.15)
    for dtype in (torch.float32, torch.bfloat16):
        for i, t in enumerate(scheduler.timesteps):
            sigma = t.expand(2).to(dtype) / 1000  # exactly what the pipelines pass
            assert schedule_step(scheduler, sigma[:1]) == (i, 28)
    assert schedule_step(None, torch.tensor([0.5])) == (None, None)


def test_segments_from_kontext_ids():
    ids = torch.cat([flux_ids(3, 4), flux_ids(2, 5, index=1.0)])
    seg = segments_from_ids(7, ids)
    assert (seg.text_len, seg.target_len, seg.context_len) == (7, 12, 10)
    assert seg.target_grid == (3, 4) and seg.context_grid == (2, 5)
    assert seg.context == slice(19, 29) and seg.image == slice(7, 29)
    with pytest.raises(ValueError, match="before the context"):
        segments_from_ids(7, ids.flip(0))


def test_session_installs_and_restores_processors():
    transformer = components()["transformer"]
    before = dict(transformer.attn_processors)
    spy = StepSpy()
    with EditSession(transformer, EditContext(rules={0: spy, 1: spy})):
        installed = transformer.attn_processors
        assert all(isinstance(p, EditAttnProcessor) for p in installed.values())
        assert all(isinstance(p.beneath, FluxAttnProcessor) for p in installed.values())
    assert transformer.attn_processors == before
    assert not transformer._forward_pre_hooks
    with pytest.raises(ValueError, match="out of range"):
        EditSession(transformer, EditContext(rules={5: spy})).__enter__()


def test_an_edit_under_context_parallelism_is_refused_by_name():
    """diffusers' enable_parallelism sets ``_parallel_config`` on the model: an edit session refuses it at entry,
    and at the next forward when the model is made parallel inside the session; the processors are restored."""
    pipe = FluxPipeline(**components())
    transformer = pipe.transformer
    before = dict(transformer.attn_processors)
    transformer._parallel_config = object()
    with pytest.raises(RuntimeError, match="context parallelism"):
        EditSession(transformer, EditContext(rules={0: StepSpy()})).__enter__()
    assert transformer.attn_processors == before and not transformer._forward_pre_hooks
    del transformer._parallel_config
    with EditSession(transformer, EditContext(rules={0: StepSpy()}), pipe.scheduler):
        transformer._parallel_config = object()
        with pytest.raises(RuntimeError, match="enable_parallelism"):
            pipe(height=32, width=32, num_inference_steps=1, output_type="latent", **embeddings())
        del transformer._parallel_config
    assert transformer.attn_processors == before


def test_hook_step_is_the_scheduler_step_under_true_cfg_and_restarts():
    pipe = FluxPipeline(**components())
    spy = StepSpy()
    e = embeddings(1)
    for _ in range(2):  # a restart must not continue a count
        with EditSession(pipe.transformer, EditContext(rules={0: spy}), pipe.scheduler):
            pipe(
                height=32,
                width=32,
                num_inference_steps=3,
                output_type="latent",
                true_cfg_scale=2.0,
                negative_prompt_embeds=e["prompt_embeds"],
                negative_pooled_prompt_embeds=e["pooled_prompt_embeds"],
                **e,
            )
    steps = [s[0] for s in spy.seen]
    assert steps == [0, 0, 1, 1, 2, 2] * 2
    assert {s[1] for s in spy.seen} == {3}
    assert {(s[3], s[4]) for s in spy.seen} == {(6, 4)}
    sigmas = [s[2] for s in spy.seen[:6:2]]
    assert sigmas[0] == 1.0 and sigmas[0] > sigmas[1] > sigmas[2] > 0


def test_select_layers():
    assert select_layers("all", 5, 2) == [0, 1, 2, 3, 4]
    assert select_layers("double", 5, 2) == [0, 1]
    assert select_layers("single", 5, 2) == [2, 3, 4]
    assert select_layers([4, 0, 4], 5, 2) == [0, 4]
    assert select_layers({"start": 1, "stop": 3}, 5, 2) == [1, 2]
    for bad in ([5], [], "some", {"start": 3, "stop": 1}):
        with pytest.raises(ValueError):
            select_layers(bad, 5, 2)
    assert attention_layer_names(components()["transformer"]) == [
        "transformer_blocks.0.attn.processor",
        "single_transformer_blocks.0.attn.processor",
    ]


def test_step_index_at_100_steps_in_bf16():
    """100 steps, mu 1.15: in bf16 some adjacent steps pass the same sigma; the scheduler's own index
    labels every forward of a real pipeline run, and an out-of-loop lookup compares in fp64, not bf16."""
    from diffusers import FluxPipeline

    from tests.fixtures.tiny_models import components, embeddings

    parts = components("flux")
    parts["transformer"] = parts["transformer"].to(torch.bfloat16)
    parts["scheduler"] = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=1.15, max_shift=1.15)
    pipe = FluxPipeline(**parts)
    seen = []
    context = EditContext(rewriters=[lambda ctx, kwargs: (seen.append((ctx.step, ctx.num_steps)), kwargs)[1]])
    with EditSession(pipe.transformer, context, pipe.scheduler):
        bf16 = {name: value.to(torch.bfloat16) for name, value in embeddings(1).items()}
        pipe(height=32, width=32, num_inference_steps=100, output_type="latent", **bf16)
    timesteps = pipe.scheduler.timesteps
    as_bf16 = timesteps.to(torch.bfloat16) / 1000  # the sigma the pipeline passes
    assert (as_bf16[1:] == as_bf16[:-1]).any()  # steps that share one bf16 sigma: what this test is about
    assert seen == [(i, 100) for i in range(100)]
    scheduler = pipe.scheduler  # after the run: no valid index, so sigma is looked up (fp32 sigma: exact)
    for i, t in enumerate(timesteps):
        assert schedule_step(scheduler, t.reshape(1) / 1000) == (i, 100)
