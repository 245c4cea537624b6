"""DyPE's ComfyUI-DyPE convention (``ExtrapolationSchedule(..., convention="comfyui")``) against its formulas
re-implemented here in fp64 (ComfyUI-DyPE v2.3.0 ``src/rope.py`` ``get_1d_dype_yarn_pos_embed``,
``get_1d_yarn_pos_embed``, ``get_1d_ntk_pos_embed`` and ``src/base.py`` ``_calc_vision_yarn_components``,
``_calc_yarn_components``, ``_calc_ntk_components``, ``_get_mscale``): turn counts raised to ``k = 2 t^2``, the NTK
ladder and the magnitude from the longest image axis, the interpolation from each axis (vision YaRN); one isotropic
YaRN from the longest axis, or each axis' own (``yarn_alt_scaling``); NTK at the longest axis' scale ``** k``."""

import math

import numpy as np
import pytest
import torch

from mmpos.integrations.diffusers import DyPEConfig, apply_dype, model_extrapolation, position_module, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES
from mmpos.spectrum.allocation import chunked_spectrum
from mmpos.spectrum.schedule import ExtrapolationSchedule, ScheduledSpectrum


def keep_mask(dim, theta, length, fast, slow):
    """ComfyUI-DyPE's ``1 - linear_ramp_mask`` over its rounded, clamped correction range."""

    def pair_index(turns):
        return dim * math.log(length / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(pair_index(fast)), 0), min(math.ceil(pair_index(slow)), dim - 1)
    low, high = max(0, low), min(dim // 2, high)
    if low == high:
        high += 0.001
    return 1 - np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)


def comfyui_yarn_1d(dim, theta, length, scale, k, aggressive):
    """``get_1d_yarn_pos_embed``'s (inv_freq, magnitude) at ``max_pe_len / ori_max_pe_len = scale``."""
    pairs = np.arange(0, dim, 2, dtype=np.float64) / dim
    base = theta**-pairs
    scale = max(scale, 1.0)
    linear = base / scale
    ntk = (theta * scale ** (dim / (dim - 2))) ** -pairs
    mask = keep_mask(dim, theta, length, 1.25**k, 0.75**k)
    freqs = linear * (1 - mask) + ntk * mask
    mask = keep_mask(dim, theta, length, 16.0**k, 2.0**k)
    freqs = freqs * (1 - mask) + base * mask
    if scale <= 1:
        return freqs, 1.0
    return freqs, (0.1 * math.log(scale) + 1.0 if aggressive else 1.0 + 0.1 * math.log(scale) / math.sqrt(scale))


def comfyui_yarn_axes(dim, theta, lengths, extents, t, dynamic, alt, dype_scale=2.0, exponent=2.0):
    """``_calc_yarn_components`` on the image axes: [(inv_freq, magnitude)] per axis."""
    base = theta ** -(np.arange(0, dim, 2, dtype=np.float64) / dim)
    k = dype_scale * t**exponent if dynamic else 1.0  # dype off: the turn counts as they are
    longest, base_patches = max(extents), max(lengths)
    if longest <= base_patches:
        return [(base, 1.0)] * len(extents)
    if alt:
        return [
            comfyui_yarn_1d(dim, theta, length, extent / length, k, True) if extent > length else (base, 1.0)
            for extent, length in zip(extents, lengths)
        ]
    table = comfyui_yarn_1d(dim, theta, base_patches, longest / base_patches, k, False)
    return [table] * len(extents)


def comfyui_ntk_axes(dim, theta, lengths, extents, t, dynamic, dype_scale=2.0):
    """``_calc_ntk_components`` on the image axes (``dype_exponent`` 2)."""
    pairs = np.arange(0, dim, 2, dtype=np.float64) / dim
    scale_global = max(1.0, max(e / length for e, length in zip(extents, lengths)))
    factor = 1.0
    if scale_global > 1.0:
        base_ntk = scale_global ** (dim / (dim - 2))
        factor = max(1.0, base_ntk ** (dype_scale * t**2) if dynamic else base_ntk)
    return [((theta * factor) ** -pairs, 1.0)] * len(extents)


def comfyui_axis(dim, theta, length, local, longest, t, start_sigma=1.0, dype_scale=2.0, exponent=2.0):
    """(inv_freq [dim / 2], magnitude) of one image axis, as ComfyUI-DyPE computes them."""
    pairs = np.arange(0, dim, 2, dtype=np.float64) / dim
    base = theta**-pairs
    if longest <= 1.0:
        return base, 1.0
    k = dype_scale * t**exponent
    beta, gamma = (1.25**k, 0.75**k), (16.0**k, 2.0**k)
    linear = base / max(local, 1.0)
    ntk = (theta * max(longest, 1.0) ** (dim / (dim - 2))) ** -pairs

    mask = keep_mask(dim, theta, length, *beta)
    freqs = linear * (1 - mask) + ntk * mask
    mask = keep_mask(dim, theta, length, *gamma)
    freqs = freqs * (1 - mask) + base * mask
    t_norm = 1.0 if t > start_sigma else t / start_sigma
    return freqs, 1.0 + 0.1 * math.log(longest) * t_norm**exponent


