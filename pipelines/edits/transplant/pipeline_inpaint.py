"""PosBridge-style object insertion (PE transplant) on FLUX.2 Klein and Qwen-Image inpainting.

The reference view(s) are placed on a canvas with the background as on FLUX.1 Fill (:mod:`.canvas`); the
stock inpainting pipeline repaints only the target region of the canvas (its latent blending keeps the rest);
while ``sigma >= tau`` the reference object's tokens take the target region's positions
(:mod:`.positions`, run by the edit session as on FLUX.1 Fill). The result is the background with only that region replaced.

The method's record (:mod:`mmpos.pipelines.edits.transplant`) maps a model's pipeline class to these.
"""

from __future__ import annotations

import torch
from diffusers import Flux2KleinInpaintPipeline, QwenImageInpaintPipeline

from mmpos.coords.grids import flux_ids

from ..families import edit_attention_for
from ..pipeline import EditPipelineMixin, coerce_config, per_call
from .canvas import TransplantConfig, canvas_ids
from .pipeline_fill import PosBridgeFillPipeline, transplant_output
from .positions import transplant_context

KLEIN_MAX_AREA = 1024 * 1024  # Flux2KleinInpaintPipeline resizes a larger image to this area


class _CanvasMixin(EditPipelineMixin):
    """The canvas of FLUX.1 PosBridge (:meth:`PosBridgeFillPipeline.prepare_canvas`) on this pipeline's grid, and
    the edit session running the transplant (token size: VAE factor x 2x2 packing, 16 for Klein and Qwen-Image)."""

    prepare_canvas = PosBridgeFillPipeline.prepare_canvas

    def _transplant(self, config, image, mask_image, references, reference_masks, target_box):
        """(canvas, FLUX.1-style transplanted ids [N, 3])."""
        canvas = self.prepare_canvas(config, image, mask_image, references, reference_masks, target_box)
        return canvas, canvas_ids(canvas, config)

    def _finish(self, canvas, canvas_images, ids, output_type, return_dict):
        """The result, with the moved and native canvas ids in the family's coordinates."""
        grid = canvas.layout.grid
        adapter = edit_attention_for(self.transformer)
        moved, native = adapter.grid_coords(ids, grid), adapter.grid_coords(flux_ids(*grid), grid)
        return transplant_output(canvas, canvas_images, moved, native, output_type, return_dict)


def _check_set_by_canvas(**values):
    for name, value in values.items():
        if value is not None:
            raise ValueError(f"{name} is set by the transplant pipeline from the canvas; do not pass it")


def _check_output_type(output_type):
    if output_type not in ("pil", "np", "pt", "latent"):
        raise ValueError(f"output_type={output_type!r}: expected 'pil', 'np', 'pt' or 'latent'")


class PosBridgeKleinInpaintPipeline(_CanvasMixin, Flux2KleinInpaintPipeline):
    """Insert a reference object into a background region with FLUX.2 Klein inpainting and PE transplant.

    Arguments keep ``Flux2KleinInpaintPipeline``'s order and meaning: ``image`` is the background,
    ``image_reference`` the stock optional condition image (``t = 20``, passed through), ``mask_image`` the target
    region (or the keyword-only ``target_box``: left, top, right, bottom). ``height``, ``width`` and
    ``padding_mask_crop`` come from the canvas. Keyword-only extras as :class:`PosBridgeFillPipeline`:
    ``references``, ``reference_masks``, ``target_box``, ``transplant``. The canvas must fit the stock pipeline's
    1024^2-pixel area (it would resize a larger one): e.g. a background up to 560x560 with the default 0.4 tiles.

    Returns a :class:`~.pipeline_fill.TransplantOutput` (``ids``: the canvas tokens' FLUX.2 ids ``[N, 4]``
    while ``sigma >= tau``; ``native_ids``: their own), or with ``return_dict=False`` its fields as a tuple.
    """

    @per_call
    @torch.no_grad()
    def __call__(
        self,
        prompt=None,
        image=None,
        image_reference=None,
        mask_image=None,
        height=None,
        width=None,
        padding_mask_crop=None,
        strength: float = 1.0,
        num_inference_steps: int = 50,
        sigmas=None,
        guidance_scale: float = 8.0,
        num_images_per_prompt: int = 1,
        generator=None,
        latents=None,
        prompt_embeds=None,
        negative_prompt_embeds=None,
        output_type: str = "pil",
        return_dict: bool = True,
        attention_kwargs=None,
        callback_on_step_end=None,
        callback_on_step_end_tensor_inputs=("latents",),
        max_sequence_length: int = 512,
        text_encoder_out_layers=(9, 18, 27),
        *,
        references=None,
        reference_masks=None,
        target_box=None,
        transplant=None,
    ):
        config = coerce_config(TransplantConfig, transplant)
        _check_set_by_canvas(height=height, width=width, padding_mask_crop=padding_mask_crop)
        _check_output_type(output_type)
        canvas, ids = self._transplant(config, image, mask_image, references, reference_masks, target_box)
        rows, cols = canvas.layout.canvas_size
        if rows * cols > KLEIN_MAX_AREA:
            raise ValueError(
                f"the canvas is {rows}x{cols} pixels, above Flux2KleinInpaintPipeline's 1024^2 area "
                "(it would resize it off the token grid); use a smaller background or tile_fraction"
            )
        with self.edit_session(transplant_context(ids, canvas.layout.grid, config)):
            canvas_images = (
                super()
                .__call__(
                    prompt=prompt,
                    image=canvas.image,
                    image_reference=image_reference,
                    mask_image=canvas.inpaint_mask[None, None].float(),
                    strength=strength,
                    num_inference_steps=num_inference_steps,
                    sigmas=sigmas,
                    guidance_scale=guidance_scale,
                    num_images_per_prompt=num_images_per_prompt,
                    generator=generator,
                    latents=latents,
                    prompt_embeds=prompt_embeds,
                    negative_prompt_embeds=negative_prompt_embeds,
                    output_type="latent" if output_type == "latent" else "pt",
                    return_dict=True,
                    attention_kwargs=attention_kwargs,
                    callback_on_step_end=callback_on_step_end,
                    callback_on_step_end_tensor_inputs=list(callback_on_step_end_tensor_inputs),
                    max_sequence_length=max_sequence_length,
                    text_encoder_out_layers=text_encoder_out_layers,
                )
                .images
            )
        return self._finish(canvas, canvas_images, ids, output_type, return_dict)


