"""Band modulation (Untwisting RoPE): style-aligned generation with band-scaled shared attention.

``mmpos edit band``: FLUX.1 (``[reference, targets...]`` in one batch) and Kontext (``variant: kontext``: the
context image is the reference). On the world t2i model: :func:`~mmpos.world.edit_pairs.style_set` examples.
"""

from __future__ import annotations

from .. import register_edit
from ..method import EditMethod, Variant, run_edit
from .cli import FLAG_KEYS, add_options, cli_run
from .demo import demo_section

PIPELINES = {  # pipeline key (class name or diffusers family) -> pipeline; a new family is one line
    "FluxPipeline": "mmpos.pipelines.edits.band.pipelines:BandModulationFluxPipeline",
    "FluxKontextPipeline": "mmpos.pipelines.edits.band.pipelines:BandModulationKontextPipeline",
    "Flux2Pipeline": "mmpos.pipelines.edits.band.pipelines:BandModulationFlux2Pipeline",
    "Flux2KleinPipeline": "mmpos.pipelines.edits.band.pipelines:BandModulationFlux2KleinPipeline",
    "QwenImagePipeline": "mmpos.pipelines.edits.band.pipelines:BandModulationQwenImagePipeline",
    "QwenImage21Pipeline": "mmpos.pipelines.edits.band.pipelines:BandModulationQwenImage21Pipeline",
    "ZImagePipeline": "mmpos.pipelines.edits.band.pipelines:BandModulationZImagePipeline",
}
VARIANTS = {"flux": Variant("FluxPipeline", "t2i"), "kontext": Variant("FluxKontextPipeline", "kontext")}


def collect(result, call) -> dict:
    """A Kontext call (``image=`` the context) edits each output; a shared-reference batch is
    ``[reference, target_1, ...]``."""
    if "image" in call:
        return {"outputs": result.images}
    return {"references": result.images[:1], "outputs": result.images[1:]}


BAND = register_edit(
    EditMethod(
        name="band",
        help="band modulation (Untwisting RoPE): style-aligned shared attention",
        config_class="mmpos.pipelines.edits.band.rule:BandConfig",
        pipelines=PIPELINES,
        world_task="t2i",
        add_options=add_options,
        flag_keys=FLAG_KEYS,
        collect=collect,
        cli_run=cli_run,
        demo_section=demo_section,
        variants=VARIANTS,
        demo_order=3,
        prompt_help="the Kontext variant's edit instruction (variant: kontext; FLUX.1 takes --reference-prompt and "
        "--target) (default: the config's prompt)",
    )
)
