"""HARoPE in fp64: identity at init, relative property for random parameters on 2D and Flux layouts,
zero-offset neutrality, factor properties, head-wise independence, gradients, reference parameters, errors."""

import pytest
import torch
from torch.nn import functional as F

import mmpos
from mmpos.coords import flux_ids, image_grid
from tests.conftest import logits

BASES = {
    "axial_2d": dict(head_dim=16, base="rope_axial"),
    "flux_blhd": dict(head_dim=32, base="rope_axial", base_options={"axes_dims": (8, 12, 12), "seq_dim": -3}),
    "mixed": dict(head_dim=16, base="rope_mixed"),
    "comrope_ld_b4": dict(head_dim=16, base="comrope_ld", base_options={"block_size": 4, "seed": 0}),
}


def _harope(spec, num_heads=3, randomise=True):
    pe = mmpos.create_pe("harope", num_heads=num_heads, **spec).double()
    if randomise:
        with torch.no_grad():
            pe.u_skew.normal_(std=0.3), pe.v_skew.normal_(std=0.3), pe.sigma.normal_()
    return pe


def _inputs(pe, text=0, batch=2):
    """q, k in the encoding's layout, coords, and a function to [B, H, L, D]."""
    if pe.num_axes == 3:
        coords = flux_ids(3, 4, text_length=text, dtype=torch.float64)
    else:
        coords = image_grid(3, 4, dtype=torch.float64)
    shape = (batch, pe.num_heads, coords.shape[0], pe.head_dim)
    q, k = torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)
    if pe.seq_dim == -3:
        return q.transpose(1, 2), k.transpose(1, 2), coords, lambda t: t.transpose(1, 2)
    return q, k, coords, lambda t: t


def _logits(pe, q, k, coords, to_bhld):
    rq, rk = pe(q, k, coords)
    return logits(to_bhld(rq), to_bhld(rk))


@pytest.mark.parametrize("base", BASES)
def test_init_equals_the_wrapped_encoding_exactly(base):
    pe = _harope(BASES[base], randomise=False)
    q, k, coords, _ = _inputs(pe, text=2)
    for ours, plain in zip(pe(q, k, coords), pe.base(q, k, coords)):
        assert torch.equal(ours, plain)


@pytest.mark.parametrize("base", BASES)
def test_relative_property_with_random_parameters(base):
    pe = _harope(BASES[base])
    q, k, coords, to_bhld = _inputs(pe, text=3)
    shift = torch.randn(pe.num_axes, dtype=torch.float64) * 10
    base_logits = _logits(pe, q, k, coords, to_bhld)
    assert torch.allclose(base_logits, _logits(pe, q, k, coords + shift, to_bhld), atol=1e-10, rtol=0)
    plain = logits(*(to_bhld(t) for t in pe.base(q, k, coords)))
    assert not torch.allclose(base_logits, plain, atol=1e-3)  # M changed something


@pytest.mark.parametrize("base", ["axial_2d", "flux_blhd"])
def test_zero_offset_neutrality(base):
    """All tokens at one position: logits equal plain q . k for any M."""
    pe = _harope(BASES[base])
    q, k, coords, to_bhld = _inputs(pe)
    same = torch.full_like(coords, 2.5)
    assert torch.allclose(_logits(pe, q, k, same, to_bhld), logits(to_bhld(q), to_bhld(k)), atol=1e-12, rtol=0)
    mq, mk = pe.transform(q, k)
    assert torch.allclose(logits(to_bhld(mq), to_bhld(mk)), logits(to_bhld(q), to_bhld(k)), atol=1e-12, rtol=0)


def test_factors_are_rotations_and_inverse_is_analytic():
    pe = _harope(BASES["axial_2d"])
    u, s, v = pe.factors(torch.float64)
    eye = torch.eye(16, dtype=torch.float64)
    for r in (u, v):
        assert torch.allclose(r.transpose(-1, -2) @ r, eye, atol=1e-13)
        assert torch.allclose(torch.linalg.det(r), torch.ones(3, dtype=torch.float64), atol=1e-12)
    m, m_inv_t = pe.matrices(torch.float64)
    assert torch.allclose(m @ m_inv_t.transpose(-1, -2), eye, atol=1e-12)
    assert torch.allclose(torch.linalg.svdvals(m), s.sort(dim=-1, descending=True).values, atol=1e-12)


