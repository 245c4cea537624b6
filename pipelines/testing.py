"""Tiny Flux / Fill / Kontext components built in code (diffusers' test-style configs, no downloads), and
reference math (explicit q/k/v and softmax attention) for tests and device checks.

The VAE has four levels (scale factor 8) so that one transformer token is 16x16 pixels, as in FLUX.1.
"""
from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel

LATENT_CHANNELS = 1
TEXT_LEN = 6
TEXT_DIM = 32


def tiny_transformer(kind: str = "flux", seed: int = 0, vae_scale: int = 8) -> FluxTransformer2DModel:
    """Fill's input is noisy latents | masked-image latents | the pixel mask folded to ``vae_scale**2`` channels."""
    torch.manual_seed(seed)
    packed = 4 * LATENT_CHANNELS
    in_channels = {"flux": packed, "kontext": packed, "fill": 2 * packed + 4 * vae_scale**2}[kind]
    return FluxTransformer2DModel(patch_size=1, in_channels=in_channels, out_channels=packed, num_layers=1,
                                  num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
                                  joint_attention_dim=TEXT_DIM, pooled_projection_dim=TEXT_DIM,
                                  axes_dims_rope=[4, 4, 8]).eval()


def tiny_vae(seed: int = 0, levels: int = 4) -> AutoencoderKL:
    """Scale factor ``2 ** (levels - 1)``: 8 by default (16-pixel tokens as in FLUX.1)."""
    torch.manual_seed(seed)
    return AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(4,) * levels,
                         down_block_types=("DownEncoderBlock2D",) * levels,
                         up_block_types=("UpDecoderBlock2D",) * levels,
                         layers_per_block=1, latent_channels=LATENT_CHANNELS, norm_num_groups=1, sample_size=32,
                         use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609,
                         scaling_factor=1.5035).eval()


def components(kind: str = "flux", seed: int = 0, vae_levels: int = 4) -> dict:
    vae_scale = 2 ** (vae_levels - 1)
    return dict(transformer=tiny_transformer(kind, seed, vae_scale), vae=tiny_vae(seed, vae_levels),
                scheduler=FlowMatchEulerDiscreteScheduler(),
                text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)


TEXT_WORDS = ("a", "the", "on", "at", "of", "and", "background", "object", "image", "into", "blend")


def tiny_text_components(seed: int = 0) -> dict:
    """Tiny CLIP and T5 encoders with tokenizers built offline (character-level CLIP BPE without merges, word-level
    T5), so a saved pipeline loads with ``from_pretrained`` and takes prompt strings like FLUX.1."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mmpos_tiny_tokenizers_") as folder, torch.random.fork_rng():
        torch.manual_seed(seed)  # the caller's RNG state is restored on exit
        return _tiny_text_components(Path(folder))


def _tiny_text_components(folder: Path) -> dict:
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast

    clip_vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for symbol in "abcdefghijklmnopqrstuvwxyz0123456789":
        clip_vocab.setdefault(symbol, len(clip_vocab))
        clip_vocab.setdefault(symbol + "</w>", len(clip_vocab))
    (folder / "vocab.json").write_text(json.dumps(clip_vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    clip_tokenizer = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=77)
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=len(clip_vocab), hidden_size=TEXT_DIM, intermediate_size=37,
                                        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=77,
                                        projection_dim=TEXT_DIM, bos_token_id=0, eos_token_id=1, pad_token_id=1))
    t5_vocab = ["<pad>", "</s>", "<unk>", *TEXT_WORDS]
    unigram = Tokenizer(models.Unigram([(token, -1.0) for token in t5_vocab], unk_id=2))
    unigram.pre_tokenizer = pre_tokenizers.Whitespace()
    unigram.save(str(folder / "tokenizer.json"))
    t5_tokenizer = T5TokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>", extra_ids=0, model_max_length=TEXT_LEN)
    t5 = T5EncoderModel(T5Config(vocab_size=len(t5_vocab), d_model=TEXT_DIM, d_kv=8, d_ff=37, num_layers=1,
                                 num_heads=2, decoder_start_token_id=0))
    return dict(text_encoder=clip.eval(), tokenizer=clip_tokenizer, text_encoder_2=t5.eval(),
                tokenizer_2=t5_tokenizer)


def embeddings(batch: int = 1, seed: int = 1) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return dict(prompt_embeds=torch.randn(batch, TEXT_LEN, TEXT_DIM, generator=generator),
                pooled_prompt_embeds=torch.randn(batch, TEXT_DIM, generator=generator))


def image(height: int, width: int, seed: int = 2) -> torch.Tensor:
    return torch.rand(1, 3, height, width, generator=torch.Generator().manual_seed(seed))


def explicit_qkv(attn, hidden_states, encoder_hidden_states=None):
    """q, k, v ``[B, S, H, D]`` written out from the module's layers (text first in double blocks), no RoPE."""
    def heads(x):
        return x.view(*x.shape[:2], -1, attn.head_dim)

    q, k, v = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states)), heads(attn.to_v(hidden_states))
    q, k = attn.norm_q(q), attn.norm_k(k)
    if encoder_hidden_states is not None:
        eq = attn.norm_added_q(heads(attn.add_q_proj(encoder_hidden_states)))
        ek = attn.norm_added_k(heads(attn.add_k_proj(encoder_hidden_states)))
        ev = heads(attn.add_v_proj(encoder_hidden_states))
        q, k, v = torch.cat([eq, q], 1), torch.cat([ek, k], 1), torch.cat([ev, v], 1)
    return q, k, v


def softmax_attention(q, k, v, logits_fn=None):
    """Explicit attention ``[B, S, H, D]``; ``logits_fn`` may edit the ``[B, H, Sq, Sk]`` logits."""
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if logits_fn is not None:
        logits = logits_fn(logits)
    return torch.einsum("bhqk,bkhd->bqhd", logits.softmax(-1), v)
