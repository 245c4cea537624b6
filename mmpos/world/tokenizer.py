"""The world's word-level tokenizer as a transformers tokenizer: what the Flux pipelines call on prompt strings.

A world pipeline holds it twice (``tokenizer`` and ``tokenizer_2``, beside ``text_encoder`` and ``text_encoder_2``,
both :class:`~mmpos.models.world.text.WorldTextEncoder`), so ``FluxPipeline(prompt="a red circle at top left")`` works:

    caption: "A red circle"      ids: [<s>, a, red, circle, <pad>, <pad>, ...]   (padded by the pipeline)

Its ids are those of :meth:`WorldTextEncoder.tokenize`; a word outside the vocabulary raises (nothing is dropped).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from .vocabulary import BOS, PAD, check_known_words, world_vocabulary


class WorldTokenizer(PreTrainedTokenizerFast):
    """Lower-cased, whitespace-split words -> vocabulary ids, ``<s>`` first; unknown words raise ValueError."""

    def __call__(self, text=None, *args, **kwargs):
        check_known_words(text, self.get_vocab())
        return super().__call__(text, *args, **kwargs)

    def tokenize(self, text, *args, **kwargs):
        check_known_words(text, self.get_vocab())
        return super().tokenize(text, *args, **kwargs)


def world_tokenizer(vocabulary: list[str] | None = None, max_length: int = 40) -> WorldTokenizer:
    """The tokenizer of a :class:`~mmpos.models.world.text.WorldTextEncoder` with this ``vocabulary`` and ``max_length``
    (its config's; ``max_length`` becomes ``model_max_length``, the length the CLIP-slot prompt is padded to)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel

    vocabulary = list(vocabulary or world_vocabulary())
    ids = {word: i for i, word in enumerate(vocabulary)}
    backend = Tokenizer(WordLevel(ids, unk_token=PAD))  # never used for unknowns: __call__ refuses them first
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, ids[BOS])])
    return WorldTokenizer(
        tokenizer_object=backend, bos_token=BOS, pad_token=PAD, model_max_length=max_length, padding_side="right"
    )
