"""A loaded pipeline kept in memory between commands of one process (``mmpos app``: a strength slider re-runs the
edit without loading the model again).

Off by default: a command line run loads its pipeline and exits. Inside :func:`keep_pipelines_loaded` (per thread
of control: a context variable) :func:`~mmpos.pipelines.loading.load_pipeline_class` of the same class, folder,
dtype and device returns the pipeline loaded the time before, provided it is back in its loaded state: no mmpos
encoding installed (:func:`set_pe` undone) and the same attention processors as at load. A pipeline a run left
changed (an interrupted edit) is loaded again. One pipeline is kept (the last one), so two models never sit in
memory at once.
"""

from __future__ import annotations

import contextlib
import contextvars
from pathlib import Path

_STORE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("mmpos_kept_pipelines", default=None)


@contextlib.contextmanager
def keep_pipelines_loaded(store: dict | None = None):
    """Keep the last loaded pipeline in ``store`` (a dict the caller holds across blocks; default: this block's)."""
    token = _STORE.set({} if store is None else store)
    try:
        yield
    finally:
        _STORE.reset(token)


def kept_pipeline(cls, path, dtype: str, device, load):
    """The pipeline ``load()`` gives for ``(cls, path, dtype, device)``: the kept one when it is still as loaded,
    else a fresh ``load()`` (kept inside :func:`keep_pipelines_loaded`)."""
    store = _STORE.get()
    if store is None:
        return load()
    key = (cls, str(path), _folder_stamp(path), dtype, str(device))
    if key in store and _state(store[key][0]) == store[key][1]:
        return store[key][0]
    store.clear()  # the kept pipeline goes before the next one loads
    pipe = load()
    store[key] = (pipe, _state(pipe))
    return pipe


def _folder_stamp(path) -> float | None:
    """A local folder's ``model_index.json`` modification time (a re-saved folder is loaded again); None for a hub id."""
    index = Path(path) / "model_index.json"
    return index.stat().st_mtime if index.is_file() else None


def _state(pipe) -> tuple:
    """What a run may change and must undo: an installed mmpos encoding, the attention processors' classes."""
    from mmpos.integrations.diffusers.hooks import installed_hook

    transformer = getattr(pipe, "transformer", None)
    if transformer is None:
        return ()
    processors = getattr(transformer, "attn_processors", {})
    return (
        installed_hook(transformer) is not None,
        tuple(sorted((n, type(p).__name__) for n, p in processors.items())),
    )
