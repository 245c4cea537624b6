"""The seam for families whose rotary tables the *pipeline* builds and passes to the transformer's forward
(CogVideoX's and ConsisID's ``forward(image_rotary_emb=...)``): the model has no position module to replace.

``set_pe`` adds a :class:`RotaryInputSeam` to the model (at the family's ``position_attr``) and a pre-forward hook
that hands it the forward's table argument and the latent token grid. The seam re-derives the positions the
pipeline's own table function uses for that grid (:attr:`RotaryInput.positions`, a re-implementation of the
pipeline's builder), checks once per table object that the stock spectrum on those positions gives the tables the
caller passed (a hand-made table, a RIFLEx patch, another pipeline's builder: refused by name instead of silently
replaced), and returns the tables of the spectrum resolved for this forward: the passed tables themselves where
the spectrum is the training one on every axis (so ``"native"`` is stock bit for bit), the family's formula with
mmpos' frequencies (the extrapolation scales the family's own ladder) elsewhere.

A forward without the argument (``image_rotary_emb=None``: a checkpoint without rope) runs as stock.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..positions import identity_key
from .base import STOCK, Family, SpectrumSeam
from .codecs import forward_arg


@dataclass(frozen=True)
class RotaryInput:
    """Where a family's pipeline-built tables come in and how they are rebuilt.

    Args:
        grid: ``grid(config, args, kwargs) -> tuple[int, ...]``: the latent token grid of this forward (the sizes the
            pipeline's builder reads).
        positions: ``positions(config, grid, device) -> (per-axis 1-D float32 positions, per-axis counts)``: the
            positions the pipeline's builder computes its phases on (a builder that slices a longer range after the
            cos / sin, as CogVideoX 1.5's ``grid_type="slice"``, gives the longer range and the counts it keeps).
        build: ``build(seam, positions, counts, spectra, stock) -> tables`` in the stock format (float32; ``stock``:
            the passed tables, for parts that are no rotary table, such as Allegro's integer positions).
        builder: the pipeline function the tables come from (error messages and docs).
        extents: optional ``extents(config, grid) -> per-axis extents`` in the coordinate units of the positions
            (what a schedule compares with its original length); default ``max - min + 1`` of the kept positions.
        arg: the forward argument holding the tables (keyword, or positional at its place in the model's
            ``forward`` signature).
    """

    grid: Callable
    positions: Callable
    build: Callable
    builder: str
    extents: Optional[Callable] = None
    arg: str = "image_rotary_emb"


def rotary_input_family(*, rotary_input: RotaryInput, **fields) -> Family:
    """The :class:`~.base.Family` of a model whose tables come in through ``rotary_input``: its seam (at
    ``mmpos_rotary_input``), the seam's tables and the hook filled in; ``fields``: the rest of the record."""
    return Family(
        position_attr="mmpos_rotary_input",
        tables=rotary_input_tables,
        make_seam=make_rotary_input_seam,
        rotary_input=rotary_input,
        **fields,
    )


class RotaryInputSeam(SpectrumSeam):
    """The stand-in for a pipeline's table builder (see the module docstring). ``config``: the model's config;
    ``arg_index``: the table argument's index in the forward's positional arguments."""

    def __init__(self, family, encoding, config, axes_dims, theta, arg_index: int):
        super().__init__(family, encoding, None, axes_dims, theta)
        self.config = config
        self.arg_index = arg_index
        self._verified = None  # the identity of the last passed tables found to be the builder's
        self.grid = None  # the grid of the forward being built


def make_rotary_input_seam(model, stock, encodings, native, coord_axes) -> RotaryInputSeam:
    """``Family.make_seam`` of a rotary-input family."""
    from . import family_for

    family = family_for(model)
    (encoding,) = encodings
    names = [n for n in inspect.signature(type(model).forward).parameters if n != "self"]
    if family.rotary_input.arg not in names:
        raise TypeError(f"{type(model).__name__}.forward has no argument {family.rotary_input.arg!r}")
    return RotaryInputSeam(
        family,
        encoding,
        model.config,
        family.native_axes_dims(model),
        family.native_theta(model),
        names.index(family.rotary_input.arg),
    )


def rotary_input_tables(seam: RotaryInputSeam, stock, grid):
    """``Family.tables`` of a rotary-input family: the tables of this forward for the caller's ``stock`` tables."""
    spec = seam.family.rotary_input
    device = _first_tensor(stock).device
    seam.grid = grid  # this forward's grid, for builders whose stock tables depend on it beyond the positions
    positions, counts = spec.positions(seam.config, grid, device)
    if seam._verified is None or not seam._verified == identity_key(stock):
        _check_stock(seam, spec, stock, positions, counts, grid)
        seam._verified = identity_key(stock)
    spectra = seam.axis_spectra(extents=lambda: _extents(spec, seam.config, grid, positions, counts))
    if all(s.is_stock for s in spectra):
        return stock
    return _like(spec.build(seam, positions, counts, spectra, stock), stock)


def _extents(spec: RotaryInput, config, grid, positions, counts) -> list[float]:
    if spec.extents is not None:
        return [float(e) for e in spec.extents(config, grid)]
    return [float(p[:n].max() - p[:n].min()) + 1.0 for p, n in zip(positions, counts)]


def replace_rotary_input(seam: RotaryInputSeam, family, model, args, kwargs):
    """The pre-forward hook's part: ``(args, kwargs)`` with the family's table argument replaced by the seam's
    tables; ``None`` (unchanged) where the forward passes no tables."""
    spec, index = family.rotary_input, seam.arg_index
    stock = forward_arg(args, kwargs, spec.arg, index)
    if stock is None:
        return None
    tables = seam(stock, spec.grid(model.config, args, kwargs))
    if spec.arg in kwargs or len(args) <= index:
        return args, {**kwargs, spec.arg: tables}
    return args[:index] + (tables,) + args[index + 1 :], kwargs


def resize_crop_region(grid: tuple[int, int], base_width: int, base_height: int):
    """The pipelines' ``get_resize_crop_region_for_grid`` (CogVideoX, HunyuanDiT: a square base): the grid's aspect
    fitted into the base grid, centred: ``((top, left), (bottom, right))``."""
    h, w = grid
    if h / w > base_height / base_width:
        resize_height, resize_width = base_height, int(round(base_height / h * w))
    else:
        resize_width, resize_height = base_width, int(round(base_width / w * h))
    top, left = int(round((base_height - resize_height) / 2.0)), int(round((base_width - resize_width) / 2.0))
    return (top, left), (top + resize_height, left + resize_width)


def fitted_positions(start: int, stop: int, count: int, device) -> torch.Tensor:
    """The builders' ``linspace(start, stop (n - 1) / n, n)`` float32: ``count`` positions spread over the crop
    ``[start, stop)`` (``numpy.linspace(..., endpoint=False)`` when ``start = 0``)."""
    return torch.linspace(start, stop * (count - 1) / count, count, device=device, dtype=torch.float32)


def _check_stock(seam, spec: RotaryInput, stock, positions, counts, grid) -> None:
    """Refuse tables that are not the pipeline builder's for ``grid`` (compared in their dtype, to a rounding)."""
    expected = _like(spec.build(seam, positions, counts, [STOCK] * len(positions), stock), stock)
    flat_stock, flat_expected = _tensors(stock), _tensors(expected)
    shapes_match = len(flat_stock) == len(flat_expected) and all(
        a.shape == b.shape for a, b in zip(flat_stock, flat_expected)
    )
    if shapes_match:
        worst = max(
            float((a.float() - b.float()).abs().max()) if a.numel() else 0.0 for a, b in zip(flat_stock, flat_expected)
        )
        if worst <= 1e-5 + torch.finfo(flat_stock[0].dtype).eps:
            return
        found = f"differs by up to {worst:.3g}"
    else:
        found = f"has shapes {[tuple(t.shape) for t in flat_stock]}, expected {[tuple(t.shape) for t in flat_expected]}"
    raise ValueError(
        f"{spec.arg} {found} from what {spec.builder} builds for the latent grid {tuple(grid)}: set_pe "
        f"({seam.family.name}) rebuilds these tables from the pipeline's positions and would silently replace a "
        "custom table; pass the stock pipeline's tables (express RIFLEx / NTK / PI as set_pe(..., "
        "extrapolation=...)) or call restore() first"
    )


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for item in value for t in _tensors(item)]


def _first_tensor(value) -> torch.Tensor:
    tensors = _tensors(value)
    if not tensors:
        raise ValueError("the rotary tables hold no tensor")
    return tensors[0]


def _like(value, reference):
    """``value`` (a tensor or a tuple of them) in the dtype and on the device of ``reference``'s tensors."""
    if isinstance(value, torch.Tensor):
        return value.to(reference.device, reference.dtype)
    return type(reference)(_like(v, r) for v, r in zip(value, reference))
