"""MRoPE, MRoPE-I and MHRoPE encodings: allocation maps, text priors, relative property, transformers' tables."""

import pytest
import torch

import mmpos
from mmpos.coords import video_grid
from mmpos.coords.multimodal import multimodal_position_ids, sequence_coords
from mmpos.ops import RotaryTable, rotate
from mmpos.spectrum import rope_inv_freq
from mmpos.spectrum.multimodal import section_axis_of_pair
from tests.conftest import logits
from tests.fixtures import tiny_qwen_vl

SEGMENTS = [("text", 3), ("image", 2, 3), ("text", 2), ("video", 3, 2, 2), ("text", 2)]


def test_interleaved_allocation_maps():
    qwen3 = section_axis_of_pair((24, 20, 20), "interleaved")
    assert "".join("THW"[a] for a in qwen3.tolist()) == "THW" * 20 + "TTTT"
    assert torch.bincount(qwen3).tolist() == [24, 20, 20]
    qwen35 = section_axis_of_pair((11, 11, 10), "interleaved")
    assert "".join("THW"[a] for a in qwen35.tolist()) == "THW" * 10 + "TH"
    chunked = section_axis_of_pair((16, 24, 24), "chunked")
    assert chunked.tolist() == [0] * 16 + [1] * 24 + [2] * 24


@pytest.mark.parametrize(
    "name,options",
    [
        ("mrope", dict(mrope_section=(16, 24, 24))),
        ("mrope_interleave", dict(mrope_section=(24, 20, 20))),
        ("mhrope", dict(num_kv_heads=8, num_heads=16, head_section=(2, 3, 3))),
    ],
)
def test_text_prior_is_plain_rope_bit_for_bit(name, options):
    pe = mmpos.create_pe(name, head_dim=128, theta=5e6, **options)
    plain = mmpos.create_pe("rope_1d", head_dim=128, theta=5e6)
    positions = torch.arange(0.0, 300.0, 7.0)
    table = pe.table(positions[:, None].expand(-1, 3)).cis
    expected = plain.table(positions).cis
    assert torch.equal(table, expected if name != "mhrope" else expected.expand(8, -1, -1))


def test_mrope_interleave_equals_axial_interleaved_allocation():
    """A video DiT use: MRoPE-I on a (t, row, col) grid is the foundation's interleaved axial allocation."""
    coords = video_grid(3, 4, 5)
    pe = mmpos.create_pe("mrope_interleave", head_dim=64, mrope_section=(12, 10, 10), layout="interleaved")
    axial = mmpos.create_pe("rope_axial", head_dim=64, axes_dims=(24, 20, 20), allocation="interleaved")
    assert torch.equal(pe.table(coords).cis, axial.table(coords).cis)


@pytest.mark.parametrize("name", ["mrope", "mrope_interleave"])
def test_phases_follow_the_allocation_fp64(name):
    section = (4, 6, 6) if name == "mrope" else (6, 5, 5)
    pe = mmpos.create_pe(name, head_dim=32, mrope_section=section, theta=1e4)
    coords = sequence_coords(SEGMENTS).double()
    axis = section_axis_of_pair(section, "chunked" if name == "mrope" else "interleaved")
    phase = coords[:, axis] * rope_inv_freq(32, 1e4)
    assert torch.allclose(
        pe.table(coords, torch.float64).cis, torch.polar(torch.ones_like(phase), phase), atol=1e-14, rtol=0
    )


@pytest.mark.parametrize(
    "name,options",
    [
        ("mrope", dict(mrope_section=(4, 6, 6))),
        ("mrope_interleave", dict(mrope_section=(6, 5, 5))),
        ("mhrope", dict(num_kv_heads=4, num_heads=8, head_section=(1, 1, 1))),
    ],
)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_relative_property_per_axis_fp64(name, options, axis):
    """Moving every token along one axis leaves all logits unchanged, and logits depend only on offsets."""
    pe = mmpos.create_pe(name, head_dim=32, theta=100.0, **options)
    coords = sequence_coords(SEGMENTS, spatial_reset=True).double()
    heads_q = options.get("num_heads", 2)
    heads_k = options.get("num_kv_heads", 2)
    q = torch.randn(1, heads_q, coords.shape[0], 32, dtype=torch.float64)
    k = torch.randn(1, heads_k, coords.shape[0], 32, dtype=torch.float64)
    shift = torch.zeros(3, dtype=torch.float64)
    shift[axis] = 37.5
    base_q, base_k = pe(q, k, coords)
    moved_q, moved_k = pe(q, k, coords + shift)
    group = heads_q // heads_k
    base = logits(base_q, base_k.repeat_interleave(group, 1))
    moved = logits(moved_q, moved_k.repeat_interleave(group, 1))
    assert torch.allclose(base, moved, atol=1e-10, rtol=0)
    assert not torch.allclose(base_q, moved_q, atol=1e-3)  # the shift did rotate q (the test can fail)


