"""Phases and rotation tables: computed once per (coordinates, spectrum, dtype, device), then cached.

A table is complex ``cis = magnitude * exp(i * phase)`` of shape ``[..., L, P]``. Phases are computed in
fp64 (exact to ~1e-10 rad at position 1e6) with autocast off; on devices without fp64 (MPS) a range-reduced
fp32 formulation gives the same accuracy (see :func:`phases_fp32_reduced`).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from .._validation import check_finite, check_float_coords

_T = TypeVar("_T")


@dataclass(eq=False)
class RotaryTable:
    """``cis``: complex64 or complex128 ``[..., L, P]``; leading dims broadcast against ``[B, H]``. ``phase``: the
    learned phases behind ``cis`` while they need a gradient (:func:`~mmpos.ops.phasors.unit_phasor_table`), else
    ``None``; derived tables (``conj``, ``to``, slices) drop it and differentiate through ``cis``."""

    cis: torch.Tensor
    phase: torch.Tensor | None = None

    @property
    def num_pairs(self) -> int:
        return self.cis.shape[-1]

    @property
    def length(self) -> int:
        return self.cis.shape[-2]

    def conj(self) -> "RotaryTable":
        """The inverse rotation (for unit magnitude)."""
        return RotaryTable(self.cis.conj().resolve_conj())

    def to(self, dtype: torch.dtype) -> "RotaryTable":
        return RotaryTable(self.cis.to(dtype))

    @property
    def cos(self) -> torch.Tensor:
        return self.cis.real

    @property
    def sin(self) -> torch.Tensor:
        return self.cis.imag


def device_has_fp64(device: torch.device) -> bool:
    return torch.device(device).type not in ("mps", "npu", "xla")


_finite_checked = threading.local()


@contextmanager
def finite_checked(coords: torch.Tensor) -> Iterator[torch.Tensor]:
    """Inside the block, :func:`check_coords` skips the finiteness test (a host sync on CUDA) for this very
    tensor, on this thread: for a model that checked its coordinates once and builds one table per block."""
    if torch.compiler.is_compiling():  # the test is skipped while tracing; no thread-local state to guard on
        yield coords
        return
    previous = getattr(_finite_checked, "coords", None)
    _finite_checked.coords = coords
    try:
        yield coords
    finally:
        _finite_checked.coords = previous


def check_coords(coords: torch.Tensor, num_axes: int, name: str = "coords") -> torch.Tensor:
    """Validate ``[L, A]`` or ``[B, L, A]`` coordinates (``[L]`` allowed when ``A == 1``)."""
    check_float_coords(name, coords)
    already_checked = torch.compiler.is_compiling() or getattr(_finite_checked, "coords", None) is coords
    if coords.dim() == 1 and num_axes == 1:
        coords = coords[:, None]
    if coords.dim() not in (2, 3) or coords.shape[-1] != num_axes:
        raise ValueError(f"{name} has shape {tuple(coords.shape)}; expected [L, {num_axes}] or [B, L, {num_axes}]")
    if not already_checked:
        check_finite(name, coords)
    return coords


def axial_phases(coords: torch.Tensor, axis_of_pair: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``phase[..., l, p] = coords[..., l, axis_of_pair[p]] * inv_freq[p]`` in fp64, ``[..., L, P]``.

    Batched coords ``[B, L, A]`` give ``[B, L, P]``; insert the head dim before rotating ``[B, H, L, D]``.
    """
    with torch.autocast(coords.device.type, enabled=False):
        c = coords.to(torch.float64)
        return c[..., axis_of_pair.to(c.device)] * inv_freq.to(c.device, torch.float64)


def phases_fp32_reduced(coords: torch.Tensor, freq_matrix: torch.Tensor) -> torch.Tensor:
    """Phases in fp32 without fp64, exact to a few fp32 ulps of pi, for any coordinate size.

    Works in turns: each product ``c * w / 2pi`` is split exactly into ``s + e`` (Dekker's two-product),
    the integer part of ``s`` is dropped exactly, and only the small remainders are added.
    Args: coords ``[..., L, A]``; freq_matrix ``[A, P]`` (radians per unit, fp64 on the CPU).
    Returns: ``[..., L, P]`` fp32 phases in ``[-pi, pi]``.
    """
    turns64 = freq_matrix.to(torch.float64) / (2 * math.pi)
    hi = turns64.to(torch.float32)
    lo = (turns64 - hi.to(torch.float64)).to(torch.float32)
    hi, lo = hi.to(coords.device), lo.to(coords.device)
    with torch.autocast(coords.device.type, enabled=False):
        c = coords.to(torch.float32).unsqueeze(-1)  # [..., L, A, 1]
        s, e = _two_product(c, hi)  # [..., L, A, P]
        frac = (s - torch.round(s)) + (e + c * lo)
        frac = frac.sum(dim=-2)
        frac = frac - torch.round(frac)
        return frac * (2 * math.pi)


