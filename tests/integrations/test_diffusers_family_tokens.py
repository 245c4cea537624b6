"""Which tokens get which spectrum in the Flux-style families whose ids mix text, output and reference images
(Chroma, LongCat-Image, Krea 2, FLUX.3), and the row-block codec they share. The conformance suite checks each
family against stock; these check the token roles the suite's single inputs cannot tell apart."""

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, set_pe
from mmpos.integrations.diffusers.families import STOCK, AxisSpectrum, get_family
from mmpos.integrations.diffusers.families.codecs import cos_sin_repeated, cos_sin_repeated_blocks
from mmpos.integrations.diffusers.families.tiny import CASES


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def tables_of(module, model, inputs):
    """The outputs of ``module`` (a position module) during one forward of ``model``."""
    outs = []
    handle = module.register_forward_hook(lambda m, a, o: outs.append(o))
    with torch.no_grad():
        model(**inputs, return_dict=False)
    handle.remove()
    return outs


def stock_and_seam_tables(family, preset, rows, cols, grid=None, **input_options):
    """(stock tables, mmpos tables, seam) of one forward at ``rows x cols`` with ``preset`` on the case's grid."""
    fam, case = get_family(family), CASES[family]
    model = case.model()
    inputs = case.inputs(rows, cols, sigma=1.0, **input_options)
    stock = tables_of(getattr(model, fam.position_attr), model, inputs)
    set_pe(model, "native", extrapolation=model_extrapolation(model, preset, grid or case.grid))
    seam = position_module(model)
    return stock, tables_of(seam, model, inputs), seam


def image_channels(axes_dims, image_axes):
    starts = [sum(axes_dims[:a]) for a in range(len(axes_dims))]
    mask = torch.zeros(sum(axes_dims), dtype=torch.bool)
    for axis in image_axes:
        mask[starts[axis] : starts[axis] + axes_dims[axis]] = True
    return mask


def repeated_cos_sin_fp64(pos, inv_freqs, magnitudes):
    """The Flux formula in fp64: per axis ``m cos(p w)``, ``m sin(p w)``, each pair's value twice, axes in order."""
    cos, sin = [], []
    for axis, (inv_freq, magnitude) in enumerate(zip(inv_freqs, magnitudes)):
        phase = pos[:, axis, None].double() * inv_freq.double()[None, :]
        cos.append((magnitude * phase.cos()).repeat_interleave(2, dim=1))
        sin.append((magnitude * phase.sin()).repeat_interleave(2, dim=1))
    return torch.cat(cos, -1), torch.cat(sin, -1)


def test_row_blocks_follow_the_formula_with_each_blocks_spectrum():
    axes_dims, theta = (4, 6), 100.0
    ladders = [theta ** -(torch.arange(0, d, 2, dtype=torch.float64) / d) for d in axes_dims]
    pos = torch.randn(9, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 20
    scaled = [AxisSpectrum(None, 1.0), AxisSpectrum(ladders[1] / 3.0, 1.25)]
    cos, sin = cos_sin_repeated_blocks(pos, [(4, [STOCK, STOCK]), (5, scaled)], axes_dims, theta)
    top = repeated_cos_sin_fp64(pos[:4], ladders, (1.0, 1.0))
    bottom = repeated_cos_sin_fp64(pos[4:], (ladders[0], ladders[1] / 3.0), (1.0, 1.25))
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (9, 10)
    assert torch.allclose(cos.double(), torch.cat([top[0], bottom[0]]), atol=1e-7, rtol=0)
    assert torch.allclose(sin.double(), torch.cat([top[1], bottom[1]]), atol=1e-7, rtol=0)
    merged = cos_sin_repeated_blocks(pos.float(), [(4, [STOCK, STOCK]), (5, [STOCK, STOCK])], axes_dims, theta)
    whole = cos_sin_repeated(pos.float(), [STOCK, STOCK], axes_dims, theta)
    assert torch.equal(merged[0], whole[0]) and torch.equal(merged[1], whole[1])
    with pytest.raises(ValueError, match="blocks cover 8 rows; pos has 9"):
        cos_sin_repeated_blocks(pos, [(4, [STOCK, STOCK]), (4, scaled)], axes_dims, theta)


@pytest.mark.parametrize("family", ["chroma", "longcat_image", "krea2"])
def test_text_rows_keep_the_training_spectrum(family):
    """YaRN at twice the grid (a magnitude != 1 and new frequencies) reaches the image rows only."""
    rows, cols = CASES[family].grid
    (stock,), (mine,), seam = stock_and_seam_tables(family, "yarn", 2 * rows, 2 * cols, text=5)
    text = seam.text_tokens
    assert text == 5
    for stock_table, table in zip(stock, mine):
        assert torch.equal(table[:text], stock_table[:text])
        assert (table[text:] - stock_table[text:]).abs().max() > 1e-3


def test_longcat_scale_comes_from_the_output_image_not_the_text_along_its_axes():
    """The text ids ``(0, j, j)`` run along the image axes and the image starts after them: at the training grid
    the schedule must see the output image's 4 x 4 tokens, not the 44 rows the text and image span together."""
    stock, mine, _ = stock_and_seam_tables("longcat_image", "dype", 4, 4, text=40, reference=True)
    assert all(torch.equal(a, b) for a, b in zip(stock[0], mine[0]))


def test_longcat_reference_rows_share_the_output_images_frequencies():
    (stock,), (mine,), seam = stock_and_seam_tables("longcat_image", "dype", 8, 8, text=5, reference=True)
    image = image_channels(seam.axes_dims, get_family("longcat_image").image_axes)
    output, reference = slice(5, 5 + 64), slice(5 + 64, None)
    for stock_table, table in zip(stock, mine):
        assert torch.equal(table[reference][:, image], table[output][:, image])  # same rows and columns
        assert not torch.equal(table[output], stock_table[output])


def test_flux3_schedules_count_tokens_not_its_half_unit_coordinates():
    """FLUX.3's image ids step 0.5 a token: PI at twice the trained 4 x 4 tokens halves the image axes' frequencies
    (scale 2, not the 1.125 a unit-step reading of its coordinates would give); text and a reference image at the
    training size keep the stock tables."""
    family = get_family("flux3")
    stock, mine, seam = stock_and_seam_tables("flux3", "pi", 8, 8, reference=(4, 4))
    text, output, reference = range(3)  # the model's pos_embed calls: txt_ids, img_ids, image_cond_ids
    for call in (text, reference):
        assert all(torch.equal(a, b) for a, b in zip(stock[call], mine[call]))
    ids = CASES["flux3"].inputs(8, 8)["img_ids"]
    ladders = [seam.theta ** -(torch.arange(0, d, 2, dtype=torch.float64) / d) for d in seam.axes_dims]
    halved = [ladder / 2 if axis in family.image_axes else ladder for axis, ladder in enumerate(ladders)]
    expected = repeated_cos_sin_fp64(ids, halved, (1.0,) * 4)
    for table, formula in zip(mine[output], expected):
        assert torch.allclose(table.double(), formula, atol=1e-6, rtol=0)
