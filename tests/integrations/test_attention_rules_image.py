"""The image attention rules on the tiny families: UltraImage, HRDiT's HAP and SPA (FLUX.1, Chroma, FLUX.2,
Qwen-Image, Z-Image): ``set_pe``'s model bit for bit up to the training size, the rule past
it (HAP: the masked attention in each family's token order, written here in fp64; SPA: the tables of the bundle grids
written here, the outputs averaged over them), gone with ``clear_attention_rule``. The rules' math against the
authors' code: ``tests/encodings/test_entropy_scaling.py``, ``test_head_scopes.py``, ``test_spa.py``."""

import pytest
import torch

from mmpos.integrations.diffusers import clear_attention_rule, set_attention_rule, set_pe
from mmpos.integrations.diffusers.attention_rules import encoding_processors
from mmpos.integrations.diffusers.families import get_family
from mmpos.integrations.diffusers.families.tiny import CASES, output
from mmpos.ops.entropy_scaling import EntropyScaling

FAMILIES = ("flux", "flux2", "chroma", "qwen", "z_image")
RULE = {"type": "ultraimage", "train_grid": (4, 4), "block": 4, "h_min": 0.0, "h_max": 2.5}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def _model(name):
    """``set_pe``: FLUX.1's native install has mmpos processors, Qwen-Image's takes the rules' processors; the others'
    native keeps the stock processors, ``rope_axial`` (the same spectrum) installs mmpos'."""
    return set_pe(CASES[name].model(), "native" if name in ("flux", "qwen") else "rope_axial")


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
    with pytest.raises(ValueError, match="cogview4 family is not supported"):
        set_attention_rule(set_pe(CASES["cogview4"].model(), "native"), RULE)
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


@pytest.mark.parametrize("name", ("flux", "chroma", "flux2", "qwen"))
def test_hap_is_stock_within_the_training_size_and_the_masked_attention_past_it(name, monkeypatch):
    from mmpos.ops.head_scopes import HeadScopes

    plain = _model(name)
    layers, heads = len(get_family(name).attention_modules(plain)), 2
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


# (image tokens, text tokens, text first) of the tiny families' joint attention at 9 x 9 image tokens: Z-Image pads
# its 81 image tokens to 96 and its 7 caption tokens to 32, and puts the caption after the image
LAYOUTS = {"flux2": (81, 5, True), "qwen": (81, 7, True), "z_image": (96, 32, False)}


