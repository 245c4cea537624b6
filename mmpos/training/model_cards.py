"""Hugging Face model-card metadata of the model folders mmpos exports: the YAML front matter above each card.

Every exporter writes ``README.md`` as ``front_matter(card_metadata(kind)) + text``: the Hub reads the license,
library, tags and pipeline task from it, and the shipped folders in ``assets/`` carry the same block
(``tests/test_model_cards.py`` checks both).
"""

from __future__ import annotations

import yaml

LICENSE = "apache-2.0"  # the project's license (LICENSE, pyproject.toml)

# kind -> (library that loads the folder, pipeline task on the Hub or None, tags besides "mmpos" and "mini-world")
_KINDS: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    "vae": ("diffusers", None, ("autoencoder", "vae")),
    "t2i": ("diffusers", "text-to-image", ("flux", "text-to-image")),
    "fill": ("diffusers", "image-to-image", ("flux", "flux-fill", "inpainting", "pe-transplant")),
    "kontext": ("diffusers", "image-to-image", ("flux", "flux-kontext", "image-editing", "looserope")),
    "video": ("diffusers", "image-to-video", ("wan", "image-to-video", "camera-control")),
}
ADAPTER_PREFIX = "camera-"  # camera-<encoding>: a camera adapter (mmpos.integrations.diffusers.CameraAdapter)


def card_metadata(kind: str) -> dict:
    """The front matter of a folder of ``kind`` (a world task ``vae``/``t2i``/``fill``/``kontext``, ``video``, or a
    camera adapter ``camera-<encoding>``): ``license``, ``library_name``, ``tags`` and, where one fits,
    ``pipeline_tag``. No ``base_model``: the folders are trained from scratch (or continue their own runs)."""
    if kind.startswith(ADAPTER_PREFIX) and len(kind) > len(ADAPTER_PREFIX):
        library, task, tags = "mmpos", None, ("camera-control", "camera-adapter", kind[len(ADAPTER_PREFIX) :])
    elif kind in _KINDS:
        library, task, tags = _KINDS[kind]
    else:
        raise ValueError(f"kind must be one of {tuple(_KINDS)} or camera-<encoding>, got {kind!r}")
    metadata: dict = {"license": LICENSE, "library_name": library}
    if task is not None:
        metadata["pipeline_tag"] = task
    metadata["tags"] = ["mmpos", "mini-world", *tags]
    return metadata


def front_matter(metadata: dict) -> str:
    """``metadata`` as a card's YAML front matter: ``---``, the YAML (keys in order), ``---``, a blank line."""
    return "---\n" + yaml.safe_dump(metadata, sort_keys=False) + "---\n\n"


def split_front_matter(text: str) -> tuple[dict, str]:
    """``(metadata, body)`` of a card's text; a card without front matter is a ValueError."""
    end = text.find("\n---\n", 3)
    if not text.startswith("---\n") or end < 0:
        raise ValueError("the card has no YAML front matter (a first line '---', then YAML, then '---')")
    metadata, body = yaml.safe_load(text[4:end]), text[end + 5 :]
    if not isinstance(metadata, dict):
        raise ValueError(f"the card's front matter must be a YAML mapping, got {type(metadata).__name__}")
    return metadata, body.lstrip("\n")
