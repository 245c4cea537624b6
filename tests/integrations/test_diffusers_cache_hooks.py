"""diffusers' MagCache, FasterCache and Pyramid Attention Broadcast combined with mmpos (``apply_pe`` / ``apply_dype``)
on the tiny FLUX.1, FLUX.2, Qwen-Image, Z-Image and Wan transformers, over six denoising-like steps whose timesteps
cross each cache's skip range (First-Block Cache and TaylorSeer: ``test_diffusers_hooks.py``). Properties: mmpos
registered before or after the cache gives the same steps bit for bit; mmpos ``"native"`` under the cache gives the
stock model's steps under it bit for bit; the cache did skip work (its steps differ from the uncached ones; where
it does not run on, or changes nothing of, the stock model, the case is skipped, saying so)."""

import pytest
import torch
from diffusers.hooks import (
    FasterCacheConfig,
    MagCacheConfig,
    PyramidAttentionBroadcastConfig,
    apply_faster_cache,
    apply_mag_cache,
    apply_pyramid_attention_broadcast,
)
from diffusers.models.cache_utils import CacheMixin

from mmpos.integrations.diffusers import DyPEConfig, PEConfig, apply_dype, apply_pe
from mmpos.integrations.diffusers.families.tiny import CASES, output

FAMILIES = ["flux", "flux2", "qwen", "z_image", "wan"]
STEPS = 6
TIMESTEPS = [900 - 100 * step for step in range(STEPS)]  # 900 ... 400: FasterCache skips inside (-1, 681) only


class Clock:
    """The current step's timestep, as a pipeline exposes it to the caches' ``current_timestep_callback``."""

    timestep = TIMESTEPS[0]


def mag_cache(model, clock):
    config = MagCacheConfig(threshold=10.0, max_skip_steps=2, num_inference_steps=STEPS, mag_ratios=[1.0] * STEPS)
    apply_mag_cache(model, config)


def faster_cache(model, clock):
    config = FasterCacheConfig(
        spatial_attention_block_skip_range=2,
        current_timestep_callback=lambda: clock.timestep,
        attention_weight_callback=lambda _: 0.5,
        is_guidance_distilled=True,  # one batch: no unconditional half to approximate
        tensor_format="BFCHW",
    )
    apply_faster_cache(model, config)


def pyramid_attention_broadcast(model, clock):
    config = PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2,
        spatial_attention_timestep_skip_range=(-1, 1001),
        current_timestep_callback=lambda: clock.timestep,
    )
    apply_pyramid_attention_broadcast(model, config)


CACHES = {
    "mag_cache": mag_cache,
    "faster_cache": faster_cache,
    "pyramid_attention_broadcast": pyramid_attention_broadcast,
}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def cache_context(model, name="cond"):
    """``model.cache_context(name)``, also for a model without ``CacheMixin`` (Z-Image's transformer)."""
    return CacheMixin.cache_context(model, name)


def drifted(inputs: dict, factor: float) -> dict:
    """The inputs with the latent scaled by ``factor`` (Z-Image takes a list of latents ``x``)."""
    if "x" in inputs:
        return dict(inputs, x=[latent * factor for latent in inputs["x"]])
    return dict(inputs, hidden_states=inputs["hidden_states"] * factor)


def steps(model, inputs, clock=None) -> torch.Tensor:
    """Six forwards in one cache context, the latent drifting and the clock advancing as in a denoising loop."""
    outs = []
    with cache_context(model), torch.no_grad():
        for step, timestep in enumerate(TIMESTEPS):
            if clock is not None:
                clock.timestep = timestep
            outs.append(output(model(**drifted(inputs, 1 - 0.01 * step), return_dict=False)))
    return torch.stack(outs)


def stock_under(cache, family) -> torch.Tensor:
    """The stock model's steps under ``cache``, checked to differ from the uncached steps (the cache reused work) and
    to equal them at the first step; skipped where the stock model does not run under the cache, or the cache leaves
    it unchanged (Z-Image: diffusers has no block metadata for MagCache, FasterCache finds no layer to cache)."""
    case, clock = CASES[family], Clock()
    model, inputs = case.model(), case.inputs(*case.grid)
    CACHES[cache](model, clock)
    try:
        cached = steps(model, inputs, clock)
    except (ValueError, RuntimeError, TypeError, KeyError) as error:
        pytest.skip(f"the stock {family} model does not run under {cache}: {error}")
    uncached = steps(case.model(), inputs)
    if torch.equal(cached, uncached):
        pytest.skip(f"{cache} leaves the stock {family} model's steps unchanged (nothing cached)")
    assert torch.equal(cached[0], uncached[0])
    return cached


def with_mmpos(model, pe, grid):
    if pe == "dype":
        apply_dype(model, DyPEConfig(trained_grid=(grid[0] / 2, grid[1] / 2)))  # the inputs are twice the grid
    else:
        apply_pe(model, PEConfig(pe, options={} if pe == "native" else {"theta": 300.0}))


@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize("family", FAMILIES)
def test_a_cache_and_mmpos_stack_in_either_order(family, cache):
    stock_under(cache, family)
    case = CASES[family]
    inputs = case.inputs(*case.grid)
    pes = ["rope_axial", "dype"] if family == "flux" else ["rope_axial"]
    for pe in pes:
        clocks = Clock(), Clock()
        pe_first, cache_first = case.model(), case.model()
        with_mmpos(pe_first, pe, case.grid)
        CACHES[cache](pe_first, clocks[0])
        CACHES[cache](cache_first, clocks[1])
        with_mmpos(cache_first, pe, case.grid)
        assert torch.equal(steps(pe_first, inputs, clocks[0]), steps(cache_first, inputs, clocks[1])), pe


@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize("family", FAMILIES)
def test_native_under_a_cache_is_the_stock_model_under_it(family, cache):
    case = CASES[family]
    inputs = case.inputs(*case.grid)
    cached, clock = stock_under(cache, family), Clock()
    native = case.model()
    CACHES[cache](native, clock)
    apply_pe(native, PEConfig("native"))
    assert torch.equal(steps(native, inputs, clock), cached)
