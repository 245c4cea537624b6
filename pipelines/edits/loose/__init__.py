"""LooseRoPE: cut-and-paste harmonisation on Kontext, the pasted tokens' positions loosened by saliency.

``mmpos edit loose``: a collage and its paste mask (or the image before pasting). On the world Kontext model:
:func:`~mmpos.world.edit_pairs.harmonise_pair` examples, the schedule rescaled to the step count
(:func:`loose_for_steps`).
"""

from __future__ import annotations

from .. import register_edit
from ..method import EditMethod, run_edit
from .cli import add_options, cli_run
from .demo import demo_section

PIPELINES = {  # pipeline key (class name or diffusers family) -> pipeline; a new family is one line
    "FluxKontextPipeline": "mmpos.pipelines.edits.loose.pipelines:LooseRoPEKontextPipeline",
    "Flux2KleinPipeline": "mmpos.pipelines.edits.loose.pipelines:LooseRoPEKleinPipeline",
    "QwenImageEditPipeline": "mmpos.pipelines.edits.loose.pipelines:LooseRoPEQwenEditPipeline",
    "QwenImageEditPlusPipeline": "mmpos.pipelines.edits.loose.pipelines:LooseRoPEQwenEditPlusPipeline",
}


def collect(result, call) -> dict:
    return {"outputs": result.images}


LOOSE = register_edit(
    EditMethod(
        name="loose",
        help="LooseRoPE cut-and-paste harmonisation on Kontext",
        config_class="mmpos.pipelines.edits.loose.rule:LooseConfig",
        pipelines=PIPELINES,
        world_task="kontext",
        add_options=add_options,
        flag_keys={},
        collect=collect,
        cli_run=cli_run,
        demo_section=demo_section,
        demo_order=2,
        prompt_help="the edit model's harmonisation instruction (default: the config's prompt, the authors' instruction)",
    )
)
