"""Family rows the conformance suite cannot state for every family: positions past a stock module's precomputed
range (Z-Image's and Lumina 2's ``axes_lens``, Qwen-Image 2.1's ``0 .. 8191``), and pipelines whose time runs
backwards (``t = 1 - sigma``)."""

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES, randn, run, tiny_lumina2, tiny_z_image


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("family, wider", [("z_image", tiny_z_image), ("lumina2", tiny_lumina2)])
def test_a_grid_past_axes_lens_runs_as_a_stock_model_with_longer_tables(family, wider):
    """The stock model indexes tables precomputed up to ``axes_lens`` (8 tokens per image axis here) and fails
    past them; the seam computes the rows, so a 12 x 12 grid gives what a stock model with longer tables gives."""
    case = CASES[family]
    model = case.model()
    lens = list(model.config.axes_lens)
    inputs = case.inputs(12, 12)
    with pytest.raises((IndexError, RuntimeError)):
        run(model, inputs)
    reference = wider(axes_lens=[lens[0], 16, 16]).eval()
    reference.load_state_dict(model.state_dict())
    expected = run(reference, inputs)
    below = case.inputs(8, 8)  # at the wall: native is the stock model, bit for bit
    stock_below = run(model, below)
    set_pe(model, "native")
    assert torch.equal(run(model, inputs), expected)
    assert torch.equal(run(model, below), stock_below)


def test_qwenimage21_positions_past_the_precomputed_range_are_computed():
    """``QwenImage21Rope`` holds positions ``0 .. 8191``: a prompt of 9000 tokens runs the text past them; the seam's
    rows there equal the stock formula (``rope_params``) at those positions, and equal the stock table below."""
    model = CASES["qwenimage21"].model()
    stock = model.pos_embed
    text, rows, cols = 9000, 2, 2
    mask = torch.tensor([False] * 10 + [True] * (rows * cols) + [False] * (text - 10))
    shapes = [(1, rows, cols)]
    set_pe(model, "native")
    tables = position_module(model)(shapes, mask, device=torch.device("cpu"))
    positions = torch.arange(10 + max(rows, cols), text + max(rows, cols))  # the text after the image
    text_rows = tables[~mask][10:]
    widths = [d // 2 for d in stock.axes_dim]
    for axis, part in enumerate(text_rows.split(widths, dim=-1)):
        assert torch.equal(part, stock.rope_params(positions, stock.axes_dim[axis], stock.theta))
    short = torch.tensor([False] * 10 + [True] * (rows * cols) + [False] * 50)
    assert torch.equal(
        position_module(model)(shapes, short, device=torch.device("cpu")),
        stock(shapes, short, device=torch.device("cpu")),
    )


@pytest.mark.parametrize("family", ["z_image", "lumina2"])
def test_backwards_time_gives_the_steps_sigma(family):
    """Z-Image and Lumina 2 pipelines pass ``t = 1 - sigma``: DyPE must follow sigma, not ``t``."""
    case = CASES[family]
    model = case.model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", case.grid))
    rows, cols = case.grid
    for sigma in (0.2, 0.9):
        run(model, case.inputs(2 * rows, 2 * cols, sigma=sigma))
        assert position_module(model).encodings[0].step.sigma == pytest.approx(sigma)


def _z_image_uneven_batch():
    """Two samples whose captions (7, 40 tokens) and images (4 x 4, 4 x 7 tokens) differ: the model pads each
    kind to a multiple of 32, then the batch to its longest sequence (zero tables, an attention mask)."""
    return dict(
        x=[randn(4, 1, 8, 8), randn(4, 1, 8, 14, seed=5)],
        t=torch.tensor([0.5, 0.5]),
        cap_feats=[randn(7, 16, seed=2), randn(40, 16, seed=3)],
    )


def _latents(model, inputs) -> list:
    """Z-Image's per-image outputs (a list: the images differ in size)."""
    with torch.no_grad():
        return list(model(**inputs, return_dict=False)[0])


def test_z_image_mmpos_processors_carry_padded_uneven_batches():
    """The seam's packed tables go through the model's split, padding and concatenations; with the native spectrum
    the mmpos processors give what the stock ones give on a batch that needs batch padding and a mask."""
    model = tiny_z_image(axes_lens=[128, 8, 8]).eval()  # the 40-token caption's image index is past 64
    inputs = _z_image_uneven_batch()
    stock = _latents(model, inputs)
    set_pe(model, "rope_axial")
    assert type(model.layers[0].attention.processor).__name__ == "ZImagePEAttnProcessor"
    for out, expected in zip(_latents(model, inputs), stock, strict=True):
        assert torch.allclose(out, expected, atol=2e-5, rtol=1e-4)
    set_pe(model, "rope_mixed", per_layer=True)  # per-head tables [B, S, H, 2P]
    assert all(torch.isfinite(out).all() for out in _latents(model, inputs))


def test_z_image_nope_is_the_stock_model_with_every_rotation_the_identity():
    """``"nope"``: the seam returns no channels and the processors skip the rotation; the reference is the stock
    model whose tables are all ``polar(1, 0) = 1``."""
    case = CASES["z_image"]
    model = case.model()
    inputs = case.inputs(*case.grid)
    stock = model.rope_embedder
    pairs = sum(stock.axes_dims) // 2
    model.rope_embedder = lambda ids: torch.ones(ids.shape[0], pairs, dtype=torch.complex64)
    expected = run(model, inputs)
    model.rope_embedder = stock
    assert (expected - run(model, inputs)).abs().max() > 1e-4  # positions matter in the stock model
    set_pe(model, "nope")
    assert torch.allclose(run(model, inputs), expected, atol=2e-5, rtol=1e-4)
