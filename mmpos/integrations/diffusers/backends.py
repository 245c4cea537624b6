"""Attention backend names for ``set_pe(..., attention_backend=...)``: diffusers' dispatch names, checked."""

from __future__ import annotations

import torch

AUTO_BACKEND = "auto"


def resolve_attention_backend(backend: str) -> str:
    """A diffusers dispatch backend name, checked (known name, installed requirements); ``"auto"`` is xformers
    on CUDA when it imports, else SDPA (``"native"``)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

    if backend == AUTO_BACKEND:
        return "xformers" if torch.cuda.is_available() and _xformers_importable() else "native"
    names = sorted(b.value for b in AttentionBackendName)
    if backend not in names:
        raise ValueError(f"attention_backend={backend!r} must be one of {names} or {AUTO_BACKEND!r}")
    _check_attention_backend_requirements(AttentionBackendName(backend))
    return backend


def _xformers_importable() -> bool:
    try:
        import xformers.ops  # noqa: F401
    except Exception:  # ImportError, or a build that does not match the installed torch
        return False
    return True