@pytest.mark.parametrize("dim,theta,length", [(56, 10000.0, 64.0), (16, 10000.0, 4.0), (24, 256.0, 32.0)])
@pytest.mark.parametrize("extents", [(128, 64), (128, 128), (96, 160), (64, 64), (48, 200)])
@pytest.mark.parametrize("sigma", [1.0, 0.7, 0.3, 0.05, 0.0])
def test_each_axis_is_comfyui_dypes_formula(dim, theta, length, extents, sigma):
    schedules = [ExtrapolationSchedule("vision_yarn", length, dynamic=True, convention="comfyui")] * 2
    spectrum = ScheduledSpectrum(chunked_spectrum, (dim, dim), theta, schedules)
    resolved = spectrum.spectrum(spectrum.policies([float(e) * length / 64 for e in extents], sigma))
    scales = [e / 64 for e in extents]
    for axis, local in enumerate(scales):
        expected, magnitude = comfyui_axis(dim, theta, length, local, max(scales), sigma)
        pairs = slice(axis * dim // 2, (axis + 1) * dim // 2)
        np.testing.assert_allclose(resolved.inv_freq[pairs].double().numpy(), expected, rtol=1e-12, atol=0)
        np.testing.assert_allclose(resolved.magnitude[pairs].double().numpy(), magnitude, rtol=1e-12, atol=0)


def test_the_conventions_differ_where_the_doc_table_says():
    """Above the grid at sigma 1: ComfyUI's turn counts ** 2 against the authors' * 1, its magnitude from the longest
    axis on both axes; at the training extent both are the plain ladder."""
    authors = ExtrapolationSchedule("vision_yarn", 64.0, dynamic=True)
    comfyui = ExtrapolationSchedule("vision_yarn", 64.0, dynamic=True, convention="comfyui")
    assert (authors.lambda_s, comfyui.lambda_s) == (1.0, 2.0)
    a = ScheduledSpectrum(chunked_spectrum, (56, 56), 10000.0, [authors] * 2)
    c = ScheduledSpectrum(chunked_spectrum, (56, 56), 10000.0, [comfyui] * 2)
    a_spec, c_spec = (s.spectrum(s.policies([128.0, 64.0], 1.0)) for s in (a, c))
    assert not torch.equal(a_spec.inv_freq, c_spec.inv_freq)
    assert a_spec.magnitude[28:].eq(1).all() and c_spec.magnitude[28:].gt(1).all()  # the 1x columns
    plain = chunked_spectrum((56, 56), 10000.0)
    assert torch.equal(c.spectrum(c.policies([64.0, 64.0], 1.0)).inv_freq, plain.inv_freq)


def test_comfyui_has_only_the_ports_methods():
    with pytest.raises(ValueError, match="no position interpolation"):
        ExtrapolationSchedule("pi", 64.0, convention="comfyui")
    with pytest.raises(ValueError, match="vision_yarn is always dynamic"):
        ExtrapolationSchedule("vision_yarn", 64.0, convention="comfyui")
    with pytest.raises(ValueError, match="yarn_alt_scaling"):
        ExtrapolationSchedule("ntk", 64.0, convention="comfyui", anisotropic=True)
    with pytest.raises(ValueError, match="convention"):
        ExtrapolationSchedule("vision_yarn", 64.0, dynamic=True, convention="paper")


def resolved_axes(method, lengths, extents, sigma, dim, theta, **options):
    """The mmpos comfyui schedule's [(inv_freq, magnitude)] per image axis, fp64."""
    schedules = [ExtrapolationSchedule(method, length, convention="comfyui", **options) for length in lengths]
    spectrum = ScheduledSpectrum(chunked_spectrum, (dim,) * len(lengths), theta, schedules)
    resolved = spectrum.spectrum(spectrum.policies([float(e) for e in extents], sigma))
    pairs = dim // 2
    return [
        (resolved.inv_freq[a * pairs : (a + 1) * pairs].double().numpy(), resolved.magnitude[a * pairs].item())
        for a in range(len(lengths))
    ]


CASES_2D = [
    ((64, 64), (128, 64)),
    ((64, 64), (96, 160)),
    ((64, 64), (64, 64)),
    ((64, 48), (80, 40)),
    ((32, 32), (20, 33)),
]


@pytest.mark.parametrize("dim,theta", [(56, 10000.0), (24, 256.0)])
@pytest.mark.parametrize("lengths,extents", CASES_2D)
@pytest.mark.parametrize("sigma", [1.0, 0.6, 0.1, 0.0])
@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("anisotropic", [False, True])
def test_yarn_is_comfyui_dypes_formula(dim, theta, lengths, extents, sigma, dynamic, anisotropic):
    got = resolved_axes("yarn", lengths, extents, sigma, dim, theta, dynamic=dynamic, anisotropic=anisotropic)
    want = comfyui_yarn_axes(dim, theta, lengths, extents, sigma, dynamic, anisotropic)
    for (inv_freq, magnitude), (expected, expected_magnitude) in zip(got, want):
        np.testing.assert_allclose(inv_freq, expected, rtol=1e-12, atol=0)
        assert magnitude == pytest.approx(expected_magnitude, rel=1e-12)


@pytest.mark.parametrize("dim,theta", [(56, 10000.0), (16, 10000.0)])
@pytest.mark.parametrize("lengths,extents", CASES_2D)
@pytest.mark.parametrize("sigma", [1.0, 0.6, 0.1, 0.0])
@pytest.mark.parametrize("dynamic", [True, False])
def test_ntk_is_comfyui_dypes_formula(dim, theta, lengths, extents, sigma, dynamic):
    got = resolved_axes("ntk", lengths, extents, sigma, dim, theta, dynamic=dynamic)
    for (inv_freq, magnitude), (expected, _) in zip(
        got, comfyui_ntk_axes(dim, theta, lengths, extents, sigma, dynamic)
    ):
        np.testing.assert_allclose(inv_freq, expected, rtol=1e-12, atol=0)
        assert magnitude == 1.0


def test_comfyui_yarn_and_ntk_differ_from_the_authors_where_the_doc_table_says():
    """At 2x rows, 1x columns, sigma 1: ComfyUI's isotropic yarn changes the 1x columns too (one scale from the
    longest axis) and its magnitude is 1 + 0.1 ln 2 / sqrt 2; its ntk stretches both axes by 2 ** 2."""
    lengths, extents = (64, 64), (128, 64)
    for method, authors_options in (("yarn", {}), ("ntk", {})):
        authors = [ExtrapolationSchedule(method, 64.0, dynamic=True, **authors_options)] * 2
        spectrum = ScheduledSpectrum(chunked_spectrum, (56, 56), 10000.0, authors)
        a = spectrum.spectrum(spectrum.policies([128.0, 64.0], 1.0))
        c = resolved_axes(method, lengths, extents, 1.0, 56, 10000.0, dynamic=True)
        plain = chunked_spectrum((56,), 10000.0).inv_freq.double().numpy()
        np.testing.assert_array_equal(a.inv_freq[28:].double().numpy(), plain)  # authors: the 1x axis stays plain
        assert np.abs(c[1][0] - plain).max() > 1e-3  # comfyui: changed
    yarn = resolved_axes("yarn", lengths, extents, 1.0, 56, 10000.0, dynamic=True)
    assert yarn[1][1] == pytest.approx(1 + 0.1 * math.log(2) / math.sqrt(2), rel=1e-12)
    ntk = resolved_axes("ntk", lengths, extents, 1.0, 56, 10000.0, dynamic=True)
    pairs = np.arange(0, 56, 2) / 56
    np.testing.assert_allclose(ntk[0][0], (10000.0 * 2.0 ** (2 * 56 / 54)) ** -pairs, rtol=1e-12)


@pytest.mark.parametrize("method,preset", [("vision_yarn", "dype"), ("yarn", "dype_yarn"), ("ntk", "dype_ntk")])
def test_dype_config_comfyui_on_flux_is_the_comfyui_preset(method, preset):
    torch.set_num_threads(1)
    case = CASES["flux"]
    inputs = case.inputs(8, 4, sigma=0.8)
    by_config, by_preset, authors = case.model(), case.model(), case.model()
    apply_dype(by_config, DyPEConfig(trained_grid=case.grid, method=method, convention="comfyui"))
    set_pe(by_preset, "native", extrapolation=model_extrapolation(by_preset, preset, case.grid, convention="comfyui"))
    apply_dype(authors, DyPEConfig(trained_grid=case.grid, method=method))
    with torch.no_grad():
        out = by_config(**inputs).sample
        assert torch.equal(out, by_preset(**inputs).sample)
        assert (out - authors(**inputs).sample).abs().max() > 1e-6  # the conventions differ at 2x rows
    assert position_module(by_config).encodings[0].schedule.describe()[1]["convention"] == "comfyui"
