"""Band modulation (Untwisting RoPE) on FLUX.2 / Klein, Qwen-Image, Qwen-Image 2.1 and Z-Image, through the edit seam.

Each pipeline subclasses the stock one and keeps its call (argument order, ``return_dict``, ``output_type``); it
adds the keyword ``band`` (a :class:`~.band.BandConfig` or dict). Text-to-image: the batch is ``[reference,
target_1 .. target_n]`` (one prompt or prompt embedding each, ``num_images_per_prompt=1``): each target attends
to its own tokens plus the reference's band-scaled image keys (:class:`~.band.SharedBandAttention`). FLUX.2 with
reference images (``image=``): the reference images' keys in the sequence are band-scaled
(:class:`~.band.ContextBandScaling`, as Kontext), found by their ``t`` coordinate. The band law per channel pair
comes from the family's own spectrum (its ``native_axes_dims``, or the ``set_pe`` encoding's). ``BAND_PIPELINES``
maps a family name to its text-to-image band pipeline; ``BAND_PIPELINES_BY_STOCK`` a stock pipeline class name.
FLUX.2 text-to-image also takes ``reference_image`` (:mod:`.band_reference`): element 0 follows that image, noised.
"""

from __future__ import annotations

import inspect

import torch
from diffusers import Flux2KleinPipeline, Flux2Pipeline, QwenImage21Pipeline, QwenImagePipeline, ZImagePipeline

from mmpos.integrations.diffusers.families import family_for

from .attention import select_layers
from .band import BandConfig, ContextBandScaling, SharedBandAttention
from .band_pipeline import BandModulationFluxPipeline, BandModulationKontextPipeline, _ProbeMixin
from .band_reference import Flux2GivenReferenceMixin
from .context import EditContext, EditSession
from .edit_pipeline import coerce_config
from .per_call import per_call


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


BAND_PIPELINES = {
    "flux": BandModulationFluxPipeline,
    "flux2": BandModulationFlux2Pipeline,
    "qwen": BandModulationQwenImagePipeline,
    "qwenimage21": BandModulationQwenImage21Pipeline,
    "z_image": BandModulationZImagePipeline,
}
BAND_PIPELINES_BY_STOCK = {
    "FluxPipeline": BandModulationFluxPipeline,
    "FluxKontextPipeline": BandModulationKontextPipeline,
    "Flux2Pipeline": BandModulationFlux2Pipeline,
    "Flux2KleinPipeline": BandModulationFlux2KleinPipeline,
    "QwenImagePipeline": BandModulationQwenImagePipeline,
    "QwenImage21Pipeline": BandModulationQwenImage21Pipeline,
    "ZImagePipeline": BandModulationZImagePipeline,
}
