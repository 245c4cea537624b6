"""Wan-Animate 2's rope method ``_rope_freqs`` under ``set_pe``: the seam's complex tables against float64 math
(``polar(1, (n + offset) * inv_freq)``, the image axes' frequencies divided by the ``"pi"`` scale of the forward's
grid), the grid of each forward in the table cache's key, and the method shadowed and given back."""

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, restore, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES

CASE = CASES["wan_animate2"]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def expected_table(offsets, axes_dims, scales, rows=512):
    """complex128 ``[rows, sum(d) / 2]``: per axis ``polar(1, (n + offset) * inv_freq / scale)``, float64."""
    parts = []
    for offset, dim, scale in zip(offsets, axes_dims, scales):
        inv_freq = 1.0 / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim) / scale
        phases = torch.outer(torch.arange(rows, dtype=torch.float64) + offset, inv_freq)
        parts.append(torch.polar(torch.ones_like(phases), phases))
    return torch.cat(parts, dim=-1)


def seam_tables(model, inputs):
    """The seam's output of each call during one forward."""
    seam = position_module(model)
    outs = []
    handle = seam.register_forward_hook(lambda m, a, o: outs.append(o))
    with torch.no_grad():
        model(**inputs, return_dict=False)
    handle.remove()
    return outs


def test_pi_divides_the_image_axes_by_each_forwards_grid():
    """Two forwards at the same sigma and reference offsets but different grids: each table is the float64 table at
    its own grid's scale (a cache keyed without the grid would give the second forward the first one's table)."""
    model = CASE.model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "pi", CASE.grid))
    axes_dims = position_module(model).axes_dims
    base_rows, base_cols = CASE.grid
    for rows in (2 * base_rows, 3 * base_rows):
        cols = 2 * base_cols
        (table,) = seam_tables(model, CASE.inputs(rows, cols, sigma=1.0))
        assert table.dtype == torch.complex128
        expected = expected_table((1, 0, cols), axes_dims, (1.0, rows / base_rows, cols / base_cols))
        assert (table - expected).abs().max() < 1e-12


def test_native_table_is_the_stock_method_bit_for_bit():
    model = CASE.model()
    stock = model._rope_freqs((1, 0, 4), torch.device("cpu"))
    set_pe(model, "native")
    assert "_rope_freqs" in vars(model)
    assert torch.equal(model._rope_freqs((1, 0, 4), torch.device("cpu")), stock)
    restore(model)
    assert "_rope_freqs" not in vars(model)
