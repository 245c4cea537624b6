"""Mochi 1 (``MochiTransformer3DModel``): ``MochiRoPE`` reading the learned ``pos_frequencies``.

The stock rope is RoPE-Mixed (Heo et al. 2024) with trained frequencies: the model holds the parameter
``pos_frequencies`` ``[3, heads, head_dim / 2]`` and calls ``rope(pos_frequencies, frames, rows, cols)`` once per
forward. Each token gets ``(t, y, x)``: the frame index ``t = 0, 1, ...`` and the centres of ``rows x cols`` cells
tiling a fixed area (``192 x 192`` position units: cells ``sqrt(192 * 192 / (rows * cols))`` wide), and pair ``i`` of
head ``h`` turns by ``t f[0, h, i] + y f[1, h, i] + x f[2, h, i]`` (fp32, autocast off); ``(cos, sin)``
``[S, heads, head_dim / 2]``, which the stock processor applies to the interleaved pairs of q and k.

**Extrapolation.** The three axes do not own channels (every pair reads all three), so a policy acts on the learned
frequencies through their time components:

* *Rows and columns* are area-normalised: at a given aspect the token grid spans the same extent at every resolution
  (built-in position interpolation), so the extent the model was trained on is never exceeded and a spatial preset has
  nothing to act on. The row and column entries of ``extrapolation=`` are a documented no-op (the conformance presets
  pass them; every result stays the stock table), the time entry is what changes the tables.
* *Time grows* with the clip (163 frames, 28 latent frames, in training). Each learned time frequency ``f = f[0, h,
  i]`` is scaled by what the policy does to a ladder frequency of the same magnitude: the ladder is RoPE-Mixed's
  initialisation, ``dim = head_dim``, ``theta = 10000`` (:data:`LADDER_THETA`); with ``r_j = policy_j / ladder_j`` at
  its pairs, ``ln r`` is interpolated linearly in ``ln |f|`` between neighbouring pairs and held at the ends outside
  the ladder's range (:func:`learned_time_frequencies`). PI: ``r = 1 / s`` everywhere, i.e. time positions divided by
  ``s`` (exact); NTK: ``r = s ** (-2 u / (dim - 2))`` with ``u = -dim ln |f| / (2 ln theta)`` the continuous pair
  index (exact inside the ladder's range); YaRN, vision YaRN and their DyPE schedules: exact at the ladder's
  magnitudes, geometric between neighbouring pairs. The time policy's magnitude (YaRN's attention factor) multiplies
  every pair's ``cos`` and ``sin``. RIFLEx names one pair ``k`` of a ladder, which learned frequencies do not have: it
  is refused.

``timestep`` runs backwards: the pipeline passes ``1000 (1 - sigma)`` (its scheduler's ``invert_sigmas``).
"""

from __future__ import annotations

import torch

from ....spectrum.extrapolation import RIFLEx, make_policy
from ....spectrum.frequencies import rope_inv_freq
from ....spectrum.schedule import is_schedule
from . import register_family
from .base import AxisSpectrum, Family

LADDER_THETA = 10000.0  # RoPE-Mixed's initial ladder, whose magnitudes the learned time frequencies are read against


def _axes_dims(model) -> tuple[int, int, int]:
    """Every pair reads every axis: each axis' reference ladder has ``head_dim`` channels."""
    head_dim = int(model.config.attention_head_dim)
    return (head_dim, head_dim, head_dim)


def time_ratio(learned: torch.Tensor, time: AxisSpectrum, dim: int, theta: float = LADDER_THETA) -> torch.Tensor:
    """What the time spectrum does to each learned time frequency (module docstring).

    Args:
        learned: ``[..., P]`` the time components ``pos_frequencies[0]`` (any sign; read in float64, no grad).
        time: the time axis' :class:`~.base.AxisSpectrum` (``inv_freq`` ``[dim / 2]`` over the ladder, or ``None``).
        dim, theta: the reference ladder ``theta ** (-2 j / dim)``.
    Returns:
        ``[..., P]`` float64 on the CPU: ``r(|learned|)`` (ones where ``time.inv_freq`` is ``None``).
    """
    x = torch.log(learned.detach().to(device="cpu", dtype=torch.float64).abs())  # -inf at 0: the slowest's ratio
    if time.inv_freq is None:
        return torch.ones_like(x)
    ladder = rope_inv_freq(dim, theta)
    log_ratio = torch.log(time.inv_freq.to(torch.float64) / ladder)
    return torch.exp(_interp(x, torch.log(ladder).flip(0), log_ratio.flip(0)))


