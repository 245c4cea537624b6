"""Calls as users write them: the layout hint of the shape error, transformers' position ids as they come, q alone."""

import pytest
import torch

import mmpos
from mmpos.coords import image_grid
from tests.fixtures import tiny_qwen_vl

F64 = torch.float64


# --- the shape error names seq_dim when the other layout fits ---------------------------------------------------
@pytest.mark.parametrize(
    "name,options,coords",
    [
        ("rope_axial", dict(head_dim=16, num_axes=2), image_grid(4, 4)),
        ("comrope_ap", dict(head_dim=16, num_heads=2, block_size=4), image_grid(4, 4)),
    ],
)
def test_shape_error_suggests_the_other_layout(name, options, coords):
    diffusers_layout = torch.randn(1, 16, 2, 16)  # [B, L, H, D]
    pe = mmpos.create_pe(name, **options)
    with pytest.raises(ValueError, match=r"x has (2 tokens|16 heads).*\[B, L, H, D\].*pass seq_dim=-3"):
        pe(diffusers_layout, diffusers_layout, coords)
    pe = mmpos.create_pe(name, **options, seq_dim=-3)
    default_layout = diffusers_layout.transpose(1, 2)
    with pytest.raises(ValueError, match=r"pass seq_dim=-2"):
        pe(default_layout, default_layout, coords)
    with pytest.raises(ValueError, match=r"^[^;]*$"):  # no layout fits: no hint
        pe(diffusers_layout[:, :15], diffusers_layout[:, :15], coords)


# --- transformers' position ids ---------------------------------------------------------------------------------
def _rope_index(kind):
    model = tiny_qwen_vl.build(kind)
    inputs = tiny_qwen_vl.mixed_inputs(kind)
    ids = torch.cat([inputs["input_ids"], inputs["input_ids"].flip(-1)])  # a batch of 2 different sequences
    types = torch.cat([inputs["mm_token_type_ids"], inputs["mm_token_type_ids"].flip(-1)])
    with torch.no_grad():
        position_ids, _ = model.model.get_rope_index(
            ids, types, torch.cat([inputs["image_grid_thw"]] * 2), torch.cat([inputs["video_grid_thw"]] * 2)
        )
    return model, position_ids  # [3, B, L]


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


@pytest.mark.parametrize(
    "kind,name,options",
    [
        ("qwen2_vl", "mrope", dict(mrope_section=(2, 3, 3))),
        ("qwen3_vl", "mrope_interleave", dict(mrope_section=(4, 2, 2))),
    ],
)
def test_mrope_takes_get_rope_index_ids_as_they_come(kind, name, options):
    model, position_ids = _rope_index(kind)
    assert position_ids.shape[0] == 3 and position_ids.dim() == 3
    batch, length = position_ids.shape[1:]
    q, k = torch.randn(2, batch, 8, length, tiny_qwen_vl.HEAD_DIM).unbind(0)
    pe = mmpos.create_pe(name, head_dim=tiny_qwen_vl.HEAD_DIM, theta=10000.0, **options)
    ours = pe(q, k, position_ids)
    documented = pe(q, k, position_ids.permute(1, 2, 0))  # [B, L, 3], the documented layout
    assert torch.equal(ours[0], documented[0]) and torch.equal(ours[1], documented[1])
    with torch.no_grad():  # transformers' own rotary embedding and rotate-half application, fp32
        cos, sin = model.model.language_model.rotary_emb(q, position_ids)
    theirs = q * cos[:, None] + _rotate_half(q) * sin[:, None]
    assert torch.allclose(ours[0], theirs, atol=2e-5, rtol=0)


def test_mhrope_takes_get_rope_index_ids_as_they_come():
    _, position_ids = _rope_index("qwen2_vl")
    batch, length = position_ids.shape[1:]
    pe = mmpos.create_pe("mhrope", head_dim=16, num_heads=4, num_kv_heads=4)
    q, k = torch.randn(2, batch, 4, length, 16, dtype=F64).unbind(0)
    for ours, documented in zip(pe(q, k, position_ids), pe(q, k, position_ids.permute(1, 2, 0))):
        assert torch.equal(ours, documented)


