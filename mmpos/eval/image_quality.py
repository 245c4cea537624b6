"""Image quality against a ground truth: PSNR and SSIM (Wang et al. 2004) in torch, no downloaded weights.

Images are ``[N, C, H, W]`` floats in ``[0, data_range]``; both functions return one value per image ``[N]``.
SSIM uses the standard 11-tap Gaussian window (sigma 1.5), ``K1 = 0.01``, ``K2 = 0.03``, over the valid region.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _check_pair(prediction: torch.Tensor, target: torch.Tensor) -> None:
    if prediction.shape != target.shape or prediction.dim() != 4:
        raise ValueError(
            f"prediction and target must both be [N, C, H, W], got {tuple(prediction.shape)} and {tuple(target.shape)}"
        )


def psnr(prediction: torch.Tensor, target: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """``10 log10(data_range^2 / MSE)`` per image ``[N]`` (inf for identical images)."""
    _check_pair(prediction, target)
    mse = (prediction - target).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(data_range**2 / mse)


def gaussian_window(size: int = 11, sigma: float = 1.5, dtype=torch.float64) -> torch.Tensor:
    """``[size, size]`` normalised Gaussian window."""
    offsets = torch.arange(size, dtype=dtype) - (size - 1) / 2
    line = torch.exp(-(offsets**2) / (2 * sigma**2))
    line = line / line.sum()
    return line[:, None] * line[None, :]


def ssim(
    prediction: torch.Tensor, target: torch.Tensor, data_range: float = 1.0, window: int = 11, sigma: float = 1.5
) -> torch.Tensor:
    """Mean SSIM per image ``[N]`` (channels averaged), Gaussian-weighted local statistics."""
    _check_pair(prediction, target)
    if min(prediction.shape[-2:]) < window:
        raise ValueError(f"images must be at least window={window} pixels on a side, got {tuple(prediction.shape)}")
    channels = prediction.shape[1]
    kernel = gaussian_window(window, sigma, prediction.dtype).to(prediction.device).expand(channels, 1, -1, -1)

    def blur(x):
        return F.conv2d(x, kernel, groups=channels)

    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mu_x, mu_y = blur(prediction), blur(target)
    var_x = blur(prediction * prediction) - mu_x**2
    var_y = blur(target * target) - mu_y**2
    cov = blur(prediction * target) - mu_x * mu_y
    ratio = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return ratio.flatten(1).mean(1)
