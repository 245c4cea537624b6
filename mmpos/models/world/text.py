"""A word-level text encoder for the world's captions and instructions, saved like any diffusers model.

It stands in for Flux's T5 (sequence embeddings) and CLIP (pooled embedding): its outputs go to the
pipelines as ``prompt_embeds`` and ``pooled_prompt_embeds``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from ...world.vocabulary import BOS, PAD, check_known_words, world_vocabulary


class WorldTextOutput(NamedTuple):
    """What :class:`WorldTextEncoder` returns: unpacks as a pair; ``[0]`` and ``.pooler_output`` are what the Flux
    pipelines read of T5 (``text_encoder_2``) and CLIP (``text_encoder``)."""

    last_hidden_state: torch.Tensor  # [B, max_length, joint_attention_dim]: prompt_embeds
    pooler_output: torch.Tensor  # [B, pooled_projection_dim]: pooled_prompt_embeds


class WorldTextEncoder(ModelMixin, ConfigMixin):
    """Captions -> ``(prompt_embeds [B, max_length, joint_attention_dim], pooled [B, pooled_projection_dim])``.

    Token 0 of every caption is ``<s>``; its final state is the pooled embedding (as CLIP pools one token).
    The empty caption is ``<s>`` followed by padding: the unconditional input for classifier-free guidance.
    Its tokenizer for the pipelines is :func:`mmpos.world.tokenizer.world_tokenizer`.
    """

    @register_to_config
    def __init__(
        self,
        vocabulary: list[str] | None = None,
        max_length: int = 40,
        width: int = 96,
        num_layers: int = 2,
        num_heads: int = 4,
        joint_attention_dim: int = 64,
        pooled_projection_dim: int = 64,
    ):
        super().__init__()
        vocabulary = list(vocabulary or world_vocabulary())
        if vocabulary[:2] != [PAD, BOS]:
            raise ValueError(f"vocabulary must start with {PAD!r}, {BOS!r}; got {vocabulary[:2]!r}")
        self.word_ids = {word: i for i, word in enumerate(vocabulary)}
        self.token_embedding = nn.Embedding(len(vocabulary), width)
        self.position_embedding = nn.Parameter(torch.randn(max_length, width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            width, num_heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(width)
        self.sequence_projection = nn.Linear(width, joint_attention_dim)
        self.pooled_projection = nn.Linear(width, pooled_projection_dim)

    def tokenize(self, captions: list[str] | str) -> torch.Tensor:
        """``int64 [B, max_length]``; unknown words and over-long captions raise (nothing is dropped)."""
        captions = [captions] if isinstance(captions, str) else list(captions)
        max_length = self.config.max_length
        ids = torch.zeros(len(captions), max_length, dtype=torch.long)
        check_known_words(captions, self.word_ids)
        for row, caption in enumerate(captions):
            words = caption.lower().split()
            if len(words) + 1 > max_length:
                raise ValueError(f"captions[{row}] has {len(words)} words; expected at most {max_length - 1}")
            ids[row, : len(words) + 1] = torch.tensor([self.word_ids[BOS]] + [self.word_ids[w] for w in words])
        return ids

    def forward(self, input_ids: torch.Tensor, output_hidden_states: bool = False) -> WorldTextOutput:
        """``input_ids [B, L]`` (:meth:`tokenize`, or a tokenizer's padded to any L) -> embeddings of ``max_length``
        tokens, the length the model was trained on: shorter ids are padded, longer ones cut where only padding
        follows. ``output_hidden_states`` is accepted for the pipelines' calls and ignored."""
        input_ids = self._to_max_length(input_ids)
        padding = input_ids == self.word_ids[PAD]
        hidden = self.token_embedding(input_ids) + self.position_embedding[: input_ids.shape[1]]
        hidden = self.final_norm(self.encoder(hidden, src_key_padding_mask=padding))
        return WorldTextOutput(self.sequence_projection(hidden), self.pooled_projection(hidden[:, 0]))

    def _to_max_length(self, input_ids: torch.Tensor) -> torch.Tensor:
        max_length, pad = self.config.max_length, self.word_ids[PAD]
        if input_ids.shape[1] < max_length:
            return torch.nn.functional.pad(input_ids, (0, max_length - input_ids.shape[1]), value=pad)
        if bool((input_ids[:, max_length:] != pad).any()):
            raise ValueError(
                f"a prompt has more than {max_length - 1} words; the world text encoder reads at most {max_length - 1}"
            )
        return input_ids[:, :max_length]

    @torch.no_grad()
    def encode_captions(self, captions: list[str] | str, device=None, dtype=None):
        """``(prompt_embeds, pooled_prompt_embeds)`` for the Flux pipelines' arguments of those names."""
        ids = self.tokenize(captions).to(device or self.device)
        prompt_embeds, pooled = self(ids)
        dtype = dtype or self.dtype
        return prompt_embeds.to(dtype), pooled.to(dtype)
