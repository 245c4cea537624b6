"""ComRoPE-AP/LD and LieRE in fp64: relative property (LieRE as negative control), commuting and orthogonal
generators, reductions to axial RoPE / RoPE-Mixed, closed forms against matrix_exp, gradients, coordinates."""

import pytest
import torch

import mmpos
from mmpos.coords import grid_coords, image_grid
from mmpos.ops.block_rotation import BlockRotationTable
from mmpos.ops.skew import skew_part
from tests.conftest import logits

COMROPE = [
    ("comrope_ap", 2, 2),
    ("comrope_ap", 4, 3),
    ("comrope_ap", 6, 2),
    ("comrope_ld", 2, 2),
    ("comrope_ld", 4, 3),
    ("comrope_ld", 3, 2),
]


def _pe(name, block_size, num_axes=2, head_dim=24, num_heads=3, **options):
    return mmpos.create_pe(
        name, head_dim=head_dim, num_heads=num_heads, num_axes=num_axes, block_size=block_size, seed=0, **options
    ).double()


def _qk(pe, length, batch=2):
    q = torch.randn(batch, pe.num_heads, length, pe.head_dim, dtype=torch.float64)
    return q, torch.randn_like(q)


@pytest.mark.parametrize("name,block_size,num_axes", COMROPE)
def test_relative_property(name, block_size, num_axes):
    pe = _pe(name, block_size, num_axes)
    q, k = _qk(pe, 10)
    coords = torch.rand(10, num_axes, dtype=torch.float64) * 4
    shift = torch.randn(num_axes, dtype=torch.float64) * 5
    base = logits(*pe(q, k, coords))
    assert torch.allclose(base, logits(*pe(q, k, coords + shift)), atol=1e-10, rtol=0)
    assert not torch.allclose(base, logits(*pe(q, k, coords * 1.5)), atol=1e-3)  # not a shift: must change


@pytest.mark.parametrize("block_size", [4, 24])
def test_liere_fails_the_relative_property(block_size):
    """The negative control: non-commuting generators make logits depend on absolute positions."""
    pe = _pe("liere", block_size)
    q, k = _qk(pe, 10)
    coords = torch.rand(10, 2, dtype=torch.float64) * 4
    shifted = logits(*pe(q, k, coords + torch.tensor([2.0, -3.0], dtype=torch.float64)))
    assert (logits(*pe(q, k, coords)) - shifted).abs().max() > 1e-2
    generators = pe.generators()
    commutator = generators[:, 0] @ generators[:, 1] - generators[:, 1] @ generators[:, 0]
    assert commutator.abs().max() > 1e-2


@pytest.mark.parametrize("name,block_size,num_axes", COMROPE)
def test_generators_commute_and_rotations_are_orthogonal(name, block_size, num_axes):
    pe = _pe(name, block_size, num_axes)
    a = pe.generators()  # [H, A, m, b, b]
    assert torch.equal(a, -a.transpose(-1, -2))
    for i in range(num_axes):
        for j in range(num_axes):
            assert torch.allclose(a[:, i] @ a[:, j], a[:, j] @ a[:, i], atol=1e-12, rtol=0)
    if block_size == 2:
        return
    x, y = torch.rand(2, 7, num_axes, dtype=torch.float64) * 3
    rx, ry, rdiff = (pe.table(c, torch.float64).matrices for c in (x, y, y - x))
    eye = torch.eye(block_size, dtype=torch.float64)
    assert torch.allclose(rx.transpose(-1, -2) @ rx, eye, atol=1e-12)
    assert torch.allclose(torch.linalg.det(rx), torch.ones(()).double(), atol=1e-12)
    assert torch.allclose(rx.transpose(-1, -2) @ ry, rdiff, atol=1e-11)  # R(x)^T R(y) = R(y - x)


@pytest.mark.parametrize("name,block_size,num_axes", COMROPE + [("liere", 4, 2), ("liere", 6, 2)])
def test_block_tables_equal_matrix_exp_of_the_generators(name, block_size, num_axes):
    """Closed forms (b = 2, 4) and the matrix_exp path equal exp(sum_i x_i A_i) built from the parameters."""
    pe = _pe(name, block_size, num_axes)
    coords = torch.randn(5, num_axes, dtype=torch.float64) * 3
    expected = torch.linalg.matrix_exp(torch.einsum("la,hamij->hlmij", coords, pe.generators()).contiguous())
    table = pe.table(coords, torch.float64)
    if block_size == 2:
        got = torch.stack([torch.stack([table.cos, -table.sin], -1), torch.stack([table.sin, table.cos], -1)], -2)
    else:
        got = table.matrices
    assert torch.allclose(got, expected, atol=1e-12, rtol=0)


