"""The tiny random pipelines of the registered families (``mmpos.integrations.diffusers.tiny_pipelines``): every
registered family has one or a stated reason; each saved folder loads with ``from_pretrained`` and runs a step
equal to the pipeline it was saved from; each pipeline with ``set_pe(..., "native")`` is bit-identical to stock
(issue 43: each family's pipelines edit-off = stock), and an extrapolation installed the same way changes it."""

from __future__ import annotations

import os

import diffusers
import pytest
import torch

from mmpos.integrations.diffusers import restore, set_pe
from mmpos.integrations.diffusers.families import FAMILIES, builtin_families
from mmpos.integrations.diffusers.hooks import installed_hook
from mmpos.integrations.diffusers.tiny_parts import tiny_call
from mmpos.integrations.diffusers.tiny_pipelines import (
    EMBEDS_FILE,
    NOT_TINY,
    PIPELINES_NOT_TINY,
    RECIPES,
    not_tiny_reason,
    save_tiny_pipeline,
    tiny_pipeline,
)
from mmpos.pipelines.loading import load_pipeline_class
from tests.fixtures.asserts import in_fresh_memory

pytestmark = pytest.mark.usefixtures("one_thread")

# Qwen-Image-Edit(-Plus) give the condition image to the model at ~1024^2 pixels whatever its size: 10-20 s each here
SLOW_PIPELINES = ("QwenImageEditPipeline", "QwenImageEditPlusPipeline")
SLOW = [pytest.mark.slow, pytest.mark.skipif(os.environ.get("MMPOS_SLOW") != "1", reason="slow (MMPOS_SLOW=1)")]
ALL = [
    pytest.param(recipe, id=f"{family}-{name}", marks=SLOW if name in SLOW_PIPELINES else [])
    for family, recipes in RECIPES.items()
    for name, recipe in recipes.items()
]


def run(pipe, recipe, steps=1):
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():  # CogView4ControlPipeline samples the control latents from the global RNG
        torch.manual_seed(0)
        return pipe(**tiny_call(recipe, steps), generator=generator, output_type="pt", return_dict=False)[0]


def test_every_registered_family_has_a_tiny_pipeline_or_a_reason():
    families = set(builtin_families())
    assert set(RECIPES) <= families and set(NOT_TINY) <= families and not set(RECIPES) & set(NOT_TINY)
    for family in families:
        assert (family in RECIPES) != bool(not_tiny_reason(family))
    for family, recipes in RECIPES.items():  # every pipeline of a covered family: built tiny, or named with why
        assert set(recipes) <= set(FAMILIES[family].pipelines)
        left = set(FAMILIES[family].pipelines) - set(recipes)
        assert left <= set(PIPELINES_NOT_TINY), f"{family}: {sorted(left - set(PIPELINES_NOT_TINY))} unexplained"
    covered = {pipeline for family in RECIPES for pipeline in FAMILIES[family].pipelines}
    assert set(PIPELINES_NOT_TINY) <= covered - {p for recipes in RECIPES.values() for p in recipes}  # no stale line


@pytest.mark.parametrize("family", builtin_families())
def test_each_family_saves_a_tiny_folder_that_loads_and_runs_or_says_why(family, tmp_path):
    if family not in RECIPES:
        with pytest.raises(ValueError, match=f"family '{family}' has no tiny pipeline: .+"):
            tiny_pipeline(family)
        return
    recipe = tiny_pipeline(family)  # the default: the family's first tiny pipeline
    assert recipe is next(iter(RECIPES[family].values()))
    folder = save_tiny_pipeline(recipe, tmp_path / family)
    cls = getattr(diffusers, recipe.pipeline)
    loaded = load_pipeline_class(cls, folder, "float32", "cpu")  # from_pretrained, components saved as None passed so
    assert type(loaded) is cls and (folder / EMBEDS_FILE).is_file()
    image = run(in_fresh_memory(loaded), recipe)
    assert torch.isfinite(image).all() and image.shape[-2:] == (recipe.side, recipe.side)
    assert torch.equal(image, run(recipe.build(), recipe))  # the folder holds the recipe's pipeline, weights and all


@pytest.mark.parametrize("recipe", ALL)
def test_each_tiny_pipeline_with_native_set_pe_is_stock_and_an_extrapolation_changes_it(recipe):
    pipe = recipe.build()
    stock = run(pipe, recipe)
    set_pe(pipe.transformer, "native")
    assert installed_hook(pipe.transformer) is not None
    assert torch.equal(run(pipe, recipe), stock)
    restore(pipe.transformer)
    set_pe(pipe.transformer, "native", extrapolation={"type": "ntk", "factor": 4.0})  # the same seam, other tables
    assert not torch.equal(run(pipe, recipe), stock)


def test_a_pipeline_that_is_not_tiny_is_refused_with_why():
    with pytest.raises(ValueError, match="ZImageOmniPipeline: not built tiny: needs a SigLIP"):
        tiny_pipeline("z_image", "ZImageOmniPipeline")
    with pytest.raises(ValueError, match="not a pipeline of family 'flux'; its tiny pipelines are FluxPipeline"):
        tiny_pipeline("flux", "WanPipeline")
    with pytest.raises(ValueError, match="unknown diffusers family 'nope'; expected one of .*flux2"):
        tiny_pipeline("nope")
