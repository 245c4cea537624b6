"""Images and masks: conversion to tensors, token-grid checks, masks in token space, file IO.

Images are ``[B, 3, H, W]`` float in [0, 1]; masks are ``[H, W]`` bool (True = selected). A token covers
``token_pixels x token_pixels`` pixels (16 for FLUX.1: VAE factor 8 times 2x2 packing).
"""

from __future__ import annotations

import os
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
    if hasattr(image, "convert"):  # PIL: shown upright, at its own depth
        from PIL import ImageOps

        image = _pil_pixels(ImageOps.exif_transpose(image)).astype(np.float32)
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
    if hasattr(mask, "convert"):  # PIL, any depth: the channel mean
        mask = torch.from_numpy(_pil_pixels(mask).mean(-1)).float()
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


MIN_PHOTO_SIDE = 16  # pixels: one FLUX.1 token; a smaller photo holds too little to resize into a model input


def read_photo(path, option: str = "image", min_side: int = MIN_PHOTO_SIDE) -> np.ndarray:
    """The picture in the file ``path`` as a viewer shows it: float32 ``[H, W, 3]`` in [0, 1].

    Every bit kept: 8-bit files / 255; 16-bit PNG / TIFF (grey or colour, read through OpenCV, which PIL turns into
    8 bits or clips at 255) / 65535; float TIFFs as stored. The EXIF orientation is applied (a portrait phone photo
    stands up; the height and width are the shown ones). Grey is repeated on three channels, alpha dropped. A file
    that is not an image, or a side below ``min_side`` pixels, is a ValueError naming ``option`` and the file."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            deep = _deep_pixels(path, image)  # 16-bit colour: oriented here, as exif_transpose would
            orientation = image.getexif().get(ORIENTATION_TAG, 1)
            array = _pil_pixels(ImageOps.exif_transpose(image)) if deep is None else _oriented(deep, orientation)
    except (FileNotFoundError, IsADirectoryError):
        raise ValueError(f"{option} {path}: no such file; expected an image file (PNG, JPEG, ...)") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as error:  # PIL: not an image, truncated, ...
        raise ValueError(f"{option} {path}: cannot be read as an image ({error}); expected PNG, JPEG, ...") from None
    height, width = array.shape[:2]
    if min(height, width) < min_side:
        raise ValueError(
            f"{option} {path} is {height}x{width} pixels; expected at least {min_side} on each side "
            "(a smaller image holds too little to resize into the model's input)"
        )
    if not np.isfinite(array).all() or array.min() < 0 or array.max() > 1:
        raise ValueError(f"{option} {path}: float pixels outside [0, 1] (or NaN); expected values in [0, 1]")
    return np.ascontiguousarray(array, dtype=np.float32)


ORIENTATION_TAG = 0x0112  # EXIF Orientation: 1 upright, 2-8 mirrored / rotated (as PIL.ImageOps.exif_transpose)


def _pil_pixels(image) -> np.ndarray:
    """``[H, W, 3]`` float in [0, 1] of a PIL image in any mode, at its own depth."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):  # 16-bit grey (``I``: PNG's, up to 65535)
        grey = np.asarray(image, dtype=np.float64) / 65535.0
        return np.repeat(grey[..., None], 3, axis=-1)
    if image.mode == "F":  # float TIFF: as stored
        return np.repeat(np.asarray(image, dtype=np.float64)[..., None], 3, axis=-1)
    return np.asarray(image.convert("RGB"), dtype=np.float64) / 255.0


def _deep_pixels(path, image) -> np.ndarray | None:
    """``[H, W, 3]`` float in [0, 1] of a 16-bit colour PNG / TIFF (PIL holds only 8 bits of it), else None."""
    rawmodes = {tile[3][0] if isinstance(tile[3], tuple) else tile[3] for tile in image.tile if len(tile) > 3}
    if image.mode not in ("RGB", "RGBA") or not any(";16" in str(mode) for mode in rawmodes):
        return None
    import cv2

    pixels = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)  # BGR(A) uint16, the file's own orientation
    if pixels is None or pixels.dtype != np.uint16 or pixels.ndim != 3:
        return None
    return pixels[..., 2::-1].astype(np.float64) / 65535.0


def _oriented(array: np.ndarray, orientation: int) -> np.ndarray:
    """``[H, W, C]`` turned upright for an EXIF ``orientation`` (1-8), as ``PIL.ImageOps.exif_transpose``."""
    transposed = array.transpose(1, 0, 2)
    return {
        2: array[:, ::-1],
        3: array[::-1, ::-1],
        4: array[::-1],
        5: transposed,
        6: transposed[:, ::-1],
        7: transposed[::-1, ::-1],
        8: transposed[::-1],
    }.get(orientation, array)