def test_mhrope_head_mapping_nope_heads_and_gqa():
    pe = mmpos.create_pe("mhrope", head_dim=16, num_kv_heads=4, num_heads=8, head_section=(1, 2, 0))
    coords = torch.tensor([[3.0, 5.0, 7.0], [11.0, 13.0, 17.0]], dtype=torch.float64)
    table = pe.table(coords, torch.float64).cis  # [H_kv, L, P]
    inv_freq = rope_inv_freq(16, 10000.0)
    for head, axis in enumerate([0, 1, 1]):
        phase = coords[:, axis, None] * inv_freq
        assert torch.allclose(table[head], torch.polar(torch.ones_like(phase), phase), atol=1e-15, rtol=0)
    assert torch.equal(table[3], torch.ones_like(table[3]))  # NoPE: cos = 1, sin = 0 exactly
    q = torch.randn(1, 8, 2, 16, dtype=torch.float64)
    rotated = pe.rotate(q, pe.table(coords, torch.float64))
    for g in range(8):
        alone = rotate(q[:, g : g + 1], RotaryTable(table[g // 2 : g // 2 + 1]), "half")
        assert torch.equal(rotated[:, g : g + 1], alone)
    assert torch.equal(rotated[:, 6:], q[:, 6:])  # query heads 6, 7 share the NoPE KV head 3
    pe_bl = mmpos.create_pe("mhrope", head_dim=16, num_kv_heads=4, num_heads=8, head_section=(1, 2, 0), seq_dim=-3)
    rotated_bl = pe_bl.rotate(q.transpose(1, 2), pe_bl.table(coords, torch.float64))  # [B, L, H, D] activations
    assert torch.equal(rotated_bl.transpose(1, 2), rotated)


def test_partial_rotary_qwen35():
    pe = mmpos.create_pe(
        "mrope_interleave", head_dim=256, partial_rotary_factor=0.25, mrope_section=(11, 11, 10), theta=1e7
    )
    assert pe.rotary_dim == 64
    x = torch.randn(1, 2, 6, 256)
    out, _ = pe(x, x, sequence_coords([("text", 2), ("image", 2, 2)]))
    assert torch.equal(out[..., 64:], x[..., 64:])
    assert not torch.allclose(out[..., :64], x[..., :64])


def test_tables_do_not_modify_coordinates():
    coords = sequence_coords(SEGMENTS)
    before = coords.clone()
    for name, options in (("mrope", {}), ("mrope_interleave", {}), ("mhrope", dict(num_heads=3))):
        mmpos.create_pe(name, head_dim=32, **options).table(coords)
    assert torch.equal(coords, before)


def _host_tables(kind):
    """Their rotary embedding on their own get_rope_index ids of an image + video sequence, plus the ids."""
    model = tiny_qwen_vl.build(kind)
    inputs = tiny_qwen_vl.mixed_inputs(kind)
    with torch.no_grad():
        ids, _ = model.model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"], inputs["video_grid_thw"]
        )
        rotary = model.model.language_model.rotary_emb
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), ids)
    return model, rotary, ids, cos, sin


@pytest.mark.parametrize(
    "kind,name,section", [("qwen2_vl", "mrope", (2, 3, 3)), ("qwen3_vl", "mrope_interleave", (4, 2, 2))]
)
def test_tables_equal_transformers_rotary_embedding(kind, name, section):
    model, rotary, ids, cos, sin = _host_tables(kind)
    pe = mmpos.create_pe(name, head_dim=tiny_qwen_vl.HEAD_DIM, mrope_section=section, theta=10000.0)
    coords = ids[:, 0].T.double()
    table = pe.table(coords, torch.float32)
    # transformers rounds each phase to fp32 before cos/sin: allow that rounding on top of 1e-6
    phase = (coords[:, section_axis_of_pair(section, pe.allocation)] * pe.spectrum.inv_freq).abs()
    tol = 1e-6 + phase * 2.0**-24
    assert ((table.cos - cos[0, :, : table.num_pairs]).abs() <= tol).all()
    assert ((table.sin - sin[0, :, : table.num_pairs]).abs() <= tol).all()
    assert torch.equal(cos[..., : table.num_pairs], cos[..., table.num_pairs :])  # their rotate-half layout
    # the allocation itself, in fp64 through their own recomposition code
    freqs = ids[..., None].double() * rope_inv_freq(tiny_qwen_vl.HEAD_DIM, 10000.0)
    theirs = rotary.recomposition_frequencies(freqs.cos().clone())[0, :, : table.num_pairs]
    assert torch.allclose(pe.table(coords, torch.float64).cos, theirs, atol=1e-15, rtol=0)


def test_transformers_interleave_writes_into_its_input_and_ours_does_not():
    _, rotary, ids, _, _ = _host_tables("qwen3_vl")
    freqs = ids[..., None].double() * rope_inv_freq(tiny_qwen_vl.HEAD_DIM, 10000.0)
    before = freqs.clone()
    rotary.recomposition_frequencies(freqs)
    if torch.equal(freqs, before):
        pytest.skip("this transformers version no longer writes into freqs[0]")
    assert not torch.equal(freqs[0], before[0])  # the peer's in-place write is detectable ...
    coords = ids[:, 0].T.double()
    coords_before = coords.clone()
    mmpos.create_pe("mrope_interleave", head_dim=16, mrope_section=(4, 2, 2)).table(coords)
    assert torch.equal(coords, coords_before)  # ... and ours leaves its input alone


