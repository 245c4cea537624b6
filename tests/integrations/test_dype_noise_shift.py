"""DyPE's noise-schedule shift (:mod:`mmpos.integrations.diffusers.noise_shift`): the ``mu`` each convention gives,
against its formula re-implemented here; the pipelines' own ``calculate_shift`` returns it from the shifted
scheduler; a tiny FLUX.1 pipeline run samples the authors' sigmas; the off switch changes nothing."""

import functools
import importlib

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

from mmpos.integrations.diffusers import DyPEConfig, NoiseShift, apply_dype_to_pipeline, apply_noise_shift, restore
from tests.fixtures.tiny_models import components

FLUX_DEV = dict(  # FLUX.1-dev's scheduler config
    use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096
)
QWEN_IMAGE = dict(  # Qwen-Image's
    use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256, max_image_seq_len=8192
)
TOKENS = [64, 1024, 4096, 6561, 16384, 65536]  # 128 px ... 4096 px FLUX.1 outputs (and 1296 px)


def stock_mu(n, config):
    """diffusers' ``calculate_shift`` for ``n`` image tokens with ``config``."""
    base_n, max_n = config["base_image_seq_len"], config["max_image_seq_len"]
    slope = (config["max_shift"] - config["base_shift"]) / (max_n - base_n)
    return n * slope + (config["base_shift"] - slope * base_n)


def authors_mu(n, config):
    """The DyPE authors' FLUX.1 pipeline: ``calculate_shift(n, base_image_seq_len, n, base_shift, max_shift)``."""
    base_n = config["base_image_seq_len"]
    slope = (config["max_shift"] - config["base_shift"]) / (n - base_n)
    return n * slope + (config["base_shift"] - slope * base_n)


def comfyui_mu(n, train_tokens, base_shift=0.5, max_shift=1.15):
    """ComfyUI-DyPE: a line from (training tokens, base_shift) to (n, max_shift), read at n; clamped at 0."""
    if n <= train_tokens:
        shift = base_shift
    else:
        slope = (max_shift - base_shift) / (n - train_tokens)
        shift = n * slope + (base_shift - slope * train_tokens)
    return max(0.0, shift)


@pytest.mark.parametrize("config", [FLUX_DEV, QWEN_IMAGE])
@pytest.mark.parametrize("n", TOKENS)
def test_each_convention_is_its_formula(config, n):
    train_tokens = 64 * 64
    assert NoiseShift("authors").mu(n, train_tokens, config) == pytest.approx(authors_mu(n, config), abs=1e-12)
    assert NoiseShift("comfyui").mu(n, train_tokens, config) == pytest.approx(comfyui_mu(n, train_tokens), abs=1e-12)
    custom = NoiseShift("comfyui", base_shift=-0.3, max_shift=2.0).mu(n, train_tokens, config)
    assert custom == pytest.approx(comfyui_mu(n, train_tokens, -0.3, 2.0), abs=1e-12)  # clamped at 0 below
    assert NoiseShift(None).mu(n, train_tokens, config) is None


def test_above_the_training_size_the_conventions_undo_the_stock_extrapolation():
    """FLUX.1 at 2048 px: stock mu 3.23 (e^mu = 25.3), the authors' and ComfyUI-DyPE's 1.15 (its value at 1024 px)."""
    n = 128 * 128
    assert stock_mu(n, FLUX_DEV) == pytest.approx(3.23, abs=1e-9)
    assert NoiseShift("authors").mu(n, 4096, FLUX_DEV) == NoiseShift("comfyui").mu(n, 4096, FLUX_DEV) == 1.15
    assert NoiseShift("comfyui").mu(4096, 4096, FLUX_DEV) == 0.5  # at the training size: base_shift (stock: 1.15)


