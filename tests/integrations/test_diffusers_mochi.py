"""Mochi's learned per-head frequencies under extrapolation (float64, against the rule the family documents): each
learned time frequency is scaled by what the policy does to a ladder frequency of the same magnitude; rows and
columns are area-normalised (spatial entries are a no-op); RIFLEx is refused; the step's sigma from the reversed
timestep."""

import math

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, restore, set_pe
from mmpos.integrations.diffusers.families import get_family
from mmpos.integrations.diffusers.families.base import AxisSpectrum
from mmpos.integrations.diffusers.families.mochi import LADDER_THETA, learned_time_frequencies
from mmpos.integrations.diffusers.families.tiny import CASES
from mmpos.spectrum.extrapolation import NTKAware, PositionInterpolation, YaRN
from mmpos.spectrum.frequencies import rope_inv_freq

DIM = 16  # the tiny model's head_dim: the time ladder has 8 pairs


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def spectrum_of(policy, dim=DIM):
    inv_freq, magnitude = policy.frequencies(dim, LADDER_THETA)
    return AxisSpectrum(inv_freq, magnitude)


def learned_like(dim=DIM, seed=0):
    """Signed frequencies spread over (and a little beyond) the ladder's range, between its pairs."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(4, 64, generator=g, dtype=torch.float64) * (dim / 2 - 1)  # continuous pair index in range
    sign = torch.where(torch.rand(4, 64, generator=g) < 0.5, -1.0, 1.0).double()
    return sign * LADDER_THETA ** (-2 * u / dim), u


def test_pi_divides_every_learned_time_frequency_by_the_factor():
    f, _ = learned_like()
    out = learned_time_frequencies(f, spectrum_of(PositionInterpolation(3.0)), DIM)
    assert torch.allclose(out, f / 3.0, rtol=1e-14, atol=0)
    beyond = torch.tensor([2.0, -5.0, 1e-9], dtype=torch.float64)  # outside the ladder's range: PI is still exact
    assert torch.allclose(learned_time_frequencies(beyond, spectrum_of(PositionInterpolation(3.0)), DIM), beyond / 3)


def test_ntk_scales_each_learned_frequency_as_the_ladder_at_its_continuous_pair_index():
    f, u = learned_like()
    s = 2.5
    out = learned_time_frequencies(f, spectrum_of(NTKAware(s)), DIM)
    expected = f * s ** (-2 * u / (DIM - 2))  # theta * s ** (d / (d - 2)) at pair index u
    assert torch.allclose(out, expected, rtol=1e-12, atol=0)
    assert (out.abs() <= f.abs() * (1 + 1e-12)).all()  # NTK never raises a frequency


def test_yarn_is_exact_at_the_ladder_and_between_its_neighbours_elsewhere():
    policy = YaRN(factor=4.0, original_length=8.0)
    spectrum = spectrum_of(policy)
    ladder = rope_inv_freq(DIM, LADDER_THETA)
    assert torch.allclose(learned_time_frequencies(-ladder, spectrum, DIM), -spectrum.inv_freq, rtol=1e-13, atol=0)
    mid = torch.sqrt(ladder[:-1] * ladder[1:])  # halfway in log frequency: the neighbours' geometric mean ratio
    ratios = spectrum.inv_freq / ladder
    expected = mid * torch.sqrt(ratios[:-1] * ratios[1:])
    assert torch.allclose(learned_time_frequencies(mid, spectrum, DIM), expected, rtol=1e-13, atol=0)
    # beyond the ladder's ends: the end pairs' ratios (YaRN keeps the fastest, interpolates the slowest by 1/s)
    ends = torch.tensor([10.0, 1e-12])
    assert torch.allclose(learned_time_frequencies(ends, spectrum, DIM), ends * ratios[[0, -1]], rtol=1e-13)
    assert learned_time_frequencies(torch.zeros(3), spectrum, DIM).eq(0).all()


def tables(model, inputs):
    """The ``(cos, sin)`` the model's position module gives this forward (captured at the first block)."""
    seen = {}

    def keep(module, args, kwargs):
        seen.setdefault("emb", kwargs["image_rotary_emb"])

    handle = model.transformer_blocks[0].register_forward_pre_hook(keep, with_kwargs=True)
    with torch.no_grad():
        out = model(**inputs, return_dict=False)[0]
    handle.remove()
    return seen["emb"], out


