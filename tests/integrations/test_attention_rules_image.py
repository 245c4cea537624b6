"""UltraImage (``set_attention_rule(model, {"type": "ultraimage", ...})``) on the tiny FLUX.1, FLUX.2, Chroma and
Z-Image: ``set_pe``'s model bit for bit up to the training size, every attention layer's per-head factor past it,
measured once per generation, gone with ``clear_attention_rule``. The rule's math against the authors' code:
``tests/encodings/test_entropy_scaling.py``."""

import pytest
import torch

from mmpos.integrations.diffusers import clear_attention_rule, set_attention_rule, set_pe
from mmpos.integrations.diffusers.attention_rules import encoding_processors
from mmpos.integrations.diffusers.families.tiny import CASES, output
from mmpos.ops.entropy_scaling import EntropyScaling

FAMILIES = ("flux", "flux2", "chroma", "z_image")
RULE = {"type": "ultraimage", "train_grid": (4, 4), "block": 4, "h_min": 0.0, "h_max": 2.5}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def _model(name):
    """``set_pe``: FLUX.1's native install has mmpos processors; the others' native keeps the stock processors,
    ``rope_axial`` (the same spectrum) installs mmpos'."""
    return set_pe(CASES[name].model(), "native" if name == "flux" else "rope_axial")


def run(model, name, side, sigma=0.5):
    with torch.no_grad():
        return output(model(**CASES[name].inputs(side, side, sigma)))


@pytest.mark.parametrize("name", FAMILIES)
def test_set_pe_bit_for_bit_up_to_the_training_size_and_a_measured_change_past_it(name):
    plain, ruled = _model(name), set_attention_rule(_model(name), RULE)
    for side in (2, 4):
        assert torch.equal(run(ruled, name, side), run(plain, name, side))
    change = (run(ruled, name, 6, 1.0) - run(plain, name, 6, 1.0)).abs().max() / run(plain, name, 6, 1.0).abs().max()
    assert change > 1e-3
    factors = ruled._mmpos_attention_rule[0].factors()
    assert sorted(factors) == list(range(len(encoding_processors(ruled))))  # every attention layer
    values = torch.cat([f.flatten() for f in factors.values()])
    assert ((values >= 1.1 - 1e-6) & (values <= 1.3 + 1e-6)).all()


@pytest.mark.parametrize("name", ("flux", "z_image"))
def test_factor_one_is_the_set_pe_model_bit_for_bit(name):
    """lambda = 1 everywhere: q times 1 is q, so the rule's path must be the stock attention exactly."""
    plain = _model(name)
    neutral = set_attention_rule(_model(name), {**RULE, "lambda_min": 1.0, "lambda_max": 1.0})
    assert torch.equal(run(neutral, name, 6, 1.0), run(plain, name, 6, 1.0))


def test_measured_once_per_generation(monkeypatch):
    model = set_attention_rule(_model("flux"), RULE)
    calls = []
    entropy = EntropyScaling.entropy
    monkeypatch.setattr(EntropyScaling, "entropy", lambda self, *a, **k: calls.append(1) or entropy(self, *a, **k))
    run(model, "flux", 6, 1.0)
    first = {k: v.clone() for k, v in model._mmpos_attention_rule[0].factors().items()}
    assert len(calls) == 2  # two attention layers, at the first (noisiest) step
    run(model, "flux", 6, 0.5)
    run(model, "flux", 6, 0.5)  # a second pass at the same step (unconditional): the same factors
    assert len(calls) == 2
    later = model._mmpos_attention_rule[0].factors()
    assert all(torch.equal(first[k], later[k]) for k in first)
    run(model, "flux", 6, 1.0)  # sigma went up: a new generation, measured again
    assert len(calls) == 4
    run(model, "flux", 7, 0.5)  # another size: measured again
    assert len(calls) == 6


