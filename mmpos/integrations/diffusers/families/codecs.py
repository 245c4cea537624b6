"""Table formats several families share: each rebuilds a stock rotary table from per-axis frequencies.

Every function takes the positions as the stock module holds them and one :class:`~.base.AxisSpectrum` per axis;
an axis whose spectrum is the stock one gets the stock ladder computed with the stock expression (so the result
is the stock table bit for bit), any other axis mmpos' float64 frequencies rounded to the stock dtype.

    pair layout of ``cos_sin_repeated`` (Flux, HunyuanVideo, CogView): [c0 c0 c1 c1 ...] per axis, axes in order
    ``complex_pairs`` (Wan, Qwen-Image, Lumina): [e^{i p0} e^{i p1} ...] per axis, axes in order
    ``rotation_matrices`` (HiDream, Kandinsky 6): [[c0 -s0] [s0 c0]] [[c1 -s1] [s1 c1]] ... per pair

Modules that precompute a table on the CPU and index it by integer ids (Z-Image, Lumina 2, Qwen-Image 2.1) are
matched by :class:`PrecomputedRows`: the same CPU arithmetic (CPU and CUDA cos / sin differ in the last bit), kept
on the device, extended past the stock range instead of failing there.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .base import AxisSpectrum


def ladder(dim: int, theta: float, dtype: torch.dtype, device=None) -> torch.Tensor:
    """``get_1d_rotary_pos_embed``'s frequencies ``1 / theta ** (2i / dim)`` ``[dim / 2]`` in ``dtype``."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype, device=device)[: dim // 2] / dim))


def axis_frequencies(
    spectrum: AxisSpectrum, dim: int, theta: float, dtype: torch.dtype, device=None, stock_ladder=ladder
) -> torch.Tensor:
    """The stock ladder (``stock_ladder(dim, theta, dtype, device)``) or ``spectrum.inv_freq`` in ``dtype``."""
    if spectrum.inv_freq is None:
        return stock_ladder(dim, theta, dtype, device)
    return spectrum.inv_freq.to(device=device, dtype=dtype)


def _scaled(x: torch.Tensor, magnitude) -> torch.Tensor:
    """``x * magnitude``; a 0-d tensor magnitude (a compiled graph's published spectrum) is always applied."""
    if isinstance(magnitude, torch.Tensor):
        return x * magnitude.to(x.dtype)
    return x if magnitude == 1.0 else x * magnitude


def cos_sin_repeated(
    pos: torch.Tensor,
    spectra: Sequence[AxisSpectrum],
    axes_dims: Sequence[int],
    theta: float,
    freqs_dtype: torch.dtype = torch.float64,
    stock_ladder=ladder,
):
    """Flux-style ``(cos, sin)`` ``[S, D]`` float32, each pair's value repeated (``repeat_interleave_real``), axes
    concatenated: ``get_1d_rotary_pos_embed(d, pos[:, a], theta, use_real=True, repeat_interleave_real=True)``
    per axis. ``pos``: ``[S, A]`` (float32 as the stock modules read ids)."""
    cos_out, sin_out = [], []
    for axis, (dim, spectrum) in enumerate(zip(axes_dims, spectra)):
        freqs = axis_frequencies(spectrum, dim, theta, freqs_dtype, pos.device, stock_ladder)
        phases = torch.outer(pos[:, axis], freqs)
        cos_out.append(_scaled(phases.cos(), spectrum.magnitude).repeat_interleave(2, dim=1).float())
        sin_out.append(_scaled(phases.sin(), spectrum.magnitude).repeat_interleave(2, dim=1).float())
    return torch.cat(cos_out, dim=-1), torch.cat(sin_out, dim=-1)


def same_spectra(a: Sequence[AxisSpectrum], b: Sequence[AxisSpectrum]) -> bool:
    """Whether two per-axis spectra give the same tables (same ladder or frequencies, same magnitudes)."""

    def same(x, y):
        if x.magnitude != y.magnitude or (x.inv_freq is None) != (y.inv_freq is None):
            return False
        return x.inv_freq is None or x.inv_freq is y.inv_freq or torch.equal(x.inv_freq, y.inv_freq)

    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def cos_sin_repeated_blocks(
    pos: torch.Tensor,
    blocks: Sequence[tuple[int, Sequence[AxisSpectrum]]],
    axes_dims: Sequence[int],
    theta: float,
    freqs_dtype: torch.dtype = torch.float64,
    stock_ladder=ladder,
):
    """:func:`cos_sin_repeated` over consecutive row blocks of ``pos [S, A]``, each with its own spectra
    (``blocks``: ``[(rows, spectra), ...]``, rows summing to ``S``; e.g. text rows on the training spectrum, then
    the image rows on the schedule's). Neighbouring blocks with the same spectra are computed as one. Each row's
    values are those of :func:`cos_sin_repeated` on the whole ``pos`` with that row's spectra (rows are
    independent), so an all-stock call is the stock table bit for bit."""
    if sum(rows for rows, _ in blocks) != pos.shape[0]:
        raise ValueError(f"blocks cover {sum(rows for rows, _ in blocks)} rows; pos has {pos.shape[0]}")
    merged: list[list] = []
    for rows, spectra in [block for block in blocks if block[0]] or blocks[:1]:
        if merged and same_spectra(merged[-1][1], spectra):
            merged[-1][0] += rows
        else:
            merged.append([rows, spectra])
    if len(merged) == 1:
        return cos_sin_repeated(pos, merged[0][1], axes_dims, theta, freqs_dtype, stock_ladder)
    parts = [
        cos_sin_repeated(chunk, spectra, axes_dims, theta, freqs_dtype, stock_ladder)
        for chunk, (_, spectra) in zip(pos.split([rows for rows, _ in merged]), merged)
    ]
    return torch.cat([c for c, _ in parts], dim=0), torch.cat([s for _, s in parts], dim=0)