def test_heads_are_independent():
    pe = _harope(BASES["axial_2d"])
    q, k, coords, _ = _inputs(pe)
    before = pe(q, k, coords)
    with torch.no_grad():
        pe.u_skew[1].add_(0.5), pe.sigma[1].add_(1.0)
    after = pe(q, k, coords)
    for b, a in zip(before, after):
        assert torch.equal(b[:, [0, 2]], a[:, [0, 2]]) and not torch.allclose(b[:, 1], a[:, 1])


def test_gradients_reach_every_parameter_and_match_finite_differences():
    pe = _harope(dict(head_dim=4, base="rope_axial"), num_heads=2)
    q, k, coords, _ = _inputs(pe, batch=1)
    names = ("u_skew", "v_skew", "sigma")
    params = tuple(getattr(pe, n).detach().clone().requires_grad_(True) for n in names)

    weights = torch.randn(12, 12, dtype=torch.float64)

    def run(*values):  # a few outputs keep the Jacobian small
        rq, rk = torch.func.functional_call(pe, dict(zip(names, values)), (q, k, coords))
        return (logits(rq, rk) * weights).sum((-1, -2))

    assert torch.autograd.gradcheck(run, params, fast_mode=True)
    run(*params).sin().sum().backward()
    assert all(p.grad.abs().min() > 0 for p in params)


def test_reference_parameters_only_their_skew_part_matters():
    """Loading the reference's full A_u, A_v: a symmetric part added to them changes nothing, and
    U = exp((A - A^T) / 2), s = softplus(sigma) + 1e-6 as in the reference."""
    pe = _harope(BASES["axial_2d"], randomise=False)
    a_u, a_v = torch.randn(2, 3, 16, 16, dtype=torch.float64) * 0.2
    sigma = torch.randn(3, 16, dtype=torch.float64)
    pe.load_reference_parameters(a_u, a_v, sigma)
    u, s, v = pe.factors(torch.float64)
    assert torch.allclose(u, torch.linalg.matrix_exp((a_u - a_u.transpose(-1, -2)) / 2), atol=1e-14)
    assert torch.allclose(v, torch.linalg.matrix_exp((a_v - a_v.transpose(-1, -2)) / 2), atol=1e-14)
    assert torch.allclose(s, F.softplus(sigma) + 1e-6, atol=1e-14)
    q, k, coords, _ = _inputs(pe)
    expected = pe(q, k, coords)
    symmetric = torch.randn(3, 16, 16, dtype=torch.float64)
    pe.load_reference_parameters(a_u + symmetric + symmetric.transpose(-1, -2), a_v, sigma)
    assert all(torch.allclose(a, b, atol=1e-13) for a, b in zip(pe(q, k, coords), expected))
    assert pe.u_skew.numel() == 3 * 16 * 15 // 2  # only the free entries are stored


def test_singular_values_stay_positive_and_matrices_are_cached():
    pe = _harope(BASES["axial_2d"], randomise=False)
    with torch.no_grad():
        pe.sigma.fill_(-1e4)
    assert torch.equal(pe.singular_values(), torch.full((3, 16), 1e-6, dtype=torch.float64))
    q, k, coords, _ = _inputs(pe)
    with torch.no_grad():
        pe.sigma.zero_()
        pe(q, k, coords)
        cached = pe._cached[1]
        pe(q, k, coords)
        assert pe._cached[1] is cached
        pe.u_skew.add_(0.1)
        pe(q, k, coords)
        assert pe._cached[1] is not cached


