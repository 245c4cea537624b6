"""fp64 properties of the rotary baselines: relative property, reductions, no mutation, layouts, autograd."""

import pytest
import torch

import mmpos
from mmpos.coords import image_grid, video_grid
from mmpos.ops import RotaryTable, rotate
from tests.conftest import logits

VARIANTS = {
    "rope_1d": dict(name="rope_1d", head_dim=32),
    "rope_1d_interleaved": dict(name="rope_1d", head_dim=32, layout="interleaved"),
    "axial_2d": dict(name="rope_axial", head_dim=32),
    "axial_2d_half_theta": dict(name="rope_axial", head_dim=32, layout="half", theta=(100.0, 1000.0)),
    "axial_3d_interleaved_alloc": dict(
        name="rope_axial", head_dim=48, axes_dims=(16, 16, 16), allocation="interleaved"
    ),
    "axial_3d_ntk_riflex": dict(
        name="rope_axial",
        head_dim=64,
        num_axes=3,
        extrapolation=[
            {"type": "riflex", "k": 2, "target_length": 40},
            {"type": "ntk", "factor": 2.0},
            {"type": "yarn", "factor": 2.0, "original_length": 16},
        ],
    ),
    "axial_partial_prefix": dict(name="rope_axial", head_dim=40, rotary_dim=32, num_prefix_tokens=2),
    "mixed": dict(name="rope_mixed", head_dim=32, num_heads=3),
}


def _build(spec):
    spec = dict(spec)
    return mmpos.create_pe(spec.pop("name"), **spec).double()


def _coords(pe, length):
    return torch.randn(length, pe.num_axes, dtype=torch.float64) * 7


@pytest.mark.parametrize("variant", VARIANTS)
def test_relative_property(variant):
    """Logits between rotated q and k depend only on coordinate differences."""
    pe = _build(VARIANTS[variant])
    length = 9
    q = torch.randn(2, 3, length + pe.num_prefix_tokens, pe.head_dim, dtype=torch.float64)
    k = torch.randn_like(q)
    coords = _coords(pe, length)
    shift = torch.randn(pe.num_axes, dtype=torch.float64) * 1000
    n = pe.num_prefix_tokens  # prefix tokens are unrotated: the property holds among rotated tokens
    a = logits(*pe(q, k, coords))[..., n:, n:]
    b = logits(*pe(q, k, coords + shift))[..., n:, n:]
    assert torch.allclose(a, b, atol=1e-9, rtol=0)
    moved = logits(*pe(q, k, coords * 1.5))[..., n:, n:]  # the test can fail: scaling is not a shift
    assert not torch.allclose(a, moved, atol=1e-3)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rotation_preserves_norms_and_inputs(variant):
    pe = _build(VARIANTS[variant])
    q = torch.randn(1, 3, 6 + pe.num_prefix_tokens, pe.head_dim, dtype=torch.float64)
    q_before = q.clone()
    coords = _coords(pe, 6)
    coords_before = coords.clone()
    out = pe(q, q, coords)[0]
    assert torch.equal(q, q_before) and torch.equal(coords, coords_before)
    if variant not in ("axial_3d_ntk_riflex",):  # YaRN scales magnitudes on purpose
        assert torch.allclose(out.norm(dim=-1), q.norm(dim=-1), atol=1e-12)


def test_zero_coordinates_are_identity():
    pe = _build(VARIANTS["axial_2d"])
    q = torch.randn(1, 2, 5, 32, dtype=torch.float64)
    assert torch.equal(pe(q, q, torch.zeros(5, 2, dtype=torch.float64))[0], q)


def test_rope_mixed_with_axis_aligned_frequencies_equals_axial():
    axial = mmpos.create_pe("rope_axial", head_dim=32, axes_dims=(16, 16), theta=100.0).double()
    mixed = mmpos.create_pe("rope_mixed", head_dim=32, num_heads=2).double()
    with torch.no_grad():
        mixed.freqs.copy_(axial.frequency_matrix().expand(2, -1, -1))
    q = torch.randn(1, 2, 12, 32, dtype=torch.float64)
    coords = image_grid(3, 4, dtype=torch.float64)
    assert torch.equal(axial(q, q, coords)[0], mixed(q, q, coords)[0])


def test_interleaved_allocation_matches_qwen3_vl_layout():
    """[T H W T H W ... T T] for mrope_section (24, 20, 20): H at 1::3, W at 2::3 up to 3 * 20."""
    pe = mmpos.create_pe("rope_axial", head_dim=128, axes_dims=(48, 40, 40), allocation="interleaved")
    axis = pe.spectrum.axis_of_pair
    expected = torch.zeros(64, dtype=torch.long)
    expected[1:60:3], expected[2:60:3] = 1, 2
    assert torch.equal(axis, expected)
    ladder = 1.0 / 10000 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    assert torch.equal(pe.spectrum.inv_freq, ladder)


def test_layouts_are_channel_permutations_of_each_other():
    interleaved = _build(dict(name="rope_axial", head_dim=32, layout="interleaved"))
    half = _build(dict(name="rope_axial", head_dim=32, layout="half"))
    q = torch.randn(1, 2, 7, 32, dtype=torch.float64)
    coords = _coords(interleaved, 7)
    perm = torch.arange(32).view(16, 2).t().flatten()  # interleaved index of each half-layout channel
    out_half = half(q[..., perm], q[..., perm], coords)[0]
    out_inter = interleaved(q, q, coords)[0]
    assert torch.equal(out_half, out_inter[..., perm])


