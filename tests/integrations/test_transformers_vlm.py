"""Switching a Qwen-VL model's RoPE (tiny configs built here, no weights): forward, text prior, restore, decoding."""

import pytest
import torch

import mmpos
from mmpos.coords import vrope
from mmpos.integrations.transformers_vlm import ENCODINGS, use_multimodal_rope
from tests.fixtures import tiny_qwen_vl

KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
TEXT_IDS = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9]])


@pytest.fixture(scope="module")
def models():
    return {kind: tiny_qwen_vl.build(kind) for kind in KINDS}


@pytest.fixture(scope="module")
def host_logits(models):
    """Unpatched logits per model: (mixed text-image-video input, text-only input)."""
    return {
        kind: (_logits(model, **tiny_qwen_vl.mixed_inputs(kind)), _logits(model, input_ids=TEXT_IDS))
        for kind, model in models.items()
    }


def _logits(model, **inputs):
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_patched_forward_text_prior_and_restore(models, host_logits, kind, encoding):
    model = models[kind]
    host_mixed, host_text = host_logits[kind]
    host_rotary = model.model.language_model.rotary_emb
    # the Qwen2 hosts' chunked (2, 3, 3) cannot interleave (h would need pair 10 of 8)
    section = (4, 2, 2) if encoding == "mrope_interleave" and kind != "qwen3_vl" else None
    with use_multimodal_rope(model, encoding, mrope_section=section):
        mixed = _logits(model, **tiny_qwen_vl.mixed_inputs(kind))
        text = _logits(model, input_ids=TEXT_IDS)
    assert mixed.shape == host_mixed.shape and torch.isfinite(mixed).all()
    assert torch.equal(text, host_text)  # text prior: bit-identical
    native = (encoding == "mrope" and kind != "qwen3_vl") or (encoding == "mrope_interleave" and kind == "qwen3_vl")
    assert torch.equal(mixed, host_mixed) == native  # the host's own scheme reproduced exactly; others differ
    assert "get_rope_index" not in vars(model.model) and model.model.language_model.rotary_emb is host_rotary


@pytest.mark.parametrize("kind", KINDS)
def test_restore_gives_back_the_host_model(models, host_logits, kind):
    model = models[kind]
    with use_multimodal_rope(model, "mhrope", head_section=(1, 1, 1)):
        _logits(model, **tiny_qwen_vl.mixed_inputs(kind))
    assert torch.equal(_logits(model, **tiny_qwen_vl.mixed_inputs(kind)), host_logits[kind][0])


def test_spatial_reset_and_nope_heads_take_effect(models, host_logits):
    model = models["qwen3_vl"]
    inputs = tiny_qwen_vl.mixed_inputs("qwen3_vl")
    host, host_text = host_logits["qwen3_vl"]
    with use_multimodal_rope(model, "mrope_interleave", spatial_reset=True):
        reset = _logits(model, **inputs)
        ids, _ = model.model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"], inputs["video_grid_thw"]
        )
    image = inputs["input_ids"][0] == tiny_qwen_vl.IMAGE_TOKEN
    assert ids[1:, 0, image].tolist() == [[0, 0, 1, 1], [0, 1, 0, 1]] and not torch.equal(reset, host)
    with use_multimodal_rope(model, "mhrope", head_section=(1, 1, 1)):  # 4 KV heads: the last is NoPE
        cos, sin = model.model.language_model.rotary_emb(torch.zeros(1), inputs["input_ids"][None].expand(3, -1, -1))
        nope_text = _logits(model, input_ids=TEXT_IDS)
    assert cos.shape == (1, 4, inputs["input_ids"].shape[1], tiny_qwen_vl.HEAD_DIM)
    assert torch.equal(cos[:, 3], torch.ones_like(cos[:, 3])) and torch.equal(sin[:, 3], torch.zeros_like(sin[:, 3]))
    assert not torch.equal(nope_text, host_text)


def test_vrope_adapter_matches_the_vrope_encoding(models):
    model = models["qwen2_vl"]
    inputs = tiny_qwen_vl.mixed_inputs("qwen2_vl")
    with use_multimodal_rope(model, "vrope"):
        ids, _ = model.model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"], inputs["video_grid_thw"]
        )
        cos, sin = model.model.language_model.rotary_emb(torch.zeros(1), ids)
    variants = vrope.expand_ids(ids[:, 0].T)
    pe = mmpos.create_pe("vrope", head_dim=tiny_qwen_vl.HEAD_DIM)
    table = pe.table(variants.double(), torch.float64)
    assert torch.allclose(cos[0, :, :8].double(), table.cos, atol=4e-6, rtol=0)  # fp32 phases up to ~30
    assert torch.allclose(sin[0, :, 8:].double(), table.sin, atol=4e-6, rtol=0)
    first_video = int((inputs["input_ids"][0] == tiny_qwen_vl.VIDEO_TOKEN).nonzero()[0])
    assert (
        variants[first_video].tolist()
        == [variants[first_video - 1, 0].item() + 1] * 1 + variants[first_video, 1:].tolist()
    )  # the video's top-left v0 continues the text


