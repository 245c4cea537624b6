"""Learned phases: rotate_pair (one backward for q and k) gives the gradients of two separate rotations, passes
gradcheck in fp64 with prefix tokens, partial rotary, both layouts and broadcast tables; the table is bitwise
cos + i sin."""

import pytest
import torch

import mmpos
from mmpos.coords import grid_coords
from mmpos.ops.phasors import rotate_pair, trains_phases, unit_phasor_table, unit_phasors
from mmpos.ops.rotation import rotate


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_gradcheck_with_prefix_partial_rotary_and_a_broadcast_table(layout, seq_dim):
    batch, heads, prefix, length, dim, pairs = 2, 3, 1, 5, 10, 4  # 8 of 10 channels rotate
    shape = (batch, heads, prefix + length, dim) if seq_dim == -2 else (batch, prefix + length, heads, dim)
    q, k = (torch.randn(shape, dtype=torch.float64, requires_grad=True) for _ in range(2))
    phase = torch.randn(heads, length, pairs, dtype=torch.float64, requires_grad=True)

    def run(q, k, phase):
        table = unit_phasor_table(phase, torch.complex128)
        assert trains_phases(table)
        return rotate_pair(q, k, table, layout, seq_dim=seq_dim, num_prefix_tokens=prefix)

    assert torch.autograd.gradcheck(run, (q, k, phase), fast_mode=True)
    separate = unit_phasor_table(phase, torch.complex128)
    separate.phase = None  # the per-tensor path, differentiating through cis
    for fused, alone in zip(
        run(q, k, phase), rotate_pair(q, k, separate, layout, seq_dim=seq_dim, num_prefix_tokens=prefix)
    ):
        assert torch.equal(fused, alone)


@pytest.mark.parametrize("name", ["comrope_ap", "comrope_ld", "rope_mixed"])
def test_encodings_get_the_gradients_of_separate_rotations(name):
    options = dict(block_size=2) if name.startswith("comrope") else {}
    pe = mmpos.create_pe(name, head_dim=16, num_heads=2, num_prefix_tokens=1, seed=0, **options).double()
    coords = grid_coords((3, 3), "normalized", dtype=torch.float64)
    q, k = (torch.randn(2, 2, 10, 16, dtype=torch.float64, requires_grad=True) for _ in range(2))
    weights = torch.randn(2, 2, 10, 10, dtype=torch.float64)

    def gradients(encode):
        for t in (q, k, *pe.parameters()):
            t.grad = None
        rq, rk = encode(pe.table(coords, torch.float64))
        ((rq @ rk.transpose(-1, -2)) * weights).sum().backward()
        return [t.grad.clone() for t in (q, k, *pe.parameters())]

    fused = gradients(lambda table: pe.rotate_qk(q, k, table))
    separate = gradients(lambda table: (pe.rotate(q, table), pe.rotate(k, table)))
    for a, b in zip(fused, separate):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_only_one_output_used():
    phase = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    q, k = torch.randn(2, 2, 4, 6, dtype=torch.float64), torch.randn(2, 2, 4, 6, dtype=torch.float64)
    rq, _ = rotate_pair(q, k, unit_phasor_table(phase, torch.complex128))
    (rq * torch.arange(6.0, dtype=torch.float64)).sum().backward()
    expected_phase = phase.detach().clone().requires_grad_(True)
    (
        rotate(q, unit_phasor_table(expected_phase, torch.complex128)) * torch.arange(6.0, dtype=torch.float64)
    ).sum().backward()
    torch.testing.assert_close(phase.grad, expected_phase.grad, rtol=1e-12, atol=1e-12)


def test_no_grad_and_fixed_tables_take_the_plain_path():
    phase = torch.randn(4, 3, requires_grad=True)
    with torch.no_grad():
        assert not trains_phases(unit_phasor_table(phase, torch.complex64))
    assert not trains_phases(unit_phasor_table(phase.detach(), torch.complex64))


@pytest.mark.parametrize(
    "phase_dtype,real", [(torch.float32, torch.float32), (torch.float64, torch.float32), (torch.float32, torch.float64)]
)
def test_unit_phasors_are_bitwise_cos_and_sin(phase_dtype, real):
    phase = torch.randn(3, 7, 5, dtype=phase_dtype) * 100
    expected = torch.complex(phase.cos().to(real), phase.sin().to(real))
    assert torch.equal(unit_phasors(phase, real), expected)