def test_bf16_activations():
    pe = _harope(BASES["flux_blhd"])
    q, k, coords, to_bhld = _inputs(pe, text=2)
    exact = _logits(pe, q, k, coords, to_bhld)
    pe = pe.float()
    low = pe(q.bfloat16(), k.bfloat16(), coords.float())
    assert low[0].dtype == torch.bfloat16
    got = logits(*(to_bhld(t).double() for t in low))
    assert (got - exact).abs().max() < 0.05 * exact.abs().max()


def test_bad_options_and_inputs():
    with pytest.raises(ValueError, match="not a rotary encoding"):
        mmpos.create_pe("harope", head_dim=16, num_heads=2, base="ape_sincos", base_options={"embed_dim": 16})
    with pytest.raises(ValueError, match="must not set 'head_dim'"):
        mmpos.create_pe("harope", head_dim=16, num_heads=2, base_options={"head_dim": 8})
    with pytest.raises(ValueError, match="base encoding has num_heads=3; expected num_heads=2"):
        mmpos.create_pe("harope", head_dim=16, num_heads=2, base="rope_mixed", base_options={"num_heads": 3})
    with pytest.raises(ValueError, match="unknown encoding 'rope_nope'"):
        mmpos.create_pe("harope", head_dim=16, num_heads=2, base="rope_nope")
    with pytest.raises(ValueError, match="eps must be positive"):
        mmpos.create_pe("harope", head_dim=16, num_heads=2, eps=0.0)
    pe = _harope(BASES["axial_2d"])
    q, k, coords, _ = _inputs(pe)
    with pytest.raises(ValueError, match="k has shape .* expected 3 heads of 16 channels.*GQA"):
        pe(q, k[:, :1], coords)
    with pytest.raises(ValueError, match="q has shape"):
        pe(q[..., :8], k, coords)


# ----- M folded into a fused qkv projection (timm ViT, DiT) ----------------------------------------------------
def _tiny_vit(pe="harope", dtype=torch.float64, randomise=True):
    import timm

    from mmpos.integrations.timm import convert

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=5,
    ).to(dtype)
    convert(model, pe)
    if randomise:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("u_skew", "v_skew", "sigma")):
                    p.normal_(std=0.1)
    return model


def _count_transforms(monkeypatch):
    calls = []
    original = mmpos.encodings.harope.HARoPE.transform
    monkeypatch.setattr(
        mmpos.encodings.harope.HARoPE, "transform", lambda self, *a: calls.append(1) or original(self, *a)
    )
    return calls


def test_folded_projection_equals_the_map_per_token_fp64(monkeypatch):
    """A batch of >= C tokens folds M into the qkv weights; one image (17 tokens < C = 32) applies M per token:
    same outputs and gradients in fp64."""
    model, x = _tiny_vit(), torch.randn(4, 3, 32, 32, dtype=torch.float64)
    calls = _count_transforms(monkeypatch)
    folded = model(x)
    assert not calls  # no per-token map
    per_token = torch.cat([model(x[i : i + 1]) for i in range(4)])
    assert len(calls) == 2 * 4  # two blocks, four single-image calls
    torch.testing.assert_close(folded, per_token, rtol=0, atol=1e-13)
    grads, weights = [], torch.randn(4, 5, dtype=torch.float64)
    for run in (lambda: model(x), lambda: torch.cat([model(x[i : i + 1]) for i in range(4)])):
        model.zero_grad()
        (run() * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    scale = max(g.abs().max() for g in grads[1].values())  # HARoPE's gradients are ~1e-3 of it, and cancel
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=0, atol=1e-10 * scale, msg=name)
    assert grads[0]["blocks.1.attn.pe.u_skew"].abs().max() > 1e-6 * scale


def test_folded_projection_at_init_is_the_wrapped_encoding_bit_for_bit():
    """M = I: I @ W is W exactly, so the folded HARoPE ViT equals the rope_axial ViT bit for bit (fp32)."""
    harope, plain = _tiny_vit(randomise=False, dtype=torch.float32), _tiny_vit("rope_axial", dtype=torch.float32)
    plain.load_state_dict(harope.state_dict(), strict=False)
    x = torch.randn(4, 3, 32, 32)
    assert torch.equal(harope(x), plain(x))


