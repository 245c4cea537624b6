"""DyPE and resolution-aware extrapolation schedules: the paper's formulas in fp64, stock bits at the training
size, one table per distinct schedule value, and the same options on Flux and Wan through ``set_pe``."""

import math

import pytest
import torch

import mmpos
from mmpos.coords.grids import image_grid, video_grid
from mmpos.integrations.diffusers import model_extrapolation, position_module, restore, set_pe
from mmpos.spectrum import rope_inv_freq
from mmpos.spectrum.schedule import ExtrapolationSchedule, extrapolation_preset
from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs, tiny_wan, tiny_wan_inputs

SIGMAS = (1.0, 0.8, 0.5, 0.2, 0.05)
FLUX_AXIS = dict(dim=56, theta=10000.0, original=64)  # FLUX.1: 56 channels per image axis, 1024 px = 64 tokens


pytestmark = pytest.mark.usefixtures("one_thread")


def ladder(dim, theta):
    """``theta ** (-2j / dim)`` in fp64, written out."""
    return torch.tensor([theta ** (-2 * j / dim) for j in range(dim // 2)], dtype=torch.float64)


def ramp(dim, theta, length, fast, slow):
    """0 for pairs turning more than ``fast`` times over ``length``, 1 below ``slow`` turns, linear between
    (pair index of n turns: ``dim ln(L / 2 pi n) / (2 ln theta)``, ends rounded outwards, kept in [0, dim - 1])."""
    index = [dim * math.log(length / (2 * math.pi * n)) / (2 * math.log(theta)) for n in (fast, slow)]
    low, high = (min(max(v, 0), dim - 1) for v in (math.floor(index[0]), math.ceil(index[1])))
    high = high + 0.001 if high == low else high
    return torch.tensor([min(max((j - low) / (high - low), 0.0), 1.0) for j in range(dim // 2)], dtype=torch.float64)


@pytest.mark.parametrize("sigma", SIGMAS)
@pytest.mark.parametrize("lambda_s,lambda_t,start", [(1.0, 2.0, 1.0), (2.0, 2.0, 1.0), (1.0, 1.5, 0.6)])
def test_kappa_is_lambda_s_t_to_the_lambda_t(sigma, lambda_s, lambda_t, start):
    schedule = ExtrapolationSchedule(
        "vision_yarn", 64, dynamic=True, lambda_s=lambda_s, lambda_t=lambda_t, start_sigma=start
    )
    assert schedule.kappa(sigma) == pytest.approx(lambda_s * min(sigma / start, 1.0) ** lambda_t, rel=1e-15)


@pytest.mark.parametrize("sigma", SIGMAS)
@pytest.mark.parametrize("extent", [128, 192, 256])
def test_dype_ntk_follows_theta_times_scale_to_kappa_d_over_d_minus_2(sigma, extent):
    d, theta, original = FLUX_AXIS.values()
    schedule = ExtrapolationSchedule("ntk", original, dynamic=True)  # lambda_s = 2, lambda_t = 2
    kappa = 2.0 * sigma**2
    expected = ladder(d, theta * (extent / original) ** (kappa * d / (d - 2)))
    inv_freq, magnitude = schedule.policy(extent, sigma).frequencies(d, theta)
    torch.testing.assert_close(inv_freq, expected, rtol=1e-13, atol=0)
    assert magnitude == 1.0


@pytest.mark.parametrize("sigma", SIGMAS)
@pytest.mark.parametrize("extent", [128, 192, 256])
def test_dype_vision_yarn_follows_the_three_ladders_with_thresholds_times_kappa(sigma, extent):
    d, theta, original = FLUX_AXIS.values()
    scale, kappa = extent / original, sigma**2  # lambda_s = 1, lambda_t = 2
    plain, ntk = ladder(d, theta), ladder(d, theta * scale ** (d / (d - 2)))
    low_part = dype_reference_ramp(d, theta, original, 1.25 * kappa, 0.75 * kappa)[0]  # 1: interpolated, 0: NTK
    high_part = dype_reference_ramp(d, theta, original, 16 * kappa, 2 * kappa)[0]  # 0: plain ladder
    middle = plain / scale * low_part + ntk * (1 - low_part)
    expected = middle * high_part + plain * (1 - high_part)
    policy = ExtrapolationSchedule("vision_yarn", original, dynamic=True).policy(extent, sigma)
    inv_freq, magnitude = policy.frequencies(d, theta)
    torch.testing.assert_close(inv_freq, expected, rtol=1e-13, atol=0)
    assert magnitude == pytest.approx(0.1 * kappa * math.log(scale) + 1, rel=1e-15)  # scheduled attention scale


@pytest.mark.parametrize("sigma", SIGMAS)
def test_dype_yarn_scales_beta_fast_and_slow_by_kappa(sigma):
    d, theta, original = FLUX_AXIS.values()
    kappa = sigma**2
    part = ramp(d, theta, original, 32 * kappa, 1 * kappa)
    expected = ladder(d, theta) / 3 * part + ladder(d, theta) * (1 - part)
    inv_freq, magnitude = ExtrapolationSchedule("yarn", original, dynamic=True).policy(192, sigma).frequencies(d, theta)
    torch.testing.assert_close(inv_freq, expected, rtol=1e-13, atol=0)
    assert magnitude == pytest.approx(0.1 * kappa * math.log(3) + 1, rel=1e-15)


def test_dype_strength_decays_from_full_extrapolation_to_the_plain_ladder():
    d, theta, original = FLUX_AXIS.values()
    schedule = ExtrapolationSchedule("vision_yarn", original, dynamic=True)
    static = ExtrapolationSchedule("vision_yarn", original).policy(256, None).frequencies(d, theta)[0]
    assert torch.equal(schedule.policy(256, 1.0).frequencies(d, theta)[0], static)  # t = 1: static vision YaRN
    late = schedule.policy(256, 1e-4).frequencies(d, theta)  # kappa = 1e-8: every pair turns "often enough"
    assert torch.equal(late[0], rope_inv_freq(d, theta)) and late[1] == pytest.approx(1.0, abs=1e-8)
    assert schedule.policy(256, 0.0) == mmpos.spectrum.NoExtrapolation()
    # static presets keep YaRN's magnitude whatever the step
    assert ExtrapolationSchedule("vision_yarn", original).policy(256).frequencies(d, theta)[1] == 0.1 * math.log(4) + 1


@pytest.mark.parametrize("preset", ["dype", "dype_ntk", "dype_yarn", "ntk", "yarn", "vision_yarn", "pi"])
def test_at_or_below_the_training_extent_every_preset_is_the_plain_ladder(preset):
    pe = mmpos.create_pe(
        "rope_axial", head_dim=24, axes_dims=(12, 12), extrapolation=extrapolation_preset(preset, (8, 8))
    )
    stock = mmpos.create_pe("rope_axial", head_dim=24, axes_dims=(12, 12))
    coords = image_grid(8, 6, dtype=torch.float64)
    for sigma in SIGMAS:
        pe.step.sigma = sigma
        assert torch.equal(pe.table(coords, torch.float64).cis, stock.table(coords, torch.float64).cis)
    assert pe.cache.builds == 1


def test_the_scale_is_per_axis_from_the_coordinates_extent():
    """Reference conventions: the training extent in tokens per axis (FLUX.1: 64 = 1024 px / 16), each axis its
    own scale (2048 x 1024: rows 2x, columns stock), Flux's index axis left alone."""
    model = tiny_flux(axes_dims_rope=[4, 12, 12], attention_head_dim=28)
    extrapolation = model_extrapolation(model, "ntk", trained_grid=(64, 64))
    assert extrapolation[0] is None and [e.original_length for e in extrapolation[1:]] == [64, 64]
    pe = mmpos.create_pe("rope_axial", head_dim=28, axes_dims=(4, 12, 12), extrapolation=extrapolation)
    coords = torch.cat([torch.zeros(128 * 64, 1), image_grid(128, 64)], dim=1).double()
    training = pe.spectrum
    static = mmpos.create_pe(
        "rope_axial", head_dim=28, axes_dims=(4, 12, 12), extrapolation=[None, {"type": "ntk", "factor": 2.0}, None]
    )
    assert torch.equal(pe.table(coords, torch.float64).cis, static.table(coords, torch.float64).cis)
    assert torch.equal(pe.spectrum_at(coords).inv_freq, static.spectrum.inv_freq)
    assert pe.spectrum is training  # a lookup leaves the encoding as it was


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


@pytest.mark.parametrize("preset", ["dype", "dype_ntk"])
def test_flux_with_dype_at_the_training_size_is_stock_bit_for_bit(preset):
    model = tiny_flux()
    stock_outputs, outputs = [], []
    for sigma in SIGMAS:
        stock_outputs.append(run(model, dict(tiny_flux_inputs(height=4, width=6), timestep=torch.tensor([sigma]))))
    set_pe(model, "native", extrapolation=model_extrapolation(model, preset, trained_grid=(4, 6)))
    for sigma in SIGMAS:
        outputs.append(run(model, dict(tiny_flux_inputs(height=4, width=6), timestep=torch.tensor([sigma]))))
    assert all(torch.equal(a, b) for a, b in zip(outputs, stock_outputs))
    assert position_module(model).table_builds == 1
    bigger = dict(tiny_flux_inputs(height=8, width=12), timestep=torch.tensor([0.5]))
    native = run(restore(set_pe(model, "native")), bigger)
    set_pe(model, "native", extrapolation=model_extrapolation(model, preset, trained_grid=(4, 6)))
    assert not torch.equal(run(model, bigger), native)  # above it, DyPE acts


def test_one_table_build_per_distinct_schedule_value():
    model = tiny_flux()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", trained_grid=(4, 4)))
    sigmas = (1.0, 0.8, 0.8, 0.5, 0.5, 0.5, 0.2, 1.0)  # true CFG: two forwards per step; a restart revisits 1.0
    for sigma in sigmas:
        run(model, dict(tiny_flux_inputs(height=8, width=8), timestep=torch.tensor([sigma])))
    assert position_module(model).table_builds == len(set(sigmas))
    set_pe(model, "native", extrapolation=model_extrapolation(model, "vision_yarn", trained_grid=(4, 4)))
    for sigma in sigmas:  # static: one table for the whole run
        run(model, dict(tiny_flux_inputs(height=8, width=8), timestep=torch.tensor([sigma])))
    assert position_module(model).table_builds == 1


def test_the_step_sigma_comes_from_the_timestep_the_pipeline_passes():
    flux, wan = tiny_flux(), tiny_wan()
    set_pe(flux, "native", extrapolation=model_extrapolation(flux, "dype", (2, 2)))
    run(flux, dict(tiny_flux_inputs(), timestep=torch.tensor([0.25])))
    assert flux.pos_embed.encodings[0].step.sigma == 0.25  # Flux pipelines pass sigma
    set_pe(wan, "native", extrapolation=model_extrapolation(wan, "dype", (2, 2)))
    run(wan, dict(tiny_wan_inputs(), timestep=torch.tensor([250])))
    assert wan.rope.encodings[0].step.sigma == 0.25  # Wan pipelines pass sigma * 1000


def test_wan_riflex_on_time_and_a_resolution_schedule_on_rows_and_columns():
    model = tiny_wan()
    riflex = {"type": "riflex", "k": 2, "target_length": 6}
    set_pe(model, "native", extrapolation=model_extrapolation(model, "ntk", (2, 2), time=riflex))
    cos, _ = model.rope(tiny_wan_inputs(frames=6, height=8, width=6)["hidden_states"])  # grid (6, 4, 3)
    expected = mmpos.create_pe(
        "rope_axial",
        head_dim=12,
        axes_dims=(4, 4, 4),
        extrapolation=[riflex, {"type": "ntk", "factor": 2.0}, {"type": "ntk", "factor": 1.5}],
    )
    encoding = model.rope.encodings[0]
    assert torch.equal(encoding.spectrum_at(video_grid(6, 4, 3)).inv_freq, expected.spectrum.inv_freq)
    assert torch.equal(cos, model.rope(tiny_wan_inputs(frames=6, height=8, width=6)["hidden_states"])[0])
    restore(model)
    stock = model.rope(tiny_wan_inputs(frames=6, height=8, width=6)["hidden_states"])[0]
    assert not torch.equal(cos, stock)


def test_bad_schedules_name_the_argument():
    with pytest.raises(ValueError, match="dynamic=True needs method"):
        ExtrapolationSchedule("pi", 64, dynamic=True)
    with pytest.raises(ValueError, match="original_length"):
        ExtrapolationSchedule("ntk", 0)
    with pytest.raises(ValueError, match="lambda_t"):
        ExtrapolationSchedule("ntk", 64, dynamic=True, lambda_t=-1)
    with pytest.raises(ValueError, match="extrapolation preset"):
        extrapolation_preset("dyp", (64, 64))
    with pytest.raises(ValueError, match="time= is for video"):
        model_extrapolation(tiny_flux(), "ntk", (4, 4), time={"type": "riflex", "k": 1, "target_length": 4})
    pe = mmpos.create_pe(
        "rope_axial", head_dim=24, axes_dims=(12, 12), extrapolation=extrapolation_preset("dype", (4, 4))
    )
    with pytest.raises(ValueError, match="sigma"):
        pe.table(image_grid(8, 8), torch.float32)  # above the training size without a step


def test_schedules_from_config_dicts():
    from_dict = mmpos.create_pe(
        "rope_axial",
        head_dim=24,
        axes_dims=(12, 12),
        extrapolation=[{"type": "schedule", "method": "ntk", "original_length": 4, "dynamic": True}, None],
    )
    from_object = mmpos.create_pe(
        "rope_axial",
        head_dim=24,
        axes_dims=(12, 12),
        extrapolation=[ExtrapolationSchedule("ntk", 4, dynamic=True), None],
    )
    coords = image_grid(8, 8, dtype=torch.float64)
    from_dict.step.sigma = from_object.step.sigma = 0.6
    assert torch.equal(from_dict.table(coords, torch.float64).cis, from_object.table(coords, torch.float64).cis)
    with pytest.raises(TypeError, match="extrapolation schedule"):
        mmpos.create_pe(
            "rope_axial",
            head_dim=24,
            extrapolation={"type": "schedule", "method": "ntk", "original_length": 4, "lamda_t": 1},
        )


def dype_reference_ramp(dim, theta, length, fast, slow):
    """DyPE's ramp (guyyariv/DyPE ``get_1d_rotary_pos_embed``, re-implemented in fp64): the ends of the turn-count
    range rounded outwards, ``low >= 0``, ``high <= dim - 1`` then ``high <= dim // 2``. Returns the ramp and
    whether its ends are reversed (``low > high``: tiny turn counts)."""
    index = [dim * math.log(length / (2 * math.pi * n)) / (2 * math.log(theta)) for n in (fast, slow)]
    low, high = max(math.floor(index[0]), 0), min(math.ceil(index[1]), dim - 1, dim // 2)
    reversed_ends = low > high
    high = high + 0.001 if high == low else high
    values = [min(max((j - low) / (high - low), 0.0), 1.0) for j in range(dim // 2)]
    return torch.tensor(values, dtype=torch.float64), reversed_ends


def dype_reference_vision_yarn(dim, theta, original, extent, sigma):
    """DyPE's FLUX spectrum of one axis in fp64 (``kappa = sigma ** 2``, fixed magnitude), with the one documented
    difference: a reversed ramp (reference: 1 everywhere) is 0 everywhere in mmpos. Returns
    ``(inv_freq, magnitude, reversed ramps)``."""
    plain = ladder(dim, theta)
    scale = extent / original
    if scale <= 1:
        return plain, 1.0, 0
    kappa = sigma**2
    ntk = ladder(dim, theta * scale ** (dim / (dim - 2)))
    low_part, low_reversed = dype_reference_ramp(dim, theta, original, 1.25 * kappa, 0.75 * kappa)
    high_part, high_reversed = dype_reference_ramp(dim, theta, original, 16 * kappa, 2 * kappa)
    low_part, high_part = (
        torch.zeros_like(p) if r else p for p, r in ((low_part, low_reversed), (high_part, high_reversed))
    )
    middle = plain / scale * low_part + ntk * (1 - low_part)
    return middle * high_part + plain * (1 - high_part), 0.1 * math.log(scale) + 1, low_reversed + high_reversed


DYPE_SWEEP_SIGMAS = (0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


@pytest.mark.parametrize("dim", [16, 32, 42, 56, 64, 128])
def test_dype_vision_yarn_matches_the_authors_ramp_ends_over_a_sweep(dim):
    theta, original = 10000.0, 64
    reversed_ramps = 0
    for extent in (64, 80, 96, 128, 160, 192, 256):  # 1x .. 4x
        for sigma in DYPE_SWEEP_SIGMAS:
            schedule = ExtrapolationSchedule("vision_yarn", original, dynamic=True, schedule_magnitude=False)
            inv_freq, magnitude = schedule.policy(extent, sigma).frequencies(dim, theta)
            expected, expected_magnitude, reversed_here = dype_reference_vision_yarn(
                dim, theta, original, extent, sigma
            )
            reversed_ramps += reversed_here
            torch.testing.assert_close(
                inv_freq, expected, rtol=1e-13, atol=0, msg=lambda m: f"dim={dim} extent={extent} sigma={sigma}: {m}"
            )
            assert magnitude == pytest.approx(expected_magnitude, rel=1e-15)
    if dim == 16:
        assert reversed_ramps > 0  # the sweep reaches the documented difference, too


def test_dype_mixes_the_last_pairs_as_the_authors_do():
    # 16 channels, 2x, sigma 0.02: the plain-ladder ramp runs over pairs 6..8 (clamped at dim // 2 = 8, not 9)
    schedule = ExtrapolationSchedule("vision_yarn", 64, dynamic=True, schedule_magnitude=False)
    inv_freq, _ = schedule.policy(128, 0.02).frequencies(16, 1e4)
    plain, ntk = ladder(16, 1e4), ladder(16, 1e4 * 2 ** (16 / 14))
    torch.testing.assert_close(inv_freq[7], 0.5 * ntk[7] + 0.5 * plain[7], rtol=1e-14, atol=0)
