"""Images and masks: conversion to tensors, token-grid checks, masks in token space, file IO.

Images are ``[B, 3, H, W]`` float in [0, 1]; masks are ``[H, W]`` bool (True = selected). A token covers
``token_pixels x token_pixels`` pixels (16 for FLUX.1: VAE factor 8 times 2x2 packing).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mmpos._atomic import written_atomically


def check_token_grid(name: str, height: int, width: int, token_pixels: int = 16) -> None:
    if height % token_pixels or width % token_pixels or height <= 0 or width <= 0:
        raise ValueError(
            f"{name} is {height}x{width} pixels; both sides must be positive multiples of the "
            f"{token_pixels}-pixel token grid (resize or crop to e.g. "
            f"{max(token_pixels, height // token_pixels * token_pixels)}x"
            f"{max(token_pixels, width // token_pixels * token_pixels)})"
        )


def as_image_batch(name: str, image) -> torch.Tensor:
    """PIL image, ``[H, W, 3]`` uint8/float array, or ``[3, H, W]`` / ``[B, 3, H, W]`` tensor in [0, 1]."""
    if image is None:
        raise ValueError(f"{name} is required")
    if hasattr(image, "convert"):  # PIL
        image = np.array(image.convert("RGB"))
    if isinstance(image, np.ndarray):
        array = image.astype(np.float32) / 255.0 if image.dtype == np.uint8 else image.astype(np.float32)
        if array.ndim != 3 or array.shape[-1] != 3:
            raise ValueError(f"{name}: expected an [H, W, 3] array, got shape {array.shape}")
        image = torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)
    if not isinstance(image, torch.Tensor):
        raise TypeError(f"{name} must be a PIL image, numpy array or tensor, got {type(image).__name__}")
    if image.ndim == 3:
        image = image[None]
    if image.ndim != 4 or image.shape[1] != 3:
        raise ValueError(f"{name}: expected [3, H, W] or [B, 3, H, W], got {tuple(image.shape)}")
    image = image.float()
    if image.min() < 0 or image.max() > 1:
        raise ValueError(f"{name} must have values in [0, 1], got [{image.min():.3g}, {image.max():.3g}]")
    return image


def as_mask(name: str, mask, size: tuple[int, int] | None = None) -> torch.Tensor:
    """``[H, W]`` bool from a PIL image (L or RGB, > 127), array or tensor (> 0.5); checks ``size`` and emptiness."""
    if mask is None:
        raise ValueError(f"{name} is required")
    if hasattr(mask, "convert"):
        mask = torch.from_numpy(np.array(mask.convert("L"))).float() / 255.0
    elif isinstance(mask, np.ndarray):
        mask = torch.from_numpy(mask.astype(np.float32) / (255.0 if mask.dtype == np.uint8 else 1.0))
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a PIL image, numpy array or tensor, got {type(mask).__name__}")
    mask = mask.squeeze()
    if mask.ndim != 2:
        raise ValueError(f"{name} must be a single-channel [H, W] mask, got shape {tuple(mask.shape)}")
    mask = mask > 0.5 if mask.dtype != torch.bool else mask
    if size is not None and tuple(mask.shape) != tuple(size):
        raise ValueError(f"{name} is {mask.shape[0]}x{mask.shape[1]}; expected the image size {size[0]}x{size[1]}")
    if not bool(mask.any()):
        raise ValueError(f"{name} is empty (no pixel selected); expected at least one selected pixel")
    return mask


def mask_to_tokens(mask: torch.Tensor, grid: tuple[int, int], threshold: float = 0.5) -> torch.Tensor:
    """``[rows, cols]`` bool: tokens whose area-averaged coverage exceeds ``threshold`` (any pixel for 0)."""
    coverage = area_resize(mask.float(), grid)
    return coverage > threshold if threshold > 0 else coverage > 0


def area_resize(values: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Area-average (down) or bilinear (up) resize of an ``[H, W]`` map."""
    mode = "area" if values.shape[0] >= size[0] and values.shape[1] >= size[1] else "bilinear"
    kwargs = {} if mode == "area" else {"align_corners": False}
    return F.interpolate(values[None, None].float(), size=size, mode=mode, **kwargs)[0, 0]


def resize_image(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Antialiased bilinear resize of ``[B, 3, H, W]``, clamped to [0, 1]."""
    if tuple(image.shape[-2:]) == tuple(size):
        return image
    return F.interpolate(image, size=size, mode="bilinear", antialias=True, align_corners=False).clamp(0, 1)


def dilate(mask: torch.Tensor, radius: int) -> torch.Tensor:
    if radius <= 0:
        return mask
    size = 2 * radius + 1
    return F.max_pool2d(mask[None, None].float(), size, stride=1, padding=radius)[0, 0] > 0


def load_image(path) -> torch.Tensor:
    from PIL import Image

    return as_image_batch(str(path), Image.open(path))


def load_mask(path, size=None) -> torch.Tensor:
    from PIL import Image

    return as_mask(str(path), Image.open(path), size)


def to_pil(image: torch.Tensor):
    from PIL import Image

    array = (image.detach().float().clamp(0, 1).cpu().permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    return Image.fromarray(array)


def save_image(image: torch.Tensor, path) -> Path:
    path = Path(path)
    with written_atomically(path) as temporary:  # same suffix: PIL picks the format by it
        to_pil(image).save(temporary)
    return path