def complex_pairs(
    pos: torch.Tensor,
    spectra: Sequence[AxisSpectrum],
    axes_dims: Sequence[int],
    theta: float,
    freqs_dtype: torch.dtype = torch.float64,
    stock_ladder=ladder,
    phase_dtype=None,
    rows=None,
) -> torch.Tensor:
    """Complex ``[S, D / 2]`` tables ``polar(1, pos * inv_freq)`` per axis, concatenated (the stock modules'
    ``torch.polar(torch.ones_like(freqs), freqs)``), complex64 for float32 phases, complex128 for float64.

    ``phase_dtype``: the phases are rounded to it before ``polar`` (Z-Image: float64 phases, complex64 tables);
    default ``freqs_dtype``. ``rows``: a :class:`PrecomputedRows` giving the stock axes (integer ``pos``); while
    ``torch.compile`` traces, every axis is computed here instead (the table's range is data-dependent)."""
    phase_dtype = phase_dtype or freqs_dtype
    gathering = rows is not None and not torch.compiler.is_compiling()
    stock = [axis for axis, spectrum in enumerate(spectra) if spectrum.is_stock] if gathering else []
    gathered = rows.gather(pos, stock) if stock else {}
    out = []
    for axis, (dim, spectrum) in enumerate(zip(axes_dims, spectra)):
        if axis in gathered:
            out.append(gathered[axis])
            continue
        freqs = axis_frequencies(spectrum, dim, theta, freqs_dtype, pos.device, stock_ladder)
        phases = torch.outer(pos[:, axis].to(freqs_dtype), freqs).to(phase_dtype)
        out.append(torch.polar(_scaled(torch.ones_like(phases), spectrum.magnitude), phases))
    return torch.cat(out, dim=-1)


def rotation_matrices(cos: torch.Tensor, sin: torch.Tensor, magnitude: float = 1.0) -> torch.Tensor:
    """``[..., P]`` cos and sin -> ``[..., P, 2, 2]`` rotation matrices ``[[cos, -sin], [sin, cos]]`` per pair, scaled
    by ``magnitude`` (HiDream, Kandinsky 6: the processors compute ``out = R @ (x0, x1)``)."""
    cos, sin = _scaled(cos, magnitude), _scaled(sin, magnitude)
    return torch.stack([cos, -sin, sin, cos], dim=-1).unflatten(-1, (2, 2))


def cos_sin_text_then_image(seam, pos: torch.Tensor, image_extents, freqs_dtype: torch.dtype = torch.float64):
    """Flux-style tables for ids ``pos [S, A]`` whose first ``seam.text_tokens`` rows are text (Chroma, LongCat,
    Krea2: ``cat(txt_ids, img_ids)``): the text rows on the training spectrum, the others on the spectrum resolved
    at ``image_extents`` (per axis, from the image tokens only; ``None``: the training extent)."""
    text = min(max(int(getattr(seam, "text_tokens", 0)), 0), pos.shape[0])
    text_spectra = seam.training_spectra()
    image_spectra = seam.axis_spectra(extents=image_extents)  # last: seam.encodings[0].spectrum is the image's
    return cos_sin_repeated_blocks(
        pos, [(text, text_spectra), (pos.shape[0] - text, image_spectra)], seam.axes_dims, seam.theta, freqs_dtype
    )


def note_text_tokens(count):
    """A ``Family.check_inputs`` that records ``count(args, kwargs)`` (the forward's text tokens, which the model
    puts first in the ids it hands its rope module) as ``seam.text_tokens`` for :func:`cos_sin_text_then_image`."""

    def check_inputs(seam, args, kwargs) -> None:
        seam.text_tokens = int(count(args, kwargs))

    return check_inputs


def forward_arg(args, kwargs, name: str, index: int):
    """The forward argument ``name`` (keyword, or ``args[index]``), or ``None``."""
    return kwargs.get(name, args[index] if len(args) > index else None)