@pytest.mark.parametrize(
    "kind,encoding",
    [("qwen3_vl", "mrope_interleave"), ("qwen3_vl", "vrope"), ("qwen2_vl", "mhrope"), ("qwen2_5_vl", "vrope")],
)
def test_cached_decoding_continues_positions(models, kind, encoding):
    """Logits of a token decoded with the KV cache (positions from rope_deltas) equal a full forward's."""
    model = models[kind]
    inputs = tiny_qwen_vl.mixed_inputs(kind)
    next_token = torch.tensor([[9]])
    full = dict(
        inputs,
        input_ids=torch.cat([inputs["input_ids"], next_token], 1),
        mm_token_type_ids=torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(next_token).int()], 1),
    )
    with use_multimodal_rope(model, encoding, spatial_reset=encoding != "vrope"), torch.no_grad():
        expected = model(**full).logits[:, -1]
        prefix = model(**inputs, use_cache=True)
        step = model(
            input_ids=next_token,
            cache=prefix.past_key_values,
            use_cache=True,
            mm_token_type_ids=torch.zeros_like(next_token).int(),
        ).logits[:, -1]
    assert torch.allclose(step, expected, atol=1e-5, rtol=1e-4)


def test_generate_runs_with_a_patched_model(models):
    model = models["qwen3_vl"]
    inputs = tiny_qwen_vl.mixed_inputs("qwen3_vl")
    with use_multimodal_rope(model, "mhrope"), torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, inputs["input_ids"].shape[1] + 3)


def test_inputs_are_not_modified(models):
    model = models["qwen3_vl"]
    inputs = tiny_qwen_vl.mixed_inputs("qwen3_vl")
    before = {k: v.clone() for k, v in inputs.items()}
    with use_multimodal_rope(model, "mrope_interleave", spatial_reset=True):
        _logits(model, **inputs)
    assert all(torch.equal(before[k], v) for k, v in inputs.items())


def test_bad_use(models):
    model = models["qwen2_vl"]
    with pytest.raises(ValueError, match="encoding='rope_magic'"):
        use_multimodal_rope(model, "rope_magic")
    with pytest.raises(ValueError, match="not a Qwen2-VL"):
        use_multimodal_rope(torch.nn.Linear(2, 2), "mrope")
    with pytest.raises(ValueError, match="spatial_reset"):
        use_multimodal_rope(model, "vrope", spatial_reset=True)
    with pytest.raises(ValueError, match=r"adds up to 9 pairs"):
        use_multimodal_rope(model, "mrope", mrope_section=(3, 3, 3))
    with pytest.raises(ValueError, match="assigns 5 heads"):
        use_multimodal_rope(model, "mhrope", head_section=(2, 2, 1))
    with use_multimodal_rope(model, "mrope"):
        with pytest.raises(RuntimeError, match="already switched"):
            use_multimodal_rope(model, "vrope")
    inputs = tiny_qwen_vl.mixed_inputs("qwen2_vl")
    with use_multimodal_rope(model, "mrope"), pytest.raises(ValueError, match=r"video_grid_thw\[0\] covers 12"):
        model.model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"], torch.tensor([[2, 4, 6]])
        )


def test_state_dict_keys_are_unchanged_by_the_patch(models):
    model = models["qwen2_vl"]
    keys = set(model.state_dict())
    with use_multimodal_rope(model, "mhrope"):
        assert set(model.state_dict()) == keys


@pytest.mark.parametrize("fps", [1.2, 2.4, 4.8, 25.0])
def test_qwen2_5_vl_patched_rope_index_at_processor_frame_rates(models, fps):
    """The patched get_rope_index ("mrope") equals the host's for the float32 second_per_grid_ts its processor
    writes (temporal_patch_size / fps), on a 64-frame video where float32 and fp64 products truncate apart."""
    model = models["qwen2_5_vl"].model
    types = torch.tensor([[0, 0, 0] + [2] * 64 + [0]])
    ids = torch.where(types == 2, tiny_qwen_vl.VIDEO_TOKEN, 1)
    grids = dict(video_grid_thw=torch.tensor([[64, 2, 2]]), second_per_grid_ts=torch.tensor([2 / fps]))
    with torch.no_grad():
        expected, expected_deltas = model.get_rope_index(ids, types, **grids)
        with use_multimodal_rope(models["qwen2_5_vl"], "mrope"):
            ours, deltas = model.get_rope_index(ids, types, **grids)
    assert torch.equal(ours, expected) and torch.equal(deltas, expected_deltas)
