"""Tiny Qwen2-VL / Qwen2.5-VL / Qwen3-VL models built in code (no weights) and a mixed text-image-video input."""

import functools

import torch

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 60, 61, 62, 63
HEAD_DIM = 16  # 8 rotary pairs


def _text_config(section, interleaved=False):
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(section)}
    if interleaved:
        rope["mrope_interleaved"] = True
    return dict(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=HEAD_DIM,
        max_position_embeddings=512,
        rope_parameters=rope,
    )


_SPECIAL = dict(
    image_token_id=IMAGE_TOKEN,
    video_token_id=VIDEO_TOKEN,
    vision_start_token_id=VISION_START,
    vision_end_token_id=VISION_END,
    bos_token_id=None,
    eos_token_id=None,
)
_PATCHES = dict(patch_size=2, temporal_patch_size=2, spatial_merge_size=2, in_channels=3)


@functools.lru_cache(maxsize=None)
def build(kind: str, seed: int = 0):
    """``kind`` in ``qwen2_vl`` (chunked [2, 3, 3]), ``qwen2_5_vl``, ``qwen3_vl`` (interleaved [4, 2, 2]).

    Cached and shared by the test modules; tests that patch a model restore it.
    """
    import transformers as tf

    torch.manual_seed(seed)
    if kind == "qwen2_vl":
        config = tf.Qwen2VLConfig(
            text_config=_text_config((2, 3, 3)),
            vision_config=dict(depth=1, embed_dim=16, hidden_size=128, num_heads=2, mlp_ratio=2, **_PATCHES),
            **_SPECIAL,
        )
        model = tf.Qwen2VLForConditionalGeneration(config)
    elif kind == "qwen2_5_vl":
        config = tf.Qwen2_5_VLConfig(
            text_config=_text_config((2, 3, 3)),
            vision_config=dict(
                depth=1,
                hidden_size=16,
                intermediate_size=32,
                num_heads=2,
                out_hidden_size=128,
                window_size=8,
                fullatt_block_indexes=[0],
                tokens_per_second=2,
                **_PATCHES,
            ),
            **_SPECIAL,
        )
        model = tf.Qwen2_5_VLForConditionalGeneration(config)
    elif kind == "qwen3_vl":
        config = tf.Qwen3VLConfig(
            text_config=_text_config((4, 2, 2), interleaved=True),
            vision_config=dict(
                depth=1,
                hidden_size=32,
                intermediate_size=64,
                num_heads=2,
                out_hidden_size=128,
                num_position_embeddings=16,
                deepstack_visual_indexes=[0],
                **_PATCHES,
            ),
            **_SPECIAL,
        )
        model = tf.Qwen3VLForConditionalGeneration(config)
    else:
        raise ValueError(kind)
    return model.eval()


def mixed_inputs(kind: str, video_grid=(4, 4, 6)):
    """Text, an image (1, 4, 4), text, a video ``video_grid`` (vision patches), text; Qwen3-VL gets its per-frame
    layout (timestamp text, <vs>, frame, <ve> per temporal patch), as its processor writes it."""
    frames, height, width = video_grid
    t_llm, per_frame = frames, (height // 2) * (width // 2)
    image = [VISION_START] + [IMAGE_TOKEN] * 4 + [VISION_END]
    if kind == "qwen3_vl":
        video = []
        for frame in range(t_llm):
            video += [10 + frame, VISION_START] + [VIDEO_TOKEN] * per_frame + [VISION_END]
    else:
        video = [VISION_START] + [VIDEO_TOKEN] * (t_llm * per_frame) + [VISION_END]
    ids = torch.tensor([[1, 2, 3] + image + [4, 5] + video + [6, 7]])
    types = (ids == IMAGE_TOKEN).int() + 2 * (ids == VIDEO_TOKEN).int()
    patch_dim = 3 * 2 * 2 * 2
    pixels = torch.Generator().manual_seed(0)  # the same inputs on every call
    inputs = dict(
        input_ids=ids,
        mm_token_type_ids=types,
        image_grid_thw=torch.tensor([[1, 4, 4]]),
        pixel_values=torch.randn(16, patch_dim, generator=pixels),
        video_grid_thw=torch.tensor([[t_llm, height, width]]),
        pixel_values_videos=torch.randn(t_llm * height * width, patch_dim, generator=pixels),
    )
    if kind == "qwen2_5_vl":
        inputs["second_per_grid_ts"] = torch.tensor([1.5])
    return inputs
