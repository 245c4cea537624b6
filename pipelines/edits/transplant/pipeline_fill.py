"""PosBridge-style object insertion on FLUX.1-Fill: canvas, PE transplant, crop and composite."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from diffusers import FluxFillPipeline
from diffusers.utils import BaseOutput

from ...images import as_image_batch, as_mask, check_token_grid, to_pil
from ..pipeline import EditPipelineMixin, coerce_config, per_call
from .canvas import Canvas, TransplantConfig, canvas_ids, compose_canvas
from .positions import transplant_context


@dataclass
class TransplantOutput(BaseOutput):
    """``images``: composited results in the requested ``output_type`` (``"latent"``: Fill's packed latents of
    the canvas, uncomposited, as ``FluxFillPipeline`` returns them; then ``canvas_images`` is None)."""

    images: object  # composited results, in the requested output_type
    canvas_images: Optional[torch.Tensor]  # [B, 3, Hc, Wc] raw Fill outputs on the canvas, [0, 1]
    canvas: Canvas
    ids: torch.Tensor  # [Hc/t * Wc/t, 3] transplanted ids used while sigma >= tau (t: token pixels)
    native_ids: torch.Tensor


def box_to_mask(box, size: tuple[int, int]) -> torch.Tensor:
    """``(left, top, right, bottom)`` pixels (PIL / torchvision order, exclusive ends) -> ``[H, W]`` bool; the
    box must lie in the image."""
    if len(box) != 4:
        raise ValueError(f"target_box={tuple(box)}: expected 4 numbers (left, top, right, bottom)")
    left, top, right, bottom = (int(v) for v in box)
    if not (0 <= top < bottom <= size[0] and 0 <= left < right <= size[1]):
        raise ValueError(
            f"target_box={tuple(box)} (left, top, right, bottom) must lie inside the "
            f"{size[0]}x{size[1]} (HxW) image with left < right and top < bottom"
        )
    mask = torch.zeros(size, dtype=torch.bool)
    mask[top:bottom, left:right] = True
    return mask


class PosBridgeFillPipeline(EditPipelineMixin, FluxFillPipeline):
    """Insert a reference object into a background region with FLUX.1-Fill and PE transplant.

    Arguments keep ``FluxFillPipeline``'s order and meaning: ``image`` is the background, ``mask_image`` the
    target region (or give the keyword-only ``target_box``: left, top, right, bottom, PIL order); then the usual
    Fill arguments (prompt or prompt embeddings, steps, guidance, generator, ``output_type``, ``return_dict``).
    ``height``, ``width`` and ``masked_image_latents`` come from the canvas. Keyword-only extras: one or more
    ``references`` with optional ``reference_masks`` (object masks; default: the whole view) and ``transplant``
    (:class:`TransplantConfig` or dict). The canvas is inpainted only inside the (dilated) target region; the
    result is the background with that region replaced, so pixels outside it are the input's, exactly.

    Returns a :class:`TransplantOutput` (a diffusers ``BaseOutput``), or with ``return_dict=False`` the tuple
    ``(images, canvas_images, canvas, ids, native_ids)``. With ``output_type="latent"``, ``images`` are Fill's
    packed canvas latents (no compositing: that needs pixels).

    Multi-view: every view is placed on the canvas, but by default (``transplant_views="primary"``) only the
    first view's object tokens take the target's positions; the other views keep their native positions and act
    as extra context. ``transplant_views="all"`` maps every view's object onto the target box.

    Detail LoRA: PosBridge mentions an optional LoRA for detail (which one is not published). None is built in;
    the pipeline inherits diffusers' LoRA loader, so ``pipe.load_lora_weights(...)`` loads any FLUX.1-Fill LoRA
    and ``joint_attention_kwargs={"scale": s}`` sets its weight, as for ``FluxFillPipeline``.
    """

    @per_call
    @torch.no_grad()
    def __call__(
        self,
        prompt=None,
        prompt_2=None,
        image=None,
        mask_image=None,
        masked_image_latents=None,
        height=None,
        width=None,
        strength: float = 1.0,
        num_inference_steps: int = 50,
        sigmas=None,
        guidance_scale: float = 30.0,
        num_images_per_prompt: int = 1,
        generator=None,
        latents=None,
        prompt_embeds=None,
        pooled_prompt_embeds=None,
        output_type: str = "pil",
        return_dict: bool = True,
        joint_attention_kwargs=None,
        callback_on_step_end=None,
        callback_on_step_end_tensor_inputs=("latents",),
        max_sequence_length: int = 512,
        *,
        references=None,
        reference_masks=None,
        target_box=None,
        transplant=None,
    ):
        """Insert the ``references``' object into the target region of ``image`` (see the class docstring).

        Args:
            prompt: and ``prompt_2``, ``strength``, ``num_inference_steps``, ``sigmas``, ``guidance_scale``,
                ``num_images_per_prompt``, ``generator``, ``latents``, ``prompt_embeds``, ``pooled_prompt_embeds``,
                ``joint_attention_kwargs``, ``callback_on_step_end``, ``callback_on_step_end_tensor_inputs``,
                ``max_sequence_length``: as ``FluxFillPipeline.__call__``.
            image: the background (one image, sides multiples of the token size).
            mask_image: the target region (white = insert here); or give ``target_box``.
            masked_image_latents, height, width: set from the canvas; passing them is an error.
            output_type: ``"pil"``, ``"np"``, ``"pt"`` or ``"latent"`` (Fill's packed canvas latents).
            return_dict: a :class:`TransplantOutput` (True) or a tuple.
            references: one reference view or a list of them (images of the object).
            reference_masks: the object in each view (default: the whole view).
            target_box: ``(left, top, right, bottom)`` pixels, PIL order, instead of ``mask_image``.
            transplant: a :class:`TransplantConfig` or a dict of its fields.

        Returns:
            :class:`TransplantOutput` ``(images, canvas_images, canvas, ids, native_ids)``; ``images`` is the
            background with the target region replaced (pixels outside it are the input's, exactly).
        """
        config = coerce_config(TransplantConfig, transplant)
        for name, value in (("height", height), ("width", width), ("masked_image_latents", masked_image_latents)):
            if value is not None:
                raise ValueError(f"{name} is set by the transplant pipeline from the canvas; do not pass it")
        if output_type not in ("pil", "np", "pt", "latent"):
            raise ValueError(f"output_type={output_type!r}: expected 'pil', 'np', 'pt' or 'latent'")
        canvas = self.prepare_canvas(config, image, mask_image, references, reference_masks, target_box)
        ids = canvas_ids(canvas, config)
        context = transplant_context(ids, canvas.layout.grid, config)
        height, width = canvas.layout.canvas_size
        fill_arguments = dict(
            prompt=prompt,
            prompt_2=prompt_2,
            strength=strength,
            num_inference_steps=num_inference_steps,
            sigmas=sigmas,
            guidance_scale=guidance_scale,
            num_images_per_prompt=num_images_per_prompt,
            generator=generator,
            latents=latents,
            prompt_embeds=prompt_embeds,
            pooled_prompt_embeds=pooled_prompt_embeds,
            joint_attention_kwargs=joint_attention_kwargs,
            callback_on_step_end=callback_on_step_end,
            callback_on_step_end_tensor_inputs=list(callback_on_step_end_tensor_inputs),
            max_sequence_length=max_sequence_length,
        )
        with self.edit_session(context):
            canvas_images = (
                super()
                .__call__(
                    image=canvas.image,
                    mask_image=canvas.inpaint_mask[None, None].float(),
                    height=height,
                    width=width,
                    output_type="latent" if output_type == "latent" else "pt",
                    **fill_arguments,
                )
                .images
            )
        native = self._prepare_latent_image_ids(1, *canvas.layout.grid, ids.device, ids.dtype)
        return transplant_output(canvas, canvas_images, ids, native, output_type, return_dict)

    def prepare_canvas(self, config, background, target_mask, references, reference_masks, target_box) -> Canvas:
        """The canvas from the background ``image``, the target ``mask_image`` or ``target_box`` and the views."""
        background = as_image_batch("image (the background)", background)
        if background.shape[0] != 1:
            raise ValueError(f"image (the background) must be one image, got a batch of {background.shape[0]}")
        size = tuple(background.shape[-2:])
        check_token_grid("image (the background)", *size, self.token_pixels)
        if (target_mask is None) == (target_box is None):
            raise ValueError("give exactly one of mask_image (the target region) and target_box")
        mask = as_mask("mask_image", target_mask, size) if target_box is None else box_to_mask(target_box, size)
        if references is None:
            raise ValueError("references is required: one reference image or a list of views")
        references = references if isinstance(references, (list, tuple)) else [references]
        references = [as_image_batch(f"references[{i}]", r) for i, r in enumerate(references)]
        if reference_masks is None:
            reference_masks = [None] * len(references)
        reference_masks = reference_masks if isinstance(reference_masks, (list, tuple)) else [reference_masks]
        if len(reference_masks) != len(references):
            raise ValueError(f"got {len(reference_masks)} reference_masks for {len(references)} references")
        object_masks = [
            torch.ones(r.shape[-2:], dtype=torch.bool)
            if m is None
            else as_mask(f"reference_masks[{i}]", m, tuple(r.shape[-2:]))
            for i, (r, m) in enumerate(zip(references, reference_masks))
        ]
        return compose_canvas(config, background, mask, references, object_masks, self.token_pixels)


def transplant_output(canvas: Canvas, canvas_images, ids, native, output_type: str, return_dict: bool):
    """The pipelines' result: the composited images (or the latents with ``output_type="latent"``), the canvas
    images, the canvas and the moved / native ids, as a :class:`TransplantOutput` or a tuple."""
    if output_type == "latent":
        images, canvas_images = canvas_images, None
    else:
        images = _convert(composite(canvas, canvas_images), output_type)
    if not return_dict:
        return images, canvas_images, canvas, ids, native
    return TransplantOutput(images, canvas_images, canvas, ids, native)


def composite(canvas: Canvas, canvas_images: torch.Tensor) -> torch.Tensor:
    """Crop the background box from each canvas output and paste only the inpainted region into the input."""
    rows, cols = canvas.layout.background.slices
    background = canvas.image[..., rows, cols].to(canvas_images.device, canvas_images.dtype)
    region = canvas.inpaint_mask[rows, cols].to(canvas_images.device)
    edited = canvas_images[..., rows, cols]
    return torch.where(region, edited, background)


def _convert(images: torch.Tensor, output_type: str):
    if output_type == "pt":
        return images
    if output_type == "np":
        return images.permute(0, 2, 3, 1).float().cpu().numpy()
    if output_type == "pil":
        return [to_pil(image) for image in images]
    raise ValueError(f"output_type={output_type!r}: expected 'pil', 'np' or 'pt'")