class PosBridgeQwenInpaintPipeline(_CanvasMixin, QwenImageInpaintPipeline):
    """Insert a reference object into a background region with Qwen-Image inpainting and PE transplant.

    Arguments keep ``QwenImageInpaintPipeline``'s order and meaning (``image``: the background, ``mask_image``:
    the target region); ``masked_image_latents``, ``height``, ``width`` and ``padding_mask_crop`` come from the
    canvas. ``strength`` defaults to 1.0 (insertion repaints the region from noise; stock: 0.6). Keyword-only
    extras as :class:`PosBridgeFillPipeline`. Returns a :class:`~.pipeline_fill.TransplantOutput`
    (``ids`` / ``native_ids``: the canvas tokens' centred Qwen-Image coordinates ``[N, 3]``), or its fields as a
    tuple with ``return_dict=False``.
    """

    @per_call
    @torch.no_grad()
    def __call__(
        self,
        prompt=None,
        negative_prompt=None,
        true_cfg_scale: float = 4.0,
        image=None,
        mask_image=None,
        masked_image_latents=None,
        height=None,
        width=None,
        padding_mask_crop=None,
        strength: float = 1.0,
        num_inference_steps: int = 50,
        sigmas=None,
        guidance_scale=None,
        num_images_per_prompt: int = 1,
        generator=None,
        latents=None,
        prompt_embeds=None,
        prompt_embeds_mask=None,
        negative_prompt_embeds=None,
        negative_prompt_embeds_mask=None,
        output_type: str = "pil",
        return_dict: bool = True,
        attention_kwargs=None,
        callback_on_step_end=None,
        callback_on_step_end_tensor_inputs=("latents",),
        max_sequence_length: int = 512,
        *,
        references=None,
        reference_masks=None,
        target_box=None,
        transplant=None,
    ):
        config = coerce_config(TransplantConfig, transplant)
        _check_set_by_canvas(
            height=height, width=width, padding_mask_crop=padding_mask_crop, masked_image_latents=masked_image_latents
        )
        _check_output_type(output_type)
        canvas, ids = self._transplant(config, image, mask_image, references, reference_masks, target_box)
        rows, cols = canvas.layout.canvas_size
        with self.edit_session(transplant_context(ids, canvas.layout.grid, config)):
            canvas_images = (
                super()
                .__call__(
                    prompt=prompt,
                    negative_prompt=negative_prompt,
                    true_cfg_scale=true_cfg_scale,
                    image=canvas.image,
                    mask_image=canvas.inpaint_mask[None, None].float(),
                    height=rows,
                    width=cols,
                    strength=strength,
                    num_inference_steps=num_inference_steps,
                    sigmas=sigmas,
                    guidance_scale=guidance_scale,
                    num_images_per_prompt=num_images_per_prompt,
                    generator=generator,
                    latents=latents,
                    prompt_embeds=prompt_embeds,
                    prompt_embeds_mask=prompt_embeds_mask,
                    negative_prompt_embeds=negative_prompt_embeds,
                    negative_prompt_embeds_mask=negative_prompt_embeds_mask,
                    output_type="latent" if output_type == "latent" else "pt",
                    return_dict=True,
                    attention_kwargs=attention_kwargs,
                    callback_on_step_end=callback_on_step_end,
                    callback_on_step_end_tensor_inputs=list(callback_on_step_end_tensor_inputs),
                    max_sequence_length=max_sequence_length,
                )
                .images
            )
        return self._finish(canvas, canvas_images, ids, output_type, return_dict)
