"""One pipeline object serving several threads: each call runs on its own shallow copy (:func:`one_call`).

A diffusers pipeline keeps per-call state on itself (``_guidance_scale``, ``_current_timestep``, ``_interrupt``)
and in its scheduler (the step index), and mmpos' pipelines add their own (the band batch check, an attention
probe). :func:`per_call` runs a pipeline's ``__call__`` on a copy that shares the models but owns that state;
hooks a call registers on the shared transformer act in the calling thread only (:func:`this_thread_only`).

    class MyEditPipeline(EditPipelineMixin, FluxPipeline):
        @per_call
        def __call__(self, *args, **kwargs): ...
"""

from __future__ import annotations

import copy
import functools
import threading

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