def test_ap_with_rope_frequencies_equals_axial_rope():
    """b = 2, P_j = [[0, 0], [w_j, 0]]: axial RoPE with block j on axis j mod N (interleaved allocation)."""
    axial = mmpos.create_pe("rope_axial", head_dim=32, axes_dims=(16, 16), allocation="interleaved").double()
    pe = _pe("comrope_ap", 2, head_dim=32, num_heads=2)
    with torch.no_grad():
        pe.P.zero_()
        pe.P[:, :, 1, 0] = axial.spectrum.inv_freq
    q, k = _qk(pe, 12)
    coords = image_grid(3, 4, dtype=torch.float64) * 3.5
    for ours, theirs in zip(pe(q, k, coords), axial(q, k, coords)):
        assert torch.equal(ours, theirs)


def test_ld_with_block_size_2_equals_rope_mixed():
    """freqs[h, i, j] = s[h, j] * theta[i, j] with s = P[1, 0] - P[0, 1]."""
    pe = _pe("comrope_ld", 2, head_dim=32, num_heads=2)
    mixed = mmpos.create_pe("rope_mixed", head_dim=32, num_heads=2).double()
    s = skew_part(pe.P.detach())[..., 1, 0]
    with torch.no_grad():
        mixed.freqs.copy_(s[:, None, :] * pe.theta.detach()[None])
    q, k = _qk(pe, 12)
    coords = torch.randn(12, 2, dtype=torch.float64) * 4
    for ours, theirs in zip(pe(q, k, coords), mixed(q, k, coords)):
        assert torch.allclose(ours, theirs, atol=1e-12, rtol=0)
    assert torch.allclose(pe.frequency_matrix(), mixed.frequency_matrix(), atol=1e-15)


@pytest.mark.parametrize("block_size", [2, 4, 6])
def test_zero_parameters_or_zero_coordinates_are_the_identity(block_size):
    pe = _pe("comrope_ld", block_size)
    q, k = _qk(pe, 6)
    assert torch.equal(pe(q, k, torch.zeros(6, 2, dtype=torch.float64))[0], q)
    with torch.no_grad():
        pe.P.zero_()
    assert torch.equal(pe(q, k, torch.randn(6, 2, dtype=torch.float64))[0], q)


@pytest.mark.parametrize(
    "name,block_size", [("comrope_ap", 2), ("comrope_ap", 4), ("comrope_ld", 4), ("comrope_ld", 6), ("liere", 4)]
)
def test_gradients_reach_only_the_skew_part(name, block_size):
    pe = _pe(name, block_size)
    q, k = _qk(pe, 9)
    q.requires_grad_(True)
    coords = image_grid(3, 3, dtype=torch.float64)
    logits(*pe(q, k, coords)).sin().sum().backward()
    grad = pe.P.grad
    assert grad.abs().max() > 1e-6 and q.grad.abs().max() > 1e-6
    assert torch.allclose(grad, -grad.transpose(-1, -2), atol=1e-12)  # P's symmetric part is not used
    if name == "comrope_ld":
        assert pe.theta.grad.abs().min() > 0


@pytest.mark.parametrize("block_size", [2, 4])
def test_gradcheck_through_parameters_and_inputs(block_size):
    pe = _pe("comrope_ld", block_size, head_dim=8, num_heads=2, num_prefix_tokens=1)
    coords = torch.rand(3, 2, dtype=torch.float64)
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True)
    p0, t0 = pe.P.detach().clone().requires_grad_(True), pe.theta.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q, p, t: _with_params(pe, p, t)(q, coords), (q, p0, t0))


def _with_params(pe, p, theta):
    """pe's forward with P and theta replaced by (differentiable) tensors."""

    def run(q, coords):
        return torch.func.functional_call(pe, {"P": p, "theta": theta}, (q, q, coords))[0]

    return run


