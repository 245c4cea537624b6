"""One sweep over the registered edit methods, as timm's tests run over ``list_models()``: every shipped method, on
the shipped world model of its task (a trained FLUX.1-class model: random weights cannot show what an edit does),
through the method's own record, world calls and runner. For each:

* the edit off is the stock diffusers pipeline, pixel for pixel;
* the edit on moves the output the way the method says, by a measured amount (band: the targets take the
  reference's palette; PE transplant: more of the inserted object lands in its true mask; LooseRoPE: more of the
  pasted object is kept than by plain Kontext editing; scores of :mod:`mmpos.eval.edit_scores`, measured at 8 steps:
  palette 0.04 -> 0.45, mask IoU 0.29 -> 0.35, identity IoU 0.17 -> 0.25; at 20 steps in ``docs/results.md``);
* afterwards the edit off is the stock pipeline again, and no edit processor is left in the model.

The per-family pipelines (FLUX.2 / Klein, Qwen-Image, Z-Image, Qwen-Image 2.1) have their off-is-stock and on-differs
tests on tiny configs beside each method's (``test_band_families.py``, ``test_transplant_families.py``,
``test_loose_families.py``, ``test_band_qwenimage21.py``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from mmpos.eval.edit_scores import harmonise_row, style_row, transplant_row
from mmpos.models.world.image import build_pipeline, conditioning
from mmpos.models.world.samples import generate
from mmpos.pipelines.edits import get_edit, list_edits, run_edit
from mmpos.pipelines.edits.method import seeded_generator
from mmpos.pipelines.edits.processor import EditAttnProcessor
from mmpos.pipelines.edits.transplant.canvas import TransplantConfig
from mmpos.pipelines.world.demo import world_models_available
from mmpos.world.canvas import WORLD_TRANSPLANT, insertion_canvas, scene_part
from mmpos.world.edit_pairs import harmonise_pair, style_set, transplant_pair
from mmpos.world.images import to_uint8

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not world_models_available(), reason="the shipped world models (assets/world-*) are absent"),
]

STEPS = 8  # enough for each effect to show on the 32 px world models; docs/results.md has them at 20
GUIDANCE = 3.0


def _stock(pipe, task):
    plain = build_pipeline(task, pipe.vae, pipe.transformer, pipe.text_encoder)
    plain.set_progress_bar_config(disable=True)
    return plain


def _band_stock(pipe, sets):
    """FLUX.1 on each set's ``[reference caption, target prompts]`` batch: what band off generates (its targets)."""
    out = []
    for index, style in enumerate(sets):
        captions = [style.reference.spec.caption(), *style.prompts]
        examples = [{"image": style.reference.image, "caption": c} for c in captions]
        out.append(generate(_stock(pipe, "t2i"), "t2i", examples, steps=STEPS, seed=index)[1:])
    return np.concatenate(out)


def _transplant_stock(pipe, pairs):
    """FLUX.1 Fill on each pair's canvas (the transplant pipeline's own), the scene part: what transplant off makes
    before compositing (``raw``)."""
    stock, out = _stock(pipe, "fill"), []
    layout = TransplantConfig(**WORLD_TRANSPLANT)
    for index, pair in enumerate(pairs):
        references, masks = [pair.reference.image], [pair.reference.masks[0]]
        canvas = pipe.prepare_canvas(layout, pair.background.image, None, references, masks, pair.box)
        images = stock(
            image=canvas.image,
            mask_image=canvas.inpaint_mask[None, None].float(),
            height=canvas.image.shape[-2],
            width=canvas.image.shape[-1],
            num_inference_steps=STEPS,
            generator=seeded_generator(index),
            output_type="np",
            **conditioning(stock, [pair.caption], GUIDANCE),
        ).images
        rows, cols = canvas.layout.background.slices
        out.append(images[0][rows, cols])
    return to_uint8(np.stack(out))


def _loose_stock(pipe, pairs):
    examples = [{"image": p.target.image, "context": p.collage, "caption": p.instruction} for p in pairs]
    return np.concatenate(
        [generate(_stock(pipe, "kontext"), "kontext", [e], steps=STEPS, seed=i) for i, e in enumerate(examples)]
    )


@dataclass(frozen=True)
class Sweep:
    """One method's row: its world examples, the options off and on, the stock outputs of the examples, and the
    score whose rise is the method's effect (``score(outputs, run, examples)``, higher = more of the effect)."""

    examples: Callable
    off: Callable  # steps -> options
    on: Callable
    stock: Callable  # (pipe, examples) -> uint8 [N, S, S, 3], compared with the run's `compared` images
    compared: str  # "outputs" or "raw"
    score: Callable
    rise: float  # the least rise of the score from off to on


def _regions(pairs):
    """The repainted region of each pair's scene (where the transplant may change it)."""
    return [scene_part(insertion_canvas(p).mask) for p in pairs]


def _loose_options(steps, **options):
    return importlib.import_module("mmpos.pipelines.edits.loose.demo").loose_for_steps(steps, **options)


SWEEPS = {
    "band": Sweep(
        lambda size: [style_set(444_444 + i, 2, size) for i in range(2)],
        lambda steps: {"enabled": False},
        lambda steps: {"strength": 1.0},
        _band_stock,
        "outputs",
        lambda outputs, run, sets: style_row("", outputs, [s.reference for s in sets for _ in s.targets])["palette"],
        0.2,
    ),
    "transplant": Sweep(
        lambda size: [transplant_pair(434_343 + i, size) for i in range(4)],
        lambda steps: {**WORLD_TRANSPLANT, "enabled": False},
        lambda steps: dict(WORLD_TRANSPLANT),
        _transplant_stock,
        "raw",
        lambda outputs, run, pairs: transplant_row("", outputs, pairs, _regions(pairs), run.raw)["mask_iou"],
        0.03,
    ),
    "loose": Sweep(
        lambda size: [harmonise_pair(424_242 + i, size) for i in range(4)],
        lambda steps: _loose_options(steps, strength=0.0),
        lambda steps: _loose_options(steps),
        _loose_stock,
        "outputs",
        lambda outputs, run, pairs: harmonise_row("", outputs, pairs)["identity_iou"],
        0.04,
    ),
}


def test_every_shipped_method_is_in_the_sweep():
    assert set(list_edits()) == set(SWEEPS)


@pytest.fixture(scope="module")
def source():
    from mmpos.pipelines.world.sources import ModelSource

    return ModelSource()


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_edit_off_is_stock_on_moves_the_output_and_restore_is_stock(name, source):
    method, sweep = get_edit(name), SWEEPS[name]
    task = method.world_task
    pipe = source.pipeline(name)
    examples = sweep.examples(source.size(task))
    demo = importlib.import_module(f"mmpos.pipelines.edits.{name}.demo")
    calls = demo.world_calls(pipe, examples, STEPS, GUIDANCE)

    def run(options):
        return run_edit(method, pipe, calls, options, seed=0)

    off = run(sweep.off(STEPS))
    assert np.array_equal(getattr(off, sweep.compared), sweep.stock(pipe, examples))
    on = run(sweep.on(STEPS))
    rise = sweep.score(on.outputs, on, examples) - sweep.score(off.outputs, off, examples)
    assert rise >= sweep.rise, f"{name}: the score rose by {rise:.4f}; expected at least {sweep.rise}"
    again = run(sweep.off(STEPS))
    assert np.array_equal(again.outputs, off.outputs)
    processors = pipe.transformer.attn_processors.values()
    assert not any(isinstance(p, EditAttnProcessor) for p in processors)
