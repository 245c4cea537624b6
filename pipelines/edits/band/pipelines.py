"""Band modulation pipelines: Flux text-to-image with a shared reference, and Kontext with its context image."""

from __future__ import annotations

import inspect
from typing import Optional

import torch
from diffusers import (
    Flux2KleinPipeline,
    Flux2Pipeline,
    FluxKontextPipeline,
    FluxPipeline,
    QwenImage21Pipeline,
    QwenImagePipeline,
    ZImagePipeline,
)

from mmpos._validation import check_choice
from mmpos.integrations.diffusers.families import family_for

from ...images import as_image_batch, check_token_grid
from ..context import EditContext, EditSession
from ..pipeline import EditPipelineMixin, coerce_config, per_call
from ..processor import select_layers
from .figures import AttentionProbe
from .reference import Flux2GivenReferenceMixin, InvertedReference, NoisedReference
from .rule import BandConfig, ContextBandScaling, SharedBandAttention


class _ProbeMixin:
    _call_results = ("probe",)  # left on the pipeline by a call (:func:`~mmpos.pipelines.edits.pipeline.per_call`)

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
                context.rewriters.append(NoisedReference(x0, noise))
            else:
                context.rewriters.append(InvertedReference(x0, self.transformer, self.scheduler))
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


def family_layer_rules(transformer, layers, rule) -> dict:
    """``{layer index: rule}`` for ``layers`` (``"all"``, ``"double"``, ``"single"``, indices, a range) over the
    transformer's attention layers in the installer's order (FLUX.2: double blocks, then single blocks)."""
    count = len(family_for(transformer).attention_modules(transformer))
    double = len(transformer.transformer_blocks) if hasattr(transformer, "single_transformer_blocks") else count
    return dict.fromkeys(select_layers(layers, count, double), rule)


def _prompt_count(value) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return 1
    if isinstance(value, torch.Tensor):
        return value.shape[0]
    return len(value)


class _FamilyBandMixin(_ProbeMixin):
    """``__call__`` with ``band=``: the rule, its edit session, and the batch check before any work; ``probe=(layer,
    progress)`` records that layer's q/k (``self.probe``, for :func:`~.figures.band_attention_maps`)."""

    _reference_argument = None  # the stock argument holding in-sequence reference images (FLUX.2: "image")

    @property
    def token_pixels(self) -> int:
        """Pixels per side of one transformer token (VAE factor x 2x2 patches; 16 for the released models)."""
        return self.vae_scale_factor * 2

    @per_call
    @torch.no_grad()
    def __call__(
        self,
        *args,
        band=None,
        reference_image=None,
        reference_seed: int = 0,
        reference_mode: str = "noise",
        probe=None,
        **kwargs,
    ):
        config = coerce_config(BandConfig, band)
        bound = inspect.signature(super().__call__).bind_partial(*args, **kwargs).arguments
        axes = family_for(self.transformer).native_axes_dims(self.transformer)
        with_references = self._reference_argument is not None and bound.get(self._reference_argument) is not None
        rule = ContextBandScaling(config, axes) if with_references else SharedBandAttention(config, axes)
        context = EditContext(rules=family_layer_rules(self.transformer, config.layers, rule), enabled=config.enabled)
        if not with_references:
            context.group_size = self._check_band_batch(config, bound)
        self._install_probe(context, probe)
        if reference_image is not None and config.enabled:  # element 0 follows the given image, noised
            if with_references or not hasattr(self, "_given_reference"):
                raise ValueError(
                    f"reference_image: {type(self).__name__} takes a given reference for "
                    "text-to-image band on FLUX.2 only (not with image=)"
                )
            context.rewriters.append(self._given_reference(reference_image, reference_seed, reference_mode, bound))
        with EditSession(self.transformer, context, self.scheduler):
            return super().__call__(*args, **kwargs)

    def _check_band_batch(self, config, bound) -> int:
        """The ``[reference, target, ...]`` batch (at least two prompts or prompt embeddings; one image each)."""
        per_prompt = bound.get("num_images_per_prompt", 1)
        if per_prompt not in (None, 1):
            raise ValueError(
                f"num_images_per_prompt={per_prompt}: band modulation needs 1; give one prompt per "
                "image (the batch is [reference, target, ...])"
            )
        batch = _prompt_count(bound.get("prompt")) or _prompt_count(bound.get("prompt_embeds"))
        if config.enabled and batch < 2:
            raise ValueError(
                "band modulation needs a batch of [reference, target, ...]: at least two prompts or "
                f"prompt embeddings, got {batch}"
            )
        return batch


class BandModulationFlux2Pipeline(Flux2GivenReferenceMixin, _FamilyBandMixin, Flux2Pipeline):
    """``Flux2Pipeline`` with band modulation: shared reference (text-to-image) or, with ``image=``, band-scaled
    keys of the reference images (``t = 10, 20, ...``)."""

    _reference_argument = "image"


class BandModulationFlux2KleinPipeline(Flux2GivenReferenceMixin, _FamilyBandMixin, Flux2KleinPipeline):
    """``Flux2KleinPipeline`` with band modulation (as :class:`BandModulationFlux2Pipeline`)."""

    _reference_argument = "image"


class BandModulationQwenImagePipeline(_FamilyBandMixin, QwenImagePipeline):
    """``QwenImagePipeline`` with band-modulated shared attention (batch ``[reference, target, ...]``)."""


class BandModulationQwenImage21Pipeline(_FamilyBandMixin, QwenImage21Pipeline):
    """``QwenImage21Pipeline`` with band-modulated shared attention (batch ``[reference, target, ...]``): each
    target image's queries also see the reference's band-scaled target-image keys; the prefix (text, condition
    images) stays block-causal and stock, so the KV cache (``use_kv_cache``) and ``image=`` work unchanged."""

    @property
    def token_pixels(self) -> int:
        """Pixels per side of one token: the VAE factor (16; the transformer takes the latents unpatched)."""
        return self.vae_scale_factor


class BandModulationZImagePipeline(_FamilyBandMixin, ZImagePipeline):
    """``ZImagePipeline`` with band-modulated shared attention (batch ``[reference, target, ...]``; with CFG the
    pipeline batches ``[positive, negative]``: each half is shared within itself)."""
