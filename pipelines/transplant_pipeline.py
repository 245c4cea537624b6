"""PosBridge-style object insertion on FLUX.1-Fill: canvas, PE transplant, crop and composite."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers import FluxFillPipeline

from mmpos.coords.edits import transplant_ids

from .edit_pipeline import EditPipelineMixin, coerce_config
from .context import EditContext
from .images import as_image_batch, as_mask, check_token_grid, to_pil
from .transplant import Canvas, TransplantConfig, TransplantIds, compose_canvas, token_sets


@dataclass
class TransplantOutput:
    images: list                 # composited results, in the requested output_type
    canvas_images: torch.Tensor  # [B, 3, Hc, Wc] raw Fill outputs on the canvas, [0, 1]
    canvas: Canvas
    ids: torch.Tensor            # [Hc/t * Wc/t, 3] transplanted ids used while sigma >= tau (t: token pixels)
    native_ids: torch.Tensor


def box_to_mask(box, size: tuple[int, int]) -> torch.Tensor:
    """``(left, top, right, bottom)`` pixels (PIL / torchvision order, exclusive ends) -> ``[H, W]`` bool; the
    box must lie in the image."""
    if len(box) != 4:
        raise ValueError(f"target_box={tuple(box)}: expected 4 numbers (left, top, right, bottom)")
    left, top, right, bottom = (int(v) for v in box)
    if not (0 <= top < bottom <= size[0] and 0 <= left < right <= size[1]):
        raise ValueError(f"target_box={tuple(box)} (left, top, right, bottom) must lie inside the "
                         f"{size[0]}x{size[1]} (HxW) image with left < right and top < bottom")
    mask = torch.zeros(size, dtype=torch.bool)
    mask[top:bottom, left:right] = True
    return mask


class PosBridgeFillPipeline(EditPipelineMixin, FluxFillPipeline):
    """Insert a reference object into a background region with FLUX.1-Fill and PE transplant.

    Call with ``background`` (image), the target region as ``target_mask`` or ``target_box`` (left, top, right,
    bottom; PIL order), one or more ``references`` with optional ``reference_masks`` (object masks; default: the
    whole view), ``transplant`` (:class:`TransplantConfig` or dict) and the usual Fill arguments (prompt or
    prompt embeddings, steps, guidance, generator). The canvas is inpainted only inside the (dilated) target
    region; the result is the background with that region replaced, so pixels outside it are the input's, exactly.
    """

    @torch.no_grad()
    def __call__(self, background=None, target_mask=None, references=None, reference_masks=None,
                 target_box=None, transplant=None, output_type: str = "pil", **kwargs) -> TransplantOutput:
        config = coerce_config(TransplantConfig, transplant)
        for name in ("image", "mask_image", "height", "width", "masked_image_latents"):
            if name in kwargs:
                raise ValueError(f"{name} is set by the transplant pipeline from the canvas; do not pass it")
        canvas = self.prepare_canvas(config, background, target_mask, references, reference_masks, target_box)
        sources, target = token_sets(canvas, config)
        ids = transplant_ids(canvas.layout.grid, sources, target, config.fit, config.mode == "swap",
                             config.round_positions)
        context = EditContext(enabled=config.enabled)
        if config.enabled:
            context.rewriters.append(TransplantIds(ids, config.tau))
        height, width = canvas.layout.canvas_size
        with self.edit_session(context):
            result = super().__call__(image=canvas.image, mask_image=canvas.inpaint_mask[None, None].float(),
                                      height=height, width=width, output_type="pt", **kwargs)
        canvas_images = result.images
        composited = composite(canvas, canvas_images)
        native = self._prepare_latent_image_ids(1, *canvas.layout.grid, ids.device, ids.dtype)
        return TransplantOutput(_convert(composited, output_type), canvas_images, canvas, ids, native)

    def prepare_canvas(self, config, background, target_mask, references, reference_masks, target_box) -> Canvas:
        background = as_image_batch("background", background)
        if background.shape[0] != 1:
            raise ValueError(f"background must be one image, got a batch of {background.shape[0]}")
        size = tuple(background.shape[-2:])
        check_token_grid("background", *size, self.token_pixels)
        if (target_mask is None) == (target_box is None):
            raise ValueError("give exactly one of target_mask and target_box")
        mask = as_mask("target_mask", target_mask, size) if target_box is None else box_to_mask(target_box, size)
        if references is None:
            raise ValueError("references is required: one reference image or a list of views")
        references = references if isinstance(references, (list, tuple)) else [references]
        references = [as_image_batch(f"references[{i}]", r) for i, r in enumerate(references)]
        if reference_masks is None:
            reference_masks = [None] * len(references)
        reference_masks = reference_masks if isinstance(reference_masks, (list, tuple)) else [reference_masks]
        if len(reference_masks) != len(references):
            raise ValueError(f"got {len(reference_masks)} reference_masks for {len(references)} references")
        object_masks = [torch.ones(r.shape[-2:], dtype=torch.bool) if m is None
                        else as_mask(f"reference_masks[{i}]", m, tuple(r.shape[-2:]))
                        for i, (r, m) in enumerate(zip(references, reference_masks))]
        return compose_canvas(config, background, mask, references, object_masks, self.token_pixels)


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