@pytest.mark.parametrize(
    "pipeline",
    ["flux.pipeline_flux", "chroma.pipeline_chroma", "qwenimage.pipeline_qwenimage", "z_image.pipeline_z_image"],
)
@pytest.mark.parametrize("convention", ["authors", "comfyui"])
def test_the_pipelines_own_calculate_shift_returns_the_conventions_mu(pipeline, convention):
    """Each family's pipeline computes mu with its module's ``calculate_shift`` from the scheduler's config: the
    shifted scheduler makes it return the convention's mu at the size it was installed for."""
    module = importlib.import_module(f"diffusers.pipelines.{pipeline}")
    stand_in = type("Pipeline", (), {"__module__": module.__name__})  # the parts apply_noise_shift reads
    for n in TOKENS:
        pipe = stand_in()
        pipe.vae_scale_factor = 8
        pipe.scheduler = FlowMatchEulerDiscreteScheduler(**FLUX_DEV)
        side = int(n**0.5) * 16
        mu = apply_noise_shift(pipe, NoiseShift(convention), side, side, (64, 64))
        assert mu == NoiseShift(convention).mu(n, 4096, FLUX_DEV)
        config = pipe.scheduler.config
        got = module.calculate_shift(
            n, config["base_image_seq_len"], config["max_image_seq_len"], config["base_shift"], config["max_shift"]
        )
        assert got == mu


def tiny_flux_pipeline():
    parts = components("flux")
    parts.update(tokenizer=None, tokenizer_2=None)
    pipe = FluxPipeline(**parts)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(**FLUX_DEV)
    return pipe


def sampled_sigmas(pipe, height, width, steps=3):
    captured = []
    original = pipe.scheduler.set_timesteps

    @functools.wraps(original)  # retrieve_timesteps reads its signature
    def spy(*args, **kwargs):
        original(*args, **kwargs)
        captured.append(pipe.scheduler.sigmas.clone())

    pipe.scheduler.set_timesteps = spy
    embeds = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(0))
    pooled = torch.randn(1, pipe.transformer.config.pooled_projection_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pipe(
            prompt_embeds=embeds,
            pooled_prompt_embeds=pooled,
            height=height,
            width=width,
            num_inference_steps=steps,
            output_type="latent",
            generator=torch.Generator().manual_seed(0),
        )
    return captured[0]


def test_a_tiny_flux_run_samples_the_authors_sigmas_and_off_is_stock():
    """At 4x the training grid (2 x 2 tokens trained, 4 x 4 asked): the run's sigmas are the scheduler's at the
    authors' mu (computed here from the shift law), and with the shift off they are the stock run's."""
    height = width = 64  # tiny VAE: 16 px a token -> 4 x 4 tokens
    stock = sampled_sigmas(tiny_flux_pipeline(), height, width)

    pipe = tiny_flux_pipeline()
    mu = apply_dype_to_pipeline(pipe, DyPEConfig(trained_grid=(2, 2)), height, width)
    assert mu == 1.15
    sigmas = sampled_sigmas(pipe, height, width)
    plain = np.linspace(1.0, 1 / 3, 3)
    expected = np.exp(mu) / (np.exp(mu) + (1 / plain - 1))  # the flow-matching time shift at mu
    torch.testing.assert_close(sigmas[:-1].double(), torch.from_numpy(expected), rtol=0, atol=1e-6)
    assert not torch.allclose(sigmas, stock)  # stock mu at 16 tokens: 0.459, another schedule
    restore(pipe.transformer)

    off = tiny_flux_pipeline()
    assert apply_dype_to_pipeline(off, DyPEConfig(trained_grid=(2, 2), shift=None), height, width) is None
    assert torch.equal(sampled_sigmas(off, height, width), stock)


def test_bad_shift_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="shift convention='paper' is unknown"):
        NoiseShift("paper")
    with pytest.raises(ValueError, match="base_shift has no effect under the 'authors' convention"):
        NoiseShift("authors", base_shift=0.3)
    pipe = tiny_flux_pipeline()
    pipe.scheduler = FlowMatchEulerDiscreteScheduler()  # a fixed shift
    with pytest.raises(ValueError, match="use_dynamic_shifting=False"):
        apply_noise_shift(pipe, NoiseShift("authors"), 64, 64, (2, 2))


def test_a_pipeline_with_another_mu_law_is_refused_by_name():
    """FLUX.2 computes an empirical mu (``compute_empirical_mu``), not ``calculate_shift``: no convention defines it."""
    from diffusers import Flux2Pipeline

    pipe = object.__new__(Flux2Pipeline)  # only its class is read before the refusal
    with pytest.raises(ValueError, match="Flux2Pipeline does not compute mu with calculate_shift"):
        apply_noise_shift(pipe, NoiseShift("authors"), 2048, 2048, (64, 64))
