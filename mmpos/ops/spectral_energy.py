"""SEGA's attention rule: scale each RoPE pair of the image axes by a factor the latent's spectral energy decides.

SEGA (Rajabi et al. 2026, arXiv 2605.22668, "Spectral-Energy Guided Attention") runs past the training size on an
NTK-scaled ladder and multiplies the cos and sin of every row / column RoPE pair ``k`` by ``m_k``: q and k are scaled
by ``m_k`` on that pair, its share of the logits by ``m_k ** 2``. The ``m_k`` are measured on the denoising latent at
every step. No authors' code is public; re-derived from the ComfyUI port (wildminder/ComfyUI-DyPE: ``src/sega.py``,
``src/sega_base.py``, ``src/patch_utils.py``'s ``apply_sega_to_model``):

* the map: the latent ``[B, C, H, W]`` averaged over the batch and the channels, minus its mean;
* per axis (rows, then columns): ``|FFT|^2`` along the axis, averaged over the other; its first ``n // 2 + 1``
  frequencies (``n``: tokens along the axis, i.e. the latent's frequencies up to the token grid's Nyquist);
  frequency ``i`` in bin ``floor(i * bins / (n // 2))`` of ``bins = max(n // 2, 8)``; the profile ``E`` is the mean
  power per bin (an empty bin: 0);
* the spread: the radial profile (``max(rows, cols) // 2`` rings of the centred 2D power) ``E_iso``; its flatness
  ``SF = exp(mean log E_iso) / mean E_iso``; ``sigma = s_min + (s_max - s_min) (1 - SF ** a_s)``;
* the reference ``m_ref = ratio ** kappa`` (``ratio``: tokens along the axis over the trained tokens, at least 1;
  or ``1 + kappa ln ratio``);
* per pair of the axis (frequency ``f``): ``u = 1 -`` the log-period ``log(2 pi / f)`` normalised to ``[0, 1]`` over
  the axis' pairs (the highest frequency: 1); ``r = log E`` interpolated at bin ``u (bins - 1)``; ``z = (r -
  mean r) / std r`` (unbiased); ``s = tanh(beta z) - mean tanh(beta z)``; ``m = max(m_ref (1 - alpha sigma s),
  m_min)``: a band of high energy gets a smaller factor, one of low energy a larger one.

mmpos computes the radial profile on the latent's own grid: the port hands the token grid's size with the latent's
(twice as large) map, so its ring radii cover a quarter of the spectrum and ``scatter_add_`` reads only the first
quarter of the shifted power. Empty bins keep the port's ``log(1e-8)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

EPS = 1e-8
FORMULAS = ("power", "log")


@dataclass(frozen=True)
class SpectralEnergyScaling:
    """SEGA's per-pair factors (defaults: the port's).

    Args:
        alpha: the redistribution's amplitude (0: every pair ``m_ref``).
        beta: the tanh's sharpness.
        min_scale: the floor of each factor.
        spread_min, spread_max: the spread's range (flat spectrum: ``spread_min``).
        spread_exponent: ``a_s`` of the spread's map.
        kappa: the reference magnitude's coefficient.
        formula: ``"power"`` (``ratio ** kappa``) or ``"log"`` (``1 + kappa ln ratio``).
    """

    alpha: float = 0.15
    beta: float = 1.5
    min_scale: float = 1.0
    spread_min: float = 0.0
    spread_max: float = 1.0
    spread_exponent: float = 1.5
    kappa: float = 0.08
    formula: str = "power"

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "kappa", "spread_min", "spread_max"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.spread_min <= self.spread_max:
            raise ValueError(f"need spread_min <= spread_max, got {self.spread_min!r}, {self.spread_max!r}")
        if not (self.min_scale > 0 and self.spread_exponent > 0):
            raise ValueError(
                f"min_scale and spread_exponent must be positive, got {self.min_scale!r}, {self.spread_exponent!r}"
            )
        if self.formula not in FORMULAS:
            raise ValueError(f"formula must be one of {FORMULAS}, got {self.formula!r}")

    def reference(self, ratio: float) -> float:
        """``m_ref`` for ``ratio`` (this size's tokens along an axis over the trained ones; below 1 counts as 1)."""
        ratio = max(float(ratio), 1.0)
        return ratio**self.kappa if self.formula == "power" else 1.0 + self.kappa * math.log(ratio)

    def spread(self, radial: torch.Tensor) -> torch.Tensor:
        """``sigma`` (a 0-dim tensor) from a radial profile ``[bins]``."""
        energy = radial.clamp(min=EPS)
        flatness = (energy.log().mean().exp() / (energy.mean() + EPS)).clamp(0.0, 1.0)
        return self.spread_min + (self.spread_max - self.spread_min) * (1.0 - flatness**self.spread_exponent)

    def allocation(
        self, energy: torch.Tensor, inv_freq: torch.Tensor, m_ref: float, spread: float | torch.Tensor
    ) -> torch.Tensor:
        """The factors ``[P]`` of one axis' pairs (frequencies ``inv_freq [P]``) from its profile ``energy [bins]``."""
        work = torch.promote_types(energy.dtype, torch.float32)
        if float(spread) <= 0.0 or self.alpha <= 0.0:
            return torch.full(inv_freq.shape, float(m_ref), dtype=work, device=inv_freq.device)
        log_period = torch.log(2.0 * math.pi / inv_freq.to(work).clamp(min=EPS))
        span = log_period.max() - log_period.min()
        unit = (log_period - log_period.min()) / span if float(span) > 1e-6 else torch.zeros_like(log_period)
        bins = energy.shape[0]
        position = (1.0 - unit) * (bins - 1)
        low = position.floor().long().clamp(0, bins - 1)
        high = (low + 1).clamp(0, bins - 1)
        frac = (position - low.to(work)).clamp(0.0, 1.0)
        log_energy = energy.to(work).clamp(min=EPS).log()
        raw = log_energy[low] * (1.0 - frac) + log_energy[high] * frac
        z = (raw - raw.mean()) / raw.std().clamp(min=EPS)
        s = torch.tanh(self.beta * z)
        s = s - s.mean()
        return (m_ref * (1.0 - self.alpha * spread * s)).clamp(min=self.min_scale)

    def factors(
        self,
        latent_map: torch.Tensor,
        grid: tuple[int, int],
        trained: tuple[float, float],
        inv_freqs: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The row and column pairs' factors from ``latent_map [B, H, W]`` (channel-averaged latent) on a token
        ``grid`` (rows, cols) against the ``trained`` one; ``inv_freqs``: the rows' and the columns' frequencies."""
        centred = centred_map(latent_map)
        spread = self.spread(radial_profile(centred, max(grid) // 2))
        out = []
        for axis, (tokens, train, inv_freq) in enumerate(zip(grid, trained, inv_freqs)):
            m_ref = self.reference(tokens / train)
            if m_ref <= 1.0 + 1e-8:
                out.append(torch.ones(inv_freq.shape, dtype=centred.dtype, device=centred.device))
                continue
            energy = axis_profile(centred, axis, int(tokens), max(int(tokens) // 2, 8))
            out.append(self.allocation(energy, inv_freq.to(centred.device), m_ref, spread))
        return out[0], out[1]


def centred_map(latent_map: torch.Tensor) -> torch.Tensor:
    """``[B, H, W]`` -> the batch mean minus its mean, ``[H, W]`` (fp32 at least)."""
    work = torch.promote_types(latent_map.dtype, torch.float32)
    mean = latent_map.to(work).mean(dim=0)
    return mean - mean.mean()


def axis_profile(centred: torch.Tensor, axis: int, tokens: int, bins: int) -> torch.Tensor:
    """Mean power per bin ``[bins]`` of ``centred [H, W]``'s spectrum along ``axis`` (0: rows), its first
    ``tokens // 2 + 1`` frequencies spread over the bins."""
    power = torch.fft.fft(centred, dim=axis).abs().pow(2).mean(dim=1 - axis)[: tokens // 2 + 1]
    last = max(tokens // 2, 1)
    index = (torch.arange(power.shape[0], device=power.device) * bins) // last
    return _bin_mean(power, index.clamp(0, bins - 1), bins)


def radial_profile(centred: torch.Tensor, bins: int) -> torch.Tensor:
    """Mean power per ring ``[bins]`` of ``centred [H, W]``'s centred 2D spectrum (radius normalised to 1)."""
    if bins < 1:
        raise ValueError(f"radial_profile needs at least one bin, got {bins}")
    power = torch.fft.fftshift(torch.fft.fft2(centred)).abs().pow(2)
    rows, cols = centred.shape
    y = torch.arange(rows, dtype=power.dtype, device=power.device) - rows / 2.0
    x = torch.arange(cols, dtype=power.dtype, device=power.device) - cols / 2.0
    radius = torch.sqrt(y[:, None] ** 2 + x[None, :] ** 2)
    radius = radius / (radius.max() + EPS)
    return _bin_mean(power.flatten(), (radius * bins).long().clamp(0, bins - 1).flatten(), bins)


def _bin_mean(values: torch.Tensor, index: torch.Tensor, bins: int) -> torch.Tensor:
    total = torch.zeros(bins, dtype=values.dtype, device=values.device).index_add_(0, index, values)
    count = torch.zeros(bins, dtype=values.dtype, device=values.device).index_add_(0, index, torch.ones_like(values))
    return total / (count + EPS)


def pair_channels(pair_scale: torch.Tensor, head_dim: int, layout: str) -> torch.Tensor:
    """Per-pair factors ``[P]`` as per-channel ones ``[head_dim]`` in ``layout`` (``interleaved``: pair ``p`` on
    channels ``2p, 2p + 1``; ``half``: on ``p, p + P``); channels past ``2P`` get 1."""
    pairs = pair_scale.shape[0]
    if 2 * pairs > head_dim:
        raise ValueError(f"{pairs} pairs do not fit head_dim={head_dim}")
    out = torch.ones(head_dim, dtype=pair_scale.dtype, device=pair_scale.device)
    if layout == "interleaved":
        out[: 2 * pairs] = pair_scale.repeat_interleave(2)
    elif layout == "half":
        out[: 2 * pairs] = torch.cat([pair_scale, pair_scale])
    else:
        raise ValueError(f"layout must be 'interleaved' or 'half', got {layout!r}")
    return out
