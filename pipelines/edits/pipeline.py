"""What every editing pipeline shares: `EditPipelineMixin` (layer rules, an `EditSession` over the pipeline's
transformer, VAE packing) and `coerce_config` (a config dataclass from an instance, a dict or None)."""

from __future__ import annotations

import copy
import functools
import threading
from dataclasses import fields
from typing import Any

import torch

from .context import EditContext, EditSession
from .processor import attention_layer_names, select_layers


def coerce_config(cls, value):
    """A config dataclass from an instance, a dict (unknown keys are an error) or None (defaults)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} option(s) {unknown}; expected some of {sorted(known)}")
        return cls(**value)
    raise TypeError(f"expected a {cls.__name__}, a dict or None, got {type(value).__name__}")


class EditPipelineMixin:
    """Gives a diffusers Flux pipeline an :class:`EditSession` over its own transformer and scheduler."""

    def _layer_rules(self, layers, rule) -> dict[int, Any]:
        transformer = self.transformer
        names = attention_layer_names(transformer)
        indices = select_layers(layers, len(names), len(transformer.transformer_blocks))
        return dict.fromkeys(indices, rule)

    def edit_session(self, context: EditContext) -> EditSession:
        return EditSession(self.transformer, context, self.scheduler)

    @property
    def token_pixels(self) -> int:
        """Pixels per side of one transformer token (VAE factor x 2x2 packing; 16 for FLUX.1)."""
        return self.vae_scale_factor * 2

    def encode_packed(self, image: torch.Tensor, generator=None) -> torch.Tensor:
        """VAE-encode ``[B, 3, H, W]`` in [-1, 1] to packed latents ``[B, H*W/256, 4C]`` (scaled and shifted)."""
        if self.vae is None:
            raise ValueError("a VAE is needed to encode images; pass latents instead or load the pipeline with a vae")
        vae = self.vae
        image = image.to(device=self._execution_device, dtype=vae.dtype)
        posterior = vae.encode(image).latent_dist
        latents = posterior.mode() if generator is None else posterior.sample(generator)
        latents = (latents - vae.config.shift_factor) * vae.config.scaling_factor
        b, c, h, w = latents.shape
        return self._pack_latents(latents, b, c, h, w)


__all__ = ["one_call", "per_call", "this_thread_only"]

_SHARED_LOCKS = threading.Lock()
_ONE_CALL = "_mmpos_one_call"


def one_call(pipe):
    """``pipe`` for one call, so that calls from several threads do not share per-call state: a shallow copy (the
    same models) with its own scheduler (diffusers' schedulers keep the step index) and its own ``_guidance_scale``,
    ``_current_timestep``, ... attributes; the VAE (its causal-conv cache) and the prompt encoding (the fast
    tokenizer's padding state) are serialised by locks shared by all calls of ``pipe``."""
    with _SHARED_LOCKS:
        locks = pipe.__dict__.setdefault("_mmpos_call_locks", (threading.Lock(), threading.Lock()))
    call = copy.copy(pipe)
    call.__dict__[_ONE_CALL] = True
    call.__dict__["scheduler"] = copy.deepcopy(pipe.scheduler)
    vae_lock, prompt_lock = locks
    if getattr(pipe, "vae", None) is not None:
        call.__dict__["vae"] = _Serialised(pipe.vae, vae_lock, ("encode", "decode"))
    encode_prompt = getattr(call, "encode_prompt", None)
    if encode_prompt is not None:

        def serialised_encode_prompt(*args, **kwargs):
            with prompt_lock:
                return encode_prompt(*args, **kwargs)

        call.__dict__["encode_prompt"] = serialised_encode_prompt
    return call


def per_call(method):
    """Decorate a pipeline's ``__call__``: it runs on :func:`one_call` ``(self)`` (once: a nested call stays on its
    copy); afterwards the attributes named in the class's ``_call_results`` (``("probe",)``: what a call leaves for
    the caller to read) are copied back to ``self``."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if self.__dict__.get(_ONE_CALL):
            return method(self, *args, **kwargs)
        copied = one_call(self)
        try:
            return method(copied, *args, **kwargs)
        finally:
            for name in getattr(type(self), "_call_results", ()):
                if name in copied.__dict__:
                    self.__dict__[name] = copied.__dict__[name]

    return call


def this_thread_only(hook):
    """``hook`` (a module hook) acting only in the thread that made it: another thread's forward of the shared
    module passes through untouched (the hook returns None)."""
    owner = threading.get_ident()

    def in_owner_thread(*args, **kwargs):
        return hook(*args, **kwargs) if threading.get_ident() == owner else None

    return in_owner_thread


class _Serialised:
    """``module`` with the calls of ``methods`` taken under ``lock`` (every other attribute is the module's)."""

    def __init__(self, module, lock, methods):
        self.__dict__.update(_module=module, _lock=lock, _methods=methods)

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if name not in self._methods:
            return value

        def locked(*args, **kwargs):
            with self._lock:
                return value(*args, **kwargs)

        return locked
