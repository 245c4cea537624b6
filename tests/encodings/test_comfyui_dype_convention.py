"""DyPE's ComfyUI-DyPE convention (``ExtrapolationSchedule(..., convention="comfyui")``) against its vision-YaRN
formulas re-implemented here in fp64 (ComfyUI-DyPE ``src/rope.py`` ``get_1d_dype_yarn_pos_embed`` and
``src/base.py`` ``_calc_vision_yarn_components`` / ``_get_mscale``): turn counts raised to ``k = 2 t^2``, the NTK ladder
and the magnitude from the longest image axis, the interpolation from each axis."""

import math

import numpy as np
import pytest
import torch

from mmpos.integrations.diffusers import DyPEConfig, apply_dype, model_extrapolation, position_module, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES
from mmpos.spectrum.allocation import chunked_spectrum
from mmpos.spectrum.schedule import ExtrapolationSchedule, ScheduledSpectrum


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

    def pair_index(turns):
        return dim * math.log(length / (turns * 2 * math.pi)) / (2 * math.log(theta))

    def keep_mask(fast, slow):  # 1 - linear ramp between the rounded, clamped correction range
        low, high = max(math.floor(pair_index(fast)), 0), min(math.ceil(pair_index(slow)), dim - 1)
        low, high = max(0, low), min(dim // 2, high)
        if low == high:
            high += 0.001
        return 1 - np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)

    mask = keep_mask(*beta)
    freqs = linear * (1 - mask) + ntk * mask
    mask = keep_mask(*gamma)
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


def test_comfyui_is_only_its_dynamic_vision_yarn():
    with pytest.raises(ValueError, match="convention='comfyui' is ComfyUI-DyPE's dynamic vision_yarn"):
        ExtrapolationSchedule("ntk", 64.0, dynamic=True, convention="comfyui")
    with pytest.raises(ValueError, match="convention"):
        ExtrapolationSchedule("vision_yarn", 64.0, dynamic=True, convention="paper")


def test_dype_config_comfyui_on_flux_is_the_comfyui_preset():
    torch.set_num_threads(1)
    case = CASES["flux"]
    inputs = case.inputs(8, 4, sigma=0.8)
    by_config, by_preset = case.model(), case.model()
    apply_dype(by_config, DyPEConfig(trained_grid=case.grid, convention="comfyui"))
    set_pe(by_preset, "native", extrapolation=model_extrapolation(by_preset, "dype", case.grid, convention="comfyui"))
    with torch.no_grad():
        assert torch.equal(by_config(**inputs).sample, by_preset(**inputs).sample)
    assert position_module(by_config).encodings[0].schedule.describe()[1]["convention"] == "comfyui"
