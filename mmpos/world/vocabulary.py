"""The world's words: every word its captions and instructions use (the vocabulary of its text encoder and
tokenizer), and the check that names the words of a caption outside it."""

from __future__ import annotations

import difflib

from .scene import COLOURS, PATTERN_WORDS, POSITION_WORDS, SHAPES, SIZES

PAD, BOS = "<pad>", "<s>"
FUNCTION_WORDS = (
    "a",
    "at",
    "and",
    "on",
    "background",
    "the",
    "make",
    "remove",
    "add",
    "objects",
    "blend",
    "pasted",
    "object",
    "into",
    "image",
)


def world_vocabulary() -> list[str]:
    """Every word the world's captions and instructions use, after the pad and start tokens."""
    words = set(FUNCTION_WORDS) | set(COLOURS) | set(SHAPES) | set(SIZES) | set(PATTERN_WORDS.values())
    words |= {w for row in POSITION_WORDS for phrase in row for w in phrase.split()}
    return [PAD, BOS] + sorted(words)


def check_known_words(captions, vocabulary) -> None:
    """Raise ValueError naming the words of ``captions`` (a string or a list of them) outside ``vocabulary`` (a
    list or a word -> id mapping), with the nearest known word of each where one is close, and the known words."""
    captions = [captions] if isinstance(captions, str) else list(captions or [])
    for row, caption in enumerate(captions):
        unknown = sorted({w for w in caption.lower().split() if w not in vocabulary})
        if unknown:
            known = sorted(w for w in vocabulary if w not in (PAD, BOS))
            nearest = {w: difflib.get_close_matches(w, known, n=1) for w in unknown}
            hints = ", ".join(f"{w!r} -> {near[0]!r}" for w, near in nearest.items() if near)
            raise ValueError(
                f"captions[{row}] {caption!r} has words outside the world's vocabulary: {unknown}"
                f"{f' (nearest: {hints})' if hints else ''}; the world models know only these {len(known)} "
                f"words: {' '.join(known)}"
            )
