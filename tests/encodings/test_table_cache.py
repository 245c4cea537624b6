"""The table caches never return a table for other values: parameter writes that bypass the version counter
(``p.data.copy_``, as diffusers' ``EMAModel.copy_to`` does), and several threads sharing one encoding."""

import copy
import threading

import pytest
import torch

from mmpos.encodings import list_pes, pe_capabilities, pe_class
from mmpos.encodings.registry import create_pe
from mmpos.ops.tables import ParameterValues, TableCache

LEARNED_ROTARY = [n for n in list_pes("rotary") if pe_capabilities(n).learnable]


def build(name):
    torch.manual_seed(0)
    return create_pe(name, **pe_class(name).example_options)


def inputs(pe, length=12):
    generator = torch.Generator().manual_seed(1)
    heads = getattr(pe, "num_heads", 2)
    q = torch.randn(1, heads, length + pe.num_prefix_tokens, pe.head_dim, dtype=torch.float64, generator=generator)
    k = torch.randn(q.shape, dtype=torch.float64, generator=generator)
    coords = torch.rand(length, pe.num_axes, dtype=torch.float64, generator=generator) * 4
    return q, k, coords


@pytest.mark.parametrize("name", LEARNED_ROTARY)
def test_a_data_write_is_not_hidden_by_the_cache(name):
    pe = build(name).double()
    q, k, coords = inputs(pe)
    with torch.no_grad():
        before = pe(q, k, coords)
        for p in pe.parameters():  # EMAModel.copy_to: param.data.copy_(...), no version bump
            p.data.copy_(p.data + 0.3 * torch.randn_like(p))
        after = pe(q, k, coords)
        fresh = copy.deepcopy(pe)(q, k, coords)  # a copy starts with empty caches
    for got, expected, old in zip(after, fresh, before):
        assert torch.equal(got, expected)
        assert not torch.equal(got, old)


def test_equal_parameters_still_hit_the_cache():
    pe = build("rope_mixed").double()
    _, _, coords = inputs(pe)
    with torch.no_grad():
        first = pe.table(coords, torch.float64)
        second = pe.table(coords, torch.float64)
    assert second is first and pe.cache.builds == 1


def test_parameter_values_compare_values_and_identity():
    a, b = torch.ones(3), torch.ones(3)
    stored = ParameterValues([a]).frozen()
    assert stored == ParameterValues([a])
    a.data.add_(1)  # bypasses the version counter
    assert stored != ParameterValues([a])
    assert ParameterValues([b]).frozen() != ParameterValues([a])  # another tensor, even with equal values


def test_four_threads_share_one_encoding():
    pe = create_pe("rope_axial", head_dim=32, num_axes=2)
    grids = [torch.rand(n, 2, dtype=torch.float64) * 8 for n in (5, 9, 13, 17)]
    expected = [pe.compute_table(g, torch.complex128).cis for g in grids]
    errors, mismatches = [], []

    def work(index):
        try:
            for step in range(60):
                which = (index + step) % len(grids)
                table = pe.table(grids[which], torch.float64)
                if not torch.equal(table.cis, expected[which]):
                    mismatches.append((index, step))
        except Exception as error:  # noqa: BLE001 - the test reports any failure of a thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and not mismatches


def test_a_copied_cache_starts_empty():
    cache = TableCache(max_entries=3)
    cache.get(("k",), torch.zeros(2, 1), lambda: "table")
    clone = copy.deepcopy(cache)
    assert clone.max_entries == 3 and clone.builds == 0 and not clone._entries


def refill_through_numpy(coords):
    coords.numpy()[:] = coords.numpy()[::-1].copy() + 1  # no version bump


def refill_through_data(coords):
    coords.data.mul_(2).add_(1)  # no version bump either


@pytest.mark.parametrize("refill", [refill_through_numpy, refill_through_data, lambda c: c.add_(1)])
def test_coordinates_refilled_in_place_get_a_new_table(refill):
    """A DataLoader buffer or a ``.numpy()`` view rewritten between calls: the same tensor object, new values."""
    pe = create_pe("rope_axial", head_dim=16)
    coords = torch.rand(6, 2, dtype=torch.float64) * 4
    pe.table(coords, torch.float64)
    refill(coords)
    got = pe.table(coords, torch.float64)
    assert torch.equal(got.cis, pe.compute_table(coords, torch.complex128).cis)


def test_library_owned_coordinates_hit_by_identity(monkeypatch):
    from mmpos.ops.tables import library_owned

    pe = create_pe("rope_axial", head_dim=16)
    coords = library_owned(torch.rand(6, 2))
    first = pe.table(coords)
    monkeypatch.setattr(torch, "equal", lambda a, b: pytest.fail("compared values"))
    assert pe.table(coords) is first


def test_tables_of_differentiable_coordinates_are_not_shared_between_graphs():
    pe = create_pe("rope_axial", head_dim=16)
    q = torch.randn(1, 2, 6, 16, dtype=torch.float64)
    grid = torch.rand(6, 2, dtype=torch.float64)
    first, second = grid.clone().requires_grad_(), grid.clone().requires_grad_()
    pe(q, q, first)[0].sum().backward()
    pe(q, q, second)[0].sum().backward()  # was: first's cached table, then "backward through the graph a second time"
    assert second.grad is not None and torch.equal(first.grad, second.grad)
