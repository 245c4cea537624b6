"""ForwardTables: coordinates checked once per forward, one table per distinct encoding, applied by rotate_qk."""

import pytest
import torch

import mmpos.ops.tables as tables
from mmpos.coords import image_grid
from mmpos.encodings.per_block import create_block_pes
from mmpos.ops.forward_tables import ForwardTables, run_dtype


def encodings(name, count, **options):
    """``count`` instances of ``name`` for 2 heads of 16 channels on 2D coordinates."""
    facts = dict(head_dim=16, num_heads=2, num_axes=2, num_prefix_tokens=0, seq_dim=-2)
    return create_block_pes(name, count, facts, options, share=False)


def test_one_check_and_one_table_per_distinct_encoding(monkeypatch):
    checks = []
    monkeypatch.setattr(tables, "check_finite", lambda name, t: checks.append(name))
    shared, *learned = encodings("rope_axial", 1) + encodings("rope_mixed", 3, seed=0)
    coords = image_grid(3, 4)
    built = ForwardTables([shared, shared, *learned], coords, torch.float32, "cpu")
    assert len(built) == 4 and checks == ["coords"]
    checks.clear()
    learned[0].table(coords)  # outside a ForwardTables, every table checks its coordinates again
    assert checks == ["coords"]


def test_non_finite_coordinates_are_refused_by_name():
    coords = image_grid(3, 4)
    coords[5, 1] = float("nan")
    with pytest.raises(ValueError, match=r"coords contains 1 non-finite value\(s\)"):
        ForwardTables(encodings("rope_mixed", 3, seed=0), coords, torch.float32, "cpu")


@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed", "harope", "comrope_ld"])
def test_rotate_qk_equals_the_encodings_forward(name):
    (pe,) = encodings(name, 1)
    pe = pe.double()
    with torch.no_grad():
        for parameter in pe.parameters():  # away from initialisation (HARoPE starts at M = I)
            parameter.add_(torch.randn_like(parameter) * 0.1)
    q, k = torch.randn(2, 2, 12, 16, dtype=torch.float64), torch.randn(2, 2, 12, 16, dtype=torch.float64)
    coords = image_grid(3, 4)
    built = ForwardTables([pe], coords, torch.float64, "cpu")
    for got, expected in zip(pe.rotate_qk(q, k, built.get(pe, q)), pe(q, k, coords)):
        assert torch.equal(got, expected)


def test_unforeseen_precision_gets_its_own_table():
    (pe,) = encodings("rope_axial", 1)
    coords = image_grid(3, 4)
    built = ForwardTables([pe], coords, torch.float32, "cpu")
    q32, q64 = torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16, dtype=torch.float64)
    assert built.get(pe, q32).cis.dtype == torch.complex64
    assert torch.equal(built.get(pe, q64).cis, pe.table(coords, torch.float64).cis)


def test_run_dtype_follows_autocast():
    x = torch.randn(2, 3)
    assert run_dtype(x) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert run_dtype(x) == torch.bfloat16


@pytest.mark.parametrize("shared_first", [True, False])
def test_in_block_encodings_build_when_asked_with_one_check(monkeypatch, shared_first):
    """``in_block`` tables are built by ``get`` (in the block, where a sharded model gathered the encoding), equal
    to tables built up front, with the coordinates still checked once, also when every table is in-block."""
    checks = []
    monkeypatch.setattr(tables, "check_finite", lambda name, t: checks.append(name))
    learned = encodings("rope_mixed", 3, seed=0)
    shared = encodings("rope_axial", 1) if shared_first else []
    coords = image_grid(3, 4)
    built = ForwardTables(shared + learned, coords, torch.float32, "cpu", in_block=learned)
    assert len(built) == len(shared) and checks == ["coords"]
    q, k = torch.randn(2, 1, 2, 12, 16)
    upfront = ForwardTables(learned, coords, torch.float32, "cpu")
    for pe in learned:
        for got, expected in zip(pe.rotate_qk(q, k, built.get(pe, q)), pe.rotate_qk(q, k, upfront.get(pe, q))):
            assert torch.equal(got, expected)
    assert checks == ["coords", "coords"]  # one per ForwardTables, none per in-block table


def test_in_block_coordinates_that_are_not_finite_are_refused_before_any_block():
    coords = image_grid(3, 4)
    coords[0, 0] = float("inf")
    learned = encodings("rope_mixed", 2, seed=0)
    with pytest.raises(ValueError, match=r"coords contains 1 non-finite value\(s\)"):
        ForwardTables(learned, coords, torch.float32, "cpu", in_block=learned)