def _two_product(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Error-free product: ``a * b == s + e`` exactly (fp32, no FMA needed)."""
    s = a * b
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    e = ((a_hi * b_hi - s) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    return s, e


def _split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    big = x * 4097.0  # 2**12 + 1
    hi = big - (big - x)
    return hi, x - hi


def table_from_phases(phase: torch.Tensor, magnitude: torch.Tensor | None, complex_dtype: torch.dtype) -> RotaryTable:
    """``magnitude * (cos + i sin)`` of ``phase`` (computed at the phase's precision), as ``complex_dtype``."""
    real_dtype = torch.float64 if complex_dtype == torch.complex128 else torch.float32
    with torch.autocast(phase.device.type, enabled=False):
        cos, sin = phase.cos(), phase.sin()
        if magnitude is not None:
            magnitude = magnitude.to(phase.device, phase.dtype)
            cos, sin = cos * magnitude, sin * magnitude
        return RotaryTable(torch.complex(cos.to(real_dtype), sin.to(real_dtype)))


class KeyedCache:
    """Small LRU of values under hashable keys (e.g. coordinates per grid): ``get(key, build)``."""

    def __init__(self, max_entries: int = 4):
        self.max_entries = max_entries
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.RLock()

    def get(self, key: object, build: Callable[[], _T]) -> _T:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            value = self._entries[key] = build()
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return value

    def __getstate__(self) -> dict[str, Any]:  # copies start empty (a lock cannot be copied)
        return {"max_entries": self.max_entries}

    def __setstate__(self, state: dict[str, Any]) -> None:
        KeyedCache.__init__(self, state["max_entries"])


def _version(tensor: torch.Tensor) -> int | None:
    """In-place version counter; None for inference tensors (``torch.inference_mode``), which have none."""
    return None if tensor.is_inference() else tensor._version


class ParameterValues:
    """The values of some parameters, as a cache-key element.

    A probe holds the live tensors; :meth:`frozen` (what a cache stores) holds detached copies. Two compare
    equal when they hold the same tensors' identities, shapes and dtypes and equal values (one ``torch.equal``
    per parameter; a device sync on GPUs, once per table lookup).
    """

    def __init__(self, tensors: Iterable[torch.Tensor], _identity: tuple | None = None) -> None:
        self.tensors = tuple(tensors)
        self.identity = _identity or tuple((id(t), tuple(t.shape), t.dtype, t.device) for t in self.tensors)

    def frozen(self) -> "ParameterValues":
        return ParameterValues([t.detach().clone() for t in self.tensors], self.identity)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParameterValues) or self.identity != other.identity:
            return False
        return all(torch.equal(a, b) for a, b in zip(self.tensors, other.tensors))

    def __hash__(self) -> int:
        return hash(self.identity)


def frozen_key(key: tuple) -> tuple:
    """``key`` with its :class:`ParameterValues` replaced by stored copies (what a cache keeps)."""
    return tuple(k.frozen() if isinstance(k, ParameterValues) else k for k in key)


def library_owned(coords: torch.Tensor) -> torch.Tensor:
    """Mark coordinates the library built and keeps to itself (a model's grid, reused every step): a
    :class:`TableCache` then finds them by identity and version alone, without reading their values (a device
    sync on GPUs). Never mark a tensor a caller can write: writes through ``.data`` or a ``.numpy()`` view
    leave the version unchanged. Returns ``coords``."""
    coords._mmpos_library_owned = True  # type: ignore[attr-defined]
    return coords


def _is_library_owned(coords: torch.Tensor) -> bool:
    return getattr(coords, "_mmpos_library_owned", False)


class TableCache:
    """Small LRU cache of tables keyed by the coordinates' values (plus a caller key).

    A hit compares the coordinates' values with the stored copy, so equal coordinates rebuilt every step hit,
    and coordinates refilled in place (a DataLoader buffer, a write through ``.numpy()`` or ``.data``, which
    leave the version counter unchanged) never get the old table. Only coordinates marked
    :func:`library_owned` are found by identity and version without a comparison. Coordinates that require
    grad (in grad mode) are never cached: their table carries a graph that belongs to one forward.
    """

    def __init__(self, max_entries: int = 16):
        self.max_entries = max_entries
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.RLock()
        self.builds = 0

    def get(self, key: tuple, coords: torch.Tensor, build: Callable[[], _T]) -> _T:
        if torch.compiler.is_compiling():  # the build is traced into the graph; no lookups, locks or copies
            return build()
        if coords.requires_grad and torch.is_grad_enabled():
            table = build()
            with self._lock:
                self.builds += 1
            return table
        with self._lock:  # threads share an encoding's cache (one model served from several threads)
            return self._get(key, coords, build)

    def _get(self, key: tuple, coords: torch.Tensor, build: Callable[[], _T]) -> _T:
        # tables built under inference_mode are inference tensors, unusable by autograd: kept apart
        full_key = key + (tuple(coords.shape), coords.dtype, coords.device, torch.is_inference_mode_enabled())
        owned = _is_library_owned(coords)
        for entry_key, (ref, version, saved, table) in reversed(self._entries.items()):
            if entry_key[0] != full_key:
                continue
            same_object = owned and ref() is coords and version is not None and _version(coords) == version
            if same_object or torch.equal(saved, coords):
                self._entries.move_to_end(entry_key)
                return table
        table = build()
        self.builds += 1
        stored = (weakref.ref(coords), _version(coords), coords.detach().clone(), table)
        self._entries[(frozen_key(full_key), id(table))] = stored
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return table

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __getstate__(self) -> dict[str, Any]:  # deep copies and pickles of an encoding start with an empty cache
        return {"max_entries": self.max_entries, "builds": 0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        TableCache.__init__(self, state["max_entries"])
