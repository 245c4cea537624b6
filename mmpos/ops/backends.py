"""Which implementation :func:`mmpos.ops.rotate` uses on devices the fused kernel serves.

Chosen by an explicit call, like diffusers' ``set_attention_backend`` or timm's ``set_fused_attn``:

    >>> from mmpos.ops import set_rotary_backend, get_rotary_backend, rotary_backend
    >>> set_rotary_backend("auto")       # the fused Triton kernel on CUDA where it applies
    >>> with rotary_backend("torch"):    # the PyTorch path inside this block (comparisons, benchmarks)
    ...     ...

Backends: ``"torch"`` (the PyTorch path everywhere), ``"auto"`` (the Triton kernel where it applies and Triton
imports, the PyTorch path elsewhere), ``"triton"`` (as ``"auto"``, but choosing it fails when Triton does not
import). The environment variable ``MMPOS_TRITON`` only supplies the default at import: ``1`` -> ``"auto"``,
unset or ``0`` -> ``"torch"`` (the kernel is opt-in until it has been checked on a GPU).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Iterator

ROTARY_BACKENDS = ("auto", "triton", "torch")


@functools.lru_cache(maxsize=None)
def triton_importable() -> bool:
    """Whether ``import triton`` works here."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _default_from_environment() -> str:
    value = os.environ.get("MMPOS_TRITON", "")
    if value in ("", "0"):
        return "torch"
    if value == "1":
        return "auto"
    warnings.warn(f"MMPOS_TRITON={value!r}: expected 1 or 0; using the 'torch' rotary backend", stacklevel=2)
    return "torch"


_backend = _default_from_environment()


def set_rotary_backend(name: str) -> None:
    """Choose the rotary backend for the whole process: ``"auto"``, ``"triton"`` or ``"torch"``."""
    global _backend
    if name not in ROTARY_BACKENDS:
        raise ValueError(f"rotary backend must be one of {ROTARY_BACKENDS}, got {name!r}")
    if name == "triton" and not triton_importable():
        raise ImportError(
            "rotary backend 'triton' needs the triton package (pip install triton); "
            "use 'auto' to fall back to the PyTorch path without it"
        )
    _backend = name


def get_rotary_backend() -> str:
    """The backend :func:`set_rotary_backend` chose (or the ``MMPOS_TRITON`` default)."""
    return _backend


@contextlib.contextmanager
def rotary_backend(name: str) -> Iterator[None]:
    """Use backend ``name`` inside the block, then restore the previous one."""
    previous = get_rotary_backend()
    set_rotary_backend(name)
    try:
        yield
    finally:
        set_rotary_backend(previous)


def fused_kernel_enabled() -> bool:
    """Whether the chosen backend lets :func:`mmpos.ops.rotate` take the Triton kernel where it applies."""
    return _backend != "torch" and triton_importable()