def masked_attention(q, k, v, image, text, text_first, alphas, stride):
    """HAP's attention written out in the sequence's own token order (fp64): a query sees a key when either is text,
    their image blocks of 64 are at most the head's half width apart, or the key's image block is an anchor."""
    position = torch.arange(q.shape[1])
    is_text = position < text if text_first else position >= image
    block = torch.div(position - (text if text_first else 0), 64, rounding_mode="floor")
    out = []
    for head, alpha in enumerate(alphas):
        half = (max(2 * int(alpha // 64) - 1, 1) - 1) // 2  # beta 0
        anchor = (block % stride == 0) & ~is_text
        seen = is_text[:, None] | is_text[None, :] | ((block[:, None] - block[None, :]).abs() <= half) | anchor
        logits = torch.einsum("ld,md->lm", q[0, :, head], k[0, :, head]) * q.shape[-1] ** -0.5
        out.append(torch.softmax(logits.masked_fill(~seen, float("-inf")), -1) @ v[0, :, head])
    return torch.stack(out, dim=1)[None]


@pytest.mark.parametrize("name", ("flux2", "qwen", "z_image"))
def test_hap_equals_the_masked_attention_in_the_familys_token_order_in_fp64(name, monkeypatch):
    """Each layer's q, k, v as the rule gets them, in fp64: the rule's pruned attention equals the mask written in the
    family's token order (Z-Image: image, then caption; its noise refiner: image only, its context refiner: stock)."""
    from mmpos.integrations.diffusers.attention_rules import PrunedRule

    plain = _model(name)
    layers = len(get_family(name).attention_modules(plain))
    heads = get_family(name).num_heads(plain)
    alphas = [70.0 + 64 * (h % 2) for h in range(heads)]  # half widths 0 and 1 block
    plan = {"alphas": [alphas] * layers, "betas": [[0.0] * heads] * layers}
    pruned = set_attention_rule(
        _model(name), {"type": "hap", "train_grid": (4, 4), "scope_plan": plan, "anchor_stride": 3}
    )
    for side in (2, 4):
        assert torch.equal(run(pruned, name, side), run(plain, name, side))
    calls, call = [], PrunedRule.__call__
    monkeypatch.setattr(PrunedRule, "__call__", lambda self, *a: calls.append(a) or call(self, *a))
    ours = run(pruned, name, 9, 1.0)
    assert (ours - run(plain, name, 9, 1.0)).abs().max() > 1e-4
    image, text, text_first = LAYOUTS[name]
    kinds = []
    for q, k, v, mask, parallel, layer, attend in calls:  # the ruled forward's layers
        length = q.shape[1]
        out = call(pruned._mmpos_attention_rule[0], q.double(), k.double(), v.double(), mask, None, layer, None)
        if length not in (image + text, image):
            assert out is None  # the context refiner: stock
            kinds.append("text")
            continue
        joint = length == image + text
        expected = masked_attention(
            q.double(), k.double(), v.double(), image, text if joint else 0, text_first, alphas, 3
        )
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)
        kinds.append("joint" if joint else "image")
    assert kinds == {"z_image": ["image", "text", "joint"]}.get(name, ["joint"] * layers)


def test_hap_on_z_image_attends_each_sample_of_a_padded_batch_on_its_own():
    """Two captions of 7 and 40 tokens (padded to 32 and 64): the batch's joint sequence is padded to the longest, its
    padding masked; each sample's result is the one it gets alone."""
    model = _model("z_image")
    layers, heads = len(encoding_processors(model)), get_family("z_image").num_heads(model)
    set_attention_rule(model, {"type": "hap", "train_grid": (4, 4), "scope_plan": _plan(layers, heads, 70.0)})
    one, two = CASES["z_image"].inputs(9, 9, 1.0), CASES["z_image"].inputs(9, 9, 1.0, text=40)
    with torch.no_grad():
        both = output(
            model(
                x=one["x"] + two["x"], t=torch.cat([one["t"], two["t"]]), cap_feats=one["cap_feats"] + two["cap_feats"]
            )
        )
        alone = torch.cat([output(model(**one)), output(model(**two))])
    torch.testing.assert_close(both, alone, rtol=1e-4, atol=1e-5)


def test_hap_refusals():
    with pytest.raises(ValueError, match="wan family is not supported"):
        set_attention_rule(
            set_pe(CASES["wan"].model(), "native"),
            {"type": "hap", "train_grid": (4, 4), "scope_plan": _plan(1, 2, 64.0)},
        )
    with pytest.raises(ValueError, match="scope_plan"):
        set_attention_rule(_model("flux"), {"type": "hap", "train_grid": (4, 4), "scope_plan": [1]})
    with pytest.raises(ValueError, match="hap needs train_grid"):
        set_attention_rule(_model("flux"), {"type": "hap", "scope_plan": _plan(2, 2, 64.0)})
    qwen = set_attention_rule(_model("qwen"), {"type": "hap", "train_grid": (4, 4), "scope_plan": _plan(1, 2, 64.0)})
    padded = CASES["qwen"].inputs(9, 9, 1.0)
    padded["encoder_hidden_states_mask"][:, -2:] = 0  # a padded prompt
    with pytest.raises(ValueError, match="hap: an attention mask that masks text tokens"), torch.no_grad():
        qwen(**padded)


@pytest.mark.parametrize("name", ("flux", "chroma", "flux2", "qwen", "z_image"))
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
    layers = len(encoding_processors(spa))
    bundled = [layer for layer in range(layers) if spa._mmpos_attention_rule[0].tables(layer) is not None]
    assert len(bundled) == (2 if name == "z_image" else layers)  # Z-Image's context refiner: captions only, stock
    assert len(calls) == 5 * len(bundled) + layers - len(bundled)
    assert (first - run(plain, name, 9, 1.0)).abs().max() > 1e-4
    calls.clear()
    run(spa, name, 9, 1.0)  # the same step again (an unconditional pass): still SPA
    run(spa, name, 9, 0.8)  # the second step
    assert len(calls) == 2 * (5 * len(bundled) + layers - len(bundled))
    assert torch.equal(run(spa, name, 9, 0.6), run(plain, name, 9, 0.6))  # the third step: stock


def bundled_grids(rows, cols, group_num):
    """HRDiT's grids of a ``rows x cols`` image (0-based rows, columns), as ``tests/encodings/test_spa.py`` writes
    them from the authors' code."""
    from tests.encodings.test_spa import reference_variants

    grid = torch.cartesian_prod(torch.arange(rows), torch.arange(cols))
    return reference_variants(grid, group_num)


def _spa_tables(name, side=9):
    model = set_attention_rule(_model(name), {"type": "spa", "train_grid": (4, 4), "group_num": 4})
    run(model, name, side, 1.0)
    return model, model._mmpos_attention_rule[0]


def test_spa_on_flux2_rotates_with_pos_embed_at_the_bundled_image_ids():
    model, rule = _spa_tables("flux2")
    inputs = CASES["flux2"].inputs(9, 9, 1.0)
    text = model.pos_embed(inputs["txt_ids"][0])
    grids = bundled_grids(9, 9, 4)
    assert len(rule.tables(0)) == len(grids) == 5
    for table, grid in zip(rule.tables(0), grids):
        ids = inputs["img_ids"][0].clone()
        ids[:, 1:3] = grid.float()
        image = model.pos_embed(ids)
        assert all(torch.equal(t, torch.cat([a, b])) for t, a, b in zip(table, text, image))


def test_spa_on_qwen_image_recentres_the_bundles_and_keeps_the_text_positions_in_fp64():
    """The tables, text first, against Qwen-Image's rope written out in fp64: each axis' ladder ``theta ** (-2i /
    d)``, interleaved pairs; image rows and columns the bundle indices centred as the stock module centres a grid of
    as many bundles (3 a side: ``b - 2``), the text at ``4 + j`` on the three axes (the 9 x 9 grid's, kept)."""
    model, rule = _spa_tables("qwen")
    dims, theta = tuple(model.config.axes_dims_rope), float(model.pos_embed.theta)
    ladder = [theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) for d in dims]

    def table(coords):  # [S, 3] -> complex128 [S, P]
        return torch.polar(
            torch.ones(1, dtype=torch.float64), torch.cat([coords[:, a, None] * ladder[a] for a in range(3)], dim=1)
        )

    text = (4 + torch.arange(7, dtype=torch.float64))[:, None].expand(-1, 3)
    for ours, grid in zip(rule.tables(0), bundled_grids(9, 9, 4), strict=True):
        image = torch.cat([torch.zeros(81, 1, dtype=torch.float64), grid.double() - 2], dim=1)
        torch.testing.assert_close(ours.to(torch.complex128), torch.cat([table(text), table(image)]), rtol=0, atol=2e-6)


def test_spa_on_z_image_bundles_the_image_ids_of_the_refiner_and_the_joint_sequence():
    """The noise refiner's tables are the seam's at the image ids ``(33, row, col)`` bundled (the 15 padding ids
    ``(0, 0, 0)`` stay), the main layers' the same followed by the 32 caption ids ``(1 + j, 0, 0)``."""
    model, rule = _spa_tables("z_image")
    seam = model.rope_embedder
    captions = seam(torch.stack([1 + torch.arange(32), torch.zeros(32), torch.zeros(32)], dim=1).int())
    for refiner, joint, grid in zip(rule.tables(0), rule.tables(2), bundled_grids(9, 9, 4), strict=True):
        ids = torch.cat([torch.full((81, 1), 33), grid], dim=1)
        image = seam(torch.cat([ids, torch.zeros(15, 3, dtype=ids.dtype)]).int())
        assert refiner[1] is None and torch.equal(refiner[0][0], image)
        assert torch.equal(joint[0][0], torch.cat([image, captions]))
    assert rule.tables(1) is None  # the context refiner


def test_spa_with_one_grid_is_the_plain_model_bit_for_bit():
    """group_num above the grid's side: one grid, the stock ids; the average of one output is that output."""
    plain = _model("flux")
    spa = set_attention_rule(_model("flux"), {"type": "spa", "train_grid": (4, 4), "group_num": 80})
    assert torch.equal(run(spa, "flux", 9, 1.0), run(plain, "flux", 9, 1.0))


def test_spa_refusals():
    with pytest.raises(ValueError, match="wan family is not supported"):
        set_attention_rule(set_pe(CASES["wan"].model(), "native"), {"type": "spa", "train_grid": (4, 4)})
    with pytest.raises(ValueError, match="group_num must be an int >= 2"):
        set_attention_rule(_model("flux"), {"type": "spa", "train_grid": (4, 4), "group_num": 1})


def test_clear_gives_qwen_image_its_stock_processors_back():
    from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

    model = _model("qwen")
    before = run(model, "qwen", 9, 1.0)
    set_attention_rule(model, {"type": "spa", "train_grid": (4, 4), "group_num": 4})
    assert not torch.equal(run(model, "qwen", 9, 1.0), before)
    clear_attention_rule(model)
    assert all(type(p) is QwenDoubleStreamAttnProcessor2_0 for p in model.attn_processors.values())
    assert torch.equal(run(model, "qwen", 9, 1.0), before)


def test_spa_reaches_the_families_that_say_where_its_tables_come_from():
    from mmpos.integrations.diffusers.attention_rules import SPA_FAMILIES
    from mmpos.integrations.diffusers.families import list_families

    assert set(SPA_FAMILIES) == {f for f in list_families() if get_family(f).bundle_tables is not None}


def test_spa_refuses_context_parallelism_by_name():
    from mmpos.integrations.diffusers.processors import PEProcessor

    processor = PEProcessor(lambda q, k, table, layer: (q, k), 0)
    processor.attention_rule = type("Rule", (), {"tables": lambda self, layer: [None, None]})()
    q = torch.zeros(1, 4, 1, 8)
    with pytest.raises(ValueError, match="spa: context parallelism is not supported"):
        processor._rotate_attend(q, q, q, None, None, object())


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
