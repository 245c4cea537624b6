"""Saliency of a pasted region, pluggable: ``provider(image [1, 3, H, W] in [0, 1], mask [H, W] bool) -> [H, W]``.

- :class:`SpectralResidualSaliency` (default): Hou & Zhang's spectral residual, no weights, runs offline.
- :class:`FeatureEnergySaliency`: channel energy (mean |feature|) of a backbone's feature map, as LooseRoPE's
  reference uses a detector's P2 FPN level; any module returning ``[1, C, h, w]`` (or a list of them) works,
  e.g. a timm ``features_only`` model (:meth:`FeatureEnergySaliency.from_timm`) when its weights are available.
- :class:`UniformSaliency`: one value everywhere (every pasted token in the same bin).

Every provider sees the image with the outside of the mask zeroed, and its raw map is normalised inside the mask
(:func:`normalise_in_mask`), so values outside the mask never decide a bin.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def normalise_in_mask(raw: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Min-max normalise ``raw`` over the mask to [0, 1]; outside the mask takes the inside minimum (0)."""
    inside = raw[mask]
    low, high = inside.min(), inside.max()
    scaled = (raw - low) / (high - low) if high > low else torch.full_like(raw, 0.5)
    return torch.where(mask, scaled.clamp(0, 1), torch.zeros_like(raw))


def gaussian_blur(values: torch.Tensor, size: int, sigma: float | None = None) -> torch.Tensor:
    """Separable Gaussian blur of an ``[H, W]`` map (reflect padding); ``size <= 1`` returns the input."""
    if size <= 1:
        return values
    if size % 2 == 0:
        raise ValueError(f"blur size must be 0, 1 or odd (the map keeps its shape), got {size}")
    sigma = sigma or 0.3 * ((size - 1) * 0.5 - 1) + 0.8  # OpenCV's default for a given kernel size
    x = torch.arange(size, dtype=torch.float64, device=values.device) - (size - 1) / 2
    kernel = torch.exp(-(x**2) / (2 * sigma**2))
    kernel = (kernel / kernel.sum()).to(values.dtype)
    pad = size // 2
    out = values[None, None]
    mode = "reflect" if min(values.shape) > pad else "replicate"
    out = F.conv2d(F.pad(out, (pad, pad, 0, 0), mode=mode), kernel.view(1, 1, 1, -1))
    out = F.conv2d(F.pad(out, (0, 0, pad, pad), mode=mode), kernel.view(1, 1, -1, 1))
    return out[0, 0]


def _masked(image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return image * mask.to(image.dtype)


class SpectralResidualSaliency:
    """Spectral-residual saliency (Hou & Zhang, CVPR 2007) computed at ``size`` pixels, upsampled back."""

    def __init__(self, size: int = 64, blur: int = 9):
        self.size, self.blur = size, blur

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        gray = _masked(image, mask)[0].float().mean(0)
        small = F.interpolate(gray[None, None], size=(self.size, self.size), mode="area")[0, 0]
        spectrum = torch.fft.fft2(small)
        log_amplitude = torch.log(spectrum.abs() + 1e-8)
        residual = log_amplitude - F.avg_pool2d(log_amplitude[None, None], 3, 1, 1, count_include_pad=False)[0, 0]
        saliency = torch.fft.ifft2(torch.exp(residual + 1j * torch.angle(spectrum))).abs() ** 2
        saliency = gaussian_blur(saliency, self.blur)
        full = F.interpolate(saliency[None, None], size=gray.shape, mode="bilinear", align_corners=False)[0, 0]
        return normalise_in_mask(full, mask)


class UniformSaliency:
    def __init__(self, value: float = 0.5):
        self.value = value

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, torch.full(mask.shape, self.value), torch.zeros(mask.shape))


class FeatureEnergySaliency:
    """Mean absolute feature over channels of ``model(image)`` (level ``level`` if it returns a list)."""

    def __init__(self, model: torch.nn.Module, level: int = 0, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
        self.model, self.level = model.eval(), level
        self.mean, self.std = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)

    @classmethod
    def from_timm(cls, name: str, checkpoint: str | None = None, pretrained: bool = False, level: int = 0):
        """A timm ``features_only`` backbone; ``checkpoint`` is a local weights file (no download needed)."""
        import timm

        kwargs = {"pretrained_cfg_overlay": {"file": checkpoint}} if checkpoint else {}
        model = timm.create_model(name, pretrained=pretrained or bool(checkpoint), features_only=True, **kwargs)
        return cls(model, level)

    @torch.no_grad()
    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        parameter = next(self.model.parameters())
        x = (_masked(image, mask) - self.mean) / self.std
        features = self.model(x.to(parameter.device, parameter.dtype))
        if isinstance(features, (list, tuple)):
            features = features[self.level]
        energy = features.float().abs().mean(1, keepdim=True)
        full = F.interpolate(energy, size=mask.shape, mode="bilinear", align_corners=False)[0, 0].cpu()
        return normalise_in_mask(full, mask)


PROVIDERS = {"spectral_residual": SpectralResidualSaliency, "uniform": UniformSaliency}


def make_saliency(spec):
    """A provider from a name in :data:`PROVIDERS`, ``"timm:<model>[@<checkpoint>]"``, or a callable."""
    if callable(spec):
        return spec
    if isinstance(spec, str) and spec.startswith("timm:"):
        name, _, checkpoint = spec[5:].partition("@")
        return FeatureEnergySaliency.from_timm(name, checkpoint or None)
    if spec not in PROVIDERS:
        raise ValueError(
            f"saliency={spec!r}: expected one of {sorted(PROVIDERS)}, 'timm:<model>[@<checkpoint>]' "
            "or a callable provider"
        )
    return PROVIDERS[spec]()
