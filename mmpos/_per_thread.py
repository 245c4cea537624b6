"""A value per thread: what a call sets is read back by the same thread, never by a concurrent one.

Modules shared by several threads (one model serving requests) keep their per-call state (a diffusion step's
sigma, a forward's patch grid, its camera) in a :class:`PerThread`, never in a plain attribute.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

_UNSET = object()


class PerThread:
    """One value per thread.

    A thread reads what it set last; a thread that set nothing (a worker of ``nn.DataParallel``, autograd's
    thread) reads the latest value any thread set, else ``default``. Copies and pickles keep the calling
    thread's value as the copy's default (no forward in flight travels with a copy).
    """

    def __init__(self, default=None):
        self._default = default
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._local = threading.local()
        self._latest = self._default

    def get(self):
        value = getattr(self._local, "value", _UNSET)
        return self._latest if value is _UNSET else value

    def set(self, value) -> None:
        self._local.value = value
        self._latest = value

    def is_set_here(self) -> bool:
        """Whether this thread set a value."""
        return getattr(self._local, "value", _UNSET) is not _UNSET

    def swap(self, value, latest: bool = False):
        """Set ``value`` in this thread (and, with ``latest``, as the fallback of threads that set nothing);
        returns this thread's previous state for :meth:`restore`."""
        previous = getattr(self._local, "value", _UNSET)
        self._local.value = value
        if latest:
            self._latest = value
        return previous

    def restore(self, previous) -> None:
        """Put back the state :meth:`swap` returned (unset again if it was)."""
        if previous is _UNSET:
            self._local.__dict__.pop("value", None)
        else:
            self._local.value = previous

    @contextmanager
    def scoped(self, value):
        """``value`` in this thread only, for the duration of the block."""
        previous = self.swap(value)
        try:
            yield value
        finally:
            self.restore(previous)

    def __getstate__(self):
        return {"_default": self.get()}

    def __setstate__(self, state):
        self._default = state["_default"]
        self._init_runtime()

    def __repr__(self):
        return f"PerThread({self.get()!r})"