def test_qwen35_partial_rotary_matches_transformers():
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    config = Qwen3_5TextConfig(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1e7,
            "mrope_section": [3, 3, 2],
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
        },
    )
    rotary = Qwen3_5TextRotaryEmbedding(config)
    types = torch.tensor([[0] * 5 + [1] * 4 + [0] * 3 + [2] * 4 + [0] * 2])
    ids, _ = multimodal_position_ids(
        types, torch.tensor([[1, 4, 4]]), torch.tensor([[1, 4, 4]]), spatial_merge_size=2, split_video_frames=True
    )
    cos, _ = rotary(torch.zeros(1), ids)
    pe = mmpos.create_pe(
        "mrope_interleave", head_dim=64, partial_rotary_factor=0.25, mrope_section=(3, 3, 2), theta=1e7
    )
    assert cos.shape[-1] == 16 and pe.rotary_dim == 16
    coords = ids[:, 0].T.double()
    phase = coords[:, section_axis_of_pair((3, 3, 2), "interleaved")] * pe.spectrum.inv_freq
    tol = 1e-6 + phase.abs() * 2.0**-24  # 1e-6 plus transformers' fp32 rounding of the phase
    assert ((pe.table(coords).cos - cos[0, :, :8]).abs() <= tol).all()


@pytest.mark.parametrize(
    "name,options,match",
    [
        ("mrope", dict(head_dim=32, mrope_section=(4, 6, 5)), r"adds up to 15 pairs .* temporal count must be 5"),
        ("mrope_interleave", dict(head_dim=32, mrope_section=(2, 7, 7)), "axis 1 needs pair index 19"),
        ("mrope", dict(head_dim=32, partial_rotary_factor=0.1), "3 rotary channels"),
        ("mrope", dict(head_dim=32, partial_rotary_factor=1.5), r"partial_rotary_factor must be in \(0, 1\]"),
        ("mrope", dict(head_dim=32, mrope_section=(8, -1, 9)), "non-negative"),
        ("mhrope", dict(head_dim=32, num_kv_heads=4, num_heads=6), "num_heads=6 is not a multiple of num_kv_heads=4"),
        ("mhrope", dict(head_dim=32, num_kv_heads=4, head_section=(2, 2, 1)), "assigns 5 heads .* num_kv_heads=4"),
        ("mhrope", dict(head_dim=32, num_kv_heads=2), "pass head_section"),
    ],
)
def test_bad_options(name, options, match):
    with pytest.raises(ValueError, match=match):
        mmpos.create_pe(name, **options)


def test_bad_heads_and_coords():
    pe = mmpos.create_pe("mhrope", head_dim=16, num_kv_heads=4, num_heads=8)
    table = pe.table(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="x has 5 heads"):
        pe.rotate(torch.randn(1, 5, 3, 16), table)
    with pytest.raises(ValueError, match=r"\[L, 3\]"):
        mmpos.create_pe("mrope", head_dim=16).table(torch.zeros(3, 2))


@pytest.mark.parametrize("batch,batched_table", [(1, False), (2, False), (2, True)])
def test_mhrope_query_heads_fold_to_4d_when_that_is_a_view(monkeypatch, batch, batched_table):
    """GQA query rotation equals rotating each query head by its KV head's table; for batch 1 or batched
    tables the groups reach the rotation as a 4-D view (what CUDA's fused kernel takes), else as 5-D."""
    import mmpos.encodings.rotary_base as rotary_base

    dims = []
    original = rotary_base.rotate
    monkeypatch.setattr(rotary_base, "rotate", lambda x, *a, **kw: dims.append(x.dim()) or original(x, *a, **kw))
    pe = mmpos.create_pe("mhrope", head_dim=16, num_heads=6, num_kv_heads=3, head_section=(1, 1, 1))
    coords = sequence_coords(SEGMENTS)
    coords = coords.expand(batch, -1, -1) + torch.arange(batch)[:, None, None] if batched_table else coords
    q = torch.randn(batch, 6, coords.shape[-2], 16, dtype=torch.float64)
    out = pe.rotate(q, pe.table(coords, torch.float64))
    per_head = pe.table(coords, torch.float64).cis.index_select(-3, torch.arange(6) // 2)
    assert torch.equal(out, rotate(q, RotaryTable(per_head), "half"))
    assert dims == [4 if batch == 1 or batched_table else 5]


def test_mhrope_builds_tables_after_the_module_moves():
    from mmpos.encodings.rope_multimodal import MHRoPE

    pe = MHRoPE(head_dim=16, num_heads=4, num_kv_heads=2, head_section=(1, 1, 0)).to("meta")
    coords = torch.zeros(5, 3)
    table = pe.compute_table(coords, torch.complex64)  # head maps and spectrum on one device (was a device error)
    assert table.cis.shape[-3:] == (2, 5, 8) and pe.kv_head_of_query.device.type == "meta"
