"""LooseRoPE harmonisation pipelines on FLUX.2 Klein (edit mode) and Qwen-Image-Edit(-Plus).

Each subclasses the stock pipeline and keeps its arguments (in their order), ``output_type`` and ``return_dict``;
the collage is the stock ``image`` (with a list: its first image; the others stay extra references). Keyword-only
extras as :class:`~.loose_pipeline.LooseRoPEKontextPipeline`: ``crop_mask`` or ``original``, ``saliency``,
``loose``. The prompt defaults to the authors' harmonisation prompt. The output size is the stock one (the size
the collage is given to the model: output and collage token grids agree). The authors' verdict-and-restart loop is
on Kontext only (:class:`~.loose_pipeline.LooseRoPEKontextPipeline`).

:data:`LOOSE_PIPELINES` maps a family name to its pipeline class; :data:`LOOSE_PIPELINES_BY_STOCK` the stock
pipeline class name (``model_index.json``'s ``_class_name``) to ours, for Qwen-Image-Edit-Plus (2509).
"""

from __future__ import annotations

import inspect

import torch
from diffusers import Flux2KleinPipeline, QwenImageEditPipeline, QwenImageEditPlusPipeline

from mmpos.integrations.diffusers.families import get_family

from .attention import select_layers
from .context import EditContext, EditSession
from .edit_pipeline import coerce_config
from .images import as_image_batch, as_mask, to_pil
from .loose import LooseConfig
from .loose_families import POSITIONS, FamilyLooseRule, ForwardInputs
from .loose_pipeline import DEFAULT_PROMPT, LooseRoPEKontextPipeline, LooseRoPEOutput, crop_mask_from_original
from .per_call import per_call, this_thread_only


class _FamilyLooseMixin:
    """The LooseRoPE run around a stock edit pipeline's ``__call__`` (``family``: the diffusers family name)."""

    family = ""

    @property
    def token_pixels(self) -> int:
        """Pixels per side of one transformer token (VAE factor x 2x2 patches; 16 for the released models)."""
        return self.vae_scale_factor * 2

    def _loose_call(self, stock_call, args, kwargs, crop_mask, original, saliency, loose):
        config = coerce_config(LooseConfig, loose)
        arguments = inspect.signature(stock_call).bind(self, *args, **kwargs).arguments
        arguments.pop("self")
        images = arguments.get("image")
        first = images[0] if isinstance(images, (list, tuple)) else images
        collage = as_image_batch("image", first)
        mask = self._paste_mask(collage, crop_mask, original)
        saliency_map = LooseRoPEKontextPipeline._saliency(config, saliency, collage, mask)
        pil = to_pil(collage[0])
        arguments["image"] = [pil, *images[1:]] if isinstance(images, (list, tuple)) else pil
        if arguments.get("prompt") is None and arguments.get("prompt_embeds") is None:
            arguments["prompt"] = DEFAULT_PROMPT
        return_dict = arguments.pop("return_dict", True)
        inputs = ForwardInputs()
        rule = FamilyLooseRule(config, POSITIONS[self.family], self.transformer, inputs, saliency_map, mask)
        context = EditContext(rules=self._family_layer_rules(config.layers, rule), enabled=config.enabled)
        # prepend: before the edit's own hook (set_pe's installer may have registered it earlier), which reads them
        handle = self.transformer.register_forward_pre_hook(this_thread_only(inputs), with_kwargs=True, prepend=True)
        try:
            with EditSession(self.transformer, context, self.scheduler):
                out = stock_call(self, return_dict=True, **arguments).images
        finally:
            handle.remove()
        output = LooseRoPEOutput(out, saliency_map, mask, rule.maps, None)
        return output if return_dict else (out, saliency_map, mask, rule.maps, None)

    @staticmethod
    def _paste_mask(collage, crop_mask, original) -> torch.Tensor:
        size = tuple(collage.shape[-2:])
        if (crop_mask is None) == (original is None):
            raise ValueError("give exactly one of crop_mask and original (the image before pasting)")
        if crop_mask is not None:
            return as_mask("crop_mask", crop_mask, size)
        return as_mask(
            "crop_mask (from original)", crop_mask_from_original(collage, as_image_batch("original", original)), size
        )

    def _family_layer_rules(self, layers, rule) -> dict:
        modules = get_family(self.family).attention_modules(self.transformer)
        indices = select_layers(layers, len(modules), len(self.transformer.transformer_blocks))
        return dict.fromkeys(indices, rule)


class LooseRoPEKleinPipeline(_FamilyLooseMixin, Flux2KleinPipeline):
    """Cut-and-paste harmonisation (LooseRoPE) with FLUX.2 Klein's edit mode: the collage is the reference image
    (``t = 10``); see :mod:`.loose_family_pipeline`. Returns a :class:`~.loose_pipeline.LooseRoPEOutput`, or with
    ``return_dict=False`` the tuple ``(images, saliency, crop_mask, maps, verdicts)``."""

    family = "flux2"

    @per_call
    @torch.no_grad()
    def __call__(self, *args, crop_mask=None, original=None, saliency=None, loose=None, **kwargs):
        return self._loose_call(Flux2KleinPipeline.__call__, args, kwargs, crop_mask, original, saliency, loose)


class LooseRoPEQwenEditPipeline(_FamilyLooseMixin, QwenImageEditPipeline):
    """LooseRoPE with Qwen-Image-Edit: the collage is the condition image (frame 1); as
    :class:`LooseRoPEKleinPipeline` otherwise."""

    family = "qwen"

    @per_call
    @torch.no_grad()
    def __call__(self, *args, crop_mask=None, original=None, saliency=None, loose=None, **kwargs):
        return self._loose_call(QwenImageEditPipeline.__call__, args, kwargs, crop_mask, original, saliency, loose)


class LooseRoPEQwenEditPlusPipeline(_FamilyLooseMixin, QwenImageEditPlusPipeline):
    """LooseRoPE with Qwen-Image-Edit-Plus (2509): the collage is the first condition image (frame 1)."""

    family = "qwen"

    @per_call
    @torch.no_grad()
    def __call__(self, *args, crop_mask=None, original=None, saliency=None, loose=None, **kwargs):
        return self._loose_call(QwenImageEditPlusPipeline.__call__, args, kwargs, crop_mask, original, saliency, loose)


LOOSE_PIPELINES = {"flux2": LooseRoPEKleinPipeline, "qwen": LooseRoPEQwenEditPipeline}
LOOSE_PIPELINES_BY_STOCK = {
    "Flux2KleinPipeline": LooseRoPEKleinPipeline,
    "QwenImageEditPipeline": LooseRoPEQwenEditPipeline,
    "QwenImageEditPlusPipeline": LooseRoPEQwenEditPlusPipeline,
}