def test_dit_folds_the_map_and_matches_per_token(monkeypatch):
    from mmpos.models.dit import DiTAttention
    from mmpos.ops.forward_tables import ForwardTables

    pe = _harope(BASES["axial_2d"], num_heads=2)
    attention = DiTAttention(32, 2).double()
    coords = image_grid(3, 4, dtype=torch.float64)
    x = torch.randn(3, 12, 32, dtype=torch.float64)  # 36 tokens >= 32 channels: folded
    tables = ForwardTables([pe], coords, torch.float64, "cpu")
    calls = _count_transforms(monkeypatch)
    folded = attention(x, pe, tables)
    assert not calls
    per_token = torch.cat([attention(x[i : i + 1], pe, tables) for i in range(3)])  # 12 tokens each
    assert len(calls) == 3
    torch.testing.assert_close(folded, per_token, rtol=0, atol=1e-13)


def test_fold_checks_the_projection_shape():
    pe = _harope(BASES["axial_2d"], num_heads=2)
    with pytest.raises(ValueError, match=r"weight has shape \(64, 8\); expected a fused qkv projection \[96, C\]"):
        pe.fold_into_qkv(torch.zeros(64, 8), None)


def test_no_fold_through_adapters_or_hooks(monkeypatch):
    """A projection that is not a plain hook-free ``nn.Linear`` (a LoRA wrapper, a forward hook) is never folded
    (folding would bypass it): M is applied per token and the hook sees the call."""
    model, x = _tiny_vit(), torch.randn(4, 3, 32, 32, dtype=torch.float64)
    calls, seen = _count_transforms(monkeypatch), []
    model.blocks[0].attn.qkv.register_forward_hook(lambda *args: seen.append(1))
    model(x)
    assert seen == [1] and len(calls) == 1  # block 0 per token, block 1 folded

    class LoRALinear(torch.nn.Linear):
        pass

    pe = model.blocks[1].attn.pe
    assert pe.folds_into(torch.zeros(4, 17, 32), model.blocks[1].attn.qkv)
    assert not pe.folds_into(torch.zeros(4, 17, 32), LoRALinear(32, 96))


def test_folding_is_a_declared_capability_that_the_attention_modules_read(monkeypatch):
    """``capabilities.folds_into_qkv`` (not the presence of a method) decides folding in the DiT and timm
    attention: HARoPE claims it (with ``fold_qkv``), the other encodings do not, and an instance that withdraws
    it is applied per token, with the same output."""
    from dataclasses import replace

    from mmpos.encodings import pe_capabilities
    from mmpos.models.dit import DiTAttention
    from mmpos.ops.forward_tables import ForwardTables

    assert pe_capabilities("harope").folds_into_qkv and not pe_capabilities("rope_axial").folds_into_qkv
    assert _harope(BASES["axial_2d"], num_heads=2).capabilities.folds_into_qkv
    assert not mmpos.create_pe("harope", num_heads=2, fold_qkv=False, **BASES["axial_2d"]).capabilities.folds_into_qkv
    pe = _harope(BASES["axial_2d"], num_heads=2)
    attention = DiTAttention(32, 2).double()
    x = torch.randn(3, 12, 32, dtype=torch.float64)  # 36 tokens >= 32 channels: folding pays
    tables = ForwardTables([pe], image_grid(3, 4, dtype=torch.float64), torch.float64, "cpu")
    calls = _count_transforms(monkeypatch)
    folded = attention(x, pe, tables)
    assert not calls
    pe.capabilities = replace(pe.capabilities, folds_into_qkv=False)
    per_token = attention(x, pe, tables)
    assert len(calls) == 1
    torch.testing.assert_close(folded, per_token, rtol=0, atol=1e-13)
    model = _tiny_vit()
    for block in model.blocks:
        block.attn.pe.capabilities = replace(block.attn.pe.capabilities, folds_into_qkv=False)
    calls.clear()
    model(torch.randn(4, 3, 32, 32, dtype=torch.float64))  # a batch that would fold
    assert len(calls) == len(model.blocks)
