"""The fused CUDA kernel, run on the CPU by Triton's interpreter (TRITON_INTERPRET=1)."""

import pytest
import torch

import mmpos
from mmpos.coords.grids import grid_coords
from mmpos.ops import backends as backend_module
from mmpos.ops import get_rotary_backend, rotary_backend, rotary_triton, rotation, set_rotary_backend
from tests.conftest import bf16_ulp

pytest.importorskip("triton")


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with rotary_backend("auto"):
        yield


def _count_kernel_calls(monkeypatch) -> list:
    calls = []
    fused = rotary_triton.rotate_fused
    monkeypatch.setattr(rotation, "rotate_fused", lambda *args: calls.append(1) or fused(*args))
    return calls


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_kernel_matches_fp64_rotation(interpreter, monkeypatch, layout, seq_dim):
    """fp32 in, fp32 out through rotate(): the kernel is taken and agrees with the fp64 rotation."""
    pe = mmpos.create_pe(
        "rope_axial", head_dim=40, axes_dims=(8, 8), layout=layout, seq_dim=seq_dim, num_prefix_tokens=1
    )  # partial rotary: channels 16.. pass through
    coords = grid_coords((3, 5))
    q = torch.randn((2, 4, 16, 40) if seq_dim == -2 else (2, 16, 4, 40))
    calls = _count_kernel_calls(monkeypatch)
    out = pe.rotate(q, pe.table(coords))
    assert calls == [1], "rotate() did not take the fused kernel"
    exact = pe.rotate(q.double(), pe.table(coords, torch.float64))
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=2e-6)
    prefix = q.select(seq_dim, 0)
    assert torch.equal(out.select(seq_dim, 0), prefix)
    assert torch.equal(out[..., 16:], q[..., 16:])


def test_kernel_bf16_within_one_ulp_and_broadcast_tables(interpreter):
    """bf16 in and out, a per-batch table broadcast over heads; fp32 arithmetic rounds once per output.

    (The interpreter converts to bf16 by truncation, hence one ulp here; CUDA rounds to nearest.)"""
    pe = mmpos.create_pe("rope_axial", head_dim=32, axes_dims=(16, 16))
    coords = torch.stack([grid_coords((4, 4)), grid_coords((4, 4)) * 0.5 + 3])  # [B=2, L, 2]
    table = pe.table(coords)  # cis [2, 1, L, P]
    x = torch.randn(2, 3, 16, 32).bfloat16()
    out = torch.empty_like(x)
    rotary_triton.rotate_fused(x, table.cis, out, interleaved=True)
    exact = pe.rotate(x.double(), pe.table(coords, torch.float64))
    assert ((out.double() - exact).abs() / bf16_ulp(exact)).max() <= 1.0 + 1e-6


def test_backend_setter_switches_the_path(interpreter, monkeypatch):
    pe = mmpos.create_pe("rope_axial", head_dim=16, axes_dims=(4, 4))
    coords, q = grid_coords((3, 3)), torch.randn(1, 2, 9, 16)
    calls = _count_kernel_calls(monkeypatch)
    with rotary_backend("torch"):
        assert get_rotary_backend() == "torch"
        by_torch = pe.rotate(q, pe.table(coords))
    assert calls == [] and get_rotary_backend() == "auto"
    for name in ("triton", "auto"):
        set_rotary_backend(name)
        by_kernel = pe.rotate(q, pe.table(coords))
    assert calls == [1, 1]
    torch.testing.assert_close(by_kernel, by_torch, rtol=0, atol=2e-6)


def test_invalid_backend_is_rejected_and_nothing_changes():
    before = get_rotary_backend()
    with pytest.raises(ValueError, match=r"rotary backend must be one of \('auto', 'triton', 'torch'\), got 'cuda'"):
        set_rotary_backend("cuda")
    assert get_rotary_backend() == before


@pytest.mark.parametrize("value, default", [(None, "torch"), ("0", "torch"), ("1", "auto")])
def test_environment_only_supplies_the_default(monkeypatch, value, default):
    if value is None:
        monkeypatch.delenv("MMPOS_TRITON", raising=False)
    else:
        monkeypatch.setenv("MMPOS_TRITON", value)
    assert backend_module._default_from_environment() == default