def learned_time_frequencies(
    learned: torch.Tensor, time: AxisSpectrum, dim: int, theta: float = LADDER_THETA
) -> torch.Tensor:
    """``[..., P]`` float64: the learned time frequencies ``learned`` under the time spectrum, ``learned * r``
    (:func:`time_ratio`)."""
    return learned.detach().to(device="cpu", dtype=torch.float64) * time_ratio(learned, time, dim, theta)


def _interp(x: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear ``fp(xp)`` at ``x`` (``xp`` ascending), held at the ends."""
    if xp.numel() == 1:
        return fp.expand_as(x).clone()
    xc = x.clamp(float(xp[0]), float(xp[-1]))
    right = torch.searchsorted(xp, xc.contiguous()).clamp(1, xp.numel() - 1)
    x0, x1, f0, f1 = xp[right - 1], xp[right], fp[right - 1], fp[right]
    return f0 + (f1 - f0) * (xc - x0) / (x1 - x0)


def mochi_tables(seam, pos_frequencies, num_frames, height, width, device=None, dtype=None):
    """The stock output ``(cos, sin)`` ``[F * H * W, heads, head_dim / 2]``: the stock module itself while the time
    axis keeps its trained spectrum (bit for bit), else its arithmetic on the extrapolated time frequencies."""
    stock = seam.stock[0]
    spectra = seam.axis_spectra(extents=[float(num_frames), float(height), float(width)])
    time = spectra[seam.family.time_axis]
    if time.is_stock:  # rows and columns are area-normalised: their entries have nothing to act on
        return stock(pos_frequencies, num_frames, height, width, device=device, dtype=dtype)
    freqs = pos_frequencies
    if time.inv_freq is not None:  # the time components scaled, rows and columns as trained
        ratio = time_ratio(pos_frequencies[0], time, seam.axes_dims[0]).to(pos_frequencies.device, torch.float32)
        freqs = torch.cat([(pos_frequencies[0].float() * ratio)[None], pos_frequencies[1:].float()])
    pos = stock._get_positions(num_frames, height, width, device, dtype)
    cos, sin = stock._create_rope(freqs, pos)
    if time.magnitude != 1.0:
        cos, sin = cos * time.magnitude, sin * time.magnitude
    return cos, sin


def check_extrapolation(extrapolation) -> None:
    """Refuse RIFLEx on the time axis (``set_pe``): it names a ladder pair, the learned frequencies have none."""
    entries = extrapolation if isinstance(extrapolation, (list, tuple)) else [extrapolation]
    for entry in entries:
        if entry is not None and not is_schedule(entry) and isinstance(make_policy(entry), RIFLEx):
            raise ValueError(
                "extrapolation: RIFLEx lowers pair k of a frequency ladder; Mochi's time frequencies are learned per "
                "head (pos_frequencies), with no pair k: use pi, ntk, yarn or a DyPE schedule on the time axis"
            )


MOCHI = register_family(
    Family(
        name="mochi",
        classes=("diffusers.models.transformers.transformer_mochi:MochiTransformer3DModel",),
        position_attr="rope",
        axis_names=("t", "row", "col"),
        native_axes_dims=_axes_dims,
        native_theta=lambda model: LADDER_THETA,
        image_axes=(1, 2),
        time_axis=0,
        tables=mochi_tables,
        timestep_per_sigma=-1000.0,  # MochiPipeline passes 1000 (1 - sigma) (invert_sigmas)
        timestep_at_zero_sigma=1000.0,
        timestep_arg=("timestep", 2),
        pipelines=("MochiPipeline",),
        train_size=638,  # 848 x 480 ~ 638 x 638
        pixels_per_token=16,  # 8x VAE, patch 2
        notes=(
            "learned per-head pos_frequencies mixing (t, row, col); rows and columns area-normalised (spatial "
            "presets: no-op); time presets scale each learned frequency as the ladder's of its magnitude"
        ),
        extras={"check_extrapolation": check_extrapolation},
    )
)
