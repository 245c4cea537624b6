"""Text tokens' rotary rows under YaRN above the training grid, per family (docs/extrapolation.md, "Which tokens
follow a schedule"): FLUX.1's text rows take the YaRN magnitude on the image-axis channels, as the DyPE authors' FLUX
code gives every id; every other family with text rows keeps them on the training spectrum (the authors' Qwen-Image
code's ``txt_freqs``; mmpos' rule where the authors have no code), bit for bit the stock rows."""

import math

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, set_pe
from mmpos.integrations.diffusers.families import get_family
from mmpos.integrations.diffusers.families.tiny import CASES


def text_first(rows):
    return lambda calls: [torch.stack(calls[0][1]).movedim(0, -1)[:rows]]  # (cos, sin) [S, D] -> [S, D, 2]


def real(table):
    return torch.view_as_real(table) if table.is_complex() else table


# family -> (text rows of the position module's calls [(inputs, output)], the convention)
TEXT_ROWS = {
    "flux": (text_first(8), "yarn magnitude"),  # txt_ids: 8 rows first (tiny_flux_inputs)
    "chroma": (text_first(5), "training"),
    "longcat_image": (text_first(5), "training"),
    "krea2": (text_first(5), "training"),
    "flux2": (lambda calls: [torch.stack(calls[1][1]).movedim(0, -1)], "training"),  # its second call: txt_ids
    "flux3": (lambda calls: [torch.stack(calls[0][1]).movedim(0, -1)], "training"),  # its first call: txt_ids
    "qwen": (lambda calls: [real(calls[0][1][1])], "training"),  # (vid_freqs, txt_freqs)
    "lumina2": (lambda calls: [real(calls[0][1][1])], "training"),  # the caption's freqs_cis
}


def calls_of(module, model, inputs):
    calls = []
    handle = module.register_forward_hook(lambda m, args, out: calls.append((args, out)))
    with torch.no_grad():
        model(**inputs, return_dict=False)
    handle.remove()
    return calls


def yarn_text_rows(family):
    case, fam = CASES[family], get_family(family)
    rows, cols = case.grid
    inputs = case.inputs(2 * rows, 2 * cols, sigma=1.0)
    model = case.model()
    stock = calls_of(getattr(model, fam.position_attr), model, inputs)
    set_pe(model, "native", extrapolation=model_extrapolation(model, "yarn", case.grid))
    return stock, calls_of(position_module(model), model, inputs), model


@pytest.mark.parametrize("family", sorted(TEXT_ROWS))
def test_text_rows_follow_the_familys_convention(family):
    torch.set_num_threads(1)
    rows_of, convention = TEXT_ROWS[family]
    stock, mine, model = yarn_text_rows(family)
    (stock_text,), (text,) = rows_of(stock), rows_of(mine)
    if convention == "training":
        assert torch.equal(text, stock_text)
        return
    # FLUX.1: text ids are zeros (phase 0): cos = the magnitude, sin = 0; the image axes' channels get YaRN's
    fam = get_family(family)
    dims = fam.native_axes_dims(model)
    magnitude = torch.ones(sum(dims), dtype=torch.float64)
    for axis in fam.image_axes:
        start = sum(dims[:axis])
        magnitude[start : start + dims[axis]] = 0.1 * math.log(2.0) + 1.0  # 1.0693 at twice the grid
    torch.testing.assert_close(text[..., 0].double(), stock_text[..., 0].double() * magnitude, rtol=0, atol=1e-6)
    assert torch.equal(text[..., 1], stock_text[..., 1])  # sin 0


def test_z_image_caption_rows_keep_the_training_spectrum():
    """Z-Image's rope_embedder is a plain object: the caption call's rows against the stock embedder on its ids."""
    torch.set_num_threads(1)
    case = CASES["z_image"]
    rows, cols = case.grid
    inputs = case.inputs(2 * rows, 2 * cols, sigma=1.0)
    model = case.model()
    stock_embedder = model.rope_embedder
    set_pe(model, "native", extrapolation=model_extrapolation(model, "yarn", case.grid))
    calls = calls_of(position_module(model), model, inputs)
    image_ids, image = calls[0][0][0], calls[0][1]
    caption_ids, caption = calls[1][0][0], calls[1][1]
    assert torch.equal(caption, stock_embedder(caption_ids))
    assert (image - stock_embedder(image_ids)).abs().max() > 1e-3  # the image rows do extrapolate