def test_rope_1d_takes_batched_position_ids_as_they_come():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    position_ids = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])  # [B, L], e.g. left padding
    q, k = torch.randn(2, 2, 3, 5, 16).unbind(0)
    pe = mmpos.create_pe("rope_1d", head_dim=16)
    ours = pe(q, k, position_ids)
    documented = pe(q, k, position_ids[..., None])
    assert torch.equal(ours[0], documented[0]) and torch.equal(ours[1], documented[1])
    config = LlamaConfig(hidden_size=48, num_attention_heads=3, head_dim=16, rope_theta=10000.0)
    cos, sin = LlamaRotaryEmbedding(config)(q, position_ids)
    theirs = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.allclose(ours[0], theirs[0], atol=2e-5, rtol=0)
    # one decoding step per sequence: [B, 1] ids are two batches of one token, not two tokens
    step = torch.tensor([[5], [12]])
    new_q = q[:, :, :1]
    alone, _ = pe(new_q, None, step)
    assert torch.equal(alone, pe(new_q, new_q, step[..., None])[0])


def test_ambiguous_position_ids_are_refused():
    pe = mmpos.create_pe("mrope", head_dim=16, mrope_section=(2, 3, 3))
    q = torch.randn(3, 2, 3, 16)
    with pytest.raises(ValueError, match=r"permute\(1, 2, 0\)"):
        pe(q, q, torch.zeros(3, 3, 3, dtype=torch.long))


# --- q alone ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,options",
    [
        ("rope_1d", dict(head_dim=16)),
        ("rope_axial", dict(head_dim=16, num_axes=2)),
        ("rope_mixed", dict(head_dim=16, num_heads=2)),
        ("comrope_ld", dict(head_dim=16, num_heads=2, block_size=4)),
        ("harope", dict(head_dim=16, num_heads=2)),
        ("mrope", dict(head_dim=16)),
        ("nope", dict(head_dim=16)),
    ],
)
def test_q_alone_is_encoded_as_with_a_key(name, options):
    """Decoding against cached keys: ``pe(q, None, coords)`` gives the q that ``pe(q, k, coords)`` gives."""
    pe = mmpos.create_pe(name, **options)
    axes = pe.num_axes
    q, k = torch.randn(2, 1, 2, 3, 16, dtype=F64).unbind(0)
    coords = torch.tensor([[4.0, 1.0, 2.0][:axes], [5.0, 0.0, 3.0][:axes], [9.0, 2.0, 1.0][:axes]], dtype=F64)
    alone, none = pe(q, None, coords)
    assert none is None and torch.equal(alone, pe(q, k, coords)[0])
    with pytest.raises(TypeError, match="k must be a tensor or None"):
        pe(q, "k", coords)


# --- mmpos list ---------------------------------------------------------------------------------------------------
def test_mmpos_list_prints_one_full_sentence_per_encoding(capsys):
    from mmpos.cli import main
    from mmpos.encodings import list_pes, pe_description

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(list_pes())
    for name, line in zip(list_pes(), lines):
        description = pe_description(name)
        assert line.split()[0] == name and line.endswith(description)
        assert description.endswith(".") and not description.startswith("Args"), name
        assert "``" not in description and ":class:" not in description and "\n" not in description, name


def test_mmpos_list_table_is_the_registry():
    from mmpos.encodings import list_pes, pe_class, pe_description
    from mmpos.pipelines.commands.listing import ENCODINGS

    assert ENCODINGS == tuple((n, pe_class(n).kind.value, pe_description(n)) for n in list_pes())


def test_mmpos_list_verbose_shows_each_encodings_options(capsys):
    from mmpos.cli import main
    from mmpos.encodings import pe_options

    assert main(["list", "-v"]) == 0
    out = capsys.readouterr().out
    assert "    head_dim (required)" in out and f"    theta = {pe_options('rope_axial')['theta']!r}" in out


def test_description_falls_back_to_the_docstrings_first_sentence():
    from mmpos.encodings import registry

    class Documented(mmpos.encodings.RotaryPE):
        """Golden RoPE: pair p turns along p times the golden angle. More detail."""

    class Undocumented(mmpos.encodings.RotaryPE):
        """Args:
        head_dim: channels.
        """

    try:
        for cls, name in ((Documented, "doc_test_documented"), (Undocumented, "doc_test_undocumented")):
            registry._REGISTRY[name] = cls
        expected = "Golden RoPE: pair p turns along p times the golden angle."
        assert registry.pe_description("doc_test_documented") == expected
        assert registry.pe_description("doc_test_undocumented") == "Undocumented."
    finally:
        registry._REGISTRY.pop("doc_test_documented", None)
        registry._REGISTRY.pop("doc_test_undocumented", None)
