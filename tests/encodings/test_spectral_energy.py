"""SEGA's per-pair factors (:mod:`mmpos.ops.spectral_energy`) in fp64 against the ComfyUI port's formulas
(wildminder/ComfyUI-DyPE ``src/sega.py``; written again here from reading it: ``linspace`` bins, ``scatter_add_``
means, the unbiased ``std``), the direction and size of the effect, and bad arguments."""

import math

import pytest
import torch

from mmpos.ops.spectral_energy import (
    SpectralEnergyScaling,
    axis_profile,
    centred_map,
    pair_channels,
    radial_profile,
)

torch.manual_seed(0)


def port_axis_profile(sm, axis, bins, length):
    power = torch.fft.fft(sm, dim=axis).abs().pow(2).mean(dim=1 - axis)
    half = length // 2 + 1
    power = power[:half]
    index = (torch.linspace(0.0, 1.0, half, dtype=torch.float64) * bins).long().clamp(0, bins - 1)
    total = torch.zeros(bins, dtype=torch.float64).scatter_add_(0, index, power)
    count = torch.zeros(bins, dtype=torch.float64).scatter_add_(0, index, torch.ones_like(power))
    return total / (count + 1e-8)


def port_radial_profile(sm, bins):
    power = torch.fft.fftshift(torch.fft.fft2(sm)).abs().pow(2)
    h, w = sm.shape
    yy, xx = torch.meshgrid(
        torch.arange(h, dtype=torch.float64) - h / 2.0, torch.arange(w, dtype=torch.float64) - w / 2.0, indexing="ij"
    )
    r = torch.sqrt(yy**2 + xx**2)
    r = r / (r.max() + 1e-8)
    index = (r * bins).long().clamp(0, bins - 1).flatten()
    total = torch.zeros(bins, dtype=torch.float64).scatter_add_(0, index, power.flatten())
    count = torch.zeros(bins, dtype=torch.float64).scatter_add_(0, index, torch.ones(h * w, dtype=torch.float64))
    return total / (count + 1e-8)


def port_spread(profile, lo=0.0, hi=1.0, a=1.5):
    e = profile.clamp(min=1e-8)
    flatness = (torch.exp(torch.log(e).mean()) / (e.mean() + 1e-8)).clamp(0.0, 1.0)
    concentration = 1.0 - flatness.item()
    return lo + (hi - lo) * (1.0 - (1.0 - concentration) ** a)


def port_allocation(energy, freqs, base, spread, alpha=0.15, beta=1.5, floor=1.0):
    lp = torch.log(2.0 * math.pi / freqs.clamp(min=1e-8))
    norm = (lp - lp.min()) / (lp.max() - lp.min())
    n = energy.shape[0]
    pos = (1.0 - norm) * (n - 1)
    lo = pos.floor().long().clamp(0, n - 1)
    hi = (lo + 1).clamp(0, n - 1)
    frac = (pos - lo.double()).clamp(0.0, 1.0)
    log_e = torch.log(energy.clamp(min=1e-8))
    raw = log_e[lo] * (1.0 - frac) + log_e[hi] * frac
    z = (raw - raw.mean()) / raw.std().clamp(min=1e-8)
    s = torch.tanh(beta * z)
    s = s - s.mean()
    return (base * (1.0 - alpha * spread * s)).clamp(min=floor)


def ladder(dim, theta=10000.0):
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