def test_blhd_equals_bhld():
    bhld = _build(dict(name="rope_axial", head_dim=32, num_prefix_tokens=1))
    blhd = _build(dict(name="rope_axial", head_dim=32, num_prefix_tokens=1, seq_dim=-3))
    q = torch.randn(2, 3, 8, 32, dtype=torch.float64)
    coords = _coords(bhld, 7)
    expected = bhld(q, q, coords)[0]
    got = blhd(q.transpose(1, 2), q.transpose(1, 2), coords)[0].transpose(1, 2)
    assert torch.equal(expected, got)


def test_prefix_tokens_and_pass_through_channels_untouched():
    pe = _build(VARIANTS["axial_partial_prefix"])
    q = torch.randn(2, 3, 9, 40, dtype=torch.float64)
    out = pe(q, q, _coords(pe, 7))[0]
    assert torch.equal(out[:, :, :2], q[:, :, :2])
    assert torch.equal(out[..., 32:], q[..., 32:])
    assert not torch.allclose(out[:, :, 2:, :32], q[:, :, 2:, :32])


def test_batched_coordinates():
    pe = _build(VARIANTS["axial_2d"])
    q = torch.randn(2, 3, 6, 32, dtype=torch.float64)
    coords = torch.randn(2, 6, 2, dtype=torch.float64)
    batched = pe(q, q, coords)[0]
    for b in range(2):
        assert torch.equal(batched[b], pe(q[b : b + 1], q[b : b + 1], coords[b])[0][0])


def test_16bit_chunked_path_equals_unchunked(monkeypatch):
    from mmpos.ops import rotation

    pe = mmpos.create_pe("rope_axial", head_dim=64, num_axes=3, layout="half")
    q = torch.randn(2, 4, 300, 64).bfloat16()
    coords = video_grid(3, 10, 10)
    whole = pe(q, q, coords)[0]
    monkeypatch.setattr(rotation, "CHUNK_ELEMENTS", 1000)
    assert torch.equal(whole, pe(q, q, coords)[0])


def test_batch_split_chunks_equal_unchunked(monkeypatch):
    """Short sequences split along the batch dim, with shared and with per-sample (batched) tables."""
    from mmpos.ops import rotation

    pe = mmpos.create_pe("rope_axial", head_dim=32, num_prefix_tokens=1)
    q = torch.randn(6, 2, 10, 32).bfloat16()
    shared, batched = image_grid(3, 3), torch.randn(6, 9, 2) * 5
    whole = [pe(q, q, c)[0] for c in (shared, batched)]
    monkeypatch.setattr(rotation, "CHUNK_ELEMENTS", 2 * 2 * 9 * 16 * 2 * 2)  # 4 batch items per chunk
    assert all(torch.equal(w, pe(q, q, c)[0]) for w, c in zip(whole, (shared, batched)))


def test_autograd_through_rotation_and_learned_frequencies():
    pe = mmpos.create_pe("rope_mixed", head_dim=8, num_heads=2, num_prefix_tokens=1).double()
    coords = image_grid(2, 2, dtype=torch.float64)
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q: pe(q, q, coords)[0], (q,))

    def rotate_with(freqs):
        phase = torch.einsum("la,hap->hlp", coords, freqs)
        return rotate(q.detach(), RotaryTable(torch.polar(torch.ones_like(phase), phase)), num_prefix_tokens=1)

    freqs = torch.randn(2, 2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(rotate_with, (freqs,))
    pe(q, q, coords)[0].square().sum().backward()  # a rotation keeps norms: no gradient to the phases
    assert pe.freqs.grad is not None and pe.freqs.grad.abs().max() < 1e-12
    pe.freqs.grad = None
    (pe(q, q, coords)[0] * torch.randn_like(q)).sum().backward()
    assert pe.freqs.grad.abs().sum() > 0


def test_tables_are_cached_across_calls_and_equal_coordinates():
    pe = mmpos.create_pe("rope_axial", head_dim=32)
    q = torch.randn(1, 2, 12, 32)
    coords = image_grid(3, 4)
    for _ in range(3):
        pe(q, q, coords)
    pe(q, q, image_grid(3, 4))  # equal values, new tensor
    assert pe.cache.builds == 1
    pe(q.bfloat16(), q.bfloat16(), coords)  # another compute dtype
    pe(q, q, image_grid(4, 3))
    assert pe.cache.builds == 3


def test_reduced_fp32_phases_match_fp64():
    from mmpos.ops import axial_phases, phases_fp32_reduced

    pe = mmpos.create_pe("rope_axial", head_dim=64, num_axes=3)
    coords = torch.cat([video_grid(4, 8, 8), torch.tensor([[1e6, 999_999.0, 123_456.5]])])
    exact = axial_phases(coords, pe.spectrum.axis_of_pair, pe.spectrum.inv_freq)
    reduced = phases_fp32_reduced(coords, pe.spectrum.frequency_matrix()).double()
    wrapped = torch.remainder(reduced - exact + torch.pi, 2 * torch.pi) - torch.pi
    assert wrapped.abs().max() < 2e-6
    naive = (coords.float()[:, pe.spectrum.axis_of_pair] * pe.spectrum.inv_freq.float()).double()
    naive_err = torch.remainder(naive - exact + torch.pi, 2 * torch.pi) - torch.pi
    assert naive_err.abs().max() > 1e-2  # the plain fp32 product the reduction replaces