def photo_size(path, option: str = "image") -> tuple[int, int]:
    """``(height, width)`` of the photo as :func:`read_photo` returns it (EXIF orientation applied)."""
    return tuple(read_photo(path, option).shape[:2])


def read_photo_pil(path, option: str = "image"):
    """:func:`read_photo` as an 8-bit RGB PIL image (for pipelines that take PIL images)."""
    from PIL import Image

    return Image.fromarray((read_photo(path, option) * 255).round().astype(np.uint8))


def load_image(path, option: str = "image") -> torch.Tensor:
    """``[1, 3, H, W]`` float in [0, 1]: :func:`read_photo`."""
    return torch.from_numpy(read_photo(path, option)).permute(2, 0, 1)[None]


def read_mask_pixels(path, option: str = "mask") -> np.ndarray:
    """``[H, W]`` float in [0, 1] of a mask file (grey or colour: the channel mean), read as :func:`read_photo`."""
    return read_photo(path, option, min_side=1).mean(-1)


def read_mask_pil(path, option: str = "mask"):
    """:func:`read_mask_pixels` as an 8-bit grey (``L``) PIL image."""
    from PIL import Image

    return Image.fromarray((read_mask_pixels(path, option) * 255).round().astype(np.uint8))


def load_mask(path, size=None) -> torch.Tensor:
    return as_mask(str(path), read_mask_pixels(path), size)


def to_pil(image: torch.Tensor):
    from PIL import Image

    array = (image.detach().float().clamp(0, 1).cpu().permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    return Image.fromarray(array)


def save_image(image: torch.Tensor, path) -> Path:
    path = Path(path)
    with written_atomically(path) as temporary:  # same suffix: PIL picks the format by it
        to_pil(image).save(temporary)
    return path


def model_token_pixels(pipe) -> int:
    """Pixels per side of one transformer token of a Flux-class / Qwen-Image pipeline (VAE factor x 2x2 packing)."""
    return int(getattr(pipe, "token_pixels", None) or pipe.vae_scale_factor * 2)


def generation_bytes(pipe, height: int, width: int, batch: int) -> int:
    """A lower bound on the bytes one generation of ``batch`` images of ``height x width`` takes: the larger of the
    VAE decoder's full-size block (its input, hidden and output maps) and one transformer block over the image
    tokens (q, k, v, output and a 4x MLP of the hidden size)."""
    vae, transformer = pipe.vae.config, pipe.transformer
    channels = (vae.get("block_out_channels") or [vae.get("base_dim", 128)])[0]  # AutoencoderKL / Qwen-Image, Wan
    pixels = batch * height * width
    vae_bytes = 3 * pixels * channels * torch.finfo(pipe.vae.dtype).bits // 8
    tokens = pixels // model_token_pixels(pipe) ** 2
    config = transformer.config
    hidden = getattr(config, "num_attention_heads", 1) * getattr(config, "attention_head_dim", 64)
    transformer_bytes = 8 * tokens * hidden * torch.finfo(transformer.dtype).bits // 8
    return max(vae_bytes, transformer_bytes)


def available_bytes(device) -> int:
    """Free memory of ``device``: the CUDA device's free memory, else the host's available memory."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_output_size(pipe, height: int, width: int, batch: int, names=None) -> None:
    """Refuse, before anything is allocated, an output size that is not a positive multiple of the model's token
    (FLUX.1: 16 pixels; the world models: 4) or that does not fit in the device's free memory (the estimate of
    :func:`generation_bytes`); the ValueError names the options (``names``: how the user set height and width,
    default ``height=H``, ``width=W``)."""
    names = names or (f"height={height}", f"width={width}")
    token = model_token_pixels(pipe)
    for name, value in zip(names, (height, width)):
        if value < token or value % token:
            raise ValueError(
                f"{name}: expected a positive multiple of {token} pixels (the model's token: {token // 2}x VAE, "
                f"2x2 patches), e.g. {max(token, value // token * token)}"
            )
    needed, free = generation_bytes(pipe, height, width, batch), available_bytes(pipe.device)
    if needed > free:
        raise ValueError(
            f"{names[0]}, {names[1]}: {batch} image(s) of {height}x{width} pixels need at least "
            f"{needed / 2**30:,.1f} GiB but {pipe.device} has {free / 2**30:,.1f} GiB free; expected a smaller size"
        )


TRAINING = "the model's training"
MAX_SIZE_OVER_TRAINED = 16  # per side: DyPE / YaRN results reach 4-8x the training side; beyond 16x nothing is known


def over_trained(value: int, trained: int, what: str, whose: str) -> str:
    """``"3125x the model's training size 32; expected at most 16x (512)"``."""
    return (
        f"{value / trained:.0f}x {whose} {what} {trained}; expected at most {MAX_SIZE_OVER_TRAINED}x "
        f"({MAX_SIZE_OVER_TRAINED * trained})"
    )