def test_heads_are_independent():
    pe = _pe("comrope_ap", 4)
    q, k = _qk(pe, 8)
    coords = torch.rand(8, 2, dtype=torch.float64)
    before = pe(q, k, coords)[0]
    with torch.no_grad():
        pe.P[1] += torch.randn_like(pe.P[1])
    after = pe(q, k, coords)[0]
    assert torch.equal(before[:, [0, 2]], after[:, [0, 2]]) and not torch.allclose(before[:, 1], after[:, 1])


def test_normalised_grid_cls_at_centre_and_prefix_handling():
    grid = (3, 4)
    pe = _pe("comrope_ld", 4, grid_size=grid, num_prefix_tokens=1, prefix_at_centre=True)
    q, k = _qk(pe, 13)
    normalised = grid_coords(grid, "normalized", dtype=torch.float64)
    assert torch.allclose(normalised.amin(0), torch.tensor([1 / 6, 1 / 8], dtype=torch.float64))
    with_cls = torch.cat([torch.full((1, 2), 0.5, dtype=torch.float64), normalised])
    plain = _pe("comrope_ld", 4)
    expected = plain(q, k, with_cls)
    for got, want in zip(pe(q, k), expected):  # coords=None: the normalised grid, cls at (0.5, 0.5)
        assert torch.allclose(got, want, atol=1e-14, rtol=0)
    unrotated = _pe("comrope_ld", 4, grid_size=grid, num_prefix_tokens=1)
    out = unrotated(q, k)[0]
    assert torch.equal(out[:, :, 0], q[:, :, 0]) and torch.allclose(out[:, :, 1:], expected[0][:, :, 1:])


def test_training_perturbation():
    grid = (4, 5)
    pe = _pe("comrope_ap", 2, grid_size=grid, perturbation=1.0)
    q, k = _qk(pe, 20, batch=3)
    pe.eval()
    clean = pe(q, k)
    pe.train()
    torch.manual_seed(1)
    jittered = pe(q, k)
    assert not torch.allclose(jittered[0], clean[0])
    assert not torch.allclose(jittered[0][0], pe(q[1:2], k[1:2])[0][0])  # each sample its own jitter
    from mmpos.coords.perturb import perturb_grid_coords

    coords = grid_coords(grid, "normalized", dtype=torch.float64)
    moved = perturb_grid_coords(coords, grid, 64, intensity=1.0, fixed_axes=(0,)) - coords
    assert moved.shape == (64, 20, 2) and torch.equal(moved[..., 0], torch.zeros(64, 20, dtype=torch.float64))
    assert moved[..., 1].abs().max() <= 0.5 / 5 + 1e-15 and moved[..., 1].abs().max() > 0.05
    with pytest.raises(ValueError, match="coords=None"):
        pe(q, k, coords)
    pe.eval()
    assert torch.equal(pe(q, k)[0], clean[0])


def test_layouts_seq_dim_and_inputs_untouched():
    pe = _pe("comrope_ld", 4, num_prefix_tokens=2)
    blhd = _pe("comrope_ld", 4, num_prefix_tokens=2, seq_dim=-3)
    q, k = _qk(pe, 9)
    q_before = q.clone()
    coords = torch.rand(7, 2, dtype=torch.float64)
    out = pe(q, k, coords)[0]
    assert torch.equal(q, q_before) and torch.equal(out[:, :, :2], q[:, :, :2])
    assert torch.equal(blhd(q.transpose(1, 2), k.transpose(1, 2), coords)[0].transpose(1, 2), out)
    half = _pe("comrope_ap", 2, layout="half")
    perm = torch.arange(24).view(12, 2).t().flatten()
    inter = _pe("comrope_ap", 2)
    assert torch.equal(
        half(q[..., perm], k[..., perm], coords[:7].repeat(2, 1)[:9])[0],
        inter(q, k, coords[:7].repeat(2, 1)[:9])[0][..., perm],
    )


def test_batched_coordinates_and_bf16():
    pe = _pe("comrope_ap", 4)
    q, k = _qk(pe, 6)
    coords = torch.rand(2, 6, 2, dtype=torch.float64)
    batched = pe(q, k, coords)[0]
    for b in range(2):
        assert torch.allclose(batched[b], pe(q[b : b + 1], k[b : b + 1], coords[b])[0][0], atol=1e-15)
    low = pe.float()(q.bfloat16(), k.bfloat16(), coords.float())[0]
    assert low.dtype == torch.bfloat16
    assert torch.allclose(low.double(), batched, atol=0.04, rtol=0.01)