def test_the_factors_are_the_rules_on_the_layers_own_query_and_key(monkeypatch):
    """The first layer's factor equals EntropyScaling on the q, k that layer's processor attends with."""
    model = set_attention_rule(_model("flux"), RULE)
    seen = []
    entropy = EntropyScaling.entropy
    monkeypatch.setattr(
        EntropyScaling, "entropy", lambda self, q, k, m=None: seen.append((q, k)) or entropy(self, q, k, m)
    )
    run(model, "flux", 6, 1.0)
    scaling = EntropyScaling(block=4, h_min=0.0, h_max=2.5)
    q, k = seen[0]
    torch.testing.assert_close(model._mmpos_attention_rule[0].factors()[0], scaling.factor(scaling.entropy(q, k)))
    assert q.shape[1] == 36 + 8  # the joint sequence: 8 text tokens and 6 x 6 image tokens


def test_clear_gives_the_set_pe_model_back():
    model = _model("flux")
    before = run(model, "flux", 6, 1.0)
    set_attention_rule(model, RULE)
    assert not torch.equal(run(model, "flux", 6, 1.0), before)
    clear_attention_rule(model)
    assert torch.equal(run(model, "flux", 6, 1.0), before)


def test_refusals_name_what_is_wrong():
    with pytest.raises(ValueError, match="qwen family is not supported"):
        set_attention_rule(set_pe(CASES["qwen"].model(), "native"), RULE)
    with pytest.raises(ValueError, match="wan family is not supported"):
        set_attention_rule(set_pe(CASES["wan"].model(), "native"), RULE)
    with pytest.raises(ValueError, match="chroma with 'native' keeps its stock processors"):
        set_attention_rule(set_pe(CASES["chroma"].model(), "native"), RULE)
    with pytest.raises(ValueError, match="train_grid"):
        set_attention_rule(_model("flux"), {"type": "ultraimage"})
    with pytest.raises(ValueError, match="train_grid must be"):
        set_attention_rule(_model("flux"), {"type": "ultraimage", "train_grid": 64})
    with pytest.raises(ValueError, match="unknown options"):
        set_attention_rule(_model("flux"), {**RULE, "alpha": 0.9})
    with pytest.raises(ValueError, match="lambda_min"):
        set_attention_rule(_model("flux"), {**RULE, "lambda_min": 2.0})


def _plan(layers, heads, alpha):
    return {"alphas": [[alpha] * heads] * layers, "betas": [[0.0] * heads] * layers}


@pytest.mark.parametrize("name", ("flux", "chroma", "flux2"))
def test_hap_is_stock_within_the_training_size_and_the_masked_attention_past_it(name, monkeypatch):
    from mmpos.ops.head_scopes import HeadScopes

    plain = _model(name)
    layers, heads = len(encoding_processors(plain)), 2
    rule = {"type": "hap", "train_grid": (4, 4), "scope_plan": _plan(layers, heads, 2.0), "anchor_stride": 3}
    pruned = set_attention_rule(_model(name), rule)
    for side in (2, 4):
        assert torch.equal(run(pruned, name, side), run(plain, name, side))
    ours = run(pruned, name, 9, 1.0)
    seen = []

    def dense_masked(self, q, k, v, scale=None):  # the definition: softmax over the mask's keys
        seen.append(self.text_tokens)
        logits = torch.einsum("blhd,bmhd->bhlm", q, k) * q.shape[-1] ** -0.5
        weights = torch.softmax(logits.masked_fill(~self.mask(q.shape[1])[None], float("-inf")), -1)
        return torch.einsum("bhlm,bmhd->blhd", weights, v)

    monkeypatch.setattr(HeadScopes, "attend", dense_masked)
    torch.testing.assert_close(ours, run(pruned, name, 9, 1.0), rtol=1e-4, atol=1e-5)
    assert len(seen) == layers and seen[0] == CASES[name].inputs(9, 9, 1.0)["encoder_hidden_states"].shape[1]
    assert (ours - run(plain, name, 9, 1.0)).abs().max() > 1e-4  # 81 image tokens in 2-block bands: pruned


