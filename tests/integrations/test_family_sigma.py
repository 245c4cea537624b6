"""The step's sigma a scheduled encoding (DyPE) reads from each family's forward arguments."""

import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, set_pe
from mmpos.integrations.diffusers.families import get_family
from tests.fixtures.tiny_models import tiny_wan, tiny_wan_inputs


def test_wan22_ti2v_per_token_timesteps_give_the_noisy_tokens_sigma():
    """Wan 2.2 TI2V (``expand_timesteps``) passes ``[B, S]`` timesteps with the pinned first frame's tokens at 0:
    the sigma is the noisy tokens' (the old ``timestep.flatten()[0]`` read 0 and DyPE fell back to training)."""
    model = tiny_wan()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", (2, 2)))
    inputs = tiny_wan_inputs(frames=2, height=8, width=6)
    tokens_per_frame = (8 // 2) * (6 // 2)
    timestep = torch.full((1, 2 * tokens_per_frame), 700.0)
    timestep[:, :tokens_per_frame] = 0.0  # the conditioning frame, clean
    with torch.no_grad():
        model(**{**inputs, "timestep": timestep})
    assert position_module(model).encodings[0].step.sigma == 0.7


def test_a_batch_timestep_gives_the_first_samples_sigma():
    wan = get_family("wan")
    assert wan.sigma((None, torch.tensor([250.0, 900.0])), {}) == 0.25
    assert wan.sigma((), {"timestep": torch.tensor(500.0)}) == 0.5
    assert wan.sigma((), {}) is None
    flux = get_family("flux")
    assert flux.sigma((None, None, None, torch.tensor([0.25])), {}) == 0.25  # FLUX.1 passes timestep 4th
