"""Band modulation pipelines: Flux text-to-image with a shared reference, and Kontext with its context image."""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import FluxKontextPipeline, FluxPipeline

from mmpos._validation import check_choice

from .band import BandConfig, ContextBandScaling, SharedBandAttention
from .context import EditContext
from .edit_pipeline import EditPipelineMixin, coerce_config
from .figures import AttentionProbe
from .images import as_image_batch, check_token_grid
from .per_call import per_call


class _ProbeMixin:
    _call_results = ("probe",)  # left on the pipeline by a call (:func:`~.per_call.per_call`)

    def _install_probe(self, context: EditContext, probe) -> None:
        """``probe=(layer, progress)``: record q/k of that layer for :func:`~.figures.band_attention_maps`
        (available as ``self.probe`` after the call)."""
        self.probe = None
        if probe is None:
            return
        layer, progress = probe
        if layer not in context.rules:
            raise ValueError(f"probe layer {layer} is not an edited layer ({sorted(context.rules)})")
        self.probe = context.rules[layer] = AttentionProbe(context.rules[layer], progress)


class BandModulationFluxPipeline(_ProbeMixin, EditPipelineMixin, FluxPipeline):
    """Style-aligned generation on FLUX.1 with band-modulated shared attention (Untwisting RoPE).

    The batch is ``[reference, target_1, ..., target_n]`` (one prompt or prompt embedding each). The reference is
    generated in the same batch (default) or given as ``reference_image`` / ``reference_latents`` (packed, as the
    transformer sees them): then element 0's latents are replaced before every forward by the reference at that
    noise level, either noised (``reference_mode="noise"``: ``(1 - sigma) x0 + sigma * eps`` with a fixed ``eps``)
    or inverted (``"invert"``: inverse Euler of the unedited model from ``x0`` up the run's sigmas, conditioned on
    element 0's prompt; one extra forward per step, computed at the first step). ``band``
    (a :class:`BandConfig` or dict) holds the hyperparameters; ``band.enabled=False`` runs the stock pipeline
    through the same (inactive) processors, without replacing element 0. Output images are in batch order,
    reference first.
    """

    @per_call
    @torch.no_grad()
    def __call__(
        self,
        *args,
        band=None,
        reference_image=None,
        reference_latents: Optional[torch.Tensor] = None,
        reference_seed: int = 0,
        reference_mode: str = "noise",
        probe: Optional[tuple] = None,
        **kwargs,
    ):
        """``FluxPipeline.__call__`` with band-modulated shared attention over the batch ``[reference, target, ...]``.

        Args:
            *args, **kwargs: ``FluxPipeline.__call__``'s (one prompt or prompt embedding per image, at least two;
                ``num_images_per_prompt`` must be 1).
            band: a :class:`BandConfig` or a dict of its fields (``None``: the defaults).
            reference_image: a given reference (image or ``[1, 3, H, W]`` tensor in [0, 1]) for element 0.
            reference_latents: the same as packed latents ``[1, L, C]`` (as the transformer sees them).
            reference_seed: seed of the fixed noise of ``reference_mode="noise"``.
            reference_mode: ``"noise"`` (the reference noised to each step's sigma) or ``"invert"`` (inverse
                Euler of the unedited model, one extra forward per step).
            probe: ``(layer, progress)``: record that layer's q/k at that fraction of sampling (``self.probe``).

        Returns:
            The ``FluxPipelineOutput`` (images in batch order, reference first).
        """
        config = coerce_config(BandConfig, band)
        rule = SharedBandAttention(config, self.transformer.config.axes_dims_rope)
        context = EditContext(rules=self._layer_rules(config.layers, rule), enabled=config.enabled)
        self._install_probe(context, probe)
        if config.enabled and (reference_image is not None or reference_latents is not None):
            check_choice("reference_mode", reference_mode, ("noise", "invert"))
            x0 = self._reference_latents(reference_image, reference_latents, kwargs)
            if reference_mode == "noise":
                noise = torch.randn(
                    x0.shape, generator=torch.Generator("cpu").manual_seed(reference_seed), dtype=torch.float32
                ).to(x0.device)
                context.rewriters.append(_NoisedReference(x0, noise))
            else:
                context.rewriters.append(_InvertedReference(x0, self.transformer, self.scheduler))
        self._band_batch_check = config.enabled, kwargs.get("num_images_per_prompt", 1)  # read by check_inputs
        try:
            with self.edit_session(context):
                return super().__call__(*args, **kwargs)
        finally:
            self._band_batch_check = None

    def check_inputs(self, prompt, prompt_2, height, width, *args, prompt_embeds=None, **kwargs):
        """``FluxPipeline.check_inputs``, then the band batch, before any work: ``[reference, target, ...]`` (at
        least two prompts or prompt embeddings) and ``num_images_per_prompt == 1``."""
        super().check_inputs(prompt, prompt_2, height, width, *args, prompt_embeds=prompt_embeds, **kwargs)
        enabled, num_images_per_prompt = getattr(self, "_band_batch_check", None) or (True, 1)  # outside a call
        if num_images_per_prompt not in (None, 1):
            raise ValueError(
                f"num_images_per_prompt={num_images_per_prompt}: band modulation needs 1; give one "
                "prompt per image (the batch is [reference, target, ...])"
            )
        batch = (
            len(prompt)
            if isinstance(prompt, list)
            else 1
            if prompt is not None
            else prompt_embeds.shape[0]
            if prompt_embeds is not None
            else 0
        )
        if enabled and batch < 2:
            raise ValueError(
                f"band modulation needs a batch of [reference, target, ...]: at least two prompts or "
                f"prompt embeddings, got {batch}"
            )

    def _reference_latents(self, image, latents, kwargs) -> torch.Tensor:
        height = kwargs.get("height") or self.default_sample_size * self.vae_scale_factor
        width = kwargs.get("width") or self.default_sample_size * self.vae_scale_factor
        check_token_grid("output size", height, width, self.token_pixels)
        expected = (height // self.token_pixels) * (width // self.token_pixels)
        if latents is None:
            pixels = as_image_batch("reference_image", image)
            if tuple(pixels.shape[-2:]) != (height, width):
                raise ValueError(
                    f"reference_image is {pixels.shape[-2]}x{pixels.shape[-1]} pixels; expected the "
                    f"output size {height}x{width} (resize it first)"
                )
            latents = self.encode_packed(pixels * 2 - 1)
        if latents.ndim != 3 or latents.shape[0] != 1 or latents.shape[1] != expected:
            raise ValueError(
                f"reference_latents must be packed [1, {expected}, C] for a {height}x{width} output, "
                f"got {tuple(latents.shape)}"
            )
        return latents.float()


class _NoisedReference:
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


class _InvertedReference:
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


class BandModulationKontextPipeline(_ProbeMixin, EditPipelineMixin, FluxKontextPipeline):
    """Kontext variant: the reference is the in-sequence context image, whose keys are band-modulated.

    With ``band.strength=0`` (all scales 1) and ``adain_qk`` off, every layer runs the processor beneath the edit
    (the stock one, or ``set_pe``'s).
    """

    @per_call
    @torch.no_grad()
    def __call__(self, *args, band=None, probe: Optional[tuple] = None, **kwargs):
        """``FluxKontextPipeline.__call__`` with the context image's keys band-modulated.

        Args:
            *args, **kwargs: ``FluxKontextPipeline.__call__``'s (``image`` is the context / reference image).
            band: a :class:`BandConfig` or a dict of its fields (``None``: the defaults).
            probe: ``(layer, progress)``: record that layer's q/k at that fraction of sampling (``self.probe``).

        Returns:
            The ``FluxPipelineOutput``.
        """
        config = coerce_config(BandConfig, band)
        rule = ContextBandScaling(config, self.transformer.config.axes_dims_rope)
        context = EditContext(rules=self._layer_rules(config.layers, rule), enabled=config.enabled)
        self._install_probe(context, probe)
        with self.edit_session(context):
            return super().__call__(*args, **kwargs)