def reference_phases(model, frames, rows, cols, time_scale=1.0):
    """float64 ``[F * H * W, heads, P]``: ``t / time_scale f_t + y f_y + x f_x`` at MochiRoPE's positions (frames
    from 0, row and column centres of cells tiling 192 x 192)."""
    cell = math.sqrt(192 * 192 / (rows * cols))

    def centres(n):
        return (torch.arange(n, dtype=torch.float64) + 0.5) * cell - n * cell / 2

    t, y, x = torch.meshgrid(torch.arange(frames, dtype=torch.float64) / time_scale, centres(rows), centres(cols))
    pos = torch.stack([t, y, x], -1).reshape(-1, 3)
    return torch.einsum("na,ahp->nhp", pos, model.pos_frequencies.detach().double())


def test_pi_on_time_divides_the_time_positions_and_spatial_entries_do_nothing():
    case = CASES["mochi"]
    model = case.model()
    inputs = case.inputs(8, 8)  # 4 frames: twice the 2 trained
    (stock_cos, _), stock = tables(model, inputs)
    assert torch.allclose(stock_cos.double(), reference_phases(model, 4, 8, 8).cos(), atol=2e-5)
    set_pe(model, "native", extrapolation=model_extrapolation(model, "ntk", case.grid))  # rows and columns only
    (cos, _), out = tables(model, inputs)
    assert torch.equal(out, stock)  # area-normalised rows and columns: the spatial entries are a no-op
    pi = {"type": "pi", "factor": 2.0}
    set_pe(model, "native", extrapolation=model_extrapolation(model, "none", case.grid, time=pi))
    (cos, sin), out = tables(model, inputs)
    phases = reference_phases(model, 4, 8, 8, time_scale=2.0)
    assert (cos.double() - phases.cos()).abs().max() < 2e-5 and (sin.double() - phases.sin()).abs().max() < 2e-5
    assert (cos - stock_cos).abs().max() > 0.1  # the time components changed
    assert (out - stock).abs().max() > 1e-4
    restore(model)
    assert torch.equal(tables(model, inputs)[1], stock)


def test_the_time_policy_magnitude_scales_every_pair():
    case = CASES["mochi"]
    model = case.model()
    yarn = {"type": "yarn", "factor": 4.0, "original_length": 2.0}
    set_pe(model, "native", extrapolation=model_extrapolation(model, "none", case.grid, time=yarn))
    (cos, sin), _ = tables(model, case.inputs(8, 8))
    magnitude = 0.1 * math.log(4.0) + 1
    assert torch.allclose((cos.double() ** 2 + sin.double() ** 2).sqrt(), torch.full_like(cos.double(), magnitude))


def test_dype_on_time_follows_the_step_and_is_stock_at_the_trained_length():
    case = CASES["mochi"]
    model = case.model()
    stock = {sigma: tables(model, case.inputs(4, 4, sigma=sigma))[1] for sigma in (1.0, 0.0)}
    long_stock = tables(model, case.inputs(8, 8, sigma=0.0))[1]
    set_pe(model, "native", extrapolation=case.dype(model))
    for sigma, expected in stock.items():
        assert torch.equal(tables(model, case.inputs(4, 4, sigma=sigma))[1], expected)
    assert torch.equal(tables(model, case.inputs(8, 8, sigma=0.0))[1], long_stock)  # sigma 0: kappa 0, trained
    assert position_module(model).encodings[0].step.sigma == pytest.approx(0.0)
    assert (tables(model, case.inputs(8, 8, sigma=1.0))[1] - long_stock).abs().max() > 1e-4


def test_riflex_is_refused_by_name():
    model = CASES["mochi"].model()
    riflex = {"type": "riflex", "k": 2, "target_length": 4}
    with pytest.raises(ValueError, match="RIFLEx.*pos_frequencies"):
        set_pe(model, "native", extrapolation=model_extrapolation(model, "none", (4, 4), time=riflex))
    assert getattr(model, "_mmpos_installed", None) is None


def test_the_step_sigma_reads_the_reversed_timestep():
    family = get_family("mochi")
    assert family.sigma((), {"timestep": torch.tensor([700.0])}) == pytest.approx(0.3)
    assert family.sigma((), {"timestep": torch.tensor([0.0])}) == pytest.approx(1.0)
