"""A given reference image for FLUX.2 text-to-image band modulation (as ``reference_image`` on FLUX.1).

Batch element 0 (the reference) does not denoise freely: before every forward its latents become the given
image's, noised to that forward's sigma, ``(1 - sigma) x0 + sigma * eps`` with a fixed ``eps``
(:class:`NoisedReference`, FLUX.1's ``reference_mode="noise"``). ``x0`` is the image encoded as
``Flux2Pipeline`` encodes reference images (VAE mode, FLUX.2's 2x2 patchify, batch-norm normalisation), packed
one token per position ``[1, h/2 * w/2, 4C]``.
"""

from __future__ import annotations

import torch

from mmpos._validation import check_choice

from ...images import as_image_batch


class Flux2GivenReferenceMixin:
    """``reference_image`` (and ``reference_seed``, ``reference_mode="noise"``) for a FLUX.2 band pipeline."""

    def _given_reference(self, image, seed: int, mode: str, bound: dict) -> NoisedReference:
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
        return NoisedReference(x0, noise.to(x0.device))

    def encode_reference(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[1, 3, H, W]`` in [-1, 1] -> packed normalised latents ``[1, H/(2s) * W/(2s), 4C]`` (fp32)."""
        pixels = pixels.to(self._execution_device, self.vae.dtype)
        return self._pack_latents(self._encode_vae_image(pixels, generator=None)).float()


class NoisedReference:
    """Rewriter: batch element 0's latents become the reference noised to this forward's sigma."""

    def __init__(self, x0: torch.Tensor, noise: torch.Tensor):
        self.x0, self.noise = x0, noise

    def __call__(self, context, kwargs):
        latents = kwargs["hidden_states"]
        if latents.shape[0] < 2 or latents.shape[1:] != self.x0.shape[1:]:
            raise ValueError(f"reference latents {tuple(self.x0.shape)} do not fit the batch {tuple(latents.shape)}")
        sigma = context.sigma
        x0, noise = self.x0.to(latents.device), self.noise.to(latents.device)
        reference = ((1 - sigma) * x0 + sigma * noise).to(latents.dtype)
        return {**kwargs, "hidden_states": torch.cat([reference, latents[1:]], dim=0)}


class InvertedReference:
    """Rewriter: batch element 0's latents become the inverse-Euler trajectory of ``x0`` at this step.

    At the first forward of a run the trajectory is computed over the scheduler's sigmas (ascending from 0) with
    the edit disabled and element 0's conditioning; the context's step and sigma are restored afterwards.
    """

    def __init__(self, x0: torch.Tensor, transformer, scheduler):
        self.x0, self.transformer, self.scheduler = x0, transformer, scheduler
        self.trajectory = None
        self.busy = False

    def __call__(self, context, kwargs):
        if self.busy:
            return kwargs
        if context.step is None:
            raise ValueError("reference_mode='invert' needs the pipeline's scheduler steps")
        if self.trajectory is None:  # once per call: true-CFG runs step 0 twice (its negative branch too)
            self.trajectory = self._invert(context, kwargs)
        latents = kwargs["hidden_states"]
        reference = self.trajectory[context.step].to(latents.device, latents.dtype)
        return {**kwargs, "hidden_states": torch.cat([reference, latents[1:]], dim=0)}

    def _invert(self, context, kwargs) -> list:
        saved = (context.step, context.num_steps, context.sigma, context.enabled)
        single = {
            k: (v[:1] if k in ("encoder_hidden_states", "pooled_projections", "guidance") and v is not None else v)
            for k, v in kwargs.items()
        }
        sigmas = self.scheduler.sigmas.flip(0).tolist()  # 0 = sigma_N < ... < sigma_0
        x = self.x0.to(kwargs["hidden_states"].device, torch.float32)
        states = [x]
        self.busy, context.enabled = True, False
        try:
            for low, high in zip(sigmas[:-1], sigmas[1:]):
                timestep = torch.full((1,), low, device=x.device, dtype=kwargs["hidden_states"].dtype)
                velocity = self.transformer(
                    **{**single, "hidden_states": x.to(kwargs["hidden_states"].dtype), "timestep": timestep}
                )[0]
                x = x + (high - low) * velocity.float()
                states.append(x)
        finally:
            self.busy = False
            context.step, context.num_steps, context.sigma, context.enabled = saved
        return states[::-1][: len(sigmas) - 1]  # index i: latents at sigma_i
