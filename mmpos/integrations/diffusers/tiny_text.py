"""Tiny text encoders and tokenizers built offline (random weights, word- or character-level vocabularies written in
code), so a tiny saved pipeline (:mod:`mmpos.integrations.diffusers.tiny_pipelines`) loads with ``from_pretrained``
and takes prompt strings: FLUX.1's CLIP and T5, Qwen-Image's Qwen2.5-VL, Qwen-Image 2.1's Qwen3-VL processor.
Words outside a vocabulary map to its unknown token."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

FLUX_TEXT_LEN = 6  # T5 tokens of the tiny FLUX.1 pipelines (their max_sequence_length)
FLUX_WORDS = ("a", "the", "on", "at", "of", "and", "background", "object", "image", "into", "blend")
QWEN_WORDS = (
    "<pad>",
    "<unk>",
    "<|im_start|>",
    "<|im_end|>",
    "a",
    "red",
    "blue",
    "circle",
    "square",
    "on",
    "background",
)


def clip_t5_components(width: int, seed: int = 0) -> dict:
    """``text_encoder`` / ``tokenizer`` (CLIP, character-level BPE without merges) and ``text_encoder_2`` /
    ``tokenizer_2`` (T5, word-level): both encode to ``width`` channels, as FLUX.1's pipelines take them."""
    with tempfile.TemporaryDirectory(prefix="mmpos_tiny_tokenizers_") as folder, torch.random.fork_rng():
        torch.manual_seed(seed)  # the caller's RNG state is restored on exit
        return _clip_t5(Path(folder), width)


def _clip_t5(folder: Path, width: int) -> dict:
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel

    from mmpos.models.tiny_tokenizers import word_t5_tokenizer

    clip_vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for symbol in "abcdefghijklmnopqrstuvwxyz0123456789":
        clip_vocab.setdefault(symbol, len(clip_vocab))
        clip_vocab.setdefault(symbol + "</w>", len(clip_vocab))
    (folder / "vocab.json").write_text(json.dumps(clip_vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    clip_tokenizer = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=77)
    clip = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(clip_vocab),
            hidden_size=width,
            intermediate_size=37,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=77,
            projection_dim=width,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        )
    )
    t5_tokenizer = word_t5_tokenizer(FLUX_WORDS, model_max_length=FLUX_TEXT_LEN)
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=t5_tokenizer.vocab_size,
            d_model=width,
            d_kv=8,
            d_ff=37,
            num_layers=1,
            num_heads=2,
            decoder_start_token_id=0,
        )
    )
    return dict(text_encoder=clip.eval(), tokenizer=clip_tokenizer, text_encoder_2=t5.eval(), tokenizer_2=t5_tokenizer)


def _word_tokenizer(words, special):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    vocabulary.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=vocabulary, pad_token="<pad>", unk_token="<unk>", additional_special_tokens=list(special)
    )


def qwen2_5_vl_components(width: int) -> dict:
    """A one-layer Qwen2.5-VL ``text_encoder`` (hidden size ``width``) and a word-level ``tokenizer`` (the chat
    template's words it does not know map to ``<unk>``), as ``QwenImagePipeline`` takes them (seed the caller's RNG)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = _word_tokenizer(QWEN_WORDS, ["<|im_start|>", "<|im_end|>"])
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}
    vision = dict(
        depth=1,
        hidden_size=16,
        intermediate_size=16,
        num_heads=2,
        out_hidden_size=width,
        patch_size=2,
        temporal_patch_size=2,
        spatial_merge_size=2,
        in_channels=3,
    )
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=16,
            hidden_size=width,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=2048,
            rope_parameters=rope,
            bos_token_id=None,
            eos_token_id=None,
        ),
        vision_config=vision,
        image_token_id=12,
        video_token_id=13,
        vision_start_token_id=14,
        vision_end_token_id=15,
    )
    return dict(text_encoder=Qwen2_5_VLForConditionalGeneration(config).eval(), tokenizer=tokenizer)


def qwen3_vl_processor():
    """A Qwen3-VL processor with a word-level tokenizer of the chat template's special tokens (Qwen-Image 2.1's
    pipeline tokenizes its prompt template when built, even when given prompt embeddings)."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    special = ["<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }} {% for c in m['content'] %}{{ c['text'] }}{% endfor %}"
        "<|im_end|>{% endfor %}"
    )
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(),
        tokenizer=_word_tokenizer(["<pad>", "<unk>", *special], special),
        video_processor=Qwen3VLVideoProcessor(),
        chat_template=template,
    )