@pytest.mark.parametrize("rows, cols", [(16, 16), (32, 16), (16, 8)])
def test_profiles_spread_and_factors_are_the_ports_in_fp64(rows, cols):
    """Token grids whose half is a power of two (the port's fp32 ``linspace`` bins are then exact)."""
    latent = torch.randn(2, 2 * rows, 2 * cols, dtype=torch.float64).cumsum(1).cumsum(2)  # structured, not flat
    sm = latent.mean(0) - latent.mean(0).mean()
    assert torch.allclose(centred_map(latent), sm, rtol=0, atol=1e-12)
    for axis, tokens in enumerate((rows, cols)):
        bins = max(tokens // 2, 8)
        ours, theirs = axis_profile(sm, axis, tokens, bins), port_axis_profile(sm, axis, bins, tokens)
        assert torch.allclose(ours, theirs, rtol=1e-12, atol=0)
    radial = radial_profile(sm, max(rows, cols) // 2)
    assert torch.allclose(radial, port_radial_profile(sm, max(rows, cols) // 2), rtol=1e-12, atol=0)
    scaling = SpectralEnergyScaling()
    spread = scaling.spread(radial)
    assert abs(float(spread) - port_spread(radial)) < 1e-12 and 0.05 < float(spread) <= 1.0
    trained = (rows / 2, cols / 3)
    m_rows, m_cols = scaling.factors(latent, (rows, cols), trained, (ladder(56), ladder(56)))
    for m, tokens, train, axis in ((m_rows, rows, trained[0], 0), (m_cols, cols, trained[1], 1)):
        energy = port_axis_profile(sm, axis, max(tokens // 2, 8), tokens)
        expected = port_allocation(energy, ladder(56, 10000.0 * 2.5), (tokens / train) ** 0.08, port_spread(radial))
        assert torch.allclose(m, expected, rtol=0, atol=1e-12)  # on the NTK-scaled ladder, as the port


def test_a_high_energy_band_gets_the_smaller_factor_by_the_stated_amount():
    """Energy rising with the spatial frequency: the highest RoPE frequency (pair 0) reads the top bin and gets the
    smallest factor, the lowest frequency the largest; the range is ``m_ref alpha sigma (s_max - s_min)``."""
    scaling = SpectralEnergyScaling(min_scale=0.5)
    energy = torch.exp(torch.linspace(0.0, 6.0, 16, dtype=torch.float64))
    m = scaling.allocation(energy, ladder(32), m_ref=1.2, spread=1.0)
    assert (m.diff() > 0).all()  # pair 0 (highest frequency, highest energy) lowest
    z = torch.linspace(-1, 1, 16, dtype=torch.float64)
    z = z / z.std()
    s = torch.tanh(1.5 * z)
    assert abs(float(m.max() - m.min()) - 1.2 * 0.15 * float(s.max() - s.min())) < 1e-12
    assert float(m.max() - m.min()) > 0.3  # a measured 25% of m_ref between the extreme pairs
    assert abs(float(m.mean()) - 1.2) < 1e-12  # zero-sum redistribution around m_ref (no floor reached)
    flipped = scaling.allocation(energy.flip(0), ladder(32), m_ref=1.2, spread=1.0)
    assert torch.allclose(flipped, m.flip(0), rtol=0, atol=1e-12)


def test_the_floor_the_reference_and_the_spread_limits():
    scaling = SpectralEnergyScaling()
    assert scaling.reference(4.0) == 4.0**0.08 and scaling.reference(0.5) == 1.0
    assert abs(SpectralEnergyScaling(formula="log", kappa=0.1).reference(4.0) - (1 + 0.1 * math.log(4.0))) < 1e-15
    energy = torch.exp(torch.linspace(0.0, 6.0, 16, dtype=torch.float64))
    assert (scaling.allocation(energy, ladder(32), 1.1, 1.0) >= 1.0).all()  # the port's floor m_min = 1
    assert torch.equal(scaling.allocation(energy, ladder(32), 1.1, 0.0), torch.full((16,), 1.1, dtype=torch.float64))
    flat = torch.ones(32, dtype=torch.float64)
    peaked = torch.full((32,), 1e-6, dtype=torch.float64)
    peaked[0] = 1.0
    assert float(scaling.spread(flat)) < 1e-7 and float(scaling.spread(peaked)) > 0.9


def test_within_the_trained_grid_every_factor_is_one():
    latent = torch.randn(1, 16, 16, dtype=torch.float64)
    m_rows, m_cols = SpectralEnergyScaling().factors(latent, (8, 8), (8, 8), (ladder(16), ladder(16)))
    assert torch.equal(m_rows, torch.ones(8, dtype=torch.float64)) and torch.equal(m_cols, m_rows)


def test_pair_channels_follow_the_layout():
    m = torch.tensor([2.0, 3.0], dtype=torch.float64)
    assert pair_channels(m, 6, "interleaved").tolist() == [2, 2, 3, 3, 1, 1]
    assert pair_channels(m, 4, "half").tolist() == [2, 3, 2, 3]
    with pytest.raises(ValueError, match="layout"):
        pair_channels(m, 4, "blocks")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(alpha=-0.1), "alpha"),
        (dict(spread_min=0.8, spread_max=0.2), "spread_min <= spread_max"),
        (dict(min_scale=0.0), "min_scale"),
        (dict(formula="exp"), "formula"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SpectralEnergyScaling(**kwargs)