def test_hap_refusals():
    with pytest.raises(ValueError, match="z_image family is not supported.*text before"):
        set_attention_rule(_model("z_image"), {"type": "hap", "train_grid": (4, 4), "scope_plan": _plan(1, 2, 64.0)})
    with pytest.raises(ValueError, match="scope_plan"):
        set_attention_rule(_model("flux"), {"type": "hap", "train_grid": (4, 4), "scope_plan": [1]})
    with pytest.raises(ValueError, match="hap needs train_grid"):
        set_attention_rule(_model("flux"), {"type": "hap", "scope_plan": _plan(2, 2, 64.0)})


@pytest.mark.parametrize("name", ("flux", "chroma"))
def test_spa_averages_over_the_bundle_grids_on_the_first_steps_only(name, monkeypatch):
    from mmpos.integrations.diffusers.processors import PEProcessor

    plain = _model(name)
    spa = set_attention_rule(_model(name), {"type": "spa", "train_grid": (4, 4), "group_num": 4, "steps": 2})
    for side in (2, 4):
        assert torch.equal(run(spa, name, side), run(plain, name, side))
    calls = []
    dispatch = PEProcessor._dispatch
    monkeypatch.setattr(PEProcessor, "_dispatch", lambda self, *a: calls.append(self.layer) or dispatch(self, *a))
    first = run(spa, name, 9, 1.0)  # 9 x 9 image tokens, 4 bundles: size 3 per axis -> 1 + 2 + 2 grids
    assert len(calls) == 2 * 5
    assert (first - run(plain, name, 9, 1.0)).abs().max() > 1e-4
    calls.clear()
    run(spa, name, 9, 1.0)  # the same step again (an unconditional pass): still SPA
    run(spa, name, 9, 0.8)  # the second step
    assert len(calls) == 2 * 2 * 5
    assert torch.equal(run(spa, name, 9, 0.6), run(plain, name, 9, 0.6))  # the third step: stock


def test_spa_with_one_grid_is_the_plain_model_bit_for_bit():
    """group_num above the grid's side: one grid, the stock ids; the average of one output is that output."""
    plain = _model("flux")
    spa = set_attention_rule(_model("flux"), {"type": "spa", "train_grid": (4, 4), "group_num": 80})
    assert torch.equal(run(spa, "flux", 9, 1.0), run(plain, "flux", 9, 1.0))


def test_spa_refusals():
    with pytest.raises(ValueError, match="flux2 family is not supported"):
        set_attention_rule(_model("flux2"), {"type": "spa", "train_grid": (4, 4)})
    with pytest.raises(ValueError, match="group_num must be an int >= 2"):
        set_attention_rule(_model("flux"), {"type": "spa", "train_grid": (4, 4), "group_num": 1})


SEGA = {"type": "sega", "train_grid": (4, 4)}


def _sega_model(name):
    """Qwen-Image keeps its stock processors under ``native``: SEGA scales its seam's tables instead."""
    return set_pe(CASES[name].model(), "native") if name == "qwen" else _model(name)


@pytest.mark.parametrize("name", (*FAMILIES, "qwen"))
def test_sega_is_set_pe_bit_for_bit_up_to_the_training_size_and_changes_it_past(name):
    plain, ruled = _sega_model(name), set_attention_rule(_sega_model(name), SEGA)
    for side in (2, 4):
        assert torch.equal(run(ruled, name, side), run(plain, name, side))
        assert ruled._mmpos_attention_rule[0].factors() is None
    big = run(plain, name, 12)
    change = (run(ruled, name, 12) - big).abs().max() / big.abs().max()
    assert change > 1e-3
    m_rows, m_cols = ruled._mmpos_attention_rule[0].factors()
    assert (m_rows >= 1.0).all() and (m_cols >= 1.0).all() and float(torch.cat([m_rows, m_cols]).max()) > 3.0**0.08


