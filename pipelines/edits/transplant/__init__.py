"""PE transplant (PosBridge): object insertion on Fill, the reference tiles' tokens carrying the target box's
positions while sigma >= tau.

``mmpos edit transplant``: a background, a mask or box, reference views. On the world Fill model:
:func:`~mmpos.world.edit_pairs.transplant_pair` examples, on the world's canvas layout
(:data:`~mmpos.world.canvas.WORLD_TRANSPLANT`).
"""

from __future__ import annotations

from .. import register_edit
from ..method import EditMethod, run_edit
from .cli import add_options, cli_run
from .demo import demo_section

PIPELINES = {  # pipeline key (class name or diffusers family) -> pipeline; a new family is one line
    "FluxFillPipeline": "mmpos.pipelines.edits.transplant.pipeline_fill:PosBridgeFillPipeline",
    "Flux2KleinInpaintPipeline": "mmpos.pipelines.edits.transplant.pipeline_inpaint:PosBridgeKleinInpaintPipeline",
    "QwenImageInpaintPipeline": "mmpos.pipelines.edits.transplant.pipeline_inpaint:PosBridgeQwenInpaintPipeline",
    # the released Klein and Qwen-Image folders name their text-to-image pipeline; the inpainting pipeline takes the
    # same components (FLUX.1 Fill, by contrast, has its own weights)
    "Flux2KleinPipeline": "mmpos.pipelines.edits.transplant.pipeline_inpaint:PosBridgeKleinInpaintPipeline",
    "QwenImagePipeline": "mmpos.pipelines.edits.transplant.pipeline_inpaint:PosBridgeQwenInpaintPipeline",
}


def collect(result, call) -> dict:
    """The composited output, and the scene part of the canvas output before compositing (``raw``)."""
    rows, cols = result.canvas.layout.background.slices
    return {"outputs": result.images, "raw": result.canvas_images[..., rows, cols]}


TRANSPLANT = register_edit(
    EditMethod(
        name="transplant",
        help="PE transplant (PosBridge) object insertion on Fill",
        config_class="mmpos.pipelines.edits.transplant.canvas:TransplantConfig",
        pipelines=PIPELINES,
        world_task="fill",
        add_options=add_options,
        flag_keys={},
        collect=collect,
        cli_run=cli_run,
        demo_section=demo_section,
        demo_order=1,
        prompt_help="the inpainting prompt: the edited scene, object included (default: the config's prompt)",
    )
)
