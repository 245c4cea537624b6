"""A given reference image for FLUX.2 text-to-image band modulation (as ``reference_image`` on FLUX.1).

Batch element 0 (the reference) does not denoise freely: before every forward its latents become the given
image's, noised to that forward's sigma, ``(1 - sigma) x0 + sigma * eps`` with a fixed ``eps``
(:class:`~.band_pipeline._NoisedReference`, FLUX.1's ``reference_mode="noise"``). ``x0`` is the image encoded as
``Flux2Pipeline`` encodes reference images (VAE mode, FLUX.2's 2x2 patchify, batch-norm normalisation), packed
one token per position ``[1, h/2 * w/2, 4C]``.
"""

from __future__ import annotations

import torch

from mmpos._validation import check_choice

from .band_pipeline import _NoisedReference
from .images import as_image_batch


class Flux2GivenReferenceMixin:
    """``reference_image`` (and ``reference_seed``, ``reference_mode="noise"``) for a FLUX.2 band pipeline."""

    def _given_reference(self, image, seed: int, mode: str, bound: dict) -> _NoisedReference:
        check_choice("reference_mode", mode, ("noise",))
        height, width = bound.get("height"), bound.get("width")
        pixels = as_image_batch("reference_image", image)
        if pixels.shape[0] != 1 or (height, width) != tuple(pixels.shape[-2:]):
            raise ValueError(
                f"reference_image is {tuple(pixels.shape)}; expected one image of the output size "
                f"height={height}, width={width} (pass both, resize the image first)"
            )
        x0 = self.encode_reference(pixels * 2 - 1)
        noise = torch.randn(x0.shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
        return _NoisedReference(x0, noise.to(x0.device))

    def encode_reference(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[1, 3, H, W]`` in [-1, 1] -> packed normalised latents ``[1, H/(2s) * W/(2s), 4C]`` (fp32)."""
        pixels = pixels.to(self._execution_device, self.vae.dtype)
        return self._pack_latents(self._encode_vae_image(pixels, generator=None)).float()