def test_tables_are_cached_without_grad_and_rebuilt_after_an_update():
    pe = _pe("comrope_ld", 4)
    q, k = _qk(pe, 6)
    coords = torch.rand(6, 2, dtype=torch.float64)
    with torch.no_grad():
        first = pe(q, k, coords)[0]
        pe(q, k, coords.clone())
        assert pe.cache.builds == 1
        pe.theta.add_(1.0)
        assert not torch.allclose(pe(q, k, coords)[0], first)
        assert pe.cache.builds == 2
    pe(q, k, coords)
    assert pe.cache.builds == 2  # with gradients the table is built fresh, not cached


@pytest.mark.parametrize(
    "name,options,match",
    [
        ("comrope_ap", dict(head_dim=24, block_size=5), "block_size=5 must be >= 2 and divide head_dim=24"),
        ("comrope_ap", dict(head_dim=24, block_size=8), "head_dim / num_axes to be a multiple of block_size"),
        ("comrope_ld", dict(head_dim=24, block_size=1), "block_size=1"),
        ("comrope_ld", dict(head_dim=24, block_size=4, layout="half"), "only exists for block_size=2"),
        ("comrope_ld", dict(head_dim=24, grid_size=(3, 4, 5)), "grid_size=.* has 3 axes; expected num_axes=2"),
        ("comrope_ld", dict(head_dim=24, perturbation=1.0), "set grid_size"),
        ("comrope_ld", dict(head_dim=24, num_heads=0), "num_heads must be a positive integer"),
        ("liere", dict(head_dim=24, block_size=7), "block_size=7"),
    ],
)
def test_bad_options(name, options, match):
    options.setdefault("num_heads", 2)
    with pytest.raises((ValueError, TypeError), match=match):
        mmpos.create_pe(name, **options)


def test_bad_inputs():
    pe = _pe("comrope_ap", 4, grid_size=(3, 3))
    q, k = _qk(pe, 9)
    with pytest.raises(ValueError, match="has 2 heads; this encoding has per-head parameters for num_heads=3"):
        pe(q[:, :2], k[:, :2])
    with pytest.raises(ValueError, match=r"10 tokens after 0 prefix token\(s\) do not match grid_size=\(3, 3\)"):
        pe(*_qk(pe, 10))
    with pytest.raises(ValueError, match="table has 4 positions"):
        pe(q, k, torch.rand(4, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="needs coords"):
        _pe("comrope_ap", 4)(q, k)


def test_block_rotation_operator_prefix_pass_through_and_shared_tables():
    from mmpos.ops import apply_block_rotation
    from mmpos.ops.skew import exp_skew

    x = torch.randn(3, 2, 6, 10, dtype=torch.float64)  # 2 prefix tokens, 8 rotated channels of 10
    shared = exp_skew(skew_part(torch.randn(2, 4, 2, 4, 4, dtype=torch.float64)))  # [H, L, m, b, b]
    out = apply_block_rotation(x, BlockRotationTable(shared), num_prefix_tokens=2)
    assert torch.equal(out[:, :, :2], x[:, :, :2]) and torch.equal(out[..., 8:], x[..., 8:])
    expected = torch.einsum("hlmij,bhlmj->bhlmi", shared, x[:, :, 2:, :8].unflatten(-1, (2, 4))).flatten(-2)
    assert torch.allclose(out[:, :, 2:, :8], expected, atol=1e-14)
    per_sample = apply_block_rotation(x, BlockRotationTable(shared.expand(3, -1, -1, -1, -1, -1)), num_prefix_tokens=2)
    assert torch.allclose(per_sample, out, atol=1e-14)
    with pytest.raises(ValueError, match="table leading dims"):
        apply_block_rotation(x[:, :1], BlockRotationTable(shared), num_prefix_tokens=2)
    with pytest.raises(ValueError, match="rotates 12 channels but x has only 10"):
        apply_block_rotation(x, BlockRotationTable(torch.zeros(4, 3, 4, 4, dtype=torch.float64)), num_prefix_tokens=2)
