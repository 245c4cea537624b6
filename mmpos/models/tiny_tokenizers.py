"""Tokenizers of tiny random text encoders, built offline from a word list written in code (no downloads): the
tiny pipelines' T5 / UMT5 tokenizers (:mod:`mmpos.models.tiny_wan`, :mod:`mmpos.integrations.diffusers.tiny_text`).

    word_t5_tokenizer(("a", "red", "circle"), 8)("a blue circle").input_ids   # [3, 2, 5, 1]: blue is <unk>, </s> last
"""

from __future__ import annotations

import tempfile
from pathlib import Path

T5_SPECIAL = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2; the words follow from 3


def word_t5_tokenizer(words, model_max_length: int):
    """A ``T5TokenizerFast`` over the whitespace-split vocabulary :data:`T5_SPECIAL` + ``words`` (a Unigram of equal
    scores: each word is one token, any other word ``<unk>``), ``</s>`` appended, truncating to ``model_max_length``.
    Its ``vocab_size`` is ``3 + len(words)``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import T5TokenizerFast

    vocabulary = [*T5_SPECIAL, *words]
    if len(set(vocabulary)) != len(vocabulary):
        raise ValueError(f"words: expected distinct words other than {', '.join(T5_SPECIAL)}, got {list(words)}")
    unigram = Tokenizer(models.Unigram([(token, -1.0) for token in vocabulary], unk_id=T5_SPECIAL.index("<unk>")))
    unigram.pre_tokenizer = pre_tokenizers.Whitespace()
    with tempfile.TemporaryDirectory(prefix="mmpos_tiny_t5_") as folder:
        path = str(Path(folder) / "tokenizer.json")
        unigram.save(path)
        return T5TokenizerFast(
            tokenizer_file=path,
            eos_token="</s>",
            pad_token="<pad>",
            unk_token="<unk>",
            extra_ids=0,
            model_max_length=model_max_length,
        )