def ids_positions(ids: torch.Tensor, num_axes: int) -> torch.Tensor:
    """Flux-style ``ids [S, A]`` as the stock modules read them (``ids.float()``), after checking the shape."""
    if ids.dim() != 2 or ids.shape[-1] != num_axes:
        raise ValueError(
            f"ids have shape {tuple(ids.shape)}; expected [S, {num_axes}] (one row per token, one "
            "column per rotary axis)"
        )
    return ids.float()


def masked_extents(pos: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """``max - min + 1`` per axis of the rows of ``pos [S, A]`` where ``mask [S]`` (one device sync, no
    data-dependent shapes)."""
    big = torch.finfo(pos.dtype).max
    high = torch.where(mask[:, None], pos, -big).amax(dim=0)
    low = torch.where(mask[:, None], pos, big).amin(dim=0)
    return (high.double() - low.double() + 1).tolist()


def ids_rows(name: str, index: int):
    """``count(args, kwargs)`` for :func:`note_text_tokens`: the rows of the forward's ``name`` ids tensor
    (``[S, A]``, or the deprecated ``[1, S, A]``)."""

    def count(args, kwargs) -> int:
        ids = forward_arg(args, kwargs, name, index)
        return ids.shape[-2] if isinstance(ids, torch.Tensor) and ids.dim() >= 2 else 0

    return count


def scheduled(seam) -> bool:
    """:attr:`~.base.SpectrumSeam.scheduled`: the seam's spectrum follows a schedule (only then does a forward need
    its image tokens' extent, a host read ``torch.compile(fullgraph=True)`` cannot trace)."""
    return seam.scheduled


class PrecomputedRows:
    """The stock table of a module that precomputes ``polar(1, positions x ladder)`` on the CPU and indexes it by
    integer ids, rebuilt on demand: per axis, the rows for the positions seen so far (grown, never clamped),
    computed on the CPU with the stock expression and kept on the ids' device.

        table[p] = polar(1, (p.to(freqs_dtype) * stock_ladder(dim, theta, freqs_dtype)).to(phase_dtype))

    Args:
        axes_dims, theta: the native spectrum.
        freqs_dtype / phase_dtype / stock_ladder: as the stock module computes its table (see :func:`complex_pairs`).
    """

    def __init__(
        self,
        axes_dims: Sequence[int],
        theta: float,
        freqs_dtype: torch.dtype = torch.float64,
        phase_dtype=None,
        stock_ladder=ladder,
    ):
        self.axes_dims, self.theta = tuple(int(d) for d in axes_dims), float(theta)
        self.freqs_dtype, self.phase_dtype, self.stock_ladder = freqs_dtype, phase_dtype or freqs_dtype, stock_ladder
        self._tables: dict = {}  # (axis, device) -> (first position, rows [N, d / 2])

    def gather(self, pos: torch.Tensor, axes: Sequence[int]) -> dict:
        """``{axis: rows [S, d / 2]}`` of ``pos [S, A]`` (integer-valued) for ``axes``; one device sync."""
        if pos.is_floating_point() and not bool((pos == pos.round()).all()):
            raise ValueError("positions must be integers here (the stock module indexes a table by them)")
        pos = pos.long()
        bounds = torch.stack([pos.amin(dim=0), pos.amax(dim=0)]).tolist() if pos.shape[0] else None
        out = {}
        for axis in axes:
            if bounds is None:
                out[axis] = self._table(axis, 0, 1, pos.device)[1][:0]
                continue
            first, table = self._table(axis, bounds[0][axis], bounds[1][axis] + 1, pos.device)
            out[axis] = table[pos[:, axis] - first]
        return out

    def _table(self, axis: int, lo: int, hi: int, device) -> tuple[int, torch.Tensor]:
        key = (axis, torch.device(device))
        cached = self._tables.get(key)
        if cached is not None:
            first, table = cached
            if first <= lo and hi <= first + table.shape[0]:
                return cached
            lo, hi = min(lo, first), max(hi, first + table.shape[0])
        lo, hi = min(lo, 0), max(hi, 1)  # from 0 at least, as the stock tables are
        freqs = self.stock_ladder(self.axes_dims[axis], self.theta, self.freqs_dtype, "cpu")
        phases = torch.outer(torch.arange(lo, hi).to(self.freqs_dtype), freqs).to(self.phase_dtype)
        cached = self._tables[key] = (lo, torch.polar(torch.ones_like(phases), phases).to(device))
        return cached


def precomputed_rows(seam, **stock) -> PrecomputedRows:
    """The seam's :class:`PrecomputedRows` (made on first use with ``stock``'s arithmetic)."""
    rows = getattr(seam, "_precomputed_rows", None)
    if rows is None:
        rows = seam._precomputed_rows = PrecomputedRows(seam.axes_dims, seam.theta, **stock)
    return rows