def test_sega_factors_are_the_ops_on_the_unpacked_latent_and_sit_on_the_row_and_column_pairs(monkeypatch):
    """FLUX.1 (``axes_dims_rope`` 4, 4, 8: index pairs 0-1, row pairs 2-3, column pairs 4-7, interleaved): the
    factors equal :class:`SpectralEnergyScaling` on the latent diffusers' own ``_unpack_latents`` gives back, and
    the processors attend with q and k times them on those channels (the index pairs and v untouched)."""
    from diffusers import FluxPipeline

    from mmpos.integrations.diffusers.families import family_for
    from mmpos.ops.spectral_energy import SpectralEnergyScaling

    model = set_attention_rule(_model("flux"), SEGA)
    rule = model._mmpos_attention_rule[0]
    inputs = CASES["flux"].inputs(10, 8, 0.5)
    inputs["hidden_states"] = inputs["hidden_states"].cumsum(1)  # structured: a spread well above 0
    rule.before_forward(model, family_for(model), (), inputs)
    latent = FluxPipeline._unpack_latents(inputs["hidden_states"], 10 * 16, 8 * 16, 8).mean(dim=1)  # [B, 20, 16]
    spectrum = model.pos_embed.encodings[0].spectrum
    expected = SpectralEnergyScaling().factors(
        latent, (10, 8), (4, 4), (spectrum.inv_freq[2:4], spectrum.inv_freq[4:8])
    )
    m_rows, m_cols = rule.factors()
    assert torch.allclose(m_rows, expected[0], rtol=0, atol=1e-6) and torch.allclose(m_cols, expected[1], atol=1e-6)
    assert float((m_cols.max() - m_cols.min()) / m_cols.mean()) > 1e-3  # not uniform: the spectrum decides
    seen = []
    monkeypatch.setattr(type(rule), "before_forward", lambda *a: None)  # keep the factors measured above
    original = type(rule).__call__
    monkeypatch.setattr(
        type(rule),
        "__call__",
        lambda self, q, k, v, *rest: original(self, q, k, v, *rest[:3], lambda *a: seen.append((q, k, v, a)) or q),
    )
    with torch.no_grad():
        model(**CASES["flux"].inputs(10, 8, 0.5))
    q, k, v, (q2, k2, v2, *_) = seen[0]
    channels = torch.cat([torch.ones(4), m_rows.repeat_interleave(2), m_cols.repeat_interleave(2)])
    assert torch.equal(q2, q * channels) and torch.equal(k2, k * channels) and v2 is v


def test_sega_on_qwen_image_scales_the_seams_tables_by_the_pair_factors_and_clear_removes_it():
    """Qwen-Image (``axes_dims_rope`` 8, 4, 4: frame pairs 0-3, rows 4-5, columns 6-7): both tables (image and text)
    are the plain ones times the factors on the row and column pairs, 1 on the frame pairs."""
    model = set_attention_rule(_sega_model("qwen"), SEGA)
    tables = []
    hook = model.pos_embed.register_forward_hook(lambda m, a, out: tables.append(out))
    run(model, "qwen", 10)
    m_rows, m_cols = model._mmpos_attention_rule[0].factors()
    clear_attention_rule(model)
    run(model, "qwen", 10)
    hook.remove()
    pairs = torch.cat([torch.ones(4), m_rows, m_cols])
    for scaled, plain in zip(*tables):
        assert torch.equal(scaled, plain * pairs)
    assert float(torch.cat([m_rows, m_cols]).min()) >= 1.0 and not torch.equal(tables[0][0], tables[1][0])
    assert len(model.pos_embed._forward_hooks) == 0


def test_sega_refusals_name_the_family_and_the_option():
    with pytest.raises(ValueError, match="wan family is not supported"):
        set_attention_rule(set_pe(CASES["wan"].model(), "native"), SEGA)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        set_attention_rule(_model("flux"), {**SEGA, "alpha": -1.0})
    with pytest.raises(ValueError, match="unknown options"):
        set_attention_rule(_model("flux"), {**SEGA, "lambda_min": 1.0})
    with pytest.raises(ValueError, match="sega needs train_grid"):
        set_attention_rule(_model("flux"), {"type": "sega"})
